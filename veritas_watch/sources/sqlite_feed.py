"""Follows every agent's `openclaw-agent.sqlite`: one read-only reader per agent's sessions in a database
(`openclaw.TranscriptDb`; usually one database per agent), cursors per session.

Synchronous parts (poll, commit) run in worker threads; the daemon awaits each poll's work being
stored before it polls again, so a session's read position and committed cursor never diverge.
Each session's persisted state is a `cursors.SqliteCursor`: the reader's `SessionCursor`, what the
transforms learned (`model.SessionState`: cron or not, heartbeat turn, last entry time, entries in the
current conversation) and the conversation ends not yet handed to gap detection.

When a conversation ends (OpenClaw 2026.9 does not open a new session on `/new` or `/reset`: it
appends a `reset` event to the same one): a `reset` event read (`Transformed.ends`), the session
deleted (its window and rows vanish), or its key moved on to another window (a rollover). The end is
committed with the cursor, in one transaction, and handed on once by `ended_sessions`. A finished
run (`session_windows.ended_at`, status 'done') is not an end: OpenClaw sets it after every run.
"""

from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import Callable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from pathlib import Path

import structlog

from veritas_watch.admission import FORGOTTEN, AdmissionPolicy, reason_counts, still_excluded
from veritas_watch.model import ConversationEnd, SessionState
from veritas_watch.openclaw import AgentDirs, TranscriptDb
from veritas_watch.sinks.store import Store
from veritas_watch.sources.cursors import CursorStore, SqliteCursor
from veritas_watch.sources.sqlite import (
    DEFAULT_MAX_BYTES,
    SessionBatch,
    SqlitePoll,
    SqliteSourceError,
    SqliteTranscriptReader,
    event_entry_id,
)

log = structlog.get_logger()

# Seconds a deleted excluded session stays kept out with no archive of it seen: OpenClaw writes the deletion
# archive from the rows, deletes them, then renames the archive into place (a worker's publish step).
DELETION_ARCHIVE_GRACE = 60.0

@dataclass
class SqliteUnit:
    """What to commit for one session batch once its chunks are stored."""

    db: str  # TranscriptDb.key
    session_id: str
    state: SqliteCursor | None  # None: forget the session's cursor


@dataclass(frozen=True, slots=True)
class SqliteSource:
    """One agent database as `status` sees it: its committed session states and rows not yet read."""

    agent_id: str
    states: Mapping[str, SqliteCursor]  # session id -> committed state
    lag_rows: int = 0


@dataclass
class SourceHealth:
    schema_version: int | None = None
    sessions: int = 0
    lag_rows: int = 0
    error: str | None = None
    next_try: float = 0.0
    backoff: float = 1.0
    infos: dict[str, dict[str, object]] = field(default_factory=dict)
    forgotten: frozenset[str] = frozenset()  # never read again: no lag
    other_agents: frozenset[str] = frozenset()  # whose sessions the database holds besides this agent's
    excluded: Mapping[str, str] = field(default_factory=dict)  # kept out by the admission policy: no lag

    def exclusions(self) -> dict[str, int]:
        """Sessions kept out of memory, counted by reason (`forgotten` included)."""
        return reason_counts([*self.excluded.values(), *(FORGOTTEN for _ in self.forgotten)])


