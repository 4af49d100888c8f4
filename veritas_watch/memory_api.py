"""The memory routes of the HTTP API: what the OpenClaw memory plugins call, and `/search` for the CLI.

- `POST /memory/search` `{agent_id, query, limit?, mode?, roles?, since?, until?, expand?}`
  -> `{"results": [...], "count": n}` (+ `"hint"` from the loop guard)
- `POST /memory/context` `{agent_id, query, limit?}` -> `{"context": "<block>", "count": n, "results": [...]}`
- `POST /memory/add` `{agent_id, text, session_id?, role?, timestamp?, metadata?}` -> the stored ids
- `POST /search`: the same search, answered as a bare list (the CLI and the selftest), no loop guard.

Every search is filtered by `agent_id`; one without it is refused unless `search.allow_cross_agent`.
The loop guard counts /memory/search and /memory/context per agent (`search.loop_*`).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import structlog
from aiohttp import web

from veritas_watch.api import BadRequest, _daemon, _field, _json_body
from veritas_watch.model import Entry, SourceRef, iso_to_epoch
from veritas_watch.pipeline import Found, make_points
from veritas_watch.query import (
    CrossAgentRefused,
    MemoryHit,
    MemoryRequest,
    check_agent,
    context_block,
    embed_request,
    hit_to_result,
    run_search,
)
from veritas_watch.search import STOP_SEARCHING_HINT, SearchLoopGuard, floor_for
from veritas_watch.sinks.store import StoreError
from veritas_watch.transforms.chunk import chunk_entry
from veritas_watch.transforms.redact import redact_with_matches

if TYPE_CHECKING:
    from veritas_watch.daemon import Daemon

log = structlog.get_logger()
GUARD_KEY = web.AppKey("search_loop_guard", SearchLoopGuard)
ROLES = ("user", "assistant")
KNOWLEDGE_SESSION = "knowledge"  # the session id of manual memories added without one


def _error(status: type[web.HTTPException], message: str, **extra: Any) -> web.HTTPException:
    return status(text=json.dumps({"error": message, **extra}), content_type="application/json")


def _epoch(body: dict[str, Any], name: str) -> float | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
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


def parse_request(daemon: Daemon, body: dict[str, Any], default_limit: int) -> MemoryRequest:
    """The search request of a JSON body; BadRequest (400) with a message for anything wrong."""
    cfg = daemon.config.search
    agent_id = _field(body, "agent_id", str, required=not cfg.allow_cross_agent)
    try:
        check_agent(agent_id, cfg.allow_cross_agent)
    except CrossAgentRefused as exc:
        raise BadRequest(str(exc)) from None
    text = _field(body, "query", str)
    limit = int(_field(body, "limit", int, required=False, default=default_limit))
    if limit < 1:
        raise BadRequest("field limit must be at least 1")
    mode = body.get("mode", "hybrid")
    if mode not in ("dense", "sparse", "hybrid"):
        raise BadRequest("field mode must be dense, sparse or hybrid")
    since, until = _epoch(body, "since"), _epoch(body, "until")
    assert daemon.rt is not None
    floor = floor_for(daemon.rt.embedder.name, cfg.relevance_floor)
    floor_field = body.get("floor")
    if floor_field is False:
        floor = None  # the operator's "show me anything" (`veritas-watch search --no-floor`)
    elif floor_field is not None and floor_field is not True:
        if isinstance(floor_field, bool) or not isinstance(floor_field, (int, float)):
            raise BadRequest("field floor must be false or a number")
        floor = float(floor_field) or None
    return MemoryRequest(agent_id, text, min(limit, cfg.max_limit), mode, _roles(body), since, until,
                         _bool(body, "expand", cfg.expand_context), floor)


async def _search(daemon: Daemon, request: MemoryRequest) -> list[MemoryHit]:
    assert daemon.rt is not None
    sink = daemon.rt.sink
    vectors = await sink.in_embed_thread(lambda: embed_request(sink.embedder, request))
    try:
        return await sink.in_store_thread(lambda: run_search(sink.store, request, vectors))
    except StoreError as exc:
        log.error("search_failed", agent=request.agent_id, error=str(exc)[:300])
        raise _error(web.HTTPServiceUnavailable, "the store is not answering; retry later") from None


def _guard(request: web.Request, agent_id: str | None) -> str | None:
    """The loop guard's hint for this search, if any; raises 429 past the hard stop."""
    guard = request.app[GUARD_KEY]
    verdict, count, retry_after = guard.check(agent_id or "*", time.monotonic())
    if verdict == "ok":
        return None
    hint = STOP_SEARCHING_HINT.format(count=count, window=guard.window)
    if verdict == "stop":
        log.warning("search_loop_stopped", agent=agent_id, searches=count, window_s=guard.window)
        seconds = max(1, round(retry_after + 0.5))
        raise web.HTTPTooManyRequests(
            text=json.dumps({"error": "too many searches: stop searching", "hint": hint, "retry_after": seconds}),
            content_type="application/json", headers={"Retry-After": str(seconds)})
    log.info("search_loop_hint", agent=agent_id, searches=count, window_s=guard.window)
    return hint


