"""The detector: a session end against STATE.md's time, gaps recorded once, hooks retried, gaps closed."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from datetime import UTC, datetime, timedelta, tzinfo
from pathlib import Path
from typing import Any

import structlog

from veritas_watch.features.gaps.hook import (
    KILL_GRACE_S,
    HookPlaces,
    HookRefusal,
    hook_environment,
    refuse_hook_values,
    render_hook_argv,
    run_hook,
    validate_hook_template,
)
from veritas_watch.features.gaps.state_md import STATE_FILE, state_time
from veritas_watch.features.gaps.store import EndedSession, Gap, GapKey, GapStore, instant_or_none
from veritas_watch.features.gaps.zones import format_instant, require_aware, to_millis

DEFAULT_TOLERANCE = timedelta(minutes=2)

def _utc_now() -> datetime:
    return datetime.now(UTC)


class GapDetector:
    """Compares ended sessions with STATE.md, records gaps, runs and retries the hook.

    Hooks run in background tasks (a sync can take minutes; callers never wait for one), one
    at a time per agent, oldest session first, at most `hook_concurrency` at once. Before a
    hook runs STATE.md is checked again: a gap closed in the meantime (for example by the
    sync of an earlier session of the same agent) is not fired. A closed gap never fires.
    """

    def __init__(
        self,
        store: GapStore,
        hook: list[str] | None,
        hook_timeout: float,
        default_tz: tzinfo,
        log: Any = None,
        *,
        tolerance: timedelta = DEFAULT_TOLERANCE,
        backoff_initial: float = 30.0,
        backoff_max: float = 3600.0,
        hook_concurrency: int = 2,
        output_filter: Callable[[str], str] | None = None,
        clock: Callable[[], datetime] = _utc_now,
        removed: Callable[[str, Path], bool] | None = None,
        places: Callable[[str], HookPlaces] | None = None,
    ) -> None:
        if hook is not None:
            validate_hook_template(hook)
        if hook_timeout <= 0 or backoff_initial <= 0 or backoff_max < backoff_initial or hook_concurrency < 1:
            raise ValueError("hook_timeout and backoff_initial must be > 0, backoff_max >= backoff_initial")
        self._store = store
        self._removed = removed  # (agent, workspace) -> the agent is gone: its gaps close, no hook runs
        self._places = places  # agent -> where its values may point (OpenClaw's config, read in a thread)
        self._hook: list[str] = list(hook) if hook else []  # empty: no hook configured
        self._hook_timeout = hook_timeout
        self._default_tz = default_tz
        self._log: Any = log if log is not None else structlog.get_logger()
        self._tolerance = tolerance
        self._backoff_initial = backoff_initial
        self._backoff_max = backoff_max
        self._hook_slots = asyncio.Semaphore(hook_concurrency)
        self._agent_locks: dict[str, asyncio.Lock] = {}
        self._output_filter = output_filter
        self._clock = clock
        self._tasks: dict[GapKey, asyncio.Task[None]] = {}
        self._recover_interrupted()

    # -- public API

    async def session_ended(
        self, agent_id: str, session_id: str, transcript: str, ended_at: datetime, workspace: Path
    ) -> Gap | None:
        """Check one ended session; return the Gap if this call found a NEW one, else None.

        A session already recorded (open or closed) is neither logged nor fired again.
        """
        require_aware(ended_at, "ended_at")
        key = GapKey(agent_id, session_id, to_millis(ended_at))
        if self._store.get(key) is not None:
            return None
        state = await self._state_time(workspace)
        if self._covers(state, key.ended_at):
            return None
        now = to_millis(self._clock())  # the store keeps milliseconds: return what it holds
        gap = Gap(
            agent_id=agent_id,
            session_id=session_id,
            transcript=transcript,
            ended_at=key.ended_at,
            state_time=None if state is None else to_millis(state),
            workspace=workspace,
            detected_at=now,
            next_attempt_at=now if self._hook else None,
        )
        if not self._store.insert(gap):
            return None  # reported twice concurrently: the other call owns it
        self._log.warning(
            "gap_detected",
            agent=agent_id,
            session=session_id,
            transcript=transcript,
            session_end=format_instant(gap.ended_at),
            state_time=instant_or_none(state),
            state_missing=state is None,
            workspace=str(workspace),
        )
        if self._hook:
            self._schedule(key, due_by=now)
        return gap

    async def startup_scan(self, sessions: Iterable[EndedSession], *, newest_only: bool = True) -> list[Gap]:
        """Check sessions that ended while the daemon was down; return the new gaps.

        With `newest_only` (default) only each agent's newest ended session is checked: the
        protocol's rule is about the last session, and checking every archive would fire one
        sync per historical session on a first run (or always, for an agent without STATE.md).
        Known gaps are never fired again.
        """
        chosen = list(sessions)
        if newest_only:
            newest: dict[str, EndedSession] = {}
            for session in chosen:
                current = newest.get(session.agent_id)
                if current is None or session.ended_at > current.ended_at:
                    newest[session.agent_id] = session
            chosen = list(newest.values())
        found: list[Gap] = []
        for session in sorted(chosen, key=lambda s: s.ended_at):
            gap = await self.session_ended(
                session.agent_id, session.session_id, session.transcript, session.ended_at, session.workspace
            )
            if gap is not None:
                found.append(gap)
        return found

    async def tick(self, now: datetime) -> None:
        """Close gaps whose STATE.md caught up; start hook retries that are due. Never raises."""
        require_aware(now, "now")
        cache: dict[Path, datetime | None] = {}
        for gap in self._store.open_gaps():
            try:
                if await self._close_if_covered(gap, now, cache) or await self._close_if_removed(gap, now):
                    continue
                due = gap.next_attempt_at is not None and gap.next_attempt_at <= now
                if self._hook and due and gap.key not in self._tasks:
                    self._schedule(gap.key, due_by=now)
            except Exception:
                self._log.exception("gap_tick_error", agent=gap.agent_id, session=gap.session_id)

    def open_gaps(self) -> list[Gap]:
        return self._store.open_gaps()

    async def wait_hooks(self) -> None:
        """Wait until no hook run is pending or running (tests; graceful shutdown)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks.values()), return_exceptions=True)

    async def shutdown(self, grace: float = 5.0) -> None:
        """Give running hooks `grace` seconds, then kill them (recorded `interrupted`, retried
        at the next start)."""
        tasks = list(self._tasks.values())
        if tasks:
            _done, pending = await asyncio.wait(tasks, timeout=grace)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)

    # -- internals

    def _covers(self, state: datetime | None, ended_at: datetime) -> bool:
        return state is not None and state >= ended_at - self._tolerance

    async def _state_time(self, workspace: Path) -> datetime | None:
        # A thread: STATE.md may sit on a slow or hung network filesystem.
        return await asyncio.to_thread(state_time, workspace / STATE_FILE, self._default_tz)

    async def _close_if_covered(
        self, gap: Gap, now: datetime, cache: dict[Path, datetime | None] | None = None
    ) -> bool:
        if cache is not None and gap.workspace in cache:
            state = cache[gap.workspace]
        else:
            state = await self._state_time(gap.workspace)
            if cache is not None:
                cache[gap.workspace] = state
        if not self._covers(state, gap.ended_at):
            return False
        self._store.close_gap(gap.key, now)
        self._log.info(
            "gap_closed",
            agent=gap.agent_id,
            session=gap.session_id,
            session_end=format_instant(gap.ended_at),
            state_time=instant_or_none(state),
            delay_s=round((now - gap.ended_at).total_seconds(), 3),
            hook_attempts=gap.hook_attempts,
        )
        return True

    async def _close_if_removed(self, gap: Gap, now: datetime) -> bool:
        """An agent deleted since its gap opened (`openclaw agents delete` ends its sessions first, then takes
        it out of the roster): no one is left to sync, so the gap closes and its hook is not run again."""
        if self._removed is None or not await asyncio.to_thread(self._removed, gap.agent_id, gap.workspace):
            return False
        self._store.close_gap(gap.key, now)
        self._log.info("gap_closed", agent=gap.agent_id, session=gap.session_id,
                       session_end=format_instant(gap.ended_at), reason="agent_removed",
                       hook_attempts=gap.hook_attempts)
        return True

    def _backoff(self, attempt: int) -> timedelta:
        return timedelta(seconds=min(self._backoff_max, self._backoff_initial * 2 ** max(0, attempt - 1)))

    def _recover_interrupted(self) -> None:
        # A hook still "running" in the store was cut off by a crash. Its next_attempt_at was
        # set when it started to start + timeout + backoff, so the retry cannot overlap it.
        for gap in self._store.open_gaps():
            if gap.last_hook_status == "running":
                self._store.set_hook_state(
                    gap.key, attempts=gap.hook_attempts, status="interrupted", next_attempt_at=gap.next_attempt_at
                )
                self._log.warning(
                    "gap_hook_interrupted",
                    agent=gap.agent_id,
                    session=gap.session_id,
                    retry_at=instant_or_none(gap.next_attempt_at),
                )

    def _schedule(self, key: GapKey, *, due_by: datetime) -> None:
        task = asyncio.create_task(self._hook_task(key, due_by), name=f"gap-hook:{key.agent_id}:{key.session_id}")
        self._tasks[key] = task

        def done(finished: asyncio.Task[None]) -> None:
            if self._tasks.get(key) is finished:
                del self._tasks[key]
            if not finished.cancelled() and finished.exception() is not None:
                self._log.error(
                    "gap_hook_error", agent=key.agent_id, session=key.session_id, error=repr(finished.exception())
                )

        task.add_done_callback(done)

    def _hook_values(self, gap: Gap) -> dict[str, str]:
        return {
            "agent": gap.agent_id,
            "session_id": gap.session_id,
            "transcript": gap.transcript,
            "ended_at": format_instant(gap.ended_at),
            "workspace": str(gap.workspace),
            "state_time": instant_or_none(gap.state_time) or "",
        }

    async def _refusal(self, values: dict[str, str]) -> HookRefusal | None:
        # The shapes first: a hostile agent id never reaches a lookup of its places.
        refusal = refuse_hook_values(values)
        if refusal is None and self._places is not None:
            places = await asyncio.to_thread(self._places, values["agent"])
            refusal = refuse_hook_values(values, places)
        return refusal

    async def _hook_task(self, key: GapKey, due_by: datetime) -> None:
        lock = self._agent_locks.setdefault(key.agent_id, asyncio.Lock())
        async with lock, self._hook_slots:
            # Re-read under the lock: while this task waited, another run may have finished.
            gap = self._store.get(key)
            if gap is None or not gap.is_open or gap.next_attempt_at is None or gap.next_attempt_at > due_by:
                return
            if await self._close_if_covered(gap, self._clock()):
                return
            values = self._hook_values(gap)
            if refusal := await self._refusal(values):
                # The gap stays recorded (status, /health); the hook never runs for it, and is not retried.
                self._store.set_hook_state(key, attempts=gap.hook_attempts, status="refused", next_attempt_at=None)
                shown = {"agent": key.agent_id} if refusal.field != "agent" else {}
                if refusal.field not in ("agent", "session_id"):
                    shown["session"] = key.session_id
                self._log.warning("gap_hook_refused", field=refusal.field, reason=refusal.reason, **shown)
                return
            attempt = gap.hook_attempts + 1
            started = self._clock()
            self._store.set_hook_state(
                key,
                attempts=attempt,
                status="running",
                next_attempt_at=started + timedelta(seconds=self._hook_timeout + KILL_GRACE_S) + self._backoff(attempt),
            )
            argv = render_hook_argv(self._hook, values)
            try:
                result = await run_hook(argv, self._hook_timeout, env=hook_environment(values))
            except asyncio.CancelledError:
                self._store.set_hook_state(key, attempts=attempt, status="interrupted", next_attempt_at=self._clock())
                self._log.warning("gap_hook_interrupted", agent=key.agent_id, session=key.session_id)
                raise
            finished = self._clock()
            tail = self._output_filter(result.output_tail) if self._output_filter else result.output_tail
            current = self._store.get(key)
            still_open = current is not None and current.is_open
            fields = {
                "agent": key.agent_id,
                "session": key.session_id,
                "attempt": attempt,
                "exit_status": result.exit_status,
                "output_tail": tail,
                "duration_s": round(result.duration_s, 3),
            }
            if result.status == "ok":
                self._store.set_hook_state(key, attempts=attempt, status="ok", next_attempt_at=None)
                self._log.info("gap_hook_finished", **fields)
                return
            retry_at = finished + self._backoff(attempt) if still_open else None
            self._store.set_hook_state(key, attempts=attempt, status=result.status, next_attempt_at=retry_at)
            self._log.warning(
                "gap_hook_failed",
                reason=result.status,
                retry_at=instant_or_none(retry_at),
                retry_in_s=self._backoff(attempt).total_seconds() if retry_at else None,
                **fields,
            )
