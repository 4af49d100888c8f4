"""The daemon's loopback HTTP API (aiohttp). Handlers are thin: they call query.py and the status code.

The embedded store is locked by the daemon, so other processes (the CLI's `search`, `status`,
`export`) come through here while it runs.
"""

from __future__ import annotations

import hmac
import json
import os
from typing import TYPE_CHECKING, Any

import structlog
from aiohttp import web

if TYPE_CHECKING:
    from veritas_watch.daemon import Daemon

log = structlog.get_logger()
DAEMON_KEY = web.AppKey("daemon", object)


class BadRequest(web.HTTPBadRequest):
    def __init__(self, message: str) -> None:
        super().__init__(text=json.dumps({"error": message}), content_type="application/json")


def _daemon(request: web.Request) -> Daemon:
    return request.app[DAEMON_KEY]  # type: ignore[return-value]


async def _json_body(request: web.Request) -> dict[str, Any]:
    try:
        body = await request.json()
    except (ValueError, UnicodeDecodeError):
        raise BadRequest("body must be a JSON object") from None
    if not isinstance(body, dict):
        raise BadRequest("body must be a JSON object")
    return body


def _field(body: dict[str, Any], name: str, kind: type, *, required: bool = True, default: Any = None) -> Any:
    if name not in body or body[name] is None:
        if required:
            raise BadRequest(f"missing field: {name}")
        return default
    value = body[name]
    if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise BadRequest(f"field {name} must be an integer")
    if kind is str and (not isinstance(value, str) or not value.strip()):
        raise BadRequest(f"field {name} must be a non-empty string")
    return value


@web.middleware
async def auth_middleware(request: web.Request, handler: Any) -> web.StreamResponse:
    token = _daemon(request).config.http.token
    if token and request.path != "/health":
        given = request.headers.get("Authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
            raise web.HTTPUnauthorized(text=json.dumps({"error": "missing or wrong bearer token"}),
                                       content_type="application/json")
    result: web.StreamResponse = await handler(request)
    return result


async def health(request: web.Request) -> web.Response:
    daemon = _daemon(request)
    stats = daemon.rt.sink.stats if daemon.rt else None
    store_ok = stats is not None and stats.store_down_since is None
    return web.json_response({
        "status": "ok" if store_ok else "degraded",
        "store": "ok" if store_ok else "down",
        "watcher": daemon.watcher.mode if daemon.watcher else None,
        "backlog_bytes": daemon.backlog_bytes() if daemon.rt else None,
        "queue": daemon.rt.sink.queue.qsize() if daemon.rt else None,
    })


async def status(request: web.Request) -> web.Response:
    from veritas_watch.status import daemon_status

    return web.json_response(await daemon_status(_daemon(request)))


async def export(request: web.Request) -> web.StreamResponse:
    """Every stored point as one JSON line (`id`, `payload`), streamed page by page."""
    daemon = _daemon(request)
    assert daemon.rt is not None
    sink = daemon.rt.sink
    agent = request.query.get("agent") or None
    response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
    await response.prepare(request)
    pages = sink.store.scroll(agent_id=agent)

    def next_page(size: int = 256) -> list[str]:
        lines = []
        for point_id, payload, _ in pages:
            lines.append(json.dumps({"id": point_id, "payload": payload}, ensure_ascii=False))
            if len(lines) >= size:
                break
        return lines

    while lines := await sink.in_store_thread(next_page):
        await response.write(("\n".join(lines) + "\n").encode())
    await response.write_eof()
    return response


def make_app(daemon: Daemon) -> web.Application:
    app = web.Application(middlewares=[auth_middleware], client_max_size=4 * 1024 * 1024)
    app[DAEMON_KEY] = daemon
    app.router.add_get("/health", health)
    app.router.add_get("/status", status)
    from veritas_watch.memory_api import add_memory_routes

    add_memory_routes(app, daemon)  # /search and the plugins' /memory/search, /memory/context, /memory/add
    app.router.add_get("/export", export)
    from veritas_watch.metrics import metrics_handler
    from veritas_watch.selftest import cleanup_handler

    app.router.add_get("/metrics", metrics_handler)
    app.router.add_post("/selftest/cleanup", cleanup_handler)  # deletes agent veritas-selftest's points only
    return app


async def start_http(daemon: Daemon) -> web.AppRunner:
    runner = web.AppRunner(make_app(daemon), access_log=None)
    await runner.setup()
    http = daemon.config.http
    site = web.TCPSite(runner, http.host, http.port, reuse_address=True)
    try:
        await site.start()
    except OSError as exc:
        log.error("http_bind_failed", host=http.host, port=http.port, error=str(exc))
        await runner.cleanup()
        raise
    host, port = runner.addresses[0][:2]
    # Where the CLI finds us (the port may be 0 = "any free one" in tests).
    info = {"pid": os.getpid(), "host": host, "port": port}
    path = daemon.config.data_dir / "daemon.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(info))
    tmp.replace(path)
    log.info("http_listening", host=host, port=port)
    return runner
