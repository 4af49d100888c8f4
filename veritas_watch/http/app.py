"""The daemon's loopback HTTP API (aiohttp): the app, its middlewares, the daemon-wide routes (health,
status, export, metrics) and start-up/publication. Handlers are thin: they call query.py and status.py.

The embedded store is locked by the daemon, so other processes (the CLI's `search`, `status`,
`export`) come through here while it runs. Who may ask what is `access.py`'s: browser checks,
tokens, and the agents a caller may read; every request passes it before a handler runs. The
memory routes are `memory.py`'s, the selftest's cleanup `selftest.py`'s, shared helpers `requests.py`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog
from aiohttp import web

from veritas_watch.http.access import (
    Tokens,
    agent_param,
    bound_to_loopback,
    make_guard,
    refused,
    request_access,
    weak_token_keys,
)
from veritas_watch.http.memory import add_memory_routes
from veritas_watch.http.requests import GATE_KEY, BadRequest, Gate, json_answer, served_of
from veritas_watch.http.selftest import cleanup_handler
from veritas_watch.owner import PortTaken, StartupError, local_token
from veritas_watch.selftest import SELFTEST_AGENT
from veritas_watch.status import scope_status
from veritas_watch.transport import (
    CHALLENGE_HEADER,
    KEY_ID_HEADER,
    PROOF_HEADER,
    SOCKET_FILE,
    WEAK_TOKEN_RULE,
    NotPrivate,
    check_private_dir,
    socket_address,
)

if TYPE_CHECKING:
    from veritas_watch.config import Config
    from veritas_watch.http.port import Served

log = structlog.get_logger()
@web.middleware
async def errors_middleware(request: web.Request, handler: Any) -> web.StreamResponse:
    """An unexpected error in a handler: 500 with a JSON message and one log line (no traceback spill)."""
    try:
        response: web.StreamResponse = await handler(request)
        return response
    except web.HTTPException as exc:
        if exc.status >= 400 and exc.content_type != "application/json":
            # aiohttp's own (404 no route, 405, 413 while reading a chunked body): JSON like every other answer
            exc.text = json.dumps({"error": exc.text or exc.reason})
            exc.content_type = "application/json"
        raise
    except (ConnectionResetError, asyncio.CancelledError):
        raise
    except Exception as exc:
        frame = exc.__traceback__
        while frame is not None and frame.tb_next is not None:
            frame = frame.tb_next
        where = f"{frame.tb_frame.f_code.co_filename.rsplit('/', 1)[-1]}:{frame.tb_lineno}" if frame else ""
        log.error("http_handler_failed", method=request.method, path=request.path[:200],
                  error=f"{type(exc).__name__}: {exc}"[:300], at=where)
        raise web.HTTPInternalServerError(text=json.dumps({"error": "internal error (logged)"}),
                                          content_type="application/json") from None


MAX_BODY_BYTES = 4 * 1024 * 1024  # a request body; aiohttp refuses a longer one as it reads it


@web.middleware
async def starting_middleware(request: web.Request, handler: Any) -> web.StreamResponse:
    """While the daemon starts (the port is bound first) every route but /health answers 503."""
    if request.path != "/health":
        served_of(request)
    response: web.StreamResponse = await handler(request)
    return response


@web.middleware
async def policy_middleware(request: web.Request, handler: Any) -> web.StreamResponse:
    """Routes that are no agent's: /metrics (agent names and counts) is not for a per-agent token, and the
    selftest cleanup only for a caller allowed the selftest agent; a body announced too long is refused unread."""
    if request.content_length is not None and request.content_length > MAX_BODY_BYTES:
        # Said before the body is read: a client announcing 1 GB is not kept waiting for it.
        raise web.HTTPRequestEntityTooLarge(MAX_BODY_BYTES, request.content_length, content_type="application/json",
                                            text=json.dumps({"error": f"body over {MAX_BODY_BYTES} bytes"}))
    access = request_access(request)
    if request.path == "/metrics" and access.agent is not None:
        raise refused(web.HTTPForbidden, "/metrics is for the operator's token (http.token or http.metrics_token), "
                      "not an agent's",
                      reason="metrics_not_for_agent_token")
    if request.path == "/selftest/cleanup":
        access.require(SELFTEST_AGENT)
    response: web.StreamResponse = await handler(request)
    return response


async def security_headers(request: web.Request, response: web.StreamResponse) -> None:
    """On every answer, refusals and streamed exports included (`on_response_prepare` runs before any
    header is sent): never sniffed as another type, never kept by a cache."""
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers["Cache-Control"] = "no-store"


def _agent_query(request: web.Request) -> str | None:
    """`?agent=ID` of a GET route: one agent, checked by OpenClaw's rule (None: not given or empty)."""
    values = request.query.getall("agent", [])
    if len(values) > 1:
        raise BadRequest("give agent= once")
    value = values[0].strip() if values else ""
    return agent_param(value, "agent") if value else None


