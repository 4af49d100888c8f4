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
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import structlog

from veritas_watch import client
from veritas_watch.client import DaemonEndpoint
from veritas_watch.config import Config
from veritas_watch.safepath import make_dirs

if TYPE_CHECKING:
    pass

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


def find_daemon(config: Config) -> DaemonEndpoint:
    """The live daemon for this data dir (veritas_watch/client.py), or SelftestFailure saying why there is
    none; a daemon whose store is down fails too."""
    try:
        endpoint = client.locate(config, health_timeout=5)
    except client.NoDaemon as exc:
        raise SelftestFailure(exc.reason, str(exc)) from None
    if endpoint.health.get("store") != "ok":
        raise SelftestFailure("store_down", f"the daemon answers but its store is down: {endpoint.health}")
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
    created.extend(make_dirs(path))


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
    from veritas_watch.safepath import inside

    try:
        inside(path.parents[3], path)  # <state>/agents/<id>/sessions/<file>: a symlink never leads it elsewhere
        _make_dir(path.parent, created)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
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
