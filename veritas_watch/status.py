"""`status`: per agent, what is watched, stored and still to read; from the running daemon or from disk."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from veritas_watch.features.capture import credentials_per_agent
from veritas_watch.openclaw import TranscriptDb, agent_workspace, classify_transcript, iter_agents, transcript_dbs
from veritas_watch.sources.cursors import FileCursor
from veritas_watch.sources.sqlite import SqliteSourceError, SqliteTranscriptReader
from veritas_watch.sources.sqlite_feed import SourceHealth, SqliteSource
from veritas_watch.terminal import printable

if TYPE_CHECKING:
    from veritas_watch.daemon import Running
    from veritas_watch.features.gaps import Gap
    from veritas_watch.sinks.store import Store


def _size(path: str) -> int | None:
    try:
        return os.stat(path).st_size
    except OSError:
        return None


def _new_agent() -> dict[str, Any]:
    return {"files": 0, "lag_bytes": 0, "lag_rows": 0, "last_entry_at": None, "entries_stored": None,
            "sessions": 0, "open_gaps": 0, "credentials_captured": 0}


def agents_from_cursors(cursors: Iterable[tuple[FileCursor, int | None]],
                        sqlite: Iterable[SqliteSource] = ()) -> dict[str, dict[str, Any]]:
    """Per agent, from both sources: files, sessions, lag (bytes and rows), last entry time.

    A session is counted once by the id its points carry (a session migrated from JSONL into SQLite
    has the same one in both).
    """
    agents: dict[str, dict[str, Any]] = {}
    sessions: dict[str, set[str]] = {}

    def saw(agent_id: str, session_id: object, last_entry_ts: object) -> dict[str, Any]:
        agent = agents.setdefault(agent_id, _new_agent())
        if isinstance(session_id, str) and session_id:
            sessions.setdefault(agent_id, set()).add(session_id)
        newest = agent["last_entry_at"]
        if isinstance(last_entry_ts, str) and last_entry_ts and (newest is None or last_entry_ts > newest):
            agent["last_entry_at"] = last_entry_ts
        return agent

    for cursor, size in cursors:
        agent = saw(cursor.agent_id, cursor.session.session_id, cursor.session.last_entry_ts)
        agent["files"] += 1
        agent["lag_bytes"] += max(0, (size if size is not None else cursor.offset) - cursor.offset)
    for source in sqlite:
        agent = agents.setdefault(source.agent_id, _new_agent())
        agent["lag_rows"] += source.lag_rows
        for sid, state in source.states.items():
            # A deleted session is no session any more, but its memories (and their time) stay.
            session = None if state.vanished else state.session.session_id or sid
            saw(source.agent_id, session, state.session.last_entry_ts)
    for agent_id, ids in sessions.items():
        agents[agent_id]["sessions"] = len(ids)
    return agents


def add_unread_files(state_dir: Path, agents: dict[str, dict[str, Any]], known: set[str]) -> None:
    """JSONL transcripts that no cursor covers yet (a backfill stopped before it reached them): files whose
    whole size is backlog. The running daemon tracks every file it lists; a stopped one only knows its cursors."""
    for agent in iter_agents(state_dir):
        try:
            entries = list(os.scandir(agent.sessions))
        except OSError:  # none yet, or unreadable (doctor and the daemon say so)
            continue
        for entry in entries:
            if classify_transcript(entry.name) is None or entry.path in known:
                continue
            try:
                if not entry.is_file():  # a FIFO, a dir: never read
                    continue
                size = entry.stat().st_size
            except OSError:
                continue
            counted = agents.setdefault(agent.agent_id, _new_agent())
            counted["files"] += 1
            counted["lag_bytes"] += size


def add_credentials(state_dir: Path, data_dir: Path, agents: dict[str, dict[str, Any]]) -> None:
    """Credentials indexed per agent, and the workspace where its index and STATE.md are (or will be)."""
    for agent_id, count in credentials_per_agent(state_dir, data_dir, agents).items():
        try:
            workspace = agent_workspace(state_dir, agent_id)
        except ValueError:  # no agent id (a cursor an older version kept): no workspace either
            continue
        agents[agent_id].update(credentials_captured=count, workspace=str(workspace),
                                workspace_exists=workspace.is_dir())


def count_entries(store: Store, agents: dict[str, dict[str, Any]]) -> None:
    for agent_id, agent in agents.items():
        agent["entries_stored"] = store.count(agent_id)


def gap_record(gap: Gap) -> dict[str, Any]:
    """One open gap as `status` shows it (running or not)."""
    return {"agent_id": gap.agent_id, "session_id": gap.session_id, "transcript": gap.transcript,
            "ended_at": gap.ended_at.isoformat(), "state_time": gap.state_time.isoformat() if gap.state_time else None,
            "hook_attempts": gap.hook_attempts, "last_hook_status": gap.last_hook_status,
            "next_attempt_at": gap.next_attempt_at.isoformat() if gap.next_attempt_at else None}


def add_gaps(agents: dict[str, dict[str, Any]], open_gaps: Iterable[Gap]) -> None:
    for gap in open_gaps:
        agents.setdefault(gap.agent_id, _new_agent())["open_gaps"] += 1


def saved_open_gaps(data_dir: Path) -> list[Gap]:
    """The open gaps a stopped daemon left in its data dir (none if it never recorded any)."""
    from veritas_watch.features.gaps import GapStore

    if not (data_dir / GapStore.FILE_NAME).exists():
        return []
    with GapStore(data_dir) as store:
        return store.open_gaps()


async def daemon_status(daemon: Running) -> dict[str, Any]:
    """The running daemon's status JSON (`GET /status`): its snapshot, plus what only `status` shows."""
    rt = daemon.rt
    tracked = [(t.committed, t.size) for t in list(rt.tailer.files.values())]
    agents = agents_from_cursors(tracked, rt.sqlite.sources())
    with contextlib.suppress(TimeoutError):  # a hung store write must not hang `status`: counts left empty
        await asyncio.wait_for(rt.sink.in_read_thread(lambda: count_entries(rt.sink.store, agents)), 2.0)
    stats = rt.sink.stats
    snap = daemon.snapshot()
    open_gaps = snap.open_gaps
    if daemon.config.credentials.enabled:
        add_credentials(daemon.config.state_dir, daemon.config.data_dir, agents)
    add_gaps(agents, open_gaps)
    return {
        "running": True,
        "pid": os.getpid(),
        "uptime_s": round(time.time() - daemon.started, 1),
        "state_dir": str(daemon.config.state_dir),
        "data_dir": str(daemon.config.data_dir),
        "embedder": rt.embedder.name,
        "store": daemon.config.store.url or "embedded",
        "store_state": "ok" if snap.store_up else "down",
        "watcher": {"mode": snap.watcher_mode, "fallback_reason": snap.watcher_fallback_reason},
        "backlog_bytes": snap.backlog_bytes,
        "in_flight_bytes": snap.in_flight_bytes,
        "queue": snap.queue,
        # Gap detection's start-up scan runs after the first sweep that reads nothing while the sink is idle.
        "gap_scan_pending": daemon.gaps.startup_scan_pending,
        # stored: points written; rewritten of them: the store had that point already (no new memory).
        "entries": {"stored": stats.stored, "rewritten": stats.rewritten, "unchanged": stats.unchanged,
                    "invalid_lines": stats.invalid,
                    "redactions": stats.redactions, "skipped": dict(stats.skipped)},
        "agents": agents,
        "sqlite": [_sqlite_record(key, h) for key, h in rt.sqlite.health.items()],
        "gaps": [gap_record(g) for g in open_gaps],
        "problems": [p.to_dict() for p in daemon.problems.snapshot()],
    }


