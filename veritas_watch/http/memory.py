"""The memory routes of the HTTP API: what the OpenClaw memory plugins call, and `/search` for the CLI.

- `POST /memory/search` `{agent_id, query, limit?, mode?, roles?, since?, until?, expand?, exclude?, conversation?}`
  -> `{"results": [...], "count": n}` (+ `"hint"` from the loop guard)
- `POST /memory/context` `{agent_id, query, limit?, exclude?}` -> `{"context": "<block>", "count": n, "results": [...]}`
- `POST /memory/add` `{agent_id, text, session_id?, role?, timestamp?, metadata?}` -> the stored ids
- `POST /memory/get` `{agent_id, id, neighbours?}` -> `{"memory": {...}, "before": [...], "after": [...]}`
- `POST /search`: the same search, answered as a bare list (the CLI and the selftest), no loop guard.
- `POST /memory/count` `{agent_id, session_ids}` -> `{"agent_id": id, "count": n, "sessions": {session id: n}}`:
  how many points (turns and chunks) each session holds (`veritas-watch forget` waits on it).

`exclude`: texts the caller holds already (its conversation); memories that are one of them are left out
before the relevance floor and the ranking. `conversation`: the caller's conversation (OpenClaw's session
key); the loop guard counts each conversation of an agent on its own.

Every search is filtered by `agent_id`; one without it is refused unless `search.allow_cross_agent`.
The loop guard counts /memory/search per agent and conversation (`search.loop_*`); /memory/context
(auto-recall, once per turn) and /memory/get (a read by id) are not searches it counts.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import json
import math
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import structlog
from aiohttp import web

from veritas_watch.http.requests import BadRequest, field, json_answer, json_body, served_of
from veritas_watch.model import Entry, SourceRef, iso_to_epoch
from veritas_watch.pipeline import Found, make_points
from veritas_watch.query import (
    CrossAgentRefused,
    MemoryHit,
    MemoryRequest,
    QueryVectors,
    check_agent,
    chunk_index,
    context_block,
    embed_request,
    hit_to_result,
    neighbour_query,
    one_line,
    run_search,
    same_conversation,
)
from veritas_watch.ranking import STOP_SEARCHING_HINT, SearchLoopGuard, floor_for
from veritas_watch.sinks.store import StoreError
from veritas_watch.transforms.chunk import chunk_entry
from veritas_watch.transforms.redact import redact, redact_with_matches
from veritas_watch.transport import MAX_COUNT_SESSIONS

if TYPE_CHECKING:
    from veritas_watch.config import Config
    from veritas_watch.http.port import Served

log = structlog.get_logger()
GUARD_KEY = web.AppKey("search_loop_guard", SearchLoopGuard)
CEILING_KEY = web.AppKey("search_loop_ceiling", SearchLoopGuard)  # per agent, when searches name a conversation
AGENT_CEILING = 4
ROLES = ("user", "assistant")
KNOWLEDGE_SESSION = "knowledge"  # the session id of manual memories added without one
# /memory/add is a note, not a document: its embedding takes its turn on the write path's thread, and a
# longer text would hold that thread (and every agent's ingestion) for minutes. Metadata is copied into
# each chunk's payload.
MAX_ADD_CHARS = 20_000
MAX_METADATA_BYTES = 4096
# `exclude`: a conversation's texts; each is redacted (as stored) on the query thread before comparing
MAX_EXCLUDE = 200
MAX_EXCLUDE_CHARS = 200_000
MAX_CONVERSATION_CHARS = 256
MAX_QUEUED_PER_AGENT = 16  # an agent's searches waiting for their turn; past it 429, not held in memory


class AgentTurns:
    """Searches take turns by agent: each agent's run one at a time, in arrival order, so however many it sends
    and however long each one is, it holds one query worker and one read worker at most (two of each,
    pipeline.QUERY_WORKERS), and another agent's search starts beside it at once. Past `max_queued` waiting,
    an agent's next search is refused (429) rather than held."""

    def __init__(self, max_queued: int = MAX_QUEUED_PER_AGENT) -> None:
        self._max_queued = max_queued
        self._locks: dict[str | None, asyncio.Lock] = {}
        self._queued: dict[str | None, int] = {}

    @contextlib.asynccontextmanager
    async def turn(self, agent: str | None) -> AsyncIterator[None]:
        queued = self._queued.get(agent, 0)
        if queued >= self._max_queued:
            raise _error(web.HTTPTooManyRequests, f"{queued} searches of this agent are waiting already; retry "
                         "when they are answered", reason="searches_queued")
        self._queued[agent] = queued + 1
        lock = self._locks.setdefault(agent, asyncio.Lock())
        try:
            async with lock:
                yield
        finally:
            self._queued[agent] -= 1
            if not self._queued[agent]:  # nobody holds or waits for it: forget the agent
                del self._queued[agent]
                del self._locks[agent]


