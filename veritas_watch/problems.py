"""Paths under the state dir that cannot be followed: one log line each, shown in `status` and `doctor`.

A symlink loop, an unreadable directory, a FIFO or a socket named like a transcript, an agent dir
whose name is no agent id: each is skipped (everything else keeps flowing), logged once when first
seen, logged again only when what is wrong with it changes, and logged as resolved when a whole
sweep no longer sees it. Thread-safe: the sweep reports from a worker thread, `status` reads from
the event loop.
"""

from __future__ import annotations

import os
import stat
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import structlog

log = structlog.get_logger()

# The event each problem is logged as (stable names: `jq 'select(.event == ...)'`).
EVENTS = {
    "unreadable": "path_unreadable",
    "sessions_dir_unreadable": "sessions_dir_unreadable",
    "symlink_loop": "symlink_loop",
    "symlink_outside_state_dir": "symlink_outside_state_dir_ignored",
    "symlink_ignored": "symlink_ignored",
    "not_a_regular_file": "not_a_regular_file",
    "agent_dir_ignored": "agent_dir_ignored",
    "transcript_unreadable": "transcript_unreadable",
    "sqlite_failed": "sqlite_poll_failed",
}


@dataclass(frozen=True, slots=True)
class Problem:
    path: str
    problem: str  # a key of EVENTS
    detail: str
    agent: str | None
    since: float  # epoch seconds, when first seen in this form

    def to_dict(self) -> dict[str, object]:
        return {"path": self.path, "agent": self.agent, "problem": self.problem, "detail": self.detail,
                "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.since))}


def file_type(mode: int) -> str:
    """What a non-regular file is, in a word."""
    for test, name in ((stat.S_ISFIFO, "fifo"), (stat.S_ISSOCK, "socket"), (stat.S_ISCHR, "character device"),
                       (stat.S_ISBLK, "block device"), (stat.S_ISDIR, "directory"), (stat.S_ISLNK, "symlink")):
        if test(mode):
            return name
    return "special file"


def agent_of(path: Path, state_dir: Path) -> str | None:
    """`<state>/agents/<id>/...` -> `<id>` (a valid name or not: it names the dir that has the problem)."""
    try:
        parts = path.relative_to(state_dir).parts
    except ValueError:
        return None
    return parts[1] if len(parts) >= 2 and parts[0] == "agents" else None


class ProblemLog:
    def __init__(self, state_dir: Path | None = None, *, quiet: bool = False) -> None:
        self._state_dir = state_dir
        self._quiet = quiet  # collect only (doctor, offline status): the daemon is the one that logs
        self._lock = threading.Lock()
        self._current: dict[str, Problem] = {}
        self._seen_this_sweep: set[str] | None = None

    def report(self, path: Path, problem: str, detail: str = "", agent: str | None = None) -> None:
        key = str(path)
        if agent is None and self._state_dir is not None:
            agent = agent_of(path, self._state_dir)
        with self._lock:
            if self._seen_this_sweep is not None:
                self._seen_this_sweep.add(key)
            old = self._current.get(key)
            if old is not None and (old.problem, old.detail) == (problem, detail):
                return
            self._current[key] = Problem(key, problem, detail, agent, time.time())
        if self._quiet:
            return
        log.warning(EVENTS.get(problem, problem), path=key, agent=agent, problem=problem, detail=detail,
                    action="skipped; everything else keeps flowing")

    def begin_sweep(self) -> None:
        with self._lock:
            self._seen_this_sweep = set()

    def end_sweep(self) -> None:
        """Problems a whole sweep did not meet again are gone (fixed, or the path was removed)."""
        with self._lock:
            seen, self._seen_this_sweep = self._seen_this_sweep, None
            if seen is None:
                return
            gone = [p for key, p in self._current.items() if key not in seen]
            for problem in gone:
                del self._current[problem.path]
        for problem in [] if self._quiet else gone:
            log.info("path_problem_resolved", path=problem.path, agent=problem.agent, problem=problem.problem)

    def snapshot(self) -> list[Problem]:
        with self._lock:
            return sorted(self._current.values(), key=lambda p: p.path)


def scan_state_dir(state_dir: Path, problems: ProblemLog) -> None:
    """What the daemon's sweep would find wrong, for a process that runs no sweep (`doctor`).

    Lists every agent's sessions dir and SQLite store the way the sources do, reporting into
    `problems` (which logs nothing new if the caller silenced logging)."""
    from veritas_watch.openclaw import classify_transcript, iter_agents

    root = os.path.realpath(state_dir)
    for agent in iter_agents(state_dir, problems):
        check_sessions_dir(agent.sessions, root, problems, agent.agent_id)
        check_sqlite(agent.sqlite, problems, agent.agent_id)
        try:
            entries = list(os.scandir(agent.sessions))
        except OSError:
            continue
        for entry in entries:
            if classify_transcript(entry.name) is None:
                continue
            check_transcript(Path(entry.path), root, problems, agent.agent_id)


def check_sessions_dir(sessions: Path, root: str, problems: ProblemLog, agent: str | None) -> bool:
    """Whether a sessions dir may be listed; what is wrong with it goes to `problems`."""
    try:
        if stat.S_ISLNK(os.lstat(sessions).st_mode):
            real = os.path.realpath(sessions, strict=True)
            if not (real == root or real.startswith(root.rstrip("/") + "/")):
                problems.report(sessions, "symlink_outside_state_dir", f"points to {real}", agent)
                return False
        os.listdir(sessions)
    except FileNotFoundError:
        return False
    except OSError as exc:
        problems.report(sessions, *_os_problem(exc, "sessions_dir_unreadable"), agent)
        return False
    except RuntimeError as exc:  # Python < 3.13 raises this for a symlink loop in realpath(strict=True)
        problems.report(sessions, "symlink_loop", str(exc)[:200], agent)
        return False
    return True


def check_transcript(path: Path, root: str, problems: ProblemLog, agent: str | None) -> bool:
    """Whether a file named like a transcript is one the tailer may open (a regular file, inside)."""
    try:
        if os.path.islink(path):
            real = os.path.realpath(path, strict=True)
            if not (real == root or real.startswith(root.rstrip("/") + "/")):
                problems.report(path, "symlink_outside_state_dir", f"points to {real}", agent)
                return False
        st = os.stat(path)
    except FileNotFoundError:
        return False  # vanished between listing and stat (a rename): the next sweep finds it
    except OSError as exc:
        problems.report(path, *_os_problem(exc, "transcript_unreadable"), agent)
        return False
    except RuntimeError as exc:
        problems.report(path, "symlink_loop", str(exc)[:200], agent)
        return False
    if not stat.S_ISREG(st.st_mode):
        problems.report(path, "not_a_regular_file", f"a {file_type(st.st_mode)}, not a transcript file", agent)
        return False
    return True


def check_sqlite(path: Path, problems: ProblemLog, agent: str | None) -> bool:
    """Whether an agent's SQLite transcript store exists as a regular file (anything else is reported)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    except OSError as exc:
        if os.path.lexists(path):
            problems.report(path, *_os_problem(exc, "unreadable"), agent)
        return False
    if not stat.S_ISREG(st.st_mode):
        problems.report(path, "not_a_regular_file", f"a {file_type(st.st_mode)}, not a SQLite database", agent)
        return False
    return True


def _os_problem(exc: OSError, unreadable: str) -> tuple[str, str]:
    import errno

    if exc.errno == errno.ELOOP:
        return "symlink_loop", "too many levels of symbolic links"
    return unreadable, f"{type(exc).__name__}: {exc.strerror or exc}"