def _sqlite_record(key: str, health: SourceHealth) -> dict[str, Any]:
    source = TranscriptDb.from_key(key)
    return {"db": str(source.path), "agent": source.agent_id, "schema_version": health.schema_version,
            "sessions": health.sessions, "lag_rows": health.lag_rows, "error": health.error,
            "exclusions": health.exclusions()}  # sessions kept out of memory, by reason (admission.py)


# What one agent's caller sees of the daemon (no paths of the host, nothing of other agents).
_SHARED_FIELDS = ("running", "uptime_s", "embedder", "store", "store_state", "queue")


def scope_status(full: dict[str, Any], agent_id: str) -> dict[str, Any]:
    """`status` for a caller allowed one agent: that agent's record, gaps, SQLite stores and problems."""
    agent = full.get("agents", {}).get(agent_id) or _new_agent()
    scoped = {key: full[key] for key in _SHARED_FIELDS if key in full}
    scoped.update({
        "agent": agent_id,
        "watcher": {"mode": (full.get("watcher") or {}).get("mode")},
        "backlog_bytes": agent.get("lag_bytes", 0),
        "agents": {agent_id: agent},
        "sqlite": [s for s in full.get("sqlite", []) if s.get("agent") == agent_id],
        "gaps": [g for g in full.get("gaps", []) if g.get("agent_id") == agent_id],
        "problems": [p for p in full.get("problems", []) if p.get("agent") == agent_id],
    })
    return scoped


