"""Forgetting a session everywhere veritas-watch wrote it: its memories (store points), its rows in the agent's
CREDENTIALS_INDEX.md and in the rows still waiting for a workspace, its vault entries, its gap records.

Two ways in: a session OpenClaw forgot (`openclaw memory forget --session`: a tombstone the SQLite reader reads,
`sources/sqlite_feed.SqliteFeed.forgetting`) and `veritas-watch forget --agent A --session S`. The second is
recorded in `<data_dir>/forgotten.sqlite3` before anything is erased: the daemon reads it at every sweep and
treats those sessions as OpenClaw's forgotten ones (never read again, from any copy; their points removed),
so neither a running daemon, a crash half-way nor a restart brings any of it back.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

import structlog

from veritas_watch.admission import AdmissionPolicy, PolicyReader
from veritas_watch.client import DaemonRefused
from veritas_watch.config import Config
from veritas_watch.features.credentials import (
    IndexKeptChanging,
    forget_index_rows,
    forget_pending_rows,
    forget_vault_entries,
)
from veritas_watch.features.gaps.store import GapStore
from veritas_watch.openclaw import InvalidAgentId, agent_workspace, iter_agents, transcript_dbs
from veritas_watch.safepath import make_dirs
from veritas_watch.sinks.store import Store
from veritas_watch.transport import MAX_COUNT_SESSIONS

log = structlog.get_logger()

REQUESTS_FILE = "forgotten.sqlite3"


class ForgetRequests:
    """`<data_dir>/forgotten.sqlite3`: the sessions a person had veritas-watch forget. Read cheaply every sweep
    (`PRAGMA data_version` says whether another process added one)."""

    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / REQUESTS_FILE
        self._db: sqlite3.Connection | None = None
        self._version: int | None = None
        self._sessions: dict[str, frozenset[str]] = {}
        self._lock = threading.Lock()  # the daemon asks from the loop and from worker threads

    def _conn(self, create: bool) -> sqlite3.Connection | None:
        if self._db is None:
            if not create and not self.path.exists():
                return None
            make_dirs(self.path.parent)
            self._db = sqlite3.connect(self.path, isolation_level=None, timeout=5.0, check_same_thread=False)
            self.path.chmod(0o600)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.execute("CREATE TABLE IF NOT EXISTS forgotten (agent_id TEXT NOT NULL, session_id TEXT NOT NULL,"
                             " requested_at TEXT NOT NULL, PRIMARY KEY (agent_id, session_id))")
        return self._db

    def add(self, agent_id: str, session_ids: Iterable[str]) -> None:
        now = datetime.now(UTC).isoformat().replace("+00:00", "Z")
        with self._lock:
            conn = self._conn(create=True)
            assert conn is not None
            conn.executemany("INSERT OR IGNORE INTO forgotten VALUES (?, ?, ?)",
                             [(agent_id, sid, now) for sid in session_ids])

    def sessions(self) -> Mapping[str, frozenset[str]]:
        """agent -> the sessions forgotten in it (read again only when the file changed)."""
        with self._lock:
            conn = self._conn(create=False)
            if conn is None:
                return {}
            version = int(conn.execute("PRAGMA data_version").fetchone()[0])
            if version != self._version:
                self._version = version
                found: dict[str, set[str]] = {}
                for agent, sid in conn.execute("SELECT agent_id, session_id FROM forgotten").fetchall():
                    found.setdefault(str(agent), set()).add(str(sid))
                self._sessions = {agent: frozenset(sids) for agent, sids in found.items()}
            return self._sessions

    def close(self) -> None:
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None


@dataclass(frozen=True, slots=True)
class Erased:
    """What forgetting removed (or, in a dry run, would remove). `memories` None: not counted."""

    memories: int | None = 0
    index_rows: int = 0
    vault_entries: int = 0
    gap_records: int = 0
    pending_rows: int = 0
    sessions: tuple[str, ...] = ()  # the session ids forgotten (a key names each of its windows)

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def erase_records(config: Config, agent_id: str, sessions: frozenset[str], *, dry_run: bool = False) -> Erased:
    """Everything but the store: the agent's index rows (and rows waiting for its workspace), the vault entries
    and the gap records of `sessions` (session ids; a SQLite session's id and the id its points carry)."""
    try:
        workspace: Path | None = agent_workspace(config.state_dir, agent_id)
    except InvalidAgentId:
        workspace = None
    index = forget_index_rows(workspace, sessions, dry_run=dry_run) if workspace is not None else 0
    vault = Path(config.credentials.vault_path or config.data_dir / "credentials.vault")
    vaulted = forget_vault_entries(vault, sessions, dry_run=dry_run)
    pending = forget_pending_rows(config.data_dir, agent_id, sessions, dry_run=dry_run)
    gaps = 0
    if (config.data_dir / GapStore.FILE_NAME).exists():
        with GapStore(config.data_dir) as store:
            gaps = store.forget_sessions(agent_id, sessions, dry_run=dry_run)
    return Erased(None, index, vaulted, gaps, pending)


def session_points(store: Store, agent_id: str, sessions: Iterable[str]) -> list[str]:
    """The ids of every point of `sessions` (turns and chunks, wherever they were read from)."""
    return [pid for sid in dict.fromkeys(sessions) for pid, _, _ in store.scroll(agent_id, session_id=sid)]


def erase_session(config: Config, agent_id: str, sessions: frozenset[str], db: str = "",
                  then: Callable[[Store], None] | None = None) -> Callable[[Store], None]:
    """A store-thread cleanup (`pipeline.Work.cleanup`) that forgets `sessions` of `agent_id` everywhere: `then`
    (the feed's own point removal, which logs) or the points' removal, then the records outside the store.
    Logged once when anything was there (a restart looks again and finds nothing)."""

    def cleanup(store: Store) -> None:
        points = None  # counted (and logged, `session_forgotten`) by `then` when given
        if then is not None:
            then(store)
        elif ids := session_points(store, agent_id, sessions):
            store.delete(ids)
            points = len(ids)
        try:
            erased = erase_records(config, agent_id, sessions)
        except (OSError, sqlite3.Error, IndexKeptChanging) as exc:  # never a store retry: told, tried at the next start
            log.error("session_erase_failed", agent=agent_id, sessions=sorted(sessions),
                      error=f"{type(exc).__name__}: {exc}"[:300])
            return
        if points or erased.index_rows or erased.vault_entries or erased.gap_records or erased.pending_rows:
            log.info("session_erased", agent=agent_id, sessions=sorted(sessions), db=db or None, points=points,
                     index_rows=erased.index_rows, vault_entries=erased.vault_entries,
                     gap_records=erased.gap_records, pending_rows=erased.pending_rows)

    return cleanup


class Consent:
    """What the person said may not become memory, as the daemon reads it at each sweep: the admission policy
    (openclaw.json's memory-core `memoryPolicy.excludeSessions` OR `[memory_policy.exclude_sessions]`) and the
    sessions forgotten with `veritas-watch forget`."""

    def __init__(self, config: Config) -> None:
        self._config = config
        self.policy = PolicyReader(config.state_dir, AdmissionPolicy.from_lists(config.memory_policy.exclude_sessions))
        self.requests = ForgetRequests(config.data_dir)
        self._erased: set[tuple[str, str]] = set()  # (agent, session) this process has erased

    def forgotten(self, agent_id: str) -> frozenset[str]:
        return self.requests.sessions().get(agent_id, frozenset())

    def due(self) -> list[tuple[str, frozenset[str], Callable[[Store], None]]]:
        """The requests this process has not carried out yet (all of them after a restart: a cheap look that finds
        nothing), each as (agent, sessions, the store-thread cleanup that erases them)."""
        found = []
        for agent, sessions in sorted(self.requests.sessions().items()):
            new = frozenset(s for s in sessions if (agent, s) not in self._erased)
            if new:
                self._erased.update((agent, s) for s in new)
                found.append((agent, new, erase_session(self._config, agent, new)))
        return found

    def close(self) -> None:
        self.requests.close()


# -- `veritas-watch forget`


class Daemon(Protocol):
    @property
    def pid(self) -> int: ...

    def open(self, path: str, body: dict[str, Any] | None = None, timeout: float = 60.0) -> Any: ...


class DaemonTooOld(Exception):
    """The running daemon predates `POST /memory/count`: it must be restarted on this version first."""


def _daemon_points(daemon: Daemon, agent_id: str, sessions: frozenset[str]) -> int:
    """How many points of `sessions` the running daemon holds (`POST /memory/count`: the daemon counts them, in
    batches of what one request takes)."""
    ids = sorted(sessions)
    count = 0
    try:
        for start in range(0, len(ids), MAX_COUNT_SESSIONS):
            body = {"agent_id": agent_id, "session_ids": ids[start:start + MAX_COUNT_SESSIONS]}
            with daemon.open("/memory/count", body) as response:
                count += int(json.loads(response.read())["count"])
        return count
    except DaemonRefused as exc:
        if exc.status == 404:
            raise DaemonTooOld(f"the running daemon (pid {daemon.pid}) is older than this command: restart it "
                               "(systemctl restart veritas-watch), then forget again") from None
        raise


def resolve_sessions(config: Config, agent_id: str, selector: str) -> frozenset[str]:
    """The sessions `selector` names, as `openclaw memory forget --session` reads it: a session id (exact), or a
    session key, which names every window of that key in the agent's SQLite stores (its sessions only)."""
    from veritas_watch.sources.sqlite import SqliteSourceError, SqliteTranscriptReader

    found: set[str] = set()
    agents = [a for a in iter_agents(config.state_dir) if a.agent_id == agent_id]
    for db in transcript_dbs(config.state_dir, agents):
        if db.agent_id != agent_id or not db.path.is_file():
            continue
        try:
            with SqliteTranscriptReader(db.path, agent_id, key=db.key) as reader:
                sessions = reader.poll({}, max_rows=1, max_bytes=1).sessions
        except SqliteSourceError:
            continue
        found.update(s.session_id for s in sessions if s.session_key == selector)
    return frozenset(found or {selector})


def forget_command(config: Config, agent_id: str, selector: str, *, dry_run: bool, daemon: Daemon | None,
                   open_store: Callable[[], Store], wait_s: float = 120.0) -> Erased:
    """`veritas-watch forget`: record the request (durable first), erase the records outside the store, then the
    memories: directly when no daemon runs (this process owns the store), else the daemon removes them at its
    next sweep and this waits until it counts none of them (`POST /memory/count`, twice a second, up to `wait_s`;
    they go in any case).
    `selector`: a session id or key (`resolve_sessions`)."""
    sessions = resolve_sessions(config, agent_id, selector)
    if dry_run:
        records = erase_records(config, agent_id, sessions, dry_run=True)
        if daemon is not None:
            memories = _daemon_points(daemon, agent_id, sessions)
        else:
            store = open_store()
            try:
                memories = len(session_points(store, agent_id, sessions))
            finally:
                store.close()
        return replace(records, memories=memories, sessions=tuple(sorted(sessions)))
    if daemon is not None:
        # Counted before the request is recorded: from then on the daemon's sweep may erase them first.
        before = _daemon_points(daemon, agent_id, sessions)
        records = erase_records(config, agent_id, sessions, dry_run=True)
    requests = ForgetRequests(config.data_dir)
    try:
        requests.add(agent_id, sessions)
    finally:
        requests.close()
    if daemon is not None:
        erase_records(config, agent_id, sessions)  # whatever the daemon has not erased yet
        with contextlib.suppress(OSError):  # a sweep now (a reload does one); another user's daemon: its next sweep
            os.kill(daemon.pid, signal.SIGHUP)
        deadline = time.monotonic() + wait_s
        left = before
        while left and time.monotonic() < deadline:
            time.sleep(0.5)
            left = _daemon_points(daemon, agent_id, sessions)
        if left:
            raise TimeoutError(f"the daemon has not removed {left} memories of {selector} yet; it will (the request "
                               "is recorded): run `veritas-watch forget --dry-run` again to see")
        return replace(records, memories=before, sessions=tuple(sorted(sessions)))
    store = open_store()
    try:
        ids = session_points(store, agent_id, sessions)
        if ids:
            store.delete(ids)
            store.flush()
    finally:
        store.close()
    records = erase_records(config, agent_id, sessions)
    return replace(records, memories=len(ids), sessions=tuple(sorted(sessions)))


def render(agent_id: str, selector: str, erased: Erased, *, dry_run: bool) -> list[str]:
    verb = "would remove" if dry_run else "removed"
    named = "" if erased.sessions == (selector,) else f" ({', '.join(erased.sessions)})"
    return [f"{agent_id} session {selector}{named}: {verb} {erased.memories} memories, {erased.index_rows} "
            f"CREDENTIALS_INDEX.md rows ({erased.pending_rows} waiting), {erased.vault_entries} vault entries, "
            f"{erased.gap_records} gap records"]
