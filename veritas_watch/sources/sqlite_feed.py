"""Follows every agent's `openclaw-agent.sqlite`: one read-only reader per database, cursors per session.

Synchronous parts (poll, commit) run in worker threads; the daemon awaits each poll's work being
stored before it polls again, so a session's read position and committed cursor never diverge.
Each session's persisted state is the reader's `SessionCursor` plus what the transforms learned
(cron or not, heartbeat turn, last entry time, entries in the current conversation) and the
conversation ends not yet handed to gap detection.

When a conversation ends (OpenClaw 2026.9 does not open a new session on `/new` or `/reset`: it
appends a `reset` event to the same one): a `reset` event read (`Transformed.ends`), the session
deleted (its window and rows vanish), or its key moved on to another window (a rollover). The end is
committed with the cursor, in one transaction, and handed on once by `ended_sessions`. A finished
run (`session_windows.ended_at`, status 'done') is not an end: OpenClaw sets it after every run.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import structlog

from veritas_watch.model import ConversationEnd, SessionState, restore_turn
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


@dataclass(frozen=True, slots=True)
class SqliteSource:
    """One agent database as `status` sees it: its committed session states and rows not yet read."""

    agent_id: str
    states: Mapping[str, Mapping[str, object]]  # session id -> committed state
    lag_rows: int = 0


def sqlite_agent_id(db: str) -> str:
    """`<state>/agents/<id>/agent/openclaw-agent.sqlite` -> `<id>`."""
    return Path(db).parent.parent.name


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
        self._agents: dict[str, str] = {}  # db -> agent id

    def poll(self, path: Path, agent_id: str) -> SqlitePoll | None:
        """One poll of one database (worker thread). Errors are logged once and retried with backoff."""
        db = str(path)
        health = self.health.setdefault(db, SourceHealth())
        if time.monotonic() < health.next_try:
            return None
        reader = self._readers.get(db)
        if reader is None:
            reader = self._readers[db] = SqliteTranscriptReader(path, agent_id)
            self._agents[db] = agent_id
            self.states[db] = self._cursors.load_sqlite(db)
            log.info("sqlite_source_added", agent=agent_id, db=db)
        cursors = {}
        for sid, state in self.states[db].items():
            if state.get("vanished"):
                continue  # deleted: nothing to read
            try:
                cursors[sid] = SessionCursor.from_dict(state)
            except ValueError as exc:
                log.error("cursor_corrupt", db=db, session_id=sid, error=str(exc), policy="re-read this session")
        try:
            result = reader.poll(cursors)
        except SqliteSourceError as exc:
            if health.error != exc.reason:
                # A database never read yet and without tables is OpenClaw creating it: worth a note, not a warning.
                creating = exc.reason == "schema_missing" and health.schema_version is None
                (log.info if creating else log.warning)(
                    "sqlite_source_error", agent=agent_id, db=db, reason=exc.reason, detail=exc.detail[:300],
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

    def sources(self) -> list[SqliteSource]:
        """What `status` shows of each database: its agent, committed session states and lag."""
        return [SqliteSource(self._agents.get(db) or sqlite_agent_id(db), dict(states),
                             h.lag_rows if (h := self.health.get(db)) is not None else 0)
                for db, states in list(self.states.items())]

    def session_state(self, db: str, batch: SessionBatch) -> SessionState:
        facts = {} if batch.rewalk else self.states.get(db, {}).get(batch.session_id, {})

        def text(key: str) -> str | None:
            value = facts.get(key)
            return value if isinstance(value, str) else None

        return SessionState(
            session_id=batch.point_session_id,
            session_kind=text("session_kind") or "unknown",
            last_entry_ts=text("last_entry_ts"),
            turn=restore_turn(facts.get("turn")),
            previous_text=text("previous_text"),
            conversation_entries=_int(facts.get("conversation_entries")) or 0,
        )

    def unit_for(self, db: str, batch: SessionBatch, state: SessionState,
                 ends: Sequence[ConversationEnd] = ()) -> SqliteUnit:
        previous = self.states.get(db, {}).get(batch.session_id, {})
        if previous.get("vanished"):
            if batch.cursor is None:
                return SqliteUnit(db, batch.session_id, previous)
            previous = {}  # the session came back (restored from an archive): read it as a new one
        pending = _pending(previous)
        if batch.cursor is None:
            # The session was deleted: its last conversation ended. The state is marked vanished (no
            # cursor any more) and, once `ended_sessions` has handed that end on, kept as a tombstone:
            # its memories stay, and so does its last entry time for `status`.
            if not previous:
                return SqliteUnit(db, batch.session_id, None)
            if _int(previous.get("conversation_entries")) and not previous.get("ended_reported"):
                pending.append(ConversationEnd(
                    str(previous.get("point_session_id") or batch.session_id), _str(previous.get("last_entry_ts")),
                    _str(previous.get("session_kind")) or "unknown", "deleted", f"{db}#{batch.session_id}"))
            return SqliteUnit(db, batch.session_id, {**previous, "vanished": True, "pending_ends": _dump(pending)})
        # A rewalk reads the session again from its first row: its resets come again, and only the
        # ones past what was already handed on are new.
        handed = _int(previous.get("ends_through_seq"))
        pending += [e for e in ends if e.seq is None or handed is None or e.seq > handed]
        new_state: dict[str, object] = {**batch.cursor.to_dict(), "session_kind": state.session_kind,
                                        "turn": state.turn, "last_entry_ts": state.last_entry_ts,
                                        "previous_text": state.previous_text,
                                        "conversation_entries": state.conversation_entries,
                                        "point_session_id": batch.point_session_id,
                                        "ended_reported": bool(previous.get("ended_reported")) and not batch.rewalk,
                                        "ends_through_seq": handed,
                                        "pending_ends": _dump(pending)}
        return SqliteUnit(db, batch.session_id, new_state)

    def commit(self, units: Sequence[SqliteUnit]) -> None:
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

    def ended_sessions(self, db: str) -> list[ConversationEnd]:
        """Conversations that ended and are fully stored, each returned once (durably marked handed on)."""
        health = self.health.get(db)
        infos = health.infos if health is not None else {}
        ends: list[ConversationEnd] = []
        changed: dict[str, dict[str, object]] = {}
        for sid, state in list(self.states.get(db, {}).items()):
            pending = _pending(state)
            info = infos.get(sid)
            last_seq = info["last_seq"] if info else None
            drained = not isinstance(last_seq, int) or _next_seq(state) > last_seq
            if info and info["ended"] and drained and not state.get("ended_reported") and not state.get("vanished"):
                state["ended_reported"] = True
                changed[sid] = state
                if _int(state.get("conversation_entries")):
                    pending.append(ConversationEnd(
                        str(state.get("point_session_id") or sid), _str(state.get("last_entry_ts")),
                        _str(state.get("session_kind")) or "unknown", "moved_on", f"{db}#{sid}"))
            if pending:
                ends.extend(pending)
                seqs = [e.seq for e in pending if e.seq is not None]
                if seqs:
                    state["ends_through_seq"] = max([*seqs, _int(state.get("ends_through_seq")) or -1])
                state["pending_ends"] = []
                changed[sid] = state
            if state.get("vanished") and len(state) > len(_TOMBSTONE_KEYS):
                changed[sid] = self.states[db][sid] = {k: state.get(k) for k in _TOMBSTONE_KEYS}
        if changed:
            self._cursors.commit_sqlite(db, changed)
        return ends

    def close(self) -> None:
        for reader in self._readers.values():
            reader.close()


_TOMBSTONE_KEYS = ("vanished", "point_session_id", "last_entry_ts")  # what a deleted session leaves


def _next_seq(state: dict[str, object]) -> int:
    value = state.get("next_seq", 0)
    return value if isinstance(value, int) else 0


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _str(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _pending(state: dict[str, object]) -> list[ConversationEnd]:
    """The ends a session's cursor holds, not yet handed on (malformed entries are dropped)."""
    raw = state.get("pending_ends")
    ends = []
    for item in raw if isinstance(raw, list) else []:
        if not isinstance(item, dict):
            continue
        session_id, transcript = _str(item.get("session_id")), _str(item.get("transcript"))
        if session_id and transcript:
            ends.append(ConversationEnd(session_id, _str(item.get("ended_at")),
                                        _str(item.get("session_kind")) or "unknown",
                                        _str(item.get("reason")) or "reset", transcript, _int(item.get("seq"))))
    return ends


def _dump(ends: Sequence[ConversationEnd]) -> list[dict[str, object]]:
    return [dataclasses.asdict(e) for e in ends]


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
