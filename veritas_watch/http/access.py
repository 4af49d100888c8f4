"""Who may ask the HTTP API what: the socket's peer, browser checks, tokens, and the agents a caller may read.

What a request must show before any handler runs (`guard_middleware`):
0. over the Unix socket (`<data_dir>/api.sock`, in the 0700 data dir): the peer is the daemon's own user or
   root (SO_PEERCRED; the directory already keeps everyone else out). That caller is the operator;
1. `Host` is a loopback name (`localhost`, `127.x.x.x`, `[::1]`) or the configured host (or one of
   `http.allowed_hosts`): a DNS-rebinding page's requests carry its own name and are refused;
2. no `Origin` but our own, and no `Sec-Fetch-Site` but `same-origin`/`none`: a web page elsewhere
   is refused (browsers send these; curl, the CLI and Node's fetch do not);
3. POST bodies are `application/json`: the content types a page can send without a CORS
   preflight (`text/plain`, forms) are refused, and no route answers a preflight;
4. on TCP, the bearer token, which decides the caller's scope (every route but /health needs one):
   - `http.token`, or the daemon's local token (`<data_dir>/http.token`, mode 0600, what the CLI and
     the plugin use when they can read it): every agent;
   - a token of `http.agent_tokens`: that agent only;
   - `http.metrics_token`: GET /metrics only (a scraper's: it cannot check the proof);
   - a token shorter than `transport.MIN_TOKEN_CHARS`: none of these (logged once at start);
   - none or a wrong one: refused (401).
   `/health` proves the server holds a token before a client sends it (`transport.py`): asked with a
   challenge and a token's key id, it answers the HMAC of the challenge under that token.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import socket
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import structlog
from aiohttp import web

from veritas_watch.openclaw import InvalidAgentId, canonical_agent_id
from veritas_watch.transport import is_loopback_ip, key_id, peer_allowed, peer_uid, proof, valid_challenge, weak_token

if TYPE_CHECKING:
    from veritas_watch.config import HttpConfig

log = structlog.get_logger()
LOOPBACK_NAMES = frozenset({"localhost", "localhost.", "ip6-localhost", "ip6-loopback"})
SAFE_FETCH_SITES = frozenset({"same-origin", "none"})
OPEN_PATHS = frozenset({"/health"})  # answered to anyone who passes the browser checks
METRICS_TOKEN_PATHS = frozenset({"/metrics", *OPEN_PATHS})  # all that http.metrics_token opens


@dataclass(frozen=True, slots=True)
class Access:
    """What the caller of one request may read: every agent, one agent, or any one agent at a time."""

    all_agents: bool
    agent: str | None = None  # set for a per-agent token: this agent only
    anonymous: bool = False  # no token (on TCP: /health only)
    metrics_only: bool = False  # http.metrics_token: /metrics (and /health) only

    def allows(self, agent_id: str | None) -> bool:
        if self.all_agents:
            return True
        return self.agent is not None and agent_id == self.agent

    def require(self, agent_id: str | None) -> None:
        if not self.allows(agent_id):
            if agent_id is None:
                raise refused(web.HTTPForbidden, "every agent at once needs the operator's token (http.token); "
                              "ask for this token's agent (agent=ID)", reason="all_agents_not_allowed")
            raise refused(web.HTTPForbidden, "this token is not for that agent", reason="agent_not_allowed")


def refused(status: type[web.HTTPException], message: str, *, reason: str | None = None,
            **headers: str) -> web.HTTPException:
    """A refusal with a JSON message; `reason` names it in the (rate-limited) `request_refused` log line."""
    exc = status(text=json.dumps({"error": message}), content_type="application/json", headers=headers or None)
    exc.refusal_reason = reason  # type: ignore[attr-defined]
    return exc


ACCESS_KEY = web.RequestKey("veritas.access", Access)  # what check_request decided, for the handler


def request_access(request: web.Request) -> Access:
    return request[ACCESS_KEY]


def agent_param(value: object, field: str = "agent_id") -> str:
    """A caller's agent id, checked by OpenClaw's rule (anything else is a 400, never a path)."""
    try:
        return canonical_agent_id(value)
    except InvalidAgentId as exc:
        raise refused(web.HTTPBadRequest, f"field {field}: {exc}", reason="invalid_agent_id") from None


# -- loopback --------------------------------------------------------------------------------------

def bound_to_loopback(addresses: Iterable[Any]) -> bool:
    """Whether every socket address the server listens on is loopback."""
    hosts = [str(a[0]) for a in addresses]
    return bool(hosts) and all(is_loopback_ip(h) for h in hosts)


# -- the browser checks -----------------------------------------------------------------------------

def _split_authority(value: str) -> tuple[str, str | None]:
    """`Host`/origin authority -> (host in lower case, port or None): `[::1]:17761` -> (`::1`, `17761`)."""
    value = value.strip().lower()
    if value.startswith("["):
        end = value.find("]")
        if end < 0:
            return value, None
        rest = value[end + 1:]
        if ":" not in value[1:end]:
            return value, None  # brackets hold an IPv6 literal only (`[127.0.0.1]` names nothing)
        return value[1:end], (rest[1:] if rest.startswith(":") else None)
    if value.count(":") == 1:
        host, port = value.split(":")
        return host, port
    return value, None


WILDCARDS = frozenset({"0.0.0.0", "::", ""})


def _name_allowed(name: str, http: HttpConfig) -> bool:
    """Loopback names, the configured host and `http.allowed_hosts`; bound to every address (0.0.0.0,
    which needs a token), also any IP literal and this machine's own names: a DNS-rebinding page's
    requests name the page's DNS name, which is none of these."""
    if name in LOOPBACK_NAMES or is_loopback_ip(name):
        return True
    configured = http.bind_host.lower().strip("[]")
    allowed = {configured, *(h.lower().strip("[]") for h in http.allowed_hosts)} - WILDCARDS
    if name in allowed:
        return True
    if configured in WILDCARDS:
        try:
            ipaddress.ip_address(name)
            return True
        except ValueError:
            return name in {socket.gethostname().lower(), socket.getfqdn().lower()}
    return False