TURNS_KEY = web.AppKey("search_turns", AgentTurns)


def _error(status: type[web.HTTPException], message: str, **extra: Any) -> web.HTTPException:
    return status(text=json.dumps({"error": message, **extra}), content_type="application/json")


def _epoch(body: dict[str, Any], name: str) -> float | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    if isinstance(value, str) and (epoch := iso_to_epoch(value)) is not None:
        return epoch
    raise BadRequest(f"field {name} must be epoch seconds or an ISO-8601 time")


def _roles(body: dict[str, Any]) -> tuple[str, ...]:
    value = body.get("roles", body.get("role"))
    if value is None:
        return ()
    roles = [value] if isinstance(value, str) else value
    if not isinstance(roles, list) or not all(isinstance(r, str) and r in ROLES for r in roles):
        raise BadRequest("field roles must be a list of: user, assistant")
    return tuple(roles)


def _bool(body: dict[str, Any], name: str, default: bool) -> bool:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise BadRequest(f"field {name} must be true or false")
    return value


def parse_request(daemon: Served, body: dict[str, Any], default_limit: int) -> MemoryRequest:
    """The search request of a JSON body; BadRequest (400) with a message for anything wrong."""
    cfg = daemon.config.search
    agent_id = field(body, "agent_id", str, required=not cfg.allow_cross_agent)
    try:
        check_agent(agent_id, cfg.allow_cross_agent)
    except CrossAgentRefused as exc:
        raise BadRequest(str(exc)) from None
    # Bounded work whatever a caller sends: the model reads no more than this (query.clip_query), and the
    # ranking's cues (speaker, time, script) scanned a 3.9 MB query for seconds.
    text = field(body, "query", str)[:cfg.max_query_chars]
    limit = int(field(body, "limit", int, required=False, default=default_limit))
    if limit < 1:
        raise BadRequest("field limit must be at least 1")
    mode = body.get("mode", "hybrid")
    if mode not in ("dense", "sparse", "hybrid"):
        raise BadRequest("field mode must be dense, sparse or hybrid")
    since, until = _epoch(body, "since"), _epoch(body, "until")
    if since is not None and until is not None and since > until:
        raise BadRequest("field since is after until: no time is in that range")
    floor = floor_for(daemon.memory.embedder, cfg.relevance_floor)
    floor_field = body.get("floor")
    if floor_field is False:
        floor = None  # the operator's "show me anything" (`veritas-watch search --no-floor`)
    elif floor_field is not None and floor_field is not True:
        if isinstance(floor_field, bool) or not isinstance(floor_field, (int, float)):
            raise BadRequest("field floor must be false or a number")
        floor = float(floor_field) or None
    return MemoryRequest(agent_id, text, min(limit, cfg.max_limit), mode, _roles(body), since, until,
                         _bool(body, "expand", cfg.expand_context), floor, _exclude(body))


def _exclude(body: dict[str, Any]) -> frozenset[str]:
    value = body.get("exclude")
    if value is None:
        return frozenset()
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise BadRequest("field exclude must be a list of texts")
    if len(value) > MAX_EXCLUDE or sum(len(item) for item in value) > MAX_EXCLUDE_CHARS:
        raise BadRequest(f"field exclude holds at most {MAX_EXCLUDE} texts of {MAX_EXCLUDE_CHARS} characters "
                         "in all: send the conversation's latest", "exclude_too_long")
    return frozenset(text for item in value if (text := one_line(item)))


def _conversation(body: dict[str, Any]) -> str | None:
    value = field(body, "conversation", str, required=False, default=None)
    if value is not None and len(value) > MAX_CONVERSATION_CHARS:
        raise BadRequest(f"field conversation is over {MAX_CONVERSATION_CHARS} characters")
    return value or None


async def _search(web_request: web.Request, request: MemoryRequest) -> list[MemoryHit]:
    async with web_request.app[TURNS_KEY].turn(request.agent_id):
        return await _search_now(served_of(web_request), request)


