"""Filesystem change hints: watchdog (inotify) into an asyncio.Event, polling when inotify fails.

Events are only a latency hint; the daemon's periodic sweep is the source of truth (watchdog drops
inotify queue overflows silently, and network filesystems deliver no events at all).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Literal

import structlog
from watchdog.events import FileSystemEvent, FileSystemEventHandler
from watchdog.observers import Observer
from watchdog.observers.api import BaseObserver
from watchdog.observers.polling import PollingObserver

log = structlog.get_logger()

WatcherMode = Literal["inotify", "polling"]


class _Hint(FileSystemEventHandler):
    def __init__(self, loop: asyncio.AbstractEventLoop, event: asyncio.Event) -> None:
        self._loop = loop
        self._event = event

    def on_any_event(self, event: FileSystemEvent) -> None:
        if event.event_type in ("opened", "closed_no_write"):
            return  # reads (ours included) are not changes
        self._loop.call_soon_threadsafe(self._event.set)


class ChangeWatcher:
    """Watches `<state>/agents` recursively (and the state dir itself, to see `agents/` appear)."""

    def __init__(self, state_dir: Path, hint: asyncio.Event, *, force_polling: bool, poll_interval: float) -> None:
        self.state_dir = state_dir
        self._hint = hint
        self._force_polling = force_polling
        self._poll_interval = poll_interval
        self._observer: BaseObserver | None = None
        self._watched: set[Path] = set()
        self.mode: WatcherMode = "polling" if force_polling else "inotify"
        self.fallback_reason = "forced by watch.force_polling" if force_polling else ""

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._handler = _Hint(loop, self._hint)
        self._observer = self._new_observer()
        self._observer.start()
        self.refresh()

    def _new_observer(self) -> BaseObserver:
        if self.mode == "polling":
            return PollingObserver(timeout=self._poll_interval)
        return Observer()

    def refresh(self) -> None:
        """Add watches for directories that appeared since the last call; fall back to polling on failure."""
        if self._observer is None:
            return
        wanted = [(self.state_dir / "agents", True), (self.state_dir, False)]
        for path, recursive in wanted:
            if path in self._watched or not path.is_dir():
                continue
            try:
                self._observer.schedule(self._handler, str(path), recursive=recursive)
                self._watched.add(path)
            except OSError as exc:
                if self.mode == "polling":
                    log.error("watch_failed", path=str(path), error=str(exc))
                    continue
                self._fall_back(f"{type(exc).__name__}: {exc}")
                return

    def _fall_back(self, reason: str) -> None:
        log.warning("watcher_fallback_polling", reason=reason,
                    hint="raise fs.inotify.max_user_watches / max_user_instances to use inotify")
        self.stop()
        self.mode = "polling"
        self.fallback_reason = reason
        self._watched.clear()
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
            self._observer = self._new_observer()
            self._observer.start()
            self.refresh()
            self._hint.set()

    def stop(self) -> None:
        if self._observer is not None:
            self._observer.stop()
            self._observer.join(timeout=5)
            self._observer = None