def host_allowed(host_header: str | None, http: HttpConfig) -> bool:
    if not host_header:
        return False  # HTTP/1.1 requires Host; every real client sends one
    return _name_allowed(_split_authority(host_header)[0], http)


def origin_allowed(origin: str, http: HttpConfig, port: int | None) -> bool:
    """Only our own origin (`http://<allowed host>:<our port>`); `null` and every other site are refused."""
    if not origin.startswith("http://"):
        return False
    authority = origin[len("http://"):].rstrip("/")
    if "/" in authority or "@" in authority:
        return False
    name, given_port = _split_authority(authority)
    return _name_allowed(name, http) and port is not None and (given_port or "80") == str(port)


def _json_content_type(request: web.Request) -> bool:
    return request.content_type in ("application/json",) or request.content_type.endswith("+json")


# -- tokens ---------------------------------------------------------------------------------------

def weak_token_keys(http: HttpConfig) -> list[str]:
    """The config keys whose token is too weak for TCP (`transport.weak_token`): never accepted, never proved."""
    named = [("http.token", http.token), ("http.metrics_token", http.metrics_token),
             *((f"http.agent_tokens.{agent}", token) for agent, token in http.agent_tokens.items())]
    return [key for key, token in named if token and weak_token(token)]


def _strong(token: str) -> bool:
    return bool(token) and not weak_token(token)


class Tokens:
    """The configured tokens and the local one, compared in constant time; a weak one is left out."""

    def __init__(self, http: HttpConfig, local_token: str) -> None:
        self.admin = [t.encode() for t in (http.token, local_token) if _strong(t)]
        self.per_agent = [(agent, token.encode()) for agent, token in http.agent_tokens.items() if _strong(token)]
        self.metrics = http.metrics_token.encode() if _strong(http.metrics_token) else b""
        # The metrics token is never proved: its scraper does not ask (and a proof is an HMAC to guess against).
        every = [t for t in (http.token, local_token, *http.agent_tokens.values()) if _strong(t)]
        self.by_key_id = {key_id(t): t for t in every}

    def access(self, authorization: str) -> Access | None:
        """The caller's scope, or None for a missing, wrong or malformed token."""
        scheme, _, given = authorization.partition(" ")
        supplied = given.strip().encode() if scheme.lower() == "bearer" else b""
        if not supplied:
            return None
        admin = any(hmac.compare_digest(supplied, t) for t in self.admin)
        agent = None
        for name, token in self.per_agent:  # every token compared: the time says nothing about which matched
            if hmac.compare_digest(supplied, token):
                agent = agent or name
        metrics = bool(self.metrics) and hmac.compare_digest(supplied, self.metrics)
        if admin:
            return Access(all_agents=True)
        if agent is not None:
            return Access(all_agents=False, agent=agent)
        if metrics:
            return Access(all_agents=False, metrics_only=True)
        return None

    def proof(self, key: str | None, challenge: str | None) -> str | None:
        """`/health`'s answer to a client that asks us to prove we hold the token named `key` (None: we
        hold no such token, or the challenge is not one)."""
        token = self.by_key_id.get(key or "")
        if token is None or challenge is None or not valid_challenge(challenge):
            return None
        return proof(token, challenge)


