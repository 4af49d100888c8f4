"""`POST /selftest/cleanup`: the running daemon's half of `veritas-watch selftest` (veritas_watch/selftest.py
writes a marked entry, finds it through the API, then asks this route to delete it)."""

from __future__ import annotations

import json
import time

import structlog
from aiohttp import web

from veritas_watch.http.requests import json_answer, json_body, served_of
from veritas_watch.selftest import SELFTEST_AGENT, SESSION_PREFIX, STALE_AFTER_SECONDS, selftest_point_ids

log = structlog.get_logger()


async def cleanup_handler(request: web.Request) -> web.Response:
    """Delete points of agent `veritas-selftest`: of `session_id`, or `stale` ones, or all. Never other agents'."""
    body = await json_body(request) if request.can_read_body else {}  # a 400 saying why, for a bad body
    session_id = body.get("session_id")
    if session_id is not None and (not isinstance(session_id, str) or not session_id.startswith(SESSION_PREFIX)):
        raise web.HTTPBadRequest(text=json.dumps({"error": f"session_id must start with {SESSION_PREFIX}"}),
                                 content_type="application/json")
    # Stale: left by a run that could not clean up (its store was stalled); older than any live run.
    stale_before = time.time() - STALE_AFTER_SECONDS if body.get("stale") is True else None
    memory = served_of(request).memory
    store = memory.store

    def delete() -> int:
        ids = selftest_point_ids(store.scroll(agent_id=SELFTEST_AGENT), session_id, stale_before)
        store.delete(ids)
        return len(ids)

    deleted = await memory.in_store_thread(delete)  # a write: the store thread
    log.info("selftest_cleaned", session=session_id, deleted=deleted)
    return json_answer({"deleted": deleted})