def _scope(request: web.Request) -> str | None:
    """The one agent a GET route answers for (None: every agent, which the caller must be allowed)."""
    access = request_access(request)
    agent = _agent_query(request)
    if agent is None and access.agent is not None:
        agent = access.agent  # a per-agent token means its own agent
    access.require(agent)
    return agent


TOKENS_KEY = web.AppKey("veritas.tokens", Tokens)


async def health(request: web.Request) -> web.Response:
    """Liveness and the store's state (503 while starting), from the daemon's snapshot; and, asked with a
    challenge, the proof that this server holds the client's token (`transport.py`), before the client sends it."""
    response = _health(request)
    answer = request.app[TOKENS_KEY].proof(request.headers.get(KEY_ID_HEADER), request.headers.get(CHALLENGE_HEADER))
    if answer is not None:
        response.headers[PROOF_HEADER] = answer
    return response


def _health(request: web.Request) -> web.Response:
    served = request.app[GATE_KEY].served
    if served is None:
        return json_answer({"status": "starting"}, status=503)
    snap = served.snapshot()
    if not snap.ready:
        return json_answer({"status": snap.status}, status=503)
    return json_answer({"status": snap.status, "store": "ok" if snap.store_up else "down",
                        "watcher": snap.watcher_mode, "backlog_bytes": snap.backlog_bytes, "queue": snap.queue})


async def status(request: web.Request) -> web.Response:
    """The status JSON: every agent for a caller allowed all, else one agent's part (`?agent=ID`)."""
    agent = _scope(request)
    full = await served_of(request).status()
    return json_answer(full if agent is None else scope_status(full, agent))


async def export(request: web.Request) -> web.StreamResponse:
    """Stored points as JSON lines (`id`, `payload`), streamed page by page: one agent (`?agent=ID`), or
    every agent for a caller allowed all."""
    memory = served_of(request).memory
    agent = _scope(request)
    response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
    await response.prepare(request)
    pages = memory.store.scroll(agent_id=agent)

    def next_page(size: int = 256) -> list[str]:
        lines = []
        for point_id, payload, _ in pages:
            lines.append(json.dumps({"id": point_id, "payload": payload}, ensure_ascii=False))
            if len(lines) >= size:
                break
        return lines

    try:
        while lines := await memory.in_read_thread(next_page):
            await response.write(("\n".join(lines) + "\n").encode())
        await response.write_eof()
    except ConnectionResetError:  # the reader went away (`veritas-watch export | head`): nothing more to send
        log.debug("export_reader_gone", agent=agent)
    return response


async def metrics(request: web.Request) -> web.Response:
    """GET /metrics: the Prometheus text exposition format (in-memory state only: it runs on the loop)."""
    from prometheus_client import CONTENT_TYPE_LATEST

    return web.Response(body=served_of(request).metrics_text(), headers={"Content-Type": CONTENT_TYPE_LATEST})


def make_app(config: Config, local_token: str, gate: Gate) -> web.Application:
    tokens = Tokens(config.http, local_token)
    guard = make_guard(config.http, tokens, lambda: gate.port)
    app = web.Application(middlewares=[errors_middleware, guard, starting_middleware, policy_middleware],
                          client_max_size=MAX_BODY_BYTES)
    app.on_response_prepare.append(security_headers)
    app[GATE_KEY] = gate
    app[TOKENS_KEY] = tokens
    app.router.add_get("/health", health)
    app.router.add_get("/status", status)
    add_memory_routes(app, config)  # /search and the plugins' /memory/search, /memory/context, /memory/add
    app.router.add_get("/export", export)
    app.router.add_get("/metrics", metrics)
    app.router.add_post("/selftest/cleanup", cleanup_handler)  # deletes agent veritas-selftest's points only
    return app


@dataclass
class HttpApi:
    """The bound API: its socket (and TCP address when configured), and the gate to the daemon."""

    runner: web.AppRunner
    gate: Gate
    socket: BoundSocket
    host: str | None  # TCP, when configured
    port: int | None

    def serve(self, served: Served) -> None:
        """Start-up finished: the routes answer from the running daemon (until now: 503 "daemon starting")."""
        self.gate.served = served

    async def cleanup(self) -> None:
        """Stop answering (idempotent: start-up failing half-way and shutdown both call it)."""
        await self.runner.cleanup()
        self.socket.remove()

    def publish(self, config: Config) -> None:
        publish_http(config, self)

    def unpublish(self, config: Config) -> None:
        unpublish_http(config)


class NoHttp:
    """The API switched off (`http.enabled = false`) or not wanted (a backfill): nothing listens, nothing is
    published. A null object: start-up and shutdown read the same either way."""

    port: int | None = None
    host: str | None = None

    def serve(self, served: Served) -> None:
        pass

    async def cleanup(self) -> None:
        pass

    def publish(self, config: Config) -> None:
        pass

    def unpublish(self, config: Config) -> None:
        pass


