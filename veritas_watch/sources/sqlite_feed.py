"""Follows every agent's `openclaw-agent.sqlite`: one read-only reader per database, cursors per session.

Synchronous parts (poll, commit) run in worker threads; the daemon awaits each poll's work being
stored before it polls again, so a session's read position and committed cursor never diverge.
Each session's persisted state is the reader's `SessionCursor` plus what the transforms learned
(cron or not, heartbeat turn, last entry time) and whether its end was reported.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import structlog

from veritas_watch.model import SessionState
from veritas_watch.sinks.store import Store
from veritas_watch.sources.cursors import CursorStore
from veritas_watch.sources.sqlite import (
    SessionBatch,
    SessionCursor,
    SqlitePoll,
    SqliteSourceError,
    SqliteTranscriptReader,
)

log = structlog.get_logger()

@dataclass
class SqliteUnit:
    """What to commit for one session batch once its chunks are stored."""

    db: str
    session_id: str
    state: dict[str, object] | None  # None: forget the session's cursor


@dataclass
class SourceHealth:
    schema_version: int | None = None
    sessions: int = 0
    lag_rows: int = 0
    error: str | None = None
    next_try: float = 0.0
    backoff: float = 1.0
    infos: dict[str, dict[str, object]] = field(default_factory=dict)


class SqliteFeed:
    def __init__(self, cursors: CursorStore) -> None:
        self._cursors = cursors
        self._readers: dict[str, SqliteTranscriptReader] = {}
        self.states: dict[str, dict[str, dict[str, object]]] = {}
        self.health: dict[str, SourceHealth] = {}

    def poll(self, path: Path, agent_id: str) -> SqlitePoll | None:
        """One poll of one database (worker thread). Errors are logged once and retried with backoff."""
        db = str(path)
        health = self.health.setdefault(db, SourceHealth())
        if time.monotonic() < health.next_try:
            return None
        reader = self._readers.get(db)
        if reader is None:
            reader = self._readers[db] = SqliteTranscriptReader(path, agent_id)
            self.states[db] = self._cursors.load_sqlite(db)
            log.info("sqlite_source_added", agent=agent_id, db=db)
        cursors = {}
        for sid, state in self.states[db].items():
            try:
                cursors[sid] = SessionCursor.from_dict(state)
            except ValueError as exc:
                log.error("cursor_corrupt", db=db, session_id=sid, error=str(exc), policy="re-read this session")
        try:
            result = reader.poll(cursors)
        except SqliteSourceError as exc:
            if health.error != exc.reason:
                log.warning("sqlite_source_error", agent=agent_id, db=db, reason=exc.reason, detail=exc.detail[:300],
                            retry_in_s=health.backoff)
            health.error = exc.reason
            health.next_try = time.monotonic() + health.backoff
            health.backoff = min(health.backoff * 2, 60.0)
            return None
        if health.error is not None:
            log.info("sqlite_source_recovered", agent=agent_id, db=db)
        health.error, health.backoff = None, 1.0
        health.schema_version = result.schema.schema_version
        if not result.unchanged:
            health.sessions = len(result.sessions)
            health.infos = {s.session_id: {"ended": s.ended, "last_seq": s.last_seq} for s in result.sessions}
        health.lag_rows = self._lag(db)
        for error in (e for batch in result.batches for e in batch.errors):
            log.warning("line_invalid", file=db, session_id=error.session_id, seq=error.seq, reason=error.reason)
        return result

    def _lag(self, db: str) -> int:
        """Rows written but not yet committed, over all sessions of one database."""
        lag = 0
        for sid, info in self.health[db].infos.items():
            last_seq = info["last_seq"]
            if isinstance(last_seq, int):
                lag += max(0, last_seq + 1 - _next_seq(self.states.get(db, {}).get(sid, {})))
        return lag

    def session_state(self, db: str, batch: SessionBatch) -> SessionState:
        facts = {} if batch.rewalk else self.states.get(db, {}).get(batch.session_id, {})

        def text(key: str) -> str | None:
            value = facts.get(key)
            return value if isinstance(value, str) else None

        return SessionState(
            session_id=batch.point_session_id,
            session_kind=text("session_kind") or "unknown",
            last_entry_ts=text("last_entry_ts"),
            turn="background" if facts.get("turn") == "background" else "conversation",
            previous_text=text("previous_text"),
        )

    def unit_for(self, db: str, batch: SessionBatch, state: SessionState) -> SqliteUnit:
        if batch.cursor is None:
            return SqliteUnit(db, batch.session_id, None)
        previous = self.states.get(db, {}).get(batch.session_id, {})
        new_state: dict[str, object] = {**batch.cursor.to_dict(), "session_kind": state.session_kind,
                                        "turn": state.turn, "last_entry_ts": state.last_entry_ts,
                                        "previous_text": state.previous_text,
                                        "point_session_id": batch.point_session_id,
                                        "ended_reported": bool(previous.get("ended_reported")) and not batch.rewalk}
        return SqliteUnit(db, batch.session_id, new_state)

    def commit(self, units: list[SqliteUnit]) -> None:
        """After the store acked: persist, then make the new states the read positions."""
        by_db: dict[str, list[SqliteUnit]] = {}
        for unit in units:
            by_db.setdefault(unit.db, []).append(unit)
        for db, group in by_db.items():
            states = {u.session_id: u.state for u in group if u.state is not None}
            removed = [u.session_id for u in group if u.state is None]
            self._cursors.commit_sqlite(db, states, removed)
            known = self.states.setdefault(db, {})
            known.update(states)
            for sid in removed:
                known.pop(sid, None)

    def ended_sessions(self, db: str) -> list[tuple[str, dict[str, object]]]:
        """Sessions whose window ended and that are fully read, not yet reported: mark them reported."""
        health = self.health.get(db)
        if health is None:
            return []
        ended = []
        for sid, state in self.states.get(db, {}).items():
            info = health.infos.get(sid)
            if not info or not info["ended"] or state.get("ended_reported"):
                continue
            last_seq = info["last_seq"]
            if isinstance(last_seq, int) and _next_seq(state) <= last_seq:
                continue  # not drained yet
            state["ended_reported"] = True
            ended.append((sid, state))
        if ended:
            self._cursors.commit_sqlite(db, dict(ended))
        return ended

    def close(self) -> None:
        for reader in self._readers.values():
            reader.close()


def _next_seq(state: dict[str, object]) -> int:
    value = state.get("next_seq", 0)
    return value if isinstance(value, int) else 0


def stale_point_cleanup(db: str, agent_id: str, batch: SessionBatch) -> Callable[[Store], None] | None:
    """After a rewrite: remove this session's SQLite points whose event no longer exists."""
    present = batch.present_event_ids
    if present is None:
        return None
    prefix = f"{db}#{batch.session_id}:"

    def cleanup(store: Store) -> None:
        stale = [pid for pid, payload, _ in store.scroll(agent_id, session_id=batch.point_session_id)
                 if str(payload.get("source", "")).startswith(prefix) and payload.get("entry_id") not in present]
        if stale:
            store.delete(stale)
            log.info("stale_points_removed", agent=agent_id, db=db, session_id=batch.session_id, points=len(stale),
                     reason=batch.rewalk_reason)

    return cleanup
