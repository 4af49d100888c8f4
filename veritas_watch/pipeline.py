"""The write path: source units -> transforms -> embed -> upsert -> cursor commit.

Only this module knows the order of the stages, and the ack-then-commit rule lives here alone:
a cursor moves only after the store acknowledged every point read before it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TypeVar

import structlog

from veritas_watch.model import (
    Chunk,
    ConversationEnd,
    Entry,
    ParsedLine,
    ParseError,
    RawRecord,
    SecretFinding,
    SessionState,
    Skip,
    SourceRef,
)
from veritas_watch.sinks.embed import Embedder
from veritas_watch.sinks.store import SparseVector, Store, StoredPoint, StoreMeta, store_meta_for
from veritas_watch.transforms.chunk import chunk_entry
from veritas_watch.transforms.denoise import (
    HistoryMessage,
    clean_message,
    detection_text,
    first_user_text,
    history_messages,
    is_cron_prompt,
    next_turn,
)
from veritas_watch.transforms.parse import parse_line
from veritas_watch.transforms.redact import redact, redact_with_matches
from veritas_watch.transforms.tokenize import SPARSE_SCHEME, sparse_document

log = structlog.get_logger()
T = TypeVar("T")
CONTEXT_CHARS = 400  # how much of the previous turn goes into the next turn's dense vector
DENSE_SCHEME = "prev-turn-v1"  # what the dense vector is made of; a change re-embeds (store migration)


@dataclass
class Found:
    """A credential seen in a message, with where it can be recovered. Holds no secret value."""

    agent_id: str
    session_id: str
    finding: SecretFinding
    location: SourceRef
    seen_at: str | None
    value: str | None = field(default=None, repr=False)  # only when a vault is configured; never logged


@dataclass
class Transformed:
    chunks: list[Chunk] = field(default_factory=list)
    found: list[Found] = field(default_factory=list)
    skipped: Counter[str] = field(default_factory=Counter)
    invalid: list[tuple[SourceRef, str]] = field(default_factory=list)
    ends: list[ConversationEnd] = field(default_factory=list)  # conversations a `reset` event ended


def transform_records(records: Sequence[RawRecord], state: SessionState, *, fallback_session: str,
                      redact_key: bytes, max_line_bytes: int, chunk_chars: int, chunk_overlap: int,
                      keep_values: bool = False) -> Transformed:
    """Pure apart from `state`, which it advances (header id, cron classification, turn, last entry time).

    A user line may quote a group chat's members (`denoise.history_messages`): each of their
    messages becomes an entry of its own, before the line's own text, with its `speaker`, its own
    time, the carrying line's `entry_id` and `source`, and a point identity from what it is
    (`member_point_key`), so that a history block quoted again by a later line is the same points.
    Within one call a point comes out once (its last occurrence, as a later call would overwrite it).
    """
    out = Transformed()
    for record in records:
        line = parse_line(record.data, max_bytes=max_line_bytes)
        if isinstance(line, ParseError):
            out.invalid.append((record.source, line.reason))
            continue
        if line.line_type == "session":
            state.session_id = state.session_id or line.session_id
            out.skipped["session_header"] += 1
            continue
        session_id = state.session_id or fallback_session
        if line.line_type == "reset":
            if state.conversation_entries:  # an empty conversation (`/new` twice) needs no sync
                out.ends.append(ConversationEnd(session_id, state.last_entry_ts, state.session_kind,
                                                line.reason or "reset", record.source.render(), record.source.seq))
            state.next_conversation()
            out.skipped["conversation_reset"] += 1
            continue
        if state.session_kind == "unknown" and (first := first_user_text(line)) is not None:
            state.session_kind = "cron" if is_cron_prompt(first) else "conversation"
        if state.session_kind == "cron":
            out.skipped["cron_session"] += 1
            continue
        cleaned = clean_message(line, turn=state.turn)
        state.turn = next_turn(state.turn, line, cleaned)
        entry_id = line.entry_id or "h" + hashlib.blake2b(record.data, digest_size=10).hexdigest()
        for member in history_messages(line):
            _add_entry(out, state, _member_entry(out, record, line, session_id, entry_id, member, redact_key,
                                                 keep_values), chunk_chars, chunk_overlap)
        if isinstance(cleaned, Skip):
            out.skipped[cleaned.reason] += 1
            # Tool output and narration are not memory, but a key pasted there must still be captured.
            if cleaned.reason.startswith("tool"):
                _scan(out, record, line, session_id, detection_text(line), line.timestamp, redact_key, keep_values)
            continue
        role, text = cleaned
        redacted = _scan(out, record, line, session_id, text, line.timestamp, redact_key, keep_values)
        entry = Entry(record.agent_id, session_id, entry_id, role, redacted, line.timestamp, record.source)
        _add_entry(out, state, entry, chunk_chars, chunk_overlap)
    if len(out.chunks) > 1:
        last = {chunk.point_id: i for i, chunk in enumerate(out.chunks)}
        if len(last) < len(out.chunks):
            out.chunks = [chunk for i, chunk in enumerate(out.chunks) if last[chunk.point_id] == i]
    return out


def member_point_key(member: HistoryMessage, redact_key: bytes) -> str:
    """What identifies a quoted group message in its session: sender, time and body as written.

    The body is hashed redacted (a secret never goes into an id, even hashed); the session and agent
    are added by `model.point_id`. Never an OpenClaw entry id (those have no `:`).
    """
    body = redact(member.body, redact_key).text
    material = "\x1f".join((member.sender_key, member.stamp, body)).encode("utf-8", "replace")
    return "m:" + hashlib.blake2b(material, digest_size=16).hexdigest()


def _member_entry(out: Transformed, record: RawRecord, line: ParsedLine, session_id: str, entry_id: str,
                  member: HistoryMessage, redact_key: bytes, keep_values: bool) -> Entry:
    """A group member's message as an entry: redacted exactly like the line's own text."""
    seen_at = member.timestamp or line.timestamp  # without a time of its own: when it was quoted
    text = _scan(out, record, line, session_id, member.text, seen_at, redact_key, keep_values)
    speaker = member.speaker
    if speaker is not None:
        speaker = _scan(out, record, line, session_id, speaker, seen_at, redact_key, keep_values)
    return Entry(record.agent_id, session_id, entry_id, "user", text, seen_at, record.source,
                 speaker=speaker, point_key=member_point_key(member, redact_key))


def _scan(out: Transformed, record: RawRecord, line: ParsedLine, session_id: str, text: str, seen_at: str | None,
          redact_key: bytes, keep_values: bool) -> str:
    """`text` redacted; every credential found in it recorded with where it can be recovered."""
    redacted, matches = redact_with_matches(text, redact_key)
    out.found.extend(Found(record.agent_id, session_id, f, record.source, seen_at, m.value if keep_values else None)
                     for f, m in zip(redacted.findings, matches, strict=True))
    return redacted.text


def _add_entry(out: Transformed, state: SessionState, entry: Entry, chunk_chars: int, chunk_overlap: int) -> None:
    if entry.timestamp and (state.last_entry_ts is None or entry.timestamp > state.last_entry_ts):
        state.last_entry_ts = entry.timestamp
    state.conversation_entries += 1
    chunks = list(chunk_entry(entry, chunk_chars, chunk_overlap))
    if chunks and state.previous_text:
        chunks[0] = dataclasses.replace(chunks[0], context=state.previous_text)
    state.previous_text = entry.text[-CONTEXT_CHARS:]
    out.chunks.extend(chunks)


@dataclass
class Work:
    """One unit for the sink: chunks to store; the source's `unit` is committed once they are acked."""

    chunks: list[Chunk]
    unit: object  # what the source needs to commit its cursor (a jsonl.ReadUnit, a sqlite poll, ...)
    at_eof: bool = True
    cleanup: Callable[[Store], None] | None = None  # runs in the store thread after the upsert, before commit
    done: asyncio.Future[None] | None = None  # resolved once committed (cancelled if never stored)


