"""Wires gap detection into the daemon: sessions ended in, when to check, the archiver's timer.

The sources say which conversations ended (`ConversationEnd`, each handed on once): a JSONL transcript
renamed to `.reset.<ts>` / `.deleted.<ts>` and drained, a compressed archive read, a SQLite `reset`
event or a deleted session. Those that ended while the daemon was down are found by the first full
pass and checked together with `startup_scan`; later ones one by one.
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
from veritas_watch.features.gaps import EndedSession, Gap, GapDetector, GapStore, HookPlaces, resolve_zone
from veritas_watch.model import ConversationEnd
from veritas_watch.openclaw import (
    SQLITE_NAME,
    AgentDirs,
    agent_removed,
    agent_workspace,
    canonical_agent_id,
    iter_agents,
    session_artifact_dir,
    transcript_dbs,
)

log = structlog.get_logger()


def hook_places(state_dir: Path, agent_id: str) -> HookPlaces:
    """Where the agent's hook values may point: its workspace as OpenClaw resolves it now, the directories its
    transcript files are in (its `sessions/`, each of its databases' archive directory) and its databases."""
    agent_id = canonical_agent_id(agent_id)
    dirs = next((a for a in iter_agents(state_dir) if a.agent_id == agent_id), None)
    if dirs is None:  # not on disk (any more): the layout OpenClaw would give it
        base = state_dir / "agents" / agent_id
        dirs = AgentDirs(agent_id, base / "sessions", base / "agent" / SQLITE_NAME)
    databases = [db.path for db in transcript_dbs(state_dir, [dirs]) if db.agent_id == agent_id]
    return HookPlaces.of(agent_workspace(state_dir, agent_id),
                         [dirs.sessions, *map(session_artifact_dir, databases)], databases)


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
    _last_archive: float = float("-inf")  # the first check runs at once (monotonic starts near 0 at boot)

    @classmethod
    def open(cls, config: Config, on_detected: Callable[[str], None] | None = None) -> GapService | NoGaps:
        gaps = config.gaps
        if not gaps.enabled:
            return NoGaps()
        store = GapStore(config.data_dir)
        from datetime import timedelta

        detector = GapDetector(store, gaps.on_gap or None, gaps.hook_timeout, resolve_zone(gaps.timezone or None),
                               tolerance=timedelta(seconds=gaps.tolerance),
                               removed=lambda agent, workspace: agent_removed(config.state_dir, agent, workspace),
                               places=lambda agent: hook_places(config.state_dir, agent))
        return cls(config, detector, store, on_detected)

    def workspace(self, agent_id: str) -> Path:
        return agent_workspace(self.config.state_dir, agent_id)

    def wanted(self, agent_id: str) -> bool:
        return not self.config.gaps.agents or agent_id in self.config.gaps.agents

    async def session_ended(self, agent_id: str, end: ConversationEnd) -> None:
        """A conversation a source saw end (a reset, a deletion, an archived transcript): check it now, or
        with the start-up scan when the first pass over the backlog is not done yet."""
        ended_at = _ended_at(end.ended_at)
        if ended_at is None or not self.wanted(agent_id):
            return  # an empty conversation needs no sync
        workspace = self.workspace(agent_id)
        if agent_removed(self.config.state_dir, agent_id, workspace):
            # `openclaw agents delete` deletes the agent's sessions first: no one is left to sync them
            log.info("gap_skipped", agent=agent_id, session=end.session_id, reason="agent_removed")
            return
        ended = EndedSession(agent_id, end.session_id, end.transcript, ended_at, workspace)
        if self.first_pass_done:
            gap = await self.detector.session_ended(ended.agent_id, ended.session_id, ended.transcript,
                                                    ended.ended_at, ended.workspace)
            self._count([gap] if gap is not None else [])
        else:
            self.startup.append(ended)

    async def after_sweep(self, idle: bool) -> None:
        """After each sweep: the start-up scan once the backlog is read, open gaps re-checked, daily logs."""
        if idle and not self.first_pass_done:
            self.first_pass_done = True
            self._count(await self.detector.startup_scan(self.startup))
            self.startup = []
        await self.detector.tick(datetime.now(UTC))
        await self._archive_if_due()

    @property
    def startup_scan_pending(self) -> bool:
        """The start-up scan waits for a sweep that reads nothing while the sink is idle."""
        return not self.first_pass_done

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


class NoGaps:
    """Gap detection switched off (`gaps.enabled = false`), or not started yet: the same calls, doing nothing."""

    async def session_ended(self, agent_id: str, end: ConversationEnd) -> None:
        return None

    async def after_sweep(self, idle: bool) -> None:
        return None

    @property
    def startup_scan_pending(self) -> bool:
        return False

    def open_gaps(self) -> list[Gap]:
        return []

    async def close(self) -> None:
        return None