_REFUSAL_LOG_EVERY_S = 10.0


class RefusalLog:
    """One log line per refused request, at most one per reason per 10 s with a count (no log flood)."""

    def __init__(self) -> None:
        self._last: dict[str, float] = {}
        self._count: dict[str, int] = {}

    def __call__(self, request: web.Request, reason: str, status: int) -> None:
        now = time.monotonic()
        self._count[reason] = self._count.get(reason, 0) + 1
        if now - self._last.get(reason, -_REFUSAL_LOG_EVERY_S) >= _REFUSAL_LOG_EVERY_S:
            log.warning("request_refused", reason=reason, status=status, method=request.method,
                        path=request.path[:200], count=self._count.pop(reason))
            self._last[reason] = now


def check_request(request: web.Request, http: HttpConfig, tokens: Tokens, port: int | None) -> Access:
    """Raise the refusal for a request a browser page, another user on the socket, or a caller without the
    right token made; else the caller's scope."""
    peer = _socket_peer(request)
    if peer is not None and not peer_allowed(peer):
        raise _refusal(web.HTTPForbidden, "peer_not_allowed", "this socket is for the daemon's own user")
    if not host_allowed(request.headers.get("Host"), http):
        raise _refusal(web.HTTPForbidden, "host_not_allowed",
                       "Host must be a loopback name or the configured http.host (http.allowed_hosts)")
    origin = request.headers.get("Origin")
    if origin is not None and not origin_allowed(origin, http, port):
        raise _refusal(web.HTTPForbidden, "origin_not_allowed", "requests from web pages are refused")
    site = request.headers.get("Sec-Fetch-Site")
    if site is not None and site.lower() not in SAFE_FETCH_SITES:
        raise _refusal(web.HTTPForbidden, "cross_site", "requests from web pages are refused")
    if request.method not in ("GET", "HEAD", "POST"):
        raise _refusal(web.HTTPMethodNotAllowed, "method_not_allowed", "GET or POST only",
                       method=request.method)
    if request.method == "POST" and not _json_content_type(request):
        raise _refusal(web.HTTPUnsupportedMediaType, "content_type_not_json",
                       "POST bodies must be Content-Type: application/json")
    if peer is not None:
        return Access(all_agents=True)  # the daemon's own user (or root): the operator
    access = tokens.access(request.headers.get("Authorization", ""))
    if access is None:
        if request.path in OPEN_PATHS:
            return Access(all_agents=False, anonymous=True)
        raise _refusal(web.HTTPUnauthorized, "bad_token", "missing or wrong bearer token")
    if access.metrics_only and request.path not in METRICS_TOKEN_PATHS:
        raise _refusal(web.HTTPForbidden, "metrics_token_elsewhere", "http.metrics_token is for GET /metrics only")
    return access


def _socket_peer(request: web.Request) -> int | None:
    """The uid of a Unix-socket caller; None on TCP."""
    sock = request.transport.get_extra_info("socket") if request.transport is not None else None
    return None if sock is None else peer_uid(sock)  # peer_uid: None unless a Unix socket


class _Refusal(Exception):
    def __init__(self, response: web.HTTPException, reason: str) -> None:
        self.response = response
        self.reason = reason


def _refusal(status: type[web.HTTPException], reason: str, message: str, **kwargs: Any) -> _Refusal:
    if status is web.HTTPMethodNotAllowed:
        response: web.HTTPException = web.HTTPMethodNotAllowed(
            kwargs["method"], ["GET", "POST"], text=json.dumps({"error": message}), content_type="application/json")
    else:
        response = refused(status, message)
    return _Refusal(response, reason)


def make_guard(http: HttpConfig, tokens: Tokens, port_of: Any) -> Any:
    """The middleware: browser checks and token first, the caller's scope stored on the request."""
    refusals = RefusalLog()

    @web.middleware
    async def guard_middleware(request: web.Request, handler: Any) -> web.StreamResponse:
        try:
            request[ACCESS_KEY] = check_request(request, http, tokens, port_of())
        except _Refusal as refusal:
            refusals(request, refusal.reason, refusal.response.status)
            raise refusal.response from None
        try:
            response: web.StreamResponse = await handler(request)
        except web.HTTPException as exc:  # a handler's refusal (bad field, another agent's data): logged alike
            reason = getattr(exc, "refusal_reason", None)
            if reason is not None:
                refusals(request, reason, exc.status)
            raise
        return response

    return guard_middleware
