"""`veritas-watch selftest`: write a marked entry, wait until the running daemon finds it, remove it.

The entry goes through the real write path (a transcript file the daemon tails, parse, redact,
embed, upsert) and is read back through the daemon's `/search`. It lives in a scratch session of
a reserved agent, `veritas-selftest`, so it never shows up in a real agent's memory (every search
is filtered by agent), and it is removed afterwards: the file is deleted (the tailer forgets it)
and its points are deleted through `POST /selftest/cleanup`, which can only delete that agent's
points. The removal is then checked by searching again.

Prints progress lines and one `RESULT=PASS ...` or `RESULT=FAIL reason=...` line with timings;
exit code 0 or 1.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import secrets
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import structlog
from aiohttp import web

from veritas_watch.config import Config

if TYPE_CHECKING:
    from veritas_watch.daemon import Daemon

log = structlog.get_logger()

SELFTEST_AGENT = "veritas-selftest"
SESSION_PREFIX = "selftest-"
EXIT_PASS, EXIT_FAIL = 0, 1
STALE_AFTER_SECONDS = 600.0
STEP_TIMEOUT = 15.0  # one HTTP call; a stalled store shows up as a timeout here
# Plain words: a random token would look like a credential to the redactor and come back redacted.
_WORDS = ("amber", "basalt", "cedar", "delta", "ember", "fjord", "garnet", "harbor", "indigo", "juniper",
          "kestrel", "lagoon", "meadow", "nectar", "opal", "pebble", "quartz", "raven", "saffron", "tundra",
          "umber", "violet", "willow", "yarrow", "zephyr", "lantern", "orchid", "copper", "heron", "glacier")


class SelftestFailure(Exception):
    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason  # stable snake_case, printed as reason=...
        self.detail = detail


@dataclass
class DaemonEndpoint:
    base: str
    pid: int
    token: str

    def call(self, path: str, body: dict[str, Any] | None = None, timeout: float = 30.0) -> Any:
        headers = {"Content-Type": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.base + path, data=data, headers=headers,
                                         method="POST" if data is not None else "GET")
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return json.loads(response.read())


def find_daemon(config: Config) -> DaemonEndpoint:
    """The live daemon for this data dir, or SelftestFailure saying why there is none."""
    info_path = config.data_dir / "daemon.json"
    start_hint = "start it (systemctl start veritas-watch, or systemctl --user start veritas-watch)"
    try:
        info = json.loads(info_path.read_text())
        pid, base = int(info["pid"]), f"http://{info['host']}:{info['port']}"
    except FileNotFoundError:
        raise SelftestFailure("daemon_not_running", f"no daemon is running for data dir {config.data_dir} "
                              f"({info_path} is missing): {start_hint}") from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise SelftestFailure("daemon_not_running", f"{info_path} is unreadable ({exc}): {start_hint}") from None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        raise SelftestFailure("daemon_not_running", f"the daemon (pid {pid}) recorded in {info_path} is gone: "
                              f"{start_hint}") from None
    except PermissionError:
        pass  # alive, owned by another user: the HTTP check below decides
    endpoint = DaemonEndpoint(base, pid, config.http.token)
    try:
        health = endpoint.call("/health", timeout=5)
    except (OSError, urllib.error.URLError, ValueError) as exc:
        raise SelftestFailure("daemon_unreachable", f"the daemon (pid {pid}) does not answer on {base}/health "
                              f"({exc})") from None
    if health.get("store") != "ok":
        raise SelftestFailure("store_down", f"the daemon answers but its store is down: {health}")
    return endpoint


def _marker(rng: random.Random) -> str:
    words = " ".join(rng.sample(_WORDS, 4))
    return f"veritas-watch selftest marker: {words} {rng.randrange(10_000, 99_999)}"


def _transcript(session_id: str, entry_id: str, text: str, now: datetime) -> bytes:
    stamp = now.strftime("%Y-%m-%dT%H:%M:%S.") + f"{now.microsecond // 1000:03d}Z"
    header = {"type": "session", "version": 3, "id": session_id, "timestamp": stamp, "cwd": "/"}
    entry = {"type": "message", "id": entry_id, "parentId": None, "timestamp": stamp,
             "message": {"role": "user", "content": [{"type": "text", "text": text}],
                         "timestamp": int(now.timestamp() * 1000)}}
    return b"".join((json.dumps(obj) + "\n").encode() for obj in (header, entry))


def _make_dir(path: Path, created: list[Path]) -> None:
    """mkdir -p, remembering what we created (to remove only that afterwards)."""
    missing = []
    probe = path
    while not probe.exists():
        missing.append(probe)
        probe = probe.parent
    for directory in reversed(missing):
        directory.mkdir(mode=0o700)
        created.append(directory)


def _hits(endpoint: DaemonEndpoint, query: str, session_id: str) -> list[dict[str, Any]]:
    results = endpoint.call("/search", {"agent_id": SELFTEST_AGENT, "query": query, "limit": 10},
                            timeout=STEP_TIMEOUT)
    return [r for r in results if r.get("session_id") == session_id]


def _ms(seconds: float) -> int:
    return round(seconds * 1000)


def run_selftest(config: Config, *, timeout: float = 60.0, out: IO[str] | None = None) -> int:
    """Write-then-read check against the running daemon. Prints RESULT=PASS|FAIL; returns the exit code."""
    stream = out or sys.stdout

    def say(text: str) -> None:
        print(text, file=stream, flush=True)

    started = time.monotonic()
    timings: dict[str, int] = {}
    try:
        endpoint = find_daemon(config)
        try:
            status = endpoint.call("/status", timeout=STEP_TIMEOUT)
            leftovers = int(endpoint.call("/selftest/cleanup", {"stale": True}, timeout=STEP_TIMEOUT)["deleted"])
        except (OSError, urllib.error.URLError, ValueError, KeyError) as exc:
            raise SelftestFailure("daemon_unresponsive", f"the daemon (pid {endpoint.pid}) answers /health but not "
                                  f"/status or /selftest/cleanup ({exc}): is its store stalled? see the journal"
                                  ) from None
        state_dir = Path(str(status.get("state_dir") or config.state_dir))  # the daemon's view wins
        say(f"selftest: daemon pid {endpoint.pid} at {endpoint.base}, state dir {state_dir}")
        if leftovers:
            say(f"selftest: removed {leftovers} point(s) left by an earlier run")
        _write_and_find(endpoint, state_dir, timeout, timings, say)
    except SelftestFailure as failure:
        say(f"selftest: {failure.detail}")
        extra = "".join(f" {k}={v}" for k, v in timings.items())
        say(f"RESULT=FAIL reason={failure.reason}{extra} total_ms={_ms(time.monotonic() - started)}")
        return EXIT_FAIL
    extra = "".join(f" {k}={v}" for k, v in timings.items())
    say(f"RESULT=PASS{extra} total_ms={_ms(time.monotonic() - started)}")
    return EXIT_PASS


def _write_and_find(endpoint: DaemonEndpoint, state_dir: Path, timeout: float, timings: dict[str, int],
                    say: Callable[[str], None]) -> None:
    if not state_dir.is_dir():
        raise SelftestFailure("state_dir_missing", f"the daemon's state dir {state_dir} does not exist")
    now = datetime.now(UTC)
    session_id = f"{SESSION_PREFIX}{now:%Y%m%dT%H%M%S}-{secrets.token_hex(3)}"
    entry_id = secrets.token_hex(4)
    text = _marker(random.Random(secrets.randbits(64)))
    sessions = state_dir / "agents" / SELFTEST_AGENT / "sessions"
    path = sessions / f"{session_id}.jsonl"
    created: list[Path] = []
    failure: SelftestFailure | None = None
    deleted = 0
    try:
        _write_scratch(path, created, _transcript(session_id, entry_id, text, now))
        say(f"selftest: wrote entry {entry_id} to {path}")
        written = time.monotonic()
        _wait_searchable(endpoint, text, session_id, entry_id, timeout)
        timings["write_to_searchable_ms"] = _ms(time.monotonic() - written)
        say(f"selftest: searchable after {timings['write_to_searchable_ms']} ms")
    except SelftestFailure as exc:
        failure = exc
    finally:  # also on Ctrl-C: never leave the scratch session behind
        cleanup_started = time.monotonic()
        _remove_scratch(path, created)
        try:
            deleted = _delete_points(endpoint, session_id)
        except SelftestFailure as exc:
            failure = failure or exc
        timings["cleanup_ms"] = _ms(time.monotonic() - cleanup_started)
    if failure is not None:
        raise failure
    say(f"selftest: removed the scratch session ({deleted} point(s) deleted)")
    try:
        left = _hits(endpoint, text, session_id)
    except (OSError, urllib.error.URLError, ValueError) as exc:
        raise SelftestFailure("search_failed", f"search after cleanup failed: {exc}") from None
    if left:
        raise SelftestFailure("cleanup_incomplete", f"{len(left)} point(s) of {session_id} still searchable")


def _write_scratch(path: Path, created: list[Path], data: bytes) -> None:
    try:
        _make_dir(path.parent, created)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
    except OSError as exc:
        raise SelftestFailure("write_failed", f"cannot write the scratch session {path}: {exc} "
                              "(run selftest as the user the daemon runs as)") from None


def _wait_searchable(endpoint: DaemonEndpoint, text: str, session_id: str, entry_id: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            found = [h for h in _hits(endpoint, text, session_id) if h.get("entry_id") == entry_id]
        except (OSError, urllib.error.URLError, ValueError) as exc:
            raise SelftestFailure("search_failed", f"search through the daemon failed: {exc}") from None
        if found:
            if found[0].get("text") != text:
                raise SelftestFailure("content_mismatch", "the stored text differs from what was written: "
                                      f"{found[0].get('text')!r}")
            return
        if time.monotonic() > deadline:
            raise SelftestFailure("not_searchable", f"the entry was not searchable within {timeout:g} s "
                                  "(is the daemon stalled? see `veritas-watch status` and the journal)")
        time.sleep(0.1)


def _remove_scratch(path: Path, created: list[Path]) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    for directory in reversed(created):
        with contextlib.suppress(OSError):  # not empty: someone else put something there; leave it
            directory.rmdir()


def _delete_points(endpoint: DaemonEndpoint, session_id: str) -> int:
    try:
        result = endpoint.call("/selftest/cleanup", {"session_id": session_id}, timeout=STEP_TIMEOUT)
    except (OSError, urllib.error.URLError, ValueError) as exc:
        raise SelftestFailure("cleanup_failed", f"cannot delete the selftest points through the daemon: {exc}"
                              ) from None
    return int(result.get("deleted", 0))


# -- the daemon side: POST /selftest/cleanup ------------------------------------------------------

def selftest_point_ids(points: Any, session_id: str | None, stale_before: float | None = None) -> list[str]:
    """Ids among `(id, payload, _)` rows of the selftest agent to delete: one session, the stale ones, or all."""
    ids = []
    for point_id, payload, _ in points:
        if payload.get("agent_id") != SELFTEST_AGENT:
            continue
        if session_id is not None and payload.get("session_id") != session_id:
            continue
        ts = payload.get("ts")
        if stale_before is not None and not (isinstance(ts, (int, float)) and ts < stale_before):
            continue
        ids.append(point_id)
    return ids


async def cleanup_handler(request: web.Request) -> web.Response:
    """Delete points of agent `veritas-selftest`: of `session_id`, or `stale` ones, or all. Never other agents'."""
    from veritas_watch.api import DAEMON_KEY

    try:
        body = await request.json() if request.can_read_body else {}
    except ValueError:
        body = None
    if not isinstance(body, dict):
        raise web.HTTPBadRequest(text=json.dumps({"error": "body must be a JSON object"}),
                                 content_type="application/json")
    session_id = body.get("session_id")
    if session_id is not None and (not isinstance(session_id, str) or not session_id.startswith(SESSION_PREFIX)):
        raise web.HTTPBadRequest(text=json.dumps({"error": f"session_id must start with {SESSION_PREFIX}"}),
                                 content_type="application/json")
    # Stale: left by a run that could not clean up (its store was stalled); older than any live run.
    stale_before = time.time() - STALE_AFTER_SECONDS if body.get("stale") is True else None
    daemon: Daemon = request.app[DAEMON_KEY]  # type: ignore[assignment]
    assert daemon.rt is not None
    store = daemon.rt.sink.store

    def delete() -> int:
        ids = selftest_point_ids(store.scroll(agent_id=SELFTEST_AGENT), session_id, stale_before)
        store.delete(ids)
        return len(ids)

    deleted = await daemon.rt.sink.in_store_thread(delete)
    log.info("selftest_cleaned", session=session_id, deleted=deleted)
    return web.json_response({"deleted": deleted})
