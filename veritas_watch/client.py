"""Finding the running daemon and talking to it: the one client every CLI command uses (search, status,
export, selftest, doctor).

A ready daemon publishes `<data_dir>/daemon.json` (pid, host, port) and its local token
(`<data_dir>/http.token`, api.publish_http). `locate` reads the data dir's file, then, unless a data
dir was chosen explicitly, the system service's (`/var/lib/veritas-watch`), checks the pid is alive and
`/health` answers, and returns an endpoint that sends the strongest token this process can read: the
daemon's local token, else `http.token`.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from http.client import HTTPResponse
from pathlib import Path
from typing import Any

from veritas_watch.config import Config
from veritas_watch.owner import read_local_token

SYSTEM_DATA_DIR = Path("/var/lib/veritas-watch")  # the system unit's StateDirectory=
DAEMON_FILE = "daemon.json"
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


@dataclass(frozen=True)
class DaemonEndpoint:
    base: str  # http://host:port
    pid: int
    data_dir: Path  # whose daemon.json named it
    token: str
    health: dict[str, Any] = field(default_factory=dict)  # its /health answer when found

    def open(self, path: str, body: dict[str, Any] | None = None, timeout: float = 60.0) -> HTTPResponse:
        """The raw response (to stream NDJSON); DaemonRefused on an error status."""
        headers = {"Content-Type": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.base + path, data=data, headers=headers,
                                         method="POST" if data is not None else "GET")
        try:
            response: HTTPResponse = urllib.request.urlopen(request, timeout=timeout)
            return response
        except urllib.error.HTTPError as err:
            try:
                message = json.loads(err.read()).get("error", "")
            except (ValueError, AttributeError, OSError):
                message = ""
            raise DaemonRefused(err.code, message or str(err.reason)) from None

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
    """The live daemon, or NoDaemon saying why the first candidate has none."""
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


def _endpoint(config: Config, path: Path, health_timeout: float) -> DaemonEndpoint:
    try:
        info = json.loads(path.read_text())
        pid, base = int(info["pid"]), f"http://{info['host']}:{info['port']}"
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
    endpoint = DaemonEndpoint(base, pid, path.parent, read_local_token(path.parent) or config.http.token)
    try:
        health = endpoint.call("/health", timeout=health_timeout)
    except DaemonRefused as exc:
        raise NoDaemon("daemon_unreachable", f"the daemon (pid {pid}) on {base} is not ready: {exc}") from None
    except (OSError, urllib.error.URLError, ValueError) as exc:
        raise NoDaemon("daemon_unreachable", f"the daemon (pid {pid}) does not answer on {base}/health "
                       f"({exc})") from None
    return DaemonEndpoint(base, pid, path.parent, endpoint.token, health if isinstance(health, dict) else {})