def probe_transcript_dbs(state_dir: Path) -> list[dict[str, Any]]:
    """Each SQLite transcript store read once, as the daemon's poll reads it (read-only, one row at most): the
    `sqlite` records of `status` for a process that polls nothing (offline `status`, `doctor`)."""
    records = []
    for db in transcript_dbs(state_dir, iter_agents(state_dir)):
        if not db.path.is_file():  # none yet (a JSONL-only agent); anything else is a path problem
            continue
        health = SourceHealth()
        try:
            with SqliteTranscriptReader(db.path, db.agent_id, key=db.key) as reader:
                poll = reader.poll({}, max_rows=1, max_bytes=1)
            health.schema_version, health.sessions = poll.schema.schema_version, len(poll.sessions)
        except SqliteSourceError as exc:
            health.error = exc.reason
        records.append(_sqlite_record(db.key, health))
    return records


def offline_status(cursors: list[FileCursor], store: Store | None, sqlite: Iterable[SqliteSource] = (),
                   dirs: tuple[Path, Path] | None = None) -> dict[str, Any]:
    """`dirs`: (state dir, data dir), to count credentials. Without a store, nothing is stored yet (0)."""
    agents = agents_from_cursors(((c, _size(c.path)) for c in cursors), sqlite)
    if dirs is not None:
        add_unread_files(dirs[0], agents, {c.path for c in cursors})
        add_credentials(*dirs, agents)
    if store is not None:
        count_entries(store, agents)
    else:
        for agent in agents.values():
            agent["entries_stored"] = 0
    problems: list[dict[str, object]] = []
    if dirs is not None:
        from veritas_watch.problems import ProblemLog, scan_state_dir

        found = ProblemLog(dirs[0], quiet=True)
        scan_state_dir(dirs[0], found)
        problems = [p.to_dict() for p in found.snapshot()]
    open_gaps = saved_open_gaps(dirs[1]) if dirs is not None else []
    add_gaps(agents, open_gaps)
    return {"running": False, "agents": agents, "backlog_bytes": sum(a["lag_bytes"] for a in agents.values()),
            "gaps": [gap_record(g) for g in open_gaps], "problems": problems,
            "sqlite": probe_transcript_dbs(dirs[0]) if dirs is not None else []}


def render_text(status: dict[str, Any]) -> list[str]:
    """`veritas-watch status` without --json: one line for the daemon, one per agent, then one per thing that
    needs a look (everything `--json` knows is wrong: a store down, polling instead of inotify, a transcript
    database that cannot be read, skipped paths, open gaps, credential rows waiting). Printable text only."""
    if status.get("starting"):
        head = f"daemon: starting (pid {status.get('pid')}), not ready yet"
    else:
        head = "daemon: running" if status.get("running") else "daemon: not running"
    lines = [head + f"  backlog: {status.get('backlog_bytes', 0)} bytes"
             + (f" ({status['in_flight_bytes']} being stored)" if status.get("in_flight_bytes") else "")]
    uncounted = False
    for agent_id, agent in sorted(status.get("agents", {}).items()):
        entries = agent.get("entries_stored")
        uncounted = uncounted or entries is None
        lines.append(f"  {agent_id}: files={agent['files']} sessions={agent['sessions']} "
                     f"entries={'?' if entries is None else entries} "
                     f"lag={agent['lag_bytes']}B/{agent.get('lag_rows', 0)}rows "
                     f"last={agent['last_entry_at']} open_gaps={agent.get('open_gaps', 0)} "
                     f"credentials={agent.get('credentials_captured', 0)}")
    if uncounted:
        lines.append("  (entries=?: the store did not answer in time to count them; ask again)")
    if status.get("store_state") == "down":
        lines.append("  store: down (the daemon retries; nothing is lost: cursors wait for the store)")
    watcher = status.get("watcher") or {}
    if watcher.get("fallback_reason"):
        lines.append(f"  watcher: {watcher.get('mode')} ({watcher['fallback_reason']})")
    for db in status.get("sqlite", []):
        if db.get("error"):
            lines.append(f"  transcript database unreadable: {db['db']} (agent {db['agent']}): {db['error']}; "
                         "retried with backoff, the other agents keep flowing")
    for db in status.get("sqlite", []):
        if db.get("exclusions"):
            lines.append(f"  kept out of memory: {db['agent']}: "
                         + " ".join(f"{reason}={count}" for reason, count in db["exclusions"].items())
                         + f" session(s) ({db['db']})")
    for problem in status.get("problems", []):
        lines.append(f"  skipped: {problem['path']}: {problem['problem']} ({problem['detail']})")
    for gap in status.get("gaps", []):
        lines.append(f"  open gap: {gap['agent_id']} session {gap['session_id']} ended {gap['ended_at']}, "
                     f"STATE.md {gap['state_time'] or 'missing'} ({gap['transcript']})")
    for agent_id, agent in sorted(status.get("agents", {}).items()):
        if agent.get("credentials_captured") and agent.get("workspace_exists") is False:
            lines.append(f"  credentials waiting: {agent_id}'s workspace {agent.get('workspace')} does not exist "
                         "yet; its CREDENTIALS_INDEX.md rows are written when OpenClaw creates it")
    return [printable(line) for line in lines]
