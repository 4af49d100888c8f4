"""Finding the running daemon and talking to it: the one client every CLI command uses (search, status,
export, selftest, doctor).

A ready daemon publishes `<data_dir>/daemon.json` (pid, its Unix socket, and host and port when it also
listens on TCP); its local token is `<data_dir>/http.token` (0600). `locate` reads the data dir's file, then,
unless a data dir was chosen explicitly, the system service's (`/var/lib/veritas-watch`), checks the pid is
alive and `/health` answers, and returns an endpoint:
- over the socket (preferred): the data dir is this user's and no one else may write it, and the daemon
  checks who connects; no token is sent;
- over TCP (a daemon without a socket this process can use): the strongest token this process can read (the
  daemon's local token, else `http.token`), sent only after the server proved it holds that token
  (`transport.py`), on every request: a process that took the port first gets neither token nor question.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import socket
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from veritas_watch.config import Config
from veritas_watch.owner import read_local_token
from veritas_watch.transport import (
    CHALLENGE_HEADER,
    KEY_ID_HEADER,
    PROOF_HEADER,
    SOCKET_FILE,
    WEAK_TOKEN_RULE,
    NotPrivate,
    check_private_dir,
    key_id,
    new_challenge,
    proven,
    socket_address,
    weak_token,
)

SYSTEM_DATA_DIR = Path("/var/lib/veritas-watch")  # the system unit's StateDirectory=
DAEMON_FILE = "daemon.json"
HEALTH_BODY_MAX = 64 * 1024  # a /health answer is ~200 bytes; a proven server's is read up to this
START_HINT = "start it (systemctl start veritas-watch, or systemctl --user start veritas-watch)"


class NoDaemon(Exception):
    """No daemon answers for this data dir; `reason` is stable snake_case, the message says why."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason


class DaemonRefused(OSError):
    """The daemon answered with an error status; the message is its `error` text. An OSError, as the
    urllib error it replaces: callers that treat any failed request alike need no new clause."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"the daemon refused ({status}): {message}")
        self.status = status


class NotTheDaemon(OSError):
    """A TCP server that did not prove it holds our token: nothing was sent to it, nothing taken from it."""

    def __init__(self, where: str) -> None:
        super().__init__(f"the server on {where} did not prove it holds the token; another process may be "
                         "listening there (nothing was sent to it)")


class TokenTooWeak(OSError):
    """The only token for a TCP-only daemon is too weak to send (`transport.weak_token`): nothing was sent. Not
    "no daemon": one may run, and a command must not go on as if none did."""


class UnixHTTPConnection(http.client.HTTPConnection):
    """HTTP over the daemon's Unix socket (`Host: localhost`, as a loopback client sends)."""

    def __init__(self, path: Path, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self.path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(self.timeout)
            with socket_address(self.path.parent, self.path.name) as address:
                sock.connect(address)
        except BaseException:
            sock.close()
            raise
        self.sock = sock


@dataclass(frozen=True)
class DaemonEndpoint:
    base: str  # where, for people: unix:<path> or http://host:port
    pid: int
    data_dir: Path  # whose daemon.json named it
    token: str  # sent on TCP only, after the server's proof
    health: dict[str, Any] = field(default_factory=dict)  # its /health answer when found
    socket: Path | None = None  # the daemon's Unix socket; None: TCP
    host: str = ""
    port: int = 0

    def _connection(self, timeout: float) -> http.client.HTTPConnection:
        if self.socket is not None:
            return UnixHTTPConnection(self.socket, timeout)
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout)

    def _send(self, method: str, path: str, data: bytes | None, headers: dict[str, str],
              timeout: float) -> http.client.HTTPResponse:
        """One request on a connection of its own (closed with the response)."""
        return self._exchange(self._connection(timeout), method, path, data, headers)

    def _exchange(self, conn: http.client.HTTPConnection, method: str, path: str, data: bytes | None,
                  headers: dict[str, str], *, keep_alive: bool = False) -> http.client.HTTPResponse:
        try:
            conn.request(method, path, body=data, headers=headers if keep_alive else {"Connection": "close", **headers})
            return conn.getresponse()  # without keep_alive the connection closes with the response
        except http.client.HTTPException as exc:  # not an OSError: a garbled answer is a failed request too
            conn.close()
            raise OSError(f"bad answer from {self.base}: {type(exc).__name__}: {exc}") from None
        except BaseException:
            conn.close()
            raise

    def _proof(self, conn: http.client.HTTPConnection, *, keep_alive: bool) -> http.client.HTTPResponse:
        """GET /health on `conn` asking the server to prove it holds our token; NotTheDaemon unless it does
        (its body unread: nothing is taken from a server that did not prove itself)."""
        challenge = new_challenge()
        response = self._exchange(conn, "GET", "/health", None, {CHALLENGE_HEADER: challenge,
                                                                  KEY_ID_HEADER: key_id(self.token)},
                                  keep_alive=keep_alive)
        if not proven(self.token, challenge, response.getheader(PROOF_HEADER)):
            response.close()
            conn.close()
            raise NotTheDaemon(f"{self.host}:{self.port}")
        return response

    def _proven_request(self, path: str, method: str, data: bytes | None, headers: dict[str, str],
                        timeout: float) -> http.client.HTTPResponse:
        """Over TCP: the proof and then the request on ONE connection, so that the token goes to the process
        that proved it holds it. A second connection, even a moment later, could reach a process that took the
        port in between (the daemon stopped): the connection is never reopened (`auto_open`)."""
        conn = self._connection(timeout)
        if path == "/health":
            return self._proof(conn, keep_alive=False)  # the proof is on the answer asked for: one request
        proof_answer = self._proof(conn, keep_alive=True)
        try:
            body = proof_answer.read(HEALTH_BODY_MAX + 1)
        except (OSError, http.client.HTTPException) as exc:
            conn.close()
            raise OSError(f"bad answer from {self.base}: {type(exc).__name__}: {exc}") from None
        if len(body) > HEALTH_BODY_MAX or proof_answer.will_close:
            conn.close()
            raise OSError(f"{self.base} closed the connection after its proof (or answered more than /health "
                          "says): nothing was sent; ask again")
        conn.auto_open = 0  # http.client would reconnect silently: the request goes on this connection or not at all
        headers = {**headers, "Authorization": f"Bearer {self.token}"}
        return self._exchange(conn, method, path, data, headers)

    def open(self, path: str, body: dict[str, Any] | None = None, timeout: float = 60.0) -> http.client.HTTPResponse:
        """The raw response (to stream NDJSON); DaemonRefused on an error status."""
        headers = {"Content-Type": "application/json"}
        data = json.dumps(body).encode() if body is not None else None
        method = "POST" if data is not None else "GET"
        if self.socket is None:
            response = self._proven_request(path, method, data, headers, timeout)
        else:
            response = self._send(method, path, data, headers, timeout)
        if response.status >= 400:
            try:
                message = json.loads(response.read()).get("error", "")
            except (ValueError, AttributeError, OSError):
                message = ""
            finally:
                response.close()
            raise DaemonRefused(response.status, message or str(response.reason))
        return response

    def call(self, path: str, body: dict[str, Any] | None = None, timeout: float = 60.0) -> Any:
        """One JSON request and its JSON answer."""
        with self.open(path, body, timeout) as response:
            return json.loads(response.read())


def candidates(config: Config) -> list[Path]:
    """Where a daemon for this config publishes itself: its data dir, then the system service's (only when
    the data dir was not chosen: an operator's CLI finds the system daemon)."""
    paths = [config.data_dir / DAEMON_FILE]
    if not os.environ.get("VERITAS_WATCH_DATA_DIR") and not config.paths.data_dir.startswith(str(SYSTEM_DATA_DIR)):
        paths.append(SYSTEM_DATA_DIR / DAEMON_FILE)
    return paths