CommitBatch = Callable[[Sequence[Work]], None]


def make_points(embedder: Embedder, items: Sequence[tuple[str, str, str, dict[str, object]]]) -> list[StoredPoint]:
    """(id, dense text, text, payload) -> points: the dense vector of the first, the sparse one of `text`."""
    dense = embedder.embed_passages([dense_text for _, dense_text, _, _ in items])
    points = []
    for (point_id, _, text, payload), vector in zip(items, dense, strict=True):
        sparse = sparse_document(text)
        points.append(StoredPoint(point_id, vector.tolist(), SparseVector(sparse.indices, sparse.values), payload))
    return points


def store_meta(embedder: Embedder) -> StoreMeta:
    """What the stored vectors are made of: any change here migrates the store."""
    return store_meta_for(embedder.name, embedder.dim, SPARSE_SCHEME, DENSE_SCHEME)


@dataclass
class PipelineStats:
    stored: int = 0
    unchanged: int = 0  # replays the store already had: no embed, no write
    skipped: Counter[str] = field(default_factory=Counter)
    invalid: int = 0
    redactions: int = 0
    batches: int = 0
    store_errors: int = 0
    store_down_since: float | None = None
    last_batch_at: float = 0.0
    last_store_seconds: float = 0.0
    per_agent: Counter[str] = field(default_factory=Counter)