class SqliteFeed:
    """Every state below is keyed by `TranscriptDb.key` (one agent's sessions in one database)."""

    def __init__(self, cursors: CursorStore) -> None:
        self._cursors = cursors
        self._readers: dict[str, SqliteTranscriptReader] = {}
        self.states: dict[str, dict[str, SqliteCursor]] = {}
        self.health: dict[str, SourceHealth] = {}
        self._dbs: dict[str, TranscriptDb] = {}
        self._forgotten_done: dict[str, set[str]] = {}  # key -> forgotten sessions removed by this process
        # Agents found in another agent's database (a shared `session.store`): polled like the others.
        self._shared: dict[str, TranscriptDb] = {}
        # db -> session -> reason logged: the sessions its last poll found excluded, so it holds no more than that
        self._excluded_told: dict[str, dict[str, str]] = {}
        # db -> sessions seen excluded and not admitted since: kept after the session is deleted (its window
        # gone, its metadata with it), so its deletion archive is not read while this process remembers it;
        # a deleted one is let go once no archive of it is left (`let_go`)
        self._kept_out: dict[str, dict[str, str]] = {}  # db -> session -> reason
        self._gone: dict[str, dict[str, float]] = {}  # db -> kept-out session -> when its poll first missed it

    def poll(self, source: TranscriptDb, max_bytes: int = DEFAULT_MAX_BYTES, *, policy: AdmissionPolicy | None = None,
             forgotten: AbstractSet[str] = frozenset()) -> SqlitePoll | None:
        """One poll of one agent's sessions in one database, up to `max_bytes` of events (worker thread),
        leaving out what `policy` excludes and the agent's sessions forgotten with `veritas-watch forget`
        (`forgotten`). Errors are logged once and retried with backoff."""
        db, agent_id, path = source.key, source.agent_id, source.path
        health = self.health.setdefault(db, SourceHealth())
        if time.monotonic() < health.next_try:
            return None
        reader = self._readers.get(db)
        if reader is None:
            reader = self._readers[db] = SqliteTranscriptReader(path, agent_id, key=db)
            self._dbs[db] = source
            self.states[db] = self._cursors.load_sqlite(db)
            log.info("sqlite_source_added", agent=agent_id, db=str(path))
        # A deleted session has nothing to read; one whose stored position did not decode is read again.
        cursors = {sid: state.position for sid, state in self.states[db].items()
                   if not state.vanished and state.position is not None}
        starts = unknown_starts(self.states[db])
        try:
            result = reader.poll(cursors, max_bytes=max_bytes, policy=policy, forgotten=forgotten, starts=starts)
        except SqliteSourceError as exc:
            if health.error != exc.reason:
                # A database never read yet and without tables is OpenClaw creating it: worth a note, not a warning.
                creating = exc.reason == "schema_missing" and health.schema_version is None
                (log.info if creating else log.warning)(
                    "sqlite_source_error", agent=agent_id, db=str(path), reason=exc.reason, detail=exc.detail[:300],
                    retry_in_s=health.backoff)
            health.error = exc.reason
            health.next_try = time.monotonic() + health.backoff
            health.backoff = min(health.backoff * 2, 60.0)
            return None
        if health.error is not None:
            log.info("sqlite_source_recovered", agent=agent_id, db=str(path))
        health.error, health.backoff = None, 1.0
        health.schema_version = result.schema.schema_version
        health.forgotten = result.forgotten
        health.other_agents = result.other_agents
        health.excluded = result.excluded
        present = {s.session_id for s in result.sessions}
        kept, now = self._kept_out.setdefault(db, {}), policy or AdmissionPolicy()
        gone = self._gone.setdefault(db, {})
        for sid, reason in list(kept.items()):  # admitted now: present and not excluded, or the rule went
            if (sid in present and sid not in result.excluded) or not still_excluded(reason, now):
                del kept[sid]
                gone.pop(sid, None)
            elif sid not in present:
                gone.setdefault(sid, time.monotonic())
        kept.update(result.excluded)
        for sid in result.excluded:
            gone.pop(sid, None)
        told = self._excluded_told.get(db, {})
        for sid, reason in sorted(result.excluded.items()):
            if told.get(sid) != reason:  # once while the session stays excluded for that reason, not every sweep
                log.info("session_excluded", agent=agent_id, session=sid, reason=reason, db=str(path))
        self._excluded_told[db] = dict(result.excluded)  # a session deleted or admitted since is let go
        if not result.unchanged:
            health.sessions = len(result.sessions)
            health.infos = {s.session_id: {"ended": s.ended, "last_seq": s.last_seq} for s in result.sessions}
        health.lag_rows = self._lag(db)
        self._learn_starts(db, starts, result.start_ids)
        for error in (e for batch in result.batches for e in batch.errors):
            log.warning("line_invalid", file=str(path), session_id=error.session_id, seq=error.seq,
                        reason=error.reason)
        for other in sorted(result.other_agents):
            found = TranscriptDb(path, other)
            if found.key not in self._dbs and found.key not in self._shared:
                log.info("shared_database_agent", db=str(path), agent=other, found_by=agent_id)
                self._shared[found.key] = found
        return result

    def _learn_starts(self, db: str, asked: Mapping[str, int], found: Mapping[str, str]) -> None:
        """Keep the reset ids a poll read for cursors written before `conversation_start_id` (`unknown_starts`),
        durably now: the poll read them where the session's rows are still the ones its cursor consumed, so a
        restore from now on is judged by id. Each session's is read once (then known); one whose rows a restore
        changed before this process first polled it stays unknown (`lost_conversation`)."""
        states = self.states[db]
        learned = {sid: dataclasses.replace(state, conversation_start_id=found[sid]) for sid, seq in asked.items()
                   if sid in found and (state := states.get(sid)) is not None
                   and state.conversation_start_id is None and state.session.conversation_start == seq}
        if learned:
            self._cursors.commit_sqlite(db, learned)
            states.update(learned)

    def _lag(self, db: str) -> int:
        """Rows written but not yet committed, over all sessions of one database."""
        lag = 0
        health = self.health[db]
        for sid, info in health.infos.items():
            last_seq = info["last_seq"]
            if sid in health.forgotten or sid in health.excluded:
                continue
            if isinstance(last_seq, int):
                state = self.states.get(db, {}).get(sid)
                lag += max(0, last_seq + 1 - (state.next_seq if state is not None else 0))
        return lag

    def sources(self) -> list[SqliteSource]:
        """What `status` shows of each database: its agent, committed session states and lag."""
        return [SqliteSource(TranscriptDb.from_key(db).agent_id, dict(states),
                             h.lag_rows if (h := self.health.get(db)) is not None else 0)
                for db, states in list(self.states.items())]

    def sources_to_poll(self, found: Sequence[TranscriptDb]) -> list[TranscriptDb]:
        """`found` (`openclaw.transcript_dbs`), then the agents found in another agent's database. A database
        no longer found (its agent deleted, a `session.store` changed) keeps its cursors but not its connection
        (opened again if it comes back)."""
        keys = {db.key for db in found}
        polled = [*found, *(db for key, db in self._shared.items() if key not in keys)]
        wanted = {db.key for db in polled}
        for key, reader in self._readers.items():
            if key not in wanted:
                reader.close()
                self._excluded_told.pop(key, None)
        return polled

    def directories_elsewhere(self) -> list[Path]:
        """The directories of the databases followed outside the canonical layout (to watch)."""
        return sorted({db.path.parent for db in self._dbs.values() if not db.canonical})

    def archive_dirs(self) -> list[AgentDirs]:
        """Where the archives of sessions deleted from databases outside the canonical layout (a
        `session.store`) are: OpenClaw writes them beside the database. An archive names no agent, so only a
        directory that is one agent's: each database there is one a `sessions.json`-style store gives that
        agent (`openclaw-agent[.<id>[.<n>]].sqlite`; a store ending in `.sqlite` is every agent's), polled,
        and holding no other agent's sessions."""
        by_dir: dict[Path, tuple[set[str], Path]] = {}
        # `_dbs` only: an agent found in a database not polled yet lives in a directory its owner's
        # database already disqualifies (that owner's poll found another agent there).
        for key, source in self._dbs.items():
            if source.canonical:
                continue
            health = self.health.get(key)
            owners, _ = by_dir.setdefault(source.path.parent, (set(), source.path))
            owners.add(source.agent_id)
            if (health is None or health.schema_version is None or health.other_agents
                    or not partition_name(source.path.name, source.agent_id)):
                owners.add("")  # not read yet, or shared: no one's
        return [AgentDirs(agent, directory, db) for directory, (owners, db) in sorted(by_dir.items())
                if len(owners) == 1 and (agent := next(iter(owners)))]

    def forgetting(self, poll: SqlitePoll) -> list[tuple[SqliteUnit, Callable[[Store], None]]]:
        """Sessions the person had OpenClaw forget (`openclaw memory forget`): for each one this process has
        not forgotten yet or that still has a cursor, the removal of its points, then the end of its cursor
        (committed once they are gone). The reader reads a forgotten session no more and the transforms drop
        any other copy of it (`forgotten`), so nothing brings it back; no end of it is reported."""
        db = poll.key
        states = self.states.get(db, {})
        done = self._forgotten_done.setdefault(db, set())
        due = sorted(sid for sid in poll.forgotten if sid in states or sid not in done)
        done.update(due)  # once per process: after a restart each is looked for again (a cheap, empty scroll)
        # the id its points carry: the session header's (the same as OpenClaw's own for what it writes)
        point_ids = {sid: (states[sid].session.session_id if sid in states else None) or sid for sid in due}
        return [(SqliteUnit(db, sid, None), forget_points(poll.agent_id, poll.db_path, sid, point_ids[sid]))
                for sid in due]

    def kept_out(self, agent_id: str) -> frozenset[str]:
        """The agent's sessions the admission policy excludes, deleted ones included (as far as this process saw)."""
        return frozenset(sid for db, kept in self._kept_out.items() if self._dbs[db].agent_id == agent_id
                         for sid in kept)

    def let_go(self, archived: AbstractSet[tuple[str, str]], now: float | None = None) -> None:
        """Once a sweep, with the (agent, session) of the kept-out archives it found: a deleted excluded session
        is remembered while an archive of it is on disk (it stays unread), and let go once none is left, so
        what is remembered does not grow with every excluded session ever deleted. OpenClaw publishes the
        archive after the rows are gone, so a session missed for less than DELETION_ARCHIVE_GRACE is kept."""
        now = time.monotonic() if now is None else now
        for db, gone in self._gone.items():
            agent_id = self._dbs[db].agent_id
            for sid, since in list(gone.items()):
                if now - since >= DELETION_ARCHIVE_GRACE and (agent_id, sid) not in archived:
                    del gone[sid]
                    self._kept_out[db].pop(sid, None)

    def forgotten(self, agent_id: str) -> frozenset[str]:
        """The sessions forgotten in this agent's database, as its last poll saw them."""
        found: frozenset[str] = frozenset()
        for db, source in self._dbs.items():
            if source.agent_id == agent_id and (health := self.health.get(db)) is not None:
                found |= health.forgotten
        return found

    def session_state(self, db: str, batch: SessionBatch) -> SessionState:
        """What the transforms start this batch from: the committed session state (a fresh one for a rewalk,
        which reads the session again from its first row), under the id the session's points carry."""
        stored = None if batch.rewalk else self.states.get(db, {}).get(batch.session_id)
        base = stored.session if stored is not None else SessionState(None)
        return dataclasses.replace(base, session_id=batch.point_session_id)

    def unit_for(self, db: str, batch: SessionBatch, state: SessionState,
                 ends: Sequence[ConversationEnd] = ()) -> SqliteUnit:
        previous = self.states.get(db, {}).get(batch.session_id)
        if previous is not None and previous.vanished:
            if batch.cursor is None:
                return SqliteUnit(db, batch.session_id, previous)
            previous = None  # the session came back (restored from an archive): read it as a new one
        pending = list(previous.pending_ends) if previous is not None else []
        if batch.cursor is None:
            # The session was deleted: its last conversation ended. The state is marked vanished (no
            # cursor any more) and, once `ended_sessions` has handed that end on, kept as a tombstone:
            # its memories stay, and so does its last entry time for `status`.
            if previous is None:
                return SqliteUnit(db, batch.session_id, None)
            if previous.session.conversation_entries and not previous.ended_reported:
                pending.append(open_end(previous, batch.session_id, "deleted", self._path(db)))
            return SqliteUnit(db, batch.session_id, dataclasses.replace(previous, vanished=True, pending_ends=pending))
        # A rewalk reads the session again from its first row: its resets come again, and only the
        # ones past what was already handed on are new. After a restore the seqs past the restored rows
        # are new events': only the resets up to one the backup is known to hold were read before (a
        # reset the restore removed leaves them unknown: what is handed on again is the gap store's to
        # drop, same session, same end).
        restored = batch.rewalk_reason == "restored"
        handed = previous.ends_through_seq if previous is not None and not restored else None
        if restored and previous is not None:
            if lost_conversation(previous, batch.present_event_ids):
                pending.append(open_end(previous, batch.session_id, "restored", self._path(db)))
            elif start_held(previous, batch.present_event_ids):
                handed = previous.session.conversation_start
        pending += [e for e in ends if e.seq is None or handed is None or e.seq > handed]
        # A restore leaves a window whose end was handed on ended (the restored database has its key moved on
        # too): the conversation it holds last was handed on, by that end or by the reset that closed it. One
        # the restore made current again goes on, and its next move ends it.
        reported = previous is not None and previous.ended_reported and (
            not batch.rewalk or (restored and self._window_ended(db, batch.session_id)))
        return SqliteUnit(db, batch.session_id, SqliteCursor(
            batch.cursor, dataclasses.replace(state, session_id=batch.point_session_id),
            ended_reported=reported,
            ends_through_seq=handed, pending_ends=pending,
            conversation_start_id=conversation_start_id(batch, state, None if batch.rewalk else previous)))

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
        changed: dict[str, SqliteCursor] = {}
        for sid, state in list(self.states.get(db, {}).items()):
            pending = list(state.pending_ends)
            info = infos.get(sid)
            last_seq = info["last_seq"] if info else None
            drained = not isinstance(last_seq, int) or state.next_seq > last_seq
            if info and info["ended"] and drained and not state.ended_reported and not state.vanished:
                try:  # a rewind moves the key on to a session holding a copy of this one: the conversation goes on
                    continued = self._continued(db, sid)
                except SqliteSourceError:
                    continue  # asked again after the next poll
                state.ended_reported = True
                changed[sid] = state
                if state.session.conversation_entries and not continued:
                    pending.append(open_end(state, sid, "moved_on", self._path(db)))
            if pending:
                ends.extend(pending)
                seqs = [e.seq for e in pending if e.seq is not None]
                if seqs:
                    state.ends_through_seq = max([*seqs, state.ends_through_seq or -1])
                state.pending_ends = []
                changed[sid] = state
            if state.vanished and state != (tombstone := state.tombstone()):
                changed[sid] = self.states[db][sid] = tombstone
        if changed:
            self._cursors.commit_sqlite(db, changed)
        return ends

    def _window_ended(self, db: str, sid: str) -> bool:
        """Whether the last poll of `db` found the session's key moved on to another window."""
        health = self.health.get(db)
        info = health.infos.get(sid) if health is not None else None
        return bool(info and info["ended"])

    @staticmethod
    def _path(db: str) -> str:
        return str(TranscriptDb.from_key(db).path)

    def _continued(self, db: str, sid: str) -> bool:
        reader = self._readers.get(db)
        return reader is not None and reader.continued(sid)

    def close(self) -> None:
        for reader in self._readers.values():
            reader.close()