async def _search_now(daemon: Served, request: MemoryRequest) -> list[MemoryHit]:
    memory = daemon.memory
    key = daemon.redact_key

    def prepared() -> tuple[MemoryRequest, QueryVectors]:
        # held texts as they were stored: a secret in the conversation is a marker in its memory
        held = frozenset(one_line(redact(text, key).text) for text in request.exclude)
        return dataclasses.replace(request, exclude=held), embed_request(memory.embedder, request)

    request, vectors = await memory.in_query_thread(prepared)
    try:
        return await memory.in_read_thread(lambda: run_search(memory.store, request, vectors))
    except StoreError as exc:
        log.error("search_failed", agent=request.agent_id, error=str(exc)[:300])
        raise _error(web.HTTPServiceUnavailable, "the store is not answering; retry later") from None


def _guard(request: web.Request, agent_id: str | None, conversation: str | None) -> str | None:
    """The loop guard's hint for this search, if any; raises 429 past the hard stop. One model looping is
    one conversation: an agent that serves several counts each on its own, under a ceiling for the agent
    (AGENT_CEILING times the limits: a caller that names a new conversation each time is still stopped)."""
    guard = request.app[GUARD_KEY]
    agent = agent_id or "*"
    now = time.monotonic()
    where = hashlib.blake2b(conversation.encode(), digest_size=8).hexdigest() if conversation else None
    verdict, count, retry_after = guard.check(agent + "\x1f" + where if where else agent, now)
    if where and verdict != "stop":
        ceiling, agent_count, agent_retry = request.app[CEILING_KEY].check(agent, now)
        if ceiling == "stop":
            verdict, count, retry_after = ceiling, agent_count, agent_retry
    if verdict == "ok":
        return None
    hint = STOP_SEARCHING_HINT.format(count=count, window=guard.window)
    if verdict == "stop":
        log.warning("search_loop_stopped", agent=agent_id, conversation=where, searches=count, window_s=guard.window)
        seconds = max(1, round(retry_after + 0.5))
        raise web.HTTPTooManyRequests(
            text=json.dumps({"error": "too many searches: stop searching", "hint": hint, "retry_after": seconds}),
            content_type="application/json", headers={"Retry-After": str(seconds)})
    log.info("search_loop_hint", agent=agent_id, conversation=where, searches=count, window_s=guard.window)
    return hint


async def search(request: web.Request) -> web.Response:
    daemon = served_of(request)
    query = parse_request(daemon, await json_body(request), 10)
    return json_answer([hit_to_result(h) for h in await _search(request, query)])


async def memory_search(request: web.Request) -> web.Response:
    daemon = served_of(request)
    body = await json_body(request)
    query = parse_request(daemon, body, 10)
    hint = _guard(request, query.agent_id, _conversation(body))
    results = [hit_to_result(h) for h in await _search(request, query)]
    answer: dict[str, object] = {"results": results, "count": len(results)}
    if hint:
        answer["hint"] = hint
    return json_answer(answer)


async def memory_context(request: web.Request) -> web.Response:
    daemon = served_of(request)
    cfg = daemon.config.search
    query = parse_request(daemon, await json_body(request), cfg.context_limit)
    # Not counted by the loop guard: the context block is what a plugin puts before every user turn (auto-
    # recall), one call per turn, not a model searching in a loop; counted, a busy chat used up the guard
    # and the agent's own searches were refused.
    hits = await _search(request, query)
    block = context_block(hits, cfg.context_chars)
    return json_answer({"context": block, "count": len(hits), "results": [hit_to_result(h) for h in hits]})


def _now_iso() -> str:
    now = datetime.now(UTC)
    return now.strftime("%Y-%m-%dT%H:%M:%S.") + f"{now.microsecond // 1000:03d}Z"


