"""Wires gap detection into the daemon: which sessions ended, when to check, the archiver's timer.

A session ends when its transcript was renamed to `.reset.<ts>` / `.deleted.<ts>` and drained (or,
for SQLite, when a new window replaced it). Sessions that ended while the daemon was down are
found by the first full pass and checked together with `startup_scan`; later ones one by one.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import structlog

from veritas_watch.config import Config
from veritas_watch.features.archive import archive_daily_logs
from veritas_watch.features.gaps import EndedSession, Gap, GapDetector, GapStore, resolve_zone
from veritas_watch.openclaw import agent_workspace, iter_agents, session_stem
from veritas_watch.sources.cursors import CursorStore, FileCursor
from veritas_watch.sources.jsonl import JsonlTailer

log = structlog.get_logger()


def _ended_at(iso: str | None) -> datetime | None:
    if not iso:
        return None
    try:
        return datetime.fromisoformat(iso.replace("Z", "+00:00")).astimezone(UTC)
    except ValueError:
        return None


@dataclass
class GapService:
    config: Config
    detector: GapDetector
    store: GapStore
    on_detected: Callable[[str], None] | None = None  # metrics: one call per new gap, with the agent id
    startup: list[EndedSession] = field(default_factory=list)
    first_pass_done: bool = False
    _last_archive: float = 0.0

    @classmethod
    def open(cls, config: Config, on_detected: Callable[[str], None] | None = None) -> GapService | None:
        gaps = config.gaps
        if not gaps.enabled:
            return None
        store = GapStore(config.data_dir)
        from datetime import timedelta

        detector = GapDetector(store, gaps.on_gap or None, gaps.hook_timeout, resolve_zone(gaps.timezone or None),
                               tolerance=timedelta(seconds=gaps.tolerance))
        return cls(config, detector, store, on_detected)

    def workspace(self, agent_id: str) -> Path:
        return agent_workspace(self.config.state_dir, agent_id)

    def wanted(self, agent_id: str) -> bool:
        return not self.config.gaps.agents or agent_id in self.config.gaps.agents

    def drained_archives(self, tailer: JsonlTailer) -> list[FileCursor]:
        """Archives read to their end with nothing in flight, not yet reported: mark them ended."""
        ended = []
        for tracked in tailer.files.values():
            done = tracked.committed
            if (tracked.kind in ("reset", "deleted") and not done.ended and done.offset >= tracked.size
                    and tracked.read.offset == done.offset):
                done.ended = tracked.read.ended = True
                ended.append(done)
        return ended

    async def session_ended(self, agent_id: str, session_id: str, transcript: str, last_entry_ts: str | None,
                            kind: str) -> None:
        ended_at = _ended_at(last_entry_ts)
        if kind == "cron" or ended_at is None or not self.wanted(agent_id):
            return  # cron runs (the sync itself among them) and empty sessions need no sync
        ended = EndedSession(agent_id, session_id, transcript, ended_at, self.workspace(agent_id))
        if self.first_pass_done:
            gap = await self.detector.session_ended(ended.agent_id, ended.session_id, ended.transcript,
                                                    ended.ended_at, ended.workspace)
            self._count([gap] if gap is not None else [])
        else:
            self.startup.append(ended)

    async def after_sweep(self, tailer: JsonlTailer, cursors: CursorStore, idle: bool) -> None:
        ended = self.drained_archives(tailer)
        if ended:
            await asyncio.to_thread(cursors.commit_files, ended)
        for cursor in ended:
            await self.session_ended(cursor.agent_id, cursor.session_id or session_stem(cursor.path),
                                     cursor.path, cursor.last_entry_ts, cursor.session_kind)
        if idle and not self.first_pass_done:
            self.first_pass_done = True
            self._count(await self.detector.startup_scan(self.startup))
            self.startup = []
        await self.detector.tick(datetime.now(UTC))
        await self._archive_if_due()

    def _count(self, gaps: list[Gap]) -> None:
        if self.on_detected is not None:
            for gap in gaps:
                self.on_detected(gap.agent_id)

    async def _archive_if_due(self) -> None:
        gaps = self.config.gaps
        if not gaps.archive_daily_logs or time.monotonic() - self._last_archive < gaps.archive_interval:
            return
        self._last_archive = time.monotonic()
        zone = resolve_zone(gaps.timezone or None)
        today = datetime.now(zone).date()
        for agent in iter_agents(self.config.state_dir):
            if self.wanted(agent.agent_id):
                await asyncio.to_thread(archive_daily_logs, self.workspace(agent.agent_id), today,
                                        gaps.archive_keep_days, gaps.archive_threshold)

    def open_gaps(self) -> list[Gap]:
        return self.detector.open_gaps()

    async def close(self) -> None:
        await self.detector.shutdown()
        self.store.close()