def partition_name(name: str, agent_id: str) -> bool:
    """Whether `name` is a database a `sessions.json`-style store gives `agent_id` (OpenClaw's
    `resolveCustomStoreSqlitePath`: the default agent's unsuffixed, another's `.<id>`, then `.<id>.<n>`)."""
    return re.fullmatch(rf"openclaw-agent(?:\.{re.escape(agent_id)}(?:\.[1-9][0-9]*)?)?\.sqlite", name) is not None


def open_end(state: SqliteCursor, sid: str, reason: str, db_path: str) -> ConversationEnd:
    """The end of a session's conversation that no event of the session marks (its window gone or moved on, or a
    restore that removed it): at its last entry's time, where its last row read is (`db#session:seq`; the session
    alone after a restore, whose rows at those seqs are other events or none)."""
    facts = state.session
    last = state.next_seq - 1 if state.position is not None and reason != "restored" else -1
    where = f"{db_path}#{sid}" + (f":{last}" if last >= 0 else "")
    return ConversationEnd(facts.session_id or sid, facts.last_entry_ts, facts.session_kind or "unknown", reason, where)


def lost_conversation(previous: SqliteCursor, present: AbstractSet[str] | None) -> bool:
    """Whether a restored backup removed the conversation `previous` was in (`present`: the event ids the restored
    session holds): one that began at a reset the restored database no longer holds (OpenClaw can then write other
    events at its seqs) was said after the backup, is held nowhere but in memory, and nothing in OpenClaw will end
    it. One begun where the restored database still holds it goes on there and ends as any other; one with nothing
    stored since its reset (it had ended), or whose window's end was handed on (`ended_reported`: its key had moved
    on), needs no end (again). A reset whose id is unknown (a cursor written before ids were kept, whose session
    was restored before this version first read it: `SqliteFeed._learn_starts`) counts as lost: the turns after the
    backup were lost in any case."""
    if not previous.session.conversation_entries or previous.session.conversation_start is None:
        return False
    return not previous.ended_reported and not start_held(previous, present)