def locate(config: Config, health_timeout: float = 3.0) -> DaemonEndpoint:
    """The live daemon, or NoDaemon saying why the first candidate has none (NotTheDaemon: a TCP server
    that did not prove it holds the token answered)."""
    failure: NoDaemon | None = None
    for path in candidates(config):
        try:
            return _endpoint(config, path, health_timeout)
        except NoDaemon as exc:
            failure = failure or exc
    assert failure is not None
    raise failure


def find(config: Config, health_timeout: float = 3.0) -> DaemonEndpoint | None:
    try:
        return locate(config, health_timeout)
    except NoDaemon:
        return None


def _ways(config: Config, path: Path, info: dict[str, Any], pid: int) -> list[DaemonEndpoint]:
    """How to reach the daemon daemon.json names, best first: its socket (in a directory that is this
    user's and that no one else may write), then TCP with a token."""
    data_dir = path.parent
    ways = []
    if isinstance(info.get("socket"), str):
        # The daemon binds only `<data dir>/api.sock`: a path daemon.json names elsewhere is not followed.
        sock = data_dir / SOCKET_FILE
        with contextlib.suppress(NotPrivate, OSError):
            check_private_dir(sock.parent, client=True)
            ways.append(DaemonEndpoint(f"unix:{sock}", pid, data_dir, "", socket=sock))
    if info.get("host") is not None and info.get("port") is not None:
        try:  # a token file in a directory others may write could be theirs: the proof would prove nothing
            check_private_dir(data_dir, client=True)
            token = read_local_token(data_dir) or config.http.token
        except (NotPrivate, OSError):
            token = config.http.token
        if token and weak_token(token):
            if not ways:  # its key id would let a squatter guess it offline: not even that is sent
                raise TokenTooWeak(f"the daemon (pid {pid}) of {data_dir} can be reached only over TCP, and "
                                   f"http.token is too weak to be sent there ({WEAK_TOKEN_RULE}; the daemon does "
                                   "not accept it either): nothing was sent")
        elif token:
            host, port = str(info["host"]), int(info["port"])
            where = f"[{host}]" if ":" in host else host
            ways.append(DaemonEndpoint(f"http://{where}:{port}", pid, data_dir, token, host=host, port=port))
    return ways


def _endpoint(config: Config, path: Path, health_timeout: float) -> DaemonEndpoint:
    try:
        info = json.loads(path.read_text())
        pid = int(info["pid"])  # JSON that is not an object raises TypeError here
    except FileNotFoundError:
        raise NoDaemon("daemon_not_running", f"no daemon is running for data dir {path.parent} ({path} is "
                       f"missing): {START_HINT}") from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise NoDaemon("daemon_not_running", f"{path} is unreadable ({exc}): {START_HINT}") from None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        raise NoDaemon("daemon_not_running", f"the daemon (pid {pid}) recorded in {path} is gone: "
                       f"{START_HINT}") from None
    except PermissionError:
        pass  # alive, as another user (the system service): /health decides
    ways = _ways(config, path, info, pid)
    if not ways:
        raise NoDaemon("daemon_unreachable", f"the daemon (pid {pid}) of {path.parent} cannot be reached from "
                       "this user: its socket is not in a directory of this user's, and no token for its TCP "
                       "port is readable (http.token)")
    failure: NoDaemon | None = None
    for endpoint in ways:
        try:
            health = endpoint.call("/health", timeout=health_timeout)
        except NotTheDaemon:
            raise  # not "no daemon": a command must not go on as if none ran (nor open the store)
        except DaemonRefused as exc:
            failure = failure or NoDaemon("daemon_unreachable",
                                          f"the daemon (pid {pid}) on {endpoint.base} is not ready: {exc}")
            continue
        except (OSError, ValueError) as exc:
            failure = failure or NoDaemon("daemon_unreachable", f"the daemon (pid {pid}) does not answer on "
                                          f"{endpoint.base} ({exc})")
            continue
        return replace(endpoint, health=health if isinstance(health, dict) else {})
    assert failure is not None
    raise failure