async def memory_add(request: web.Request) -> web.Response:
    """A manual "remember this": redacted, embedded and stored as type `knowledge`.

    Id scheme as for transcripts: point_id(agent, session, entry, chunk) with the session given or
    "knowledge" and the entry id a hash of the redacted text, so adding the same text twice
    overwrites one memory instead of making two.
    """
    daemon = served_of(request)
    body = await json_body(request)
    agent_id = field(body, "agent_id", str)
    text = field(body, "text", str)
    session_id = field(body, "session_id", str, required=False, default=KNOWLEDGE_SESSION)
    role = field(body, "role", str, required=False, default="user")
    if role not in ROLES:
        raise BadRequest("field role must be user or assistant")
    timestamp = field(body, "timestamp", str, required=False, default=None)
    if timestamp is not None and iso_to_epoch(timestamp) is None:
        raise BadRequest("field timestamp must be an ISO-8601 time")
    if len(text) > MAX_ADD_CHARS:
        raise BadRequest(f"field text is {len(text)} characters, over {MAX_ADD_CHARS}: add it in parts",
                         "text_too_long")
    metadata = body.get("metadata")
    if metadata is not None and not isinstance(metadata, dict):
        raise BadRequest("field metadata must be a JSON object")
    if metadata and len(json.dumps(metadata, ensure_ascii=False).encode()) > MAX_METADATA_BYTES:
        raise BadRequest(f"field metadata is over {MAX_METADATA_BYTES} bytes as JSON", "metadata_too_long")
    redact_key = daemon.redact_key
    # Every field a caller fills is redacted like the text (session id, metadata keys and values), and every
    # secret found anywhere is captured: nothing of it is stored, returned or logged.
    secrets_found: list[tuple[Any, Any]] = []

    def clean(value: str) -> str:
        redacted, matches = redact_with_matches(value, redact_key)
        secrets_found.extend(zip(redacted.findings, matches, strict=True))
        return redacted.text

    def clean_pair(key: str, value: str) -> str:
        """A value read with its key, as a JSON member is in a text (`"password": "…"` is a credential
        whatever the value looks like); the value alone if the member's redaction cannot be read back."""
        member = clean(json.dumps({key: value}, ensure_ascii=False))
        with contextlib.suppress(ValueError, AttributeError):
            redacted = json.loads(member)
            if isinstance(redacted, dict) and len(redacted) == 1:
                return str(next(iter(redacted.values())))
        return clean(value)

    def clean_json(value: Any) -> Any:
        if isinstance(value, str):
            return clean(value)
        if isinstance(value, list):
            return [clean_json(item) for item in value]
        if isinstance(value, dict):
            cleaned = {}
            for key, item in value.items():
                name = clean(str(key))  # the member is read with its key already clean: a key is found once
                cleaned[name] = clean_pair(name, item) if isinstance(item, str) else clean_json(item)
            return cleaned
        return value

    if redact_with_matches(agent_id, redact_key)[0].findings:  # an agent named after a pasted key
        raise BadRequest("field agent_id looks like a credential, not an agent id", "agent_id_is_a_credential")
    redacted_text = clean(text)
    session_id = clean(session_id)
    metadata = clean_json(metadata) if metadata else metadata
    entry_id = "k" + hashlib.blake2b(redacted_text.encode(), digest_size=10).hexdigest()
    source = SourceRef("api", f"api:/memory/add#{entry_id}")
    entry = Entry(agent_id, session_id, entry_id, role, redacted_text, timestamp or _now_iso(), source,
                  kind="knowledge")
    capture = daemon.capture
    if secrets_found:
        keep = capture.keeps_values
        found = [Found(agent_id, session_id, f, source, entry.timestamp, m.value if keep else None)
                 for f, m in secrets_found]
        await asyncio.to_thread(capture.capture, found)  # a key told to /memory/add is indexed too
    emb = daemon.config.embedding
    chunks = chunk_entry(entry, emb.chunk_chars, emb.chunk_overlap)
    items = []
    for chunk in chunks:
        payload = chunk.payload()
        if metadata:
            payload["metadata"] = metadata
        items.append((chunk.point_id, chunk.text, chunk.context, payload))

    memory = daemon.memory
    # On the write path's thread: searches (the query thread) never wait behind an add.
    points = await memory.in_embed_thread(lambda: make_points(memory.embedder, items))
    try:
        await memory.in_store_thread(lambda: memory.store.upsert(points))
    except StoreError as exc:
        log.error("memory_add_failed", agent=agent_id, error=str(exc)[:300])
        raise _error(web.HTTPServiceUnavailable, "the store did not acknowledge the write; retry later") from None
    log.info("memory_added", agent=agent_id, session=session_id, entry=entry_id, chunks=len(points),
             redactions=len(secrets_found))
    return json_answer({"id": points[0].id if points else None, "ids": [p.id for p in points],
                              "agent_id": agent_id, "session_id": session_id, "entry_id": entry_id,
                              "type": "knowledge", "redactions": len(secrets_found)})


MAX_NEIGHBOURS = 10  # /memory/get: turns on each side at most