def start_held(previous: SqliteCursor, present: AbstractSet[str] | None) -> bool:
    """Whether a restored session still holds (`present`: its event ids) the reset `previous`'s conversation began
    at, known by its id: then it holds every row before it too (a backup is all the database was then)."""
    start_id = previous.conversation_start_id
    return previous.session.conversation_start is not None and start_id is not None and start_id in (present or ())


def unknown_starts(states: Mapping[str, SqliteCursor]) -> dict[str, int]:
    """The sessions whose current conversation began at a reset read by a cursor written before its event id was
    kept (`conversation_start_id`): session id -> that reset's seq, for the reader to read its id."""
    return {sid: start for sid, state in states.items()
            if state.conversation_start_id is None and not state.vanished and state.position is not None
            and (start := state.session.conversation_start) is not None}


def conversation_start_id(batch: SessionBatch, state: SessionState, previous: SqliteCursor | None) -> str | None:
    """The event id of the reset the session's current conversation began at (`state.conversation_start`, a seq):
    read in this batch, else as `previous` (the committed state, None on a rewalk) kept it."""
    start = state.conversation_start
    if start is None:
        return None
    found = next((event_entry_id(r.data) for r in batch.records if r.source.seq == start), None)
    return found if found is not None else previous.conversation_start_id if previous is not None else None