@dataclass
class BoundSocket:
    """`<data_dir>/api.sock`, bound and listening; removed at shutdown (only if it is still ours)."""

    directory: Path
    sock: socket.socket
    inode: int

    @property
    def path(self) -> Path:
        return self.directory / SOCKET_FILE

    def remove(self) -> None:
        with contextlib.suppress(OSError), socket_address(self.directory) as address:
            if os.stat(address).st_ino == self.inode:
                os.unlink(address)


def bind_socket(data_dir: Path) -> BoundSocket:
    """Listen on `<data_dir>/api.sock` (0600), in the data dir only the daemon's user may enter. The caller
    holds the data dir's owner lock, so a socket file already there is a crashed daemon's: removed."""
    try:
        st = check_private_dir(data_dir)
    except (NotPrivate, OSError) as exc:
        raise StartupError(f"data dir {data_dir}: {exc}; the API socket is only served from a directory "
                           "that is this user's") from None
    if st.st_mode & 0o077:
        raise StartupError(f"data dir {data_dir} is mode {oct(st.st_mode & 0o777)}: others could enter it "
                           "(the daemon makes it 0700 at start)")
    with socket_address(data_dir) as address:
        with contextlib.suppress(FileNotFoundError):
            old = os.lstat(address)
            if not stat.S_ISSOCK(old.st_mode):
                raise StartupError(f"{data_dir / SOCKET_FILE} exists and is not a socket: move it away")
            os.unlink(address)
            log.info("stale_socket_removed", path=str(data_dir / SOCKET_FILE))
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(address)
            os.chmod(address, 0o600)  # the directory keeps others out already; the file says so too
            sock.listen(128)
            inode = os.stat(address).st_ino
        except OSError as exc:
            sock.close()
            raise StartupError(f"cannot listen on {data_dir / SOCKET_FILE}: {exc.strerror or exc}") from None
    sock.setblocking(False)
    return BoundSocket(data_dir, sock, inode)


async def start_http(config: Config) -> HttpApi:
    """Listen (first thing at start-up: a taken port fails before anything else is opened): the Unix socket
    always, TCP when configured. Until `HttpApi.serve` the daemon answers 503 "daemon starting", and until
    `publish_http` no client knows where it is."""
    http = config.http
    if http.allow_all_agents:
        log.warning("http_setting_ignored", key="http.allow_all_agents",
                    reason="no caller is anonymous any more: the socket is the operator's, TCP needs a token")
    if weak := weak_token_keys(http):  # the daemon goes on: the socket needs no token, and TCP the others
        log.warning("http_token_too_weak", keys=weak, rule=WEAK_TOKEN_RULE,
                    effect="not accepted over TCP (nor proved on /health); the socket is unaffected",
                    fix="set a longer random token, e.g. `openssl rand -hex 32`")
    gate = Gate()
    # An idle connection is closed after 30 s (aiohttp keeps one an hour): connections are file descriptors.
    runner = web.AppRunner(make_app(config, local_token(config.data_dir), gate), access_log=None,
                           keepalive_timeout=30)
    await runner.setup()
    try:
        bound = bind_socket(config.data_dir)
    except StartupError:
        await runner.cleanup()
        raise
    api = HttpApi(runner, gate, bound, None, None)
    await web.SockSite(runner, bound.sock).start()
    log.info("http_listening", socket=str(bound.path))
    if not http.tcp:
        return api
    site = web.TCPSite(runner, http.bind_host, http.bind_port, reuse_address=True)
    try:
        await site.start()
    except OSError as exc:
        log.error("http_bind_failed", host=http.bind_host, port=http.bind_port, error=str(exc))
        await api.cleanup()
        raise PortTaken(f"cannot listen on {http.bind_host}:{http.bind_port}: {exc.strerror or exc}") from None
    tcp = [a for a in runner.addresses if isinstance(a, tuple)]
    if not (http.token or http.agent_tokens) and not bound_to_loopback(tcp):
        await api.cleanup()
        raise StartupError(f"http.host {http.host!r} bound to a non-loopback address without a token")
    host, port = tcp[0][:2]
    api.host, api.port = str(host), int(port)
    gate.port = int(port)
    log.info("http_listening", host=host, port=port)
    return api


def publish_http(config: Config, api: HttpApi) -> None:
    """Tell clients where the ready daemon is: `daemon.json` (pid, socket, and host and port when on TCP)."""
    info: dict[str, object] = {"pid": os.getpid(), "socket": str(api.socket.path)}
    if api.port is not None:  # the port may be 0 = "any free one" in tests
        info.update(host=api.host, port=api.port)
    path = config.data_dir / "daemon.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(info))
    tmp.replace(path)


def unpublish_http(config: Config) -> None:
    """daemon.json goes; the local token stays (the same one at the next start: clients keep finding it)."""
    with contextlib.suppress(OSError):
        (config.data_dir / "daemon.json").unlink()