async def memory_get(request: web.Request) -> web.Response:
    """One memory by id, with the turns around it in its session (the OpenClaw plugin's `memory_get`).

    `{agent_id, id, neighbours?}` -> `{"memory": result, "before": [...], "after": [...]}`, results shaped
    as /memory/search's; `neighbours` turns on each side (default 2, at most 10), oldest first, one point
    per turn (its first chunk). Only the agent's own memories: an id of another agent's memory gets the
    same 404 as an unknown one. A read of a known id, not a search: the loop guard does not count it.
    """
    import uuid  # local imports keep this route one self-contained block

    from veritas_watch.sinks.store import Hit

    daemon = served_of(request)
    body = await json_body(request)
    agent_id: str = field(body, "agent_id", str)
    memory_id: str = field(body, "id", str)
    around: int = field(body, "neighbours", int, required=False, default=2)
    if not 0 <= around <= MAX_NEIGHBOURS:
        raise BadRequest(f"field neighbours must be between 0 and {MAX_NEIGHBOURS}")
    try:
        memory_id = str(uuid.UUID(memory_id))
    except ValueError:
        raise BadRequest("field id must be a memory id (a UUID, as /memory/search returns it)") from None

    def turns(points: list[Hit], of: Hit) -> list[Hit]:
        """The first `around` turns of a fetch in position order, each by its first chunk, in `of`'s
        conversation (a `/new` keeps the session: what was said before it is another conversation)."""
        first: dict[object, Hit] = {}
        for point in points:
            if not same_conversation(of.payload, point.payload):
                continue
            key = point.payload.get("position")
            if key not in first or chunk_index(point.payload) < chunk_index(first[key].payload):
                first[key] = point
        return list(first.values())[:around]

    def lookup() -> tuple[Hit | None, list[Hit], list[Hit]]:
        own = [h for h in store.retrieve([memory_id]) if h.payload.get("agent_id") == agent_id]
        if not own:
            return None, [], []
        hit = own[0]
        fetch = around * 4  # a turn split in chunks shares one position
        # the rest of the session on each side (neighbour_query's tier 1), nearest first
        earlier, later = (neighbour_query(hit.payload, offset, 1, limit=fetch) for offset in (-1, 1))
        if not around or earlier is None or later is None:
            return hit, [], []
        before, after = store.search_batch([earlier, later])
        earlier_turns = turns(before, hit)
        older = neighbour_query(hit.payload, -1, 2, limit=fetch)
        if older is not None and len(earlier_turns) < around:  # turns stored before `session_order` existed
            earlier_turns = turns(store.search_batch([older])[0], hit)
        return hit, earlier_turns[::-1], turns(after, hit)

    memory = daemon.memory
    store = memory.store
    try:
        hit, before, after = await memory.in_read_thread(lookup)
    except StoreError as exc:
        log.error("memory_get_failed", agent=agent_id, error=str(exc)[:300])
        raise _error(web.HTTPServiceUnavailable, "the store is not answering; retry later") from None
    if hit is None:
        raise _error(web.HTTPNotFound, "no memory with this id for this agent")
    return json_answer({"memory": hit_to_result(hit), "before": [hit_to_result(h) for h in before],
                              "after": [hit_to_result(h) for h in after]})


async def memory_count(request: web.Request) -> web.Response:
    """How many points each of `session_ids` holds in the agent's memory: `veritas-watch forget` waits on it
    until the daemon removed them, a filtered count per session, not the agent's whole export streamed.
    One agent only, the caller's (`json_body` checks it), like every route."""
    daemon = served_of(request)
    body = await json_body(request)
    agent_id: str = field(body, "agent_id", str)
    sessions = body.get("session_ids")
    if (not isinstance(sessions, list) or not sessions
            or not all(isinstance(s, str) and s for s in sessions)):
        raise BadRequest("field session_ids must be a list of session ids")
    if len(sessions) > MAX_COUNT_SESSIONS:
        raise BadRequest(f"field session_ids holds at most {MAX_COUNT_SESSIONS} ids")
    store = daemon.memory.store

    def count() -> dict[str, int]:
        return {sid: sum(1 for _ in store.scroll(agent_id, page=1024, session_id=sid))
                for sid in dict.fromkeys(sessions)}

    try:
        counts = await daemon.memory.in_read_thread(count)
    except StoreError as exc:
        log.error("memory_count_failed", agent=agent_id, error=str(exc)[:300])
        raise _error(web.HTTPServiceUnavailable, "the store is not answering; retry later") from None
    return json_answer({"agent_id": agent_id, "count": sum(counts.values()), "sessions": counts})


def add_memory_routes(app: web.Application, config: Config) -> None:
    cfg = config.search
    app[GUARD_KEY] = SearchLoopGuard(cfg.loop_window, cfg.loop_hint_after, cfg.loop_stop_after)
    app[CEILING_KEY] = SearchLoopGuard(cfg.loop_window, 0, cfg.loop_stop_after * AGENT_CEILING)
    app[TURNS_KEY] = AgentTurns()
    app.router.add_post("/search", search)
    app.router.add_post("/memory/search", memory_search)
    app.router.add_post("/memory/context", memory_context)
    app.router.add_post("/memory/add", memory_add)
    app.router.add_post("/memory/get", memory_get)
    app.router.add_post("/memory/count", memory_count)