def forget_points(agent_id: str, db: str, session_id: str, point_session_id: str) -> Callable[[Store], None]:
    """Remove every point of a forgotten session (its turns and its chunks, wherever they were read from)."""

    def cleanup(store: Store) -> None:
        ids = [pid for sid in dict.fromkeys((point_session_id, session_id))
               for pid, _, _ in store.scroll(agent_id, session_id=sid)]
        if ids:  # nothing to say when a restart finds nothing left
            store.delete(ids)
            log.info("session_forgotten", agent=agent_id, db=db, session_id=session_id, points=len(ids))

    return cleanup


def taken_back(points: Sequence[tuple[str, Mapping[str, object]]], present: AbstractSet[object]) -> list[str]:
    """Which of a rewritten session's stored points (id, payload) to remove: those whose event it no longer
    holds, except history trimmed from its front. `openclaw sessions compact --max-lines N` keeps the last N
    lines and archives nothing: what came before the oldest memory it kept is then held nowhere but here,
    and stays. A rewound or withdrawn answer goes from the tail, after what was kept; a session replaced by
    new events keeps none of its memories: both leave memory as the session now reads."""
    kept = [ts for _, payload in points if payload.get("entry_id") in present and (ts := _epoch(payload)) is not None]
    oldest_kept = min(kept, default=None)
    return [pid for pid, payload in points if payload.get("entry_id") not in present
            and (oldest_kept is None or (ts := _epoch(payload)) is None or ts >= oldest_kept)]