async def search(request: web.Request) -> web.Response:
    daemon = _daemon(request)
    query = parse_request(daemon, await _json_body(request), 10)
    return web.json_response([hit_to_result(h) for h in await _search(daemon, query)])


async def memory_search(request: web.Request) -> web.Response:
    daemon = _daemon(request)
    query = parse_request(daemon, await _json_body(request), 10)
    hint = _guard(request, query.agent_id)
    results = [hit_to_result(h) for h in await _search(daemon, query)]
    answer: dict[str, object] = {"results": results, "count": len(results)}
    if hint:
        answer["hint"] = hint
    return web.json_response(answer)


async def memory_context(request: web.Request) -> web.Response:
    daemon = _daemon(request)
    cfg = daemon.config.search
    query = parse_request(daemon, await _json_body(request), cfg.context_limit)
    hint = _guard(request, query.agent_id)
    hits = await _search(daemon, query)
    block = context_block(hits, cfg.context_chars)
    answer: dict[str, object] = {"context": block, "count": len(hits), "results": [hit_to_result(h) for h in hits]}
    if hint:
        answer["hint"] = hint
    return web.json_response(answer)


def _now_iso() -> str:
    now = datetime.now(UTC)
    return now.strftime("%Y-%m-%dT%H:%M:%S.") + f"{now.microsecond // 1000:03d}Z"


async def memory_add(request: web.Request) -> web.Response:
    """A manual "remember this": redacted, embedded and stored as type `knowledge`.

    Id scheme as for transcripts: point_id(agent, session, entry, chunk) with the session given or
    "knowledge" and the entry id a hash of the redacted text, so adding the same text twice
    overwrites one memory instead of making two.
    """
    daemon = _daemon(request)
    body = await _json_body(request)
    agent_id = _field(body, "agent_id", str)
    text = _field(body, "text", str)
    session_id = _field(body, "session_id", str, required=False, default=KNOWLEDGE_SESSION)
    role = _field(body, "role", str, required=False, default="user")
    if role not in ROLES:
        raise BadRequest("field role must be user or assistant")
    timestamp = _field(body, "timestamp", str, required=False, default=None)
    if timestamp is not None and iso_to_epoch(timestamp) is None:
        raise BadRequest("field timestamp must be an ISO-8601 time")
    metadata = body.get("metadata")
    if metadata is not None and not isinstance(metadata, dict):
        raise BadRequest("field metadata must be a JSON object")
    assert daemon.rt is not None
    rt = daemon.rt
    redacted, matches = redact_with_matches(text, rt.redact_key)
    entry_id = "k" + hashlib.blake2b(redacted.text.encode(), digest_size=10).hexdigest()
    source = SourceRef("api", f"api:/memory/add#{entry_id}")
    entry = Entry(agent_id, session_id, entry_id, role, redacted.text, timestamp or _now_iso(), source,
                  kind="knowledge")
    capture = daemon.capture
    if capture is not None and redacted.findings:
        keep = capture.keeps_values
        found = [Found(agent_id, session_id, f, source, entry.timestamp, m.value if keep else None)
                 for f, m in zip(redacted.findings, matches, strict=True)]
        await asyncio.to_thread(capture.capture, found)  # a key told to /memory/add is indexed too
    emb = daemon.config.embedding
    chunks = chunk_entry(entry, emb.chunk_chars, emb.chunk_overlap)
    items = []
    for chunk in chunks:
        payload = chunk.payload()
        if metadata:
            payload["metadata"] = metadata
        items.append((chunk.point_id, chunk.embed_text, chunk.text, payload))

    sink = rt.sink
    points = await sink.in_embed_thread(lambda: make_points(sink.embedder, items))
    try:
        await sink.in_store_thread(lambda: sink.store.upsert(points))
    except StoreError as exc:
        log.error("memory_add_failed", agent=agent_id, error=str(exc)[:300])
        raise _error(web.HTTPServiceUnavailable, "the store did not acknowledge the write; retry later") from None
    log.info("memory_added", agent=agent_id, session=session_id, entry=entry_id, chunks=len(points),
             redactions=len(redacted.findings))
    return web.json_response({"id": points[0].id if points else None, "ids": [p.id for p in points],
                              "agent_id": agent_id, "session_id": session_id, "entry_id": entry_id,
                              "type": "knowledge", "redactions": len(redacted.findings)})


def add_memory_routes(app: web.Application, daemon: Daemon) -> None:
    cfg = daemon.config.search
    app[GUARD_KEY] = SearchLoopGuard(cfg.loop_window, cfg.loop_hint_after, cfg.loop_stop_after)
    app.router.add_post("/search", search)
    app.router.add_post("/memory/search", memory_search)
    app.router.add_post("/memory/context", memory_context)
    app.router.add_post("/memory/add", memory_add)
