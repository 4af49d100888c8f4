"""Filesystem change hints: watchdog (inotify) into an asyncio.Event, polling when inotify fails.

Events are only a latency hint; the daemon's periodic sweep is the source of truth (the kernel
drops events when its queue overflows, and network filesystems deliver no events at all). What
this module adds on top of watchdog:
- a kernel queue overflow, which watchdog reports only through stdlib logging, becomes one
  rate-limited `watch_overflow` warning and an immediate sweep;
- inotify limits: the instance limit (EMFILE) and the watch limit on the top directory (ENOSPC)
  raise when a watch is added; the watch limit on a subdirectory does not (watchdog skips it
  silently), so the directories that matter are checked against the kernel's own list of
  watches (`/proc/self/fdinfo`). Either way: one `watcher_fallback_polling` warning, polling
  from then on, and `status` says so;
- any other watcher error (a failed watch rebuild, a dead observer thread) falls back or
  restarts the observer, and triggers a sweep.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Literal

import structlog
from watchdog.events import (
    DirCreatedEvent,
    DirDeletedEvent,
    DirModifiedEvent,
    DirMovedEvent,
    FileClosedEvent,
    FileCreatedEvent,
    FileDeletedEvent,
    FileModifiedEvent,
    FileMovedEvent,
    FileSystemEvent,
    FileSystemEventHandler,
)
from watchdog.observers import Observer
from watchdog.observers.api import BaseObserver
from watchdog.observers.polling import PollingObserver

log = structlog.get_logger()

WatcherMode = Literal["inotify", "polling"]
WATCHDOG_LOGGERS = ("watchdog.observers.inotify_c", "watchdog.observers.inotify")
OVERFLOW_LOG_EVERY_S = 10.0  # at most one overflow warning per this many seconds (with a count)
COVER_GRACE_S = 3.0  # a new directory must have its inotify watch within this long
DirKey = tuple[int, int, int]  # device major, device minor, inode
# The events that are changes. Not IN_OPEN / IN_CLOSE_NOWRITE (watchdog's opened / closed_no_write): the kernel
# would queue two for every file the daemon's own sweep opens to check it (a thousand transcripts, thousands of
# events a sweep, each woken for and dispatched by watchdog's threads) only for the hint to ignore them.
CHANGES: list[type[FileSystemEvent]] = [FileCreatedEvent, DirCreatedEvent, FileModifiedEvent, DirModifiedEvent,
                                        FileMovedEvent, DirMovedEvent, FileDeletedEvent, DirDeletedEvent,
                                        FileClosedEvent]


class _Hint(FileSystemEventHandler):
    def __init__(self, wake: Callable[[], None]) -> None:
        self._wake = wake

    def on_any_event(self, event: FileSystemEvent) -> None:
        if event.event_type in ("opened", "closed_no_write"):
            return  # reads (ours included) are not changes
        self._wake()


class _WatchdogLogBridge(logging.Handler):
    """watchdog reports a queue overflow and failed watch rebuilds only as stdlib log records."""

    def __init__(self, on_overflow: Callable[[], None], on_error: Callable[[str], None]) -> None:
        super().__init__(logging.WARNING)
        self._on_overflow = on_overflow
        self._on_error = on_error

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if "overflow" in message.lower():
            if "lost" in message:  # one record per overflow (a second one says watches are being rebuilt)
                self._on_overflow()
        elif record.levelno >= logging.ERROR:
            self._on_error(message[:300])


def _dir_key(path: Path) -> DirKey | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return os.major(st.st_dev), os.minor(st.st_dev), st.st_ino


def inotify_watched_dirs(pid: str = "self") -> set[DirKey] | None:
    """Every inode this process has an inotify watch on, from the kernel; None where unsupported."""
    fd_dir = Path(f"/proc/{pid}/fd")
    watched: set[DirKey] = set()
    try:
        fds = os.listdir(fd_dir)
    except OSError:
        return None
    for fd in fds:
        try:
            if os.readlink(fd_dir / fd) != "anon_inode:inotify":
                continue
            info = (fd_dir.parent / "fdinfo" / fd).read_text()
        except OSError:
            continue
        for line in info.splitlines():
            if not line.startswith("inotify "):
                continue
            fields = dict(part.split(":", 1) for part in line.split()[1:] if ":" in part)
            try:
                sdev, ino = int(fields["sdev"], 16), int(fields["ino"], 16)
            except (KeyError, ValueError):
                continue
            watched.add((sdev >> 20, sdev & 0xFFFFF, ino))  # the kernel's internal dev_t layout
    return watched


class ChangeWatcher:
    """Watches `<state>/agents` recursively (and the state dir itself, to see `agents/` appear), and the
    directories of transcript databases a `session.store` put elsewhere."""

    def __init__(self, state_dir: Path, hint: asyncio.Event, *, force_polling: bool, poll_interval: float) -> None:
        self.state_dir = state_dir
        self._hint = hint
        self._force_polling = force_polling
        self._poll_interval = poll_interval
        self._observer: BaseObserver | None = None
        self._watched: set[Path] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._bridge: _WatchdogLogBridge | None = None
        self._covered: set[DirKey] = set()
        self._uncovered_since: dict[DirKey, float] = {}
        self._own_watch_tried: set[Path] = set()
        self._overflows = 0  # since the last overflow warning
        self._overflow_logged_at = -OVERFLOW_LOG_EVERY_S
        self.overflows_total = 0
        self.mode: WatcherMode = "polling" if force_polling else "inotify"
        self.fallback_reason = "forced by watch.force_polling" if force_polling else ""

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._handler = _Hint(self._wake_from_thread)
        self._bridge = _WatchdogLogBridge(lambda: self._from_thread(self._on_overflow),
                                          lambda message: self._from_thread(lambda: self._on_error(message)))
        for name in WATCHDOG_LOGGERS:
            logger = logging.getLogger(name)
            logger.addHandler(self._bridge)
            logger.propagate = False  # our structured line replaces watchdog's plain-text one
        try:
            self._observer = self._new_observer()
        except OSError as exc:  # watchdog >= 7 creates the inotify instance here (EMFILE at the limit)
            self._fall_back(f"{type(exc).__name__}: {exc}")
            return
        self._observer.start()
        self.refresh()

    def _new_observer(self) -> BaseObserver:
        if self.mode == "polling":
            return PollingObserver(timeout=self._poll_interval)
        return Observer()

    # -- from watchdog's threads -----------------------------------------------------------------

    def _from_thread(self, fn: Callable[[], None]) -> None:
        loop = self._loop
        if loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop closed while a watcher thread ran
                loop.call_soon_threadsafe(fn)

    def _wake_from_thread(self) -> None:
        self._from_thread(self._hint.set)

    def _on_overflow(self) -> None:
        self._overflows += 1
        self.overflows_total += 1
        now = time.monotonic()
        if now - self._overflow_logged_at >= OVERFLOW_LOG_EVERY_S:
            log.warning("watch_overflow", count=self._overflows, action="full sweep now",
                        hint="raise fs.inotify.max_queued_events if this repeats")
            self._overflows = 0
            self._overflow_logged_at = now
        self._hint.set()

    def _on_error(self, message: str) -> None:
        if self.mode == "inotify":
            self._fall_back(f"watchdog: {message}")
        else:
            log.error("watcher_error", mode=self.mode, error=message)
            self._hint.set()

    # -- on the event loop -------------------------------------------------------------------------

    def refresh(self, elsewhere: Iterable[Path] = ()) -> None:
        """Add watches for directories that appeared since the last call; fall back to polling on failure.
        `elsewhere`: directories outside `agents/` that hold transcripts (a configured `session.store`),
        each watched on its own."""
        if self._observer is None:
            return
        # The state dir first: its one watch must not be the one a nearly exhausted limit refuses.
        agents = self.state_dir / "agents"
        wanted = [(self.state_dir, False), (agents, True),
                  *((d, False) for d in elsewhere if not d.is_relative_to(agents))]  # agents/ is watched whole
        for path, recursive in wanted:
            if path in self._watched or not path.is_dir():
                continue
            try:
                self._observer.schedule(self._handler, str(path), recursive=recursive, event_filter=CHANGES)
                self._watched.add(path)
            except OSError as exc:
                if self.mode == "polling":
                    log.error("watch_failed", path=str(path), error=str(exc))
                    continue
                self._fall_back(f"{type(exc).__name__}: {exc}")
                return
        if self.mode == "inotify":
            self._check_coverage()

    def _dirs_to_cover(self) -> list[Path]:
        agents = self.state_dir / "agents"
        if agents not in self._watched:
            return []
        dirs = [agents]
        readable = os.R_OK | os.X_OK  # inotify cannot watch what we may not read: the sweep reports those
        with contextlib.suppress(OSError):
            for agent in os.scandir(agents):
                if agent.is_dir(follow_symlinks=False) and os.access(agent.path, readable):
                    dirs.append(Path(agent.path))
                    sessions = Path(agent.path) / "sessions"
                    if sessions.is_dir() and not sessions.is_symlink() and os.access(sessions, readable):
                        dirs.append(sessions)
        return dirs

    def _check_coverage(self) -> None:
        """Each directory that matters must hold an inotify watch (watchdog skips failures silently)."""
        pending = [(path, key) for path in self._dirs_to_cover()
                   if (key := _dir_key(path)) is not None and key not in self._covered]
        if not pending:
            return
        watched = inotify_watched_dirs()
        if watched is None:
            return  # no /proc: trust watchdog
        now = time.monotonic()
        for path, key in pending:
            if key in watched:
                self._covered.add(key)
                self._uncovered_since.pop(key, None)
                continue
            if now - self._uncovered_since.setdefault(key, now) < COVER_GRACE_S:
                continue
            if path not in self._own_watch_tried and self._observer is not None:
                # A dir the recursive watch skipped because it was unreadable then (a mode fixed since):
                # one watch of its own, and another grace period, before inotify is given up.
                self._own_watch_tried.add(path)
                with contextlib.suppress(OSError):
                    self._observer.schedule(self._handler, str(path), recursive=True, event_filter=CHANGES)
                self._uncovered_since[key] = now
                continue
            self._fall_back(f"no inotify watch on {path} (fs.inotify.max_user_watches reached?)")
            return

    def _fall_back(self, reason: str) -> None:
        log.warning("watcher_fallback_polling", reason=reason,
                    hint="raise fs.inotify.max_user_watches / max_user_instances to use inotify")
        self._stop_observer()
        self.mode = "polling"
        self.fallback_reason = reason
        self._watched.clear()
        self._covered.clear()
        self._uncovered_since.clear()
        self._observer = self._new_observer()
        self._observer.start()
        self.refresh()
        self._hint.set()  # something may have changed while we switched: sweep now

    def healthy(self) -> bool:
        return self._observer is not None and self._observer.is_alive()

    def restart_if_dead(self) -> None:
        """A watcher thread that died (watchdog raises in its thread) is replaced, and a sweep runs."""
        if self._observer is not None and not self._observer.is_alive():
            log.warning("watcher_restarted", mode=self.mode)
            self._watched.clear()
            self._covered.clear()
            try:
                self._observer = self._new_observer()
            except OSError as exc:
                self._fall_back(f"{type(exc).__name__}: {exc}")
                return
            self._observer.start()
            self.refresh()
            self._hint.set()

    def _stop_observer(self) -> None:
        if self._observer is not None:
            self._observer.stop()
            with contextlib.suppress(RuntimeError):  # never started
                self._observer.join(timeout=5)
            self._observer = None

    def stop(self) -> None:
        """Stop watching for good (shutdown) and detach from watchdog's loggers."""
        self._stop_observer()
        if self._bridge is not None:
            for name in WATCHDOG_LOGGERS:
                logger = logging.getLogger(name)
                logger.removeHandler(self._bridge)
                if not logger.handlers:
                    logger.propagate = True
            self._bridge = None