class Sink:
    """Micro-batching embed + upsert with retries. Owns the embedder and store worker threads."""

    def __init__(self, store: Store, embedder: Embedder, commit_batch: CommitBatch, *, batch_size: int,
                 linger_ms: float, queue_size: int, retry_initial: float, retry_max: float,
                 on_store_latency: Callable[[float], None] | None = None) -> None:
        self.store = store
        self._commit_batch = commit_batch
        self.embedder = embedder
        self.queue: asyncio.Queue[Work] = asyncio.Queue(maxsize=queue_size)
        self.stats = PipelineStats()
        self._batch_size = batch_size
        self._linger = linger_ms / 1000
        self._retry_initial = retry_initial
        self._retry_max = retry_max
        self._embed_thread = ThreadPoolExecutor(1, thread_name_prefix="embed")
        self._store_thread = ThreadPoolExecutor(1, thread_name_prefix="store")
        self._on_store_latency = on_store_latency
        self.stopping = False
        self._processing = False
        self.heartbeat = time.monotonic()  # advanced by the sink loop itself: the watchdog's signal

    async def in_embed_thread(self, fn: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._embed_thread, fn)

    async def in_store_thread(self, fn: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._store_thread, fn)

    async def run(self) -> None:
        while True:
            self.heartbeat = time.monotonic()
            try:
                first = await asyncio.wait_for(self.queue.get(), timeout=1.0)
            except TimeoutError:
                continue
            self._processing = True
            batch = [first]
            size = len(first.chunks)
            deadline = time.monotonic() + self._linger
            while size < self._batch_size:
                remaining = deadline - time.monotonic()
                try:
                    item = self.queue.get_nowait() if remaining <= 0 else await asyncio.wait_for(
                        self.queue.get(), remaining)
                except (TimeoutError, asyncio.QueueEmpty):
                    break
                batch.append(item)
                size += len(item.chunks)
            try:
                stored = await self._store_with_retry([c for w in batch for c in w.chunks])
                if stored:
                    for work in batch:
                        if work.cleanup is not None:
                            await self.in_store_thread(lambda cleanup=work.cleanup: cleanup(self.store))  # type: ignore[misc]
                    # Ack-then-commit: the cursors move only now, in one transaction, off the loop.
                    if not await self._commit_with_retry(batch):
                        continue
                    for work in batch:
                        if work.done is not None and not work.done.done():
                            work.done.set_result(None)
            finally:
                self._processing = False
                for work in batch:
                    if work.done is not None and not work.done.done():
                        work.done.cancel()
                    self.queue.task_done()

    @property
    def idle(self) -> bool:
        """Nothing queued and nothing being stored."""
        return self.queue.empty() and not self._processing

    async def _retry(self, operation: Callable[[], Awaitable[None]], event: str,
                     on_failure: Callable[[], None] | None = None, **fields: object) -> bool:
        """Run `operation` until it succeeds (True), or the sink is stopping (False): capped exponential
        backoff, the first failures logged each, then one line per backoff ceiling (errors without flooding)."""
        delay = self._retry_initial
        attempt = 0
        while True:
            self.heartbeat = time.monotonic()
            try:
                await operation()
                return True
            except Exception as exc:
                attempt += 1
                if attempt <= 3 or delay >= self._retry_max:
                    log.error(event, attempt=attempt, backoff_s=round(delay, 2),
                              error=f"{type(exc).__name__}: {exc}"[:300], **fields)
                if on_failure is not None:
                    on_failure()
                if self.stopping:
                    return False
                await asyncio.sleep(delay)
                delay = min(delay * 2, self._retry_max)

    async def _store_with_retry(self, chunks: list[Chunk]) -> bool:
        stored = await self._retry(lambda: self._store(chunks), "store_retry", self._store_failed, chunks=len(chunks))
        if stored and self.stats.store_down_since is not None:
            log.info("store_recovered", down_s=round(time.monotonic() - self.stats.store_down_since, 1))
            self.stats.store_down_since = None
        return stored

    def _store_failed(self) -> None:
        self.stats.store_errors += 1
        if self.stats.store_down_since is None:
            self.stats.store_down_since = time.monotonic()

    async def _commit_with_retry(self, batch: list[Work]) -> bool:
        """A failed cursor commit (disk full, I/O error) is retried: the points are stored, so waiting is safe;
        if the sink stops first, the units are read again at the next start and cost no embedding."""
        return await self._retry(lambda: asyncio.to_thread(self._commit_batch, batch), "cursor_commit_failed")

    async def _store(self, chunks: list[Chunk]) -> None:
        if not chunks:
            return
        started = time.perf_counter()
        fresh = await self.in_store_thread(lambda: self._not_yet_stored(chunks))
        self.stats.unchanged += len(chunks) - len(fresh)
        for start in range(0, len(fresh), self._batch_size):
            part = fresh[start:start + self._batch_size]
            points = await self.in_embed_thread(lambda part=part: self.to_points(part))  # type: ignore[misc]
            await self.in_store_thread(lambda points=points: self.store.upsert(points))  # type: ignore[misc]
            for chunk in part:
                self.stats.per_agent[chunk.entry.agent_id] += 1
                log.debug("entry_stored", agent=chunk.entry.agent_id, session=chunk.entry.session_id,
                          entry=chunk.entry.entry_id, chunk=chunk.index, source=chunk.entry.source.render())
        elapsed = time.perf_counter() - started
        self.stats.stored += len(fresh)
        self.stats.batches += 1
        self.stats.last_batch_at = time.time()
        self.stats.last_store_seconds = elapsed
        if self._on_store_latency is not None:
            self._on_store_latency(elapsed)

    def _not_yet_stored(self, chunks: list[Chunk]) -> list[Chunk]:
        """Drop chunks the store already holds with identical payload: a replay costs no embedding."""
        unique: dict[str, Chunk] = {}
        for chunk in chunks:
            unique[chunk.point_id] = chunk  # the same entry twice in one batch (identical archives)
        existing = {hit.id: hit.payload for hit in self.store.retrieve(list(unique))}
        return [c for pid, c in unique.items() if existing.get(pid) != c.payload()]

    def to_points(self, chunks: Sequence[Chunk]) -> list[StoredPoint]:
        return make_points(self.embedder, [(c.point_id, c.embed_text, c.text, c.payload()) for c in chunks])

    async def drain(self, timeout: float) -> bool:
        """Wait until every queued unit is stored and committed (shutdown, backfill)."""
        try:
            await asyncio.wait_for(self.queue.join(), timeout)
            return True
        except TimeoutError:
            return False

    def close(self) -> None:
        self._embed_thread.shutdown(wait=True)
        self._store_thread.shutdown(wait=True)