def _epoch(payload: Mapping[str, object]) -> float | None:
    ts = payload.get("ts")
    return float(ts) if isinstance(ts, int | float) and not isinstance(ts, bool) else None


def stale_point_cleanup(db: str, agent_id: str, batch: SessionBatch) -> Callable[[Store], None] | None:
    """On a rewalk, before its points are stored again: remove this session's SQLite points that the rewrite
    took back (`taken_back`; the store then holds only what was there before the rewrite). A database gone
    back in time (`restored`: a backup put in place) took nothing back: what was said since is held nowhere
    else now, and stays."""
    present = batch.present_event_ids
    if present is None:
        return None
    prefix = f"{db}#{batch.session_id}:"
    restored = batch.rewalk_reason == "restored"

    def cleanup(store: Store) -> None:
        points = [(pid, payload) for pid, payload, _ in store.scroll(agent_id, session_id=batch.point_session_id)
                  if str(payload.get("source", "")).startswith(prefix)]
        gone = sum(1 for _, payload in points if payload.get("entry_id") not in present)
        if restored:
            log.info("restored_points_kept", agent=agent_id, db=db, session_id=batch.session_id, points=gone)
            return
        stale = taken_back(points, present)
        if stale:
            store.delete(stale)
            log.info("stale_points_removed", agent=agent_id, db=db, session_id=batch.session_id, points=len(stale),
                     reason=batch.rewalk_reason)
        if gone > len(stale):
            log.info("trimmed_points_kept", agent=agent_id, db=db, session_id=batch.session_id,
                     points=gone - len(stale), reason=batch.rewalk_reason)

    return cleanup
