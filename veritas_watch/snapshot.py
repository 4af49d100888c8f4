"""One picture of the running daemon. `status`, `/health`, `/metrics`, systemd's STATUS line and the
backfill progress bar all render the same `Snapshot` (`daemon.Running.snapshot()`), so "is the store up?" or
"how far behind are we?" has one answer, computed in one place. A leaf: it imports nothing of ours
but the gap record's type.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from veritas_watch.features.gaps import Gap


@dataclass(frozen=True)
class Snapshot:
    ready: bool  # READY=1 sent: start-up finished
    store_up: bool  # the store acknowledges writes
    watcher_mode: str | None  # inotify | polling (None before the watcher started)
    watcher_fallback_reason: str = ""
    files: int = 0  # transcript files tracked
    lag_bytes: dict[str, int] = field(default_factory=dict)  # agent -> transcript bytes not yet stored
    in_flight_bytes: int = 0  # of those, read and being embedded or stored
    total_bytes: int = 0  # every tracked transcript's size
    done_bytes: int = 0  # of it, stored and committed
    sqlite_lag_rows: int = 0  # SQLite rows not yet read, every store
    queue: int = 0  # read units waiting for the sink
    queue_capacity: int = 0
    stored: int = 0  # points written since start
    heartbeat_age_s: float = 0.0  # since the sink loop last advanced
    open_gaps: tuple[Gap, ...] = ()

    @property
    def backlog_bytes(self) -> int:
        return sum(self.lag_bytes.values())

    @property
    def agents(self) -> int:
        """Agents with at least one tracked transcript."""
        return len(self.lag_bytes)

    @property
    def status(self) -> str:
        """`/health`'s word: starting, ok, degraded (the store is down)."""
        if not self.ready:
            return "starting"
        return "ok" if self.store_up else "degraded"
