"""Transcripts where a configured `session.store` puts them (OpenClaw 2026.9.6,
`resolveSqliteTargetFromSessionStorePath`).

A `sessions.json`-style store gives each agent its own database in the store's directory
(`openclaw-agent.sqlite` for the default agent, `openclaw-agent.<id>.sqlite` for the others) and the archives
of deleted sessions beside it; a store ending in `.sqlite` is one database shared by every agent. OpenClaw
records each database it opens in `state/openclaw.sqlite` (`agent_databases`). tests/test_openclaw_session_store.py
shows all of this on the real OpenClaw; these tests pin each rule and the daemon's reading of it.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from pathlib import Path

import pytest
import structlog.testing

from tests.daemon_harness import append, header, message, running_daemon, wait_for
from tests.sqlite_fixture import OpenClawWriter, create_database, message_event, session_header, zstd_frame
from veritas_watch.admission import AdmissionPolicy
from veritas_watch.openclaw import (
    AgentDirs,
    JsonlSessionStores,
    Registry,
    TranscriptDb,
    iter_agents,
    registered_databases,
    session_key_agent,
    transcript_dbs,
)
from veritas_watch.sources.cursors import CursorStore
from veritas_watch.sources.jsonl import JsonlTailer
from veritas_watch.sources.sqlite import SqliteTranscriptReader
from veritas_watch.sources.sqlite_feed import SqliteFeed

# OpenClaw 2026.9.6's registry table, as `sqlite3 state/openclaw.sqlite .schema agent_databases` prints it.
REGISTRY_DDL = """CREATE TABLE agent_databases (
  agent_id TEXT NOT NULL,
  path TEXT NOT NULL,
  schema_version INTEGER NOT NULL,
  last_seen_at INTEGER NOT NULL,
  size_bytes INTEGER,
  PRIMARY KEY (agent_id, path)
) STRICT;"""


def register(state: Path, *rows: tuple[str, str]) -> None:
    path = state / "state" / "openclaw.sqlite"
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute(REGISTRY_DDL.replace("CREATE TABLE", "CREATE TABLE IF NOT EXISTS"))
        conn.executemany("INSERT INTO agent_databases VALUES (?, ?, 23, 0, 4096)", rows)
    finally:
        conn.close()


def canonical(state: Path, agent: str) -> Path:
    return state / "agents" / agent / "agent" / "openclaw-agent.sqlite"


@pytest.mark.parametrize(("key", "agent"), [
    ("agent:ops:main", "ops"), ("agent:ops:subagent:1f2e", "ops"), ("AGENT:Ops:main", "ops"),
    ("agent:my agent:main", "my-agent"),  # normalizeAgentId, as OpenClaw does
    ("global", None), ("main", None), ("agent:ops", None), ("agent::main", None), ("agent:ops::x", None),
    ("", None), (None, None),
])
def test_the_agent_a_session_key_names(key: str | None, agent: str | None) -> None:
    assert session_key_agent(key) == agent


def test_a_canonical_database_keeps_its_path_as_key_and_any_other_names_its_agent(tmp_path: Path) -> None:
    own = TranscriptDb(canonical(tmp_path, "ops"), "ops")
    assert own.canonical and own.key == str(own.path)
    assert TranscriptDb.from_key(own.key) == own
    for other in (TranscriptDb(tmp_path / "shared" / "all.sqlite", "ops"),
                  TranscriptDb(canonical(tmp_path, "main"), "ops"),  # ops's sessions in main's database
                  TranscriptDb(tmp_path / "we#ird" / "openclaw-agent.ops.sqlite", "ops")):
        assert not other.canonical and TranscriptDb.from_key(other.key) == other


def test_the_registry_lists_each_database_openclaw_opened(tmp_path: Path) -> None:
    state = tmp_path / "state"
    assert registered_databases(state) == []  # no registry: an older OpenClaw, or none yet
    custom = tmp_path / "stores" / "ops" / "sessions" / "openclaw-agent.ops.sqlite"
    register(state, ("main", "agents/main/agent/openclaw-agent.sqlite"), ("ops", str(custom)),
             ("Bad Agent", str(tmp_path / "x.sqlite")), ("ops", "../sessions.json"), ("ops", "x.sqlite\0y"))
    assert registered_databases(state) == [("main", canonical(state, "main")), ("ops", custom)]
    agents = [AgentDirs(a, state / "agents" / a / "sessions", canonical(state, a)) for a in ("main", "ops")]
    assert transcript_dbs(state, agents) == [
        TranscriptDb(canonical(state, "main"), "main"), TranscriptDb(canonical(state, "ops"), "ops"),
        TranscriptDb(custom, "ops")]


def test_an_unreadable_registry_leaves_the_canonical_databases(tmp_path: Path) -> None:
    state = tmp_path / "state"
    (state / "state").mkdir(parents=True)
    (state / "state" / "openclaw.sqlite").write_bytes(b"not a database" * 100)
    assert registered_databases(state) == []


def test_each_agent_reads_only_its_own_sessions_of_a_shared_database(tmp_path: Path) -> None:
    db = create_database(tmp_path / "shared" / "all.sqlite", agent_id="main")  # the owner OpenClaw recorded
    with OpenClawWriter(db, compress=False) as writer:
        main_sid = writer.create_session("agent:main:main")
        writer.append(main_sid, message_event("main: the spare key is under the mat.", event_id="m1"))
        ops_sid = writer.create_session("agent:ops:main")
        writer.append(ops_sid, message_event("ops: rotate the TLS certificate on Friday.", event_id="o1"))
        global_sid = writer.create_session("global")  # a key naming no agent: the owner's
        writer.append(global_sid, message_event("global: the office closes at six.", event_id="g1"))

    def read(agent: str) -> tuple[set[str], frozenset[str]]:
        with SqliteTranscriptReader(db, agent) as reader:
            poll = reader.poll({})
        return {json.loads(r.data)["id"] for b in poll.batches for r in b.records if b"message" in r.data}, \
            poll.other_agents

    assert read("main") == ({"m1", "g1"}, frozenset({"ops"}))
    assert read("ops") == ({"o1"}, frozenset({"main"}))
    assert read("research") == (set(), frozenset({"main", "ops"}))


def deleted_archive(directory: Path, session_id: str, text: str) -> Path:
    """What OpenClaw 2026.9.6 leaves of a deleted session: `<id>.jsonl.deleted.<ts>.<hash>.zst` beside its database."""
    lines = [session_header(session_id), message_event(text, event_id=f"{session_id[:6]}-1")]
    path = directory / f"{session_id}.jsonl.deleted.2026-12-04T12-51-41.854Z.f431dda7905942f9a8fe905acee8eae8.zst"
    path.write_bytes(zstd_frame("".join(json.dumps(line) + "\n" for line in lines).encode()))
    return path


def test_the_daemon_follows_every_store_under_the_agent_each_session_names(tmp_path: Path) -> None:
    state, data = tmp_path / "state", tmp_path / "data"
    for agent in ("main", "ops"):  # OpenClaw creates each agent's own database, then writes elsewhere
        create_database(canonical(state, agent), agent_id=agent)
    ops_db = create_database(tmp_path / "stores" / "ops" / "sessions" / "openclaw-agent.ops.sqlite", agent_id="ops")
    shared = create_database(tmp_path / "shared" / "all.sqlite", agent_id="main")
    register(state, ("main", "agents/main/agent/openclaw-agent.sqlite"),
             ("ops", "agents/ops/agent/openclaw-agent.sqlite"), ("ops", str(ops_db)), ("main", str(shared)))
    # Archives of deleted sessions: beside ops's own store database (ops's), and beside the shared one (anyone's).
    deleted_archive(ops_db.parent, "5b1c0d2e-0000-4000-8000-000000000001", "ops: the old pager number was 4471.")
    deleted_archive(shared.parent, "5b1c0d2e-0000-4000-8000-000000000002", "someone: the attic code is 9090.")
    with running_daemon(state, data) as daemon:
        with OpenClawWriter(ops_db, compress=False) as writer:
            sid = writer.create_session("agent:ops:main")
            writer.append(sid, message_event("ops: the backup job runs at 02:00.", event_id="o1"))
        with OpenClawWriter(shared, compress=False) as writer:
            sid = writer.create_session("agent:main:main")
            writer.append(sid, message_event("main: my dentist is Dr. Alvarez.", event_id="m1"))
            sid = writer.create_session("agent:ops:cron:nightly")
            writer.append(sid, message_event("ops: the nightly report goes to the SRE list.", event_id="o2"))

        def texts(agent: str) -> set[str]:
            return {p["payload"]["data"] for p in daemon.export(agent)}

        wait_for(lambda: len(texts("ops")) == 3 and len(texts("main")) == 1, timeout=60, what="every store read")
        daemon.wait_idle()
        assert texts("main") == {"main: my dentist is Dr. Alvarez."}
        assert texts("ops") == {"ops: the backup job runs at 02:00.", "ops: the nightly report goes to the SRE list.",
                                "ops: the old pager number was 4471."}
        assert not any("attic" in t for a in ("main", "ops") for t in texts(a)), "an archive no agent can be told from"
        rows = {(s["db"], s["agent"]) for s in daemon.get("/status")["sqlite"]}
        assert {(str(shared), "main"), (str(shared), "ops"), (str(ops_db), "ops")} <= rows, rows
        assert daemon.stop() == 0
        # `status` on the stopped daemon's data dir counts each agent's sessions from the cursors they left
        offline = json.loads(daemon.cli("status", "--json").stdout)["agents"]
        assert (offline["main"]["sessions"], offline["ops"]["sessions"]) == (1, 2), offline


def test_a_database_no_longer_found_is_let_go_and_read_on_if_it_comes_back(tmp_path: Path) -> None:
    """A `session.store` changed (OpenClaw's registry then lists only the new databases) or an agent deleted:
    the database's connection is closed, its cursors kept; found again, it is read on from them."""
    db = create_database(tmp_path / "stores" / "ops" / "sessions" / "openclaw-agent.ops.sqlite", agent_id="ops")
    source = TranscriptDb(db, "ops")
    feed = SqliteFeed(CursorStore(tmp_path / "cursors.sqlite"))
    with OpenClawWriter(db, compress=False) as writer:
        sid = writer.create_session("agent:ops:main")
        writer.append(sid, message_event("ops: first", event_id="o1"))
    assert feed.sources_to_poll([source]) == [source]
    poll = feed.poll(source)
    assert poll is not None and poll.batches
    feed.commit([feed.unit_for(poll.key, b, feed.session_state(poll.key, b)) for b in poll.batches])
    reader = feed._readers[source.key]
    assert reader._conn is not None
    assert feed.sources_to_poll([]) == [] and reader._conn is None  # let go
    with OpenClawWriter(db, compress=False) as writer:
        writer.append(sid, message_event("ops: second", event_id="o2"))
    poll = feed.poll(source)  # found again
    assert poll is not None
    assert [json.loads(r.data)["id"] for b in poll.batches for r in b.records] == ["o2"]


def _age(*paths: Path) -> None:
    """Set files' mtime an hour back: a stamp that old is one `Registry` trusts (newer is its racy window)."""
    past = time.time() - 3600
    for path in paths:
        os.utime(path, (past, past))


def test_the_registry_is_read_again_only_when_it_can_have_changed(tmp_path: Path) -> None:
    """The daemon asks at every sweep: the registry is opened only when its files' stat changed (a database
    registered, the file replaced), else the last read is given back."""
    state = tmp_path / "state"
    ops = tmp_path / "stores" / "ops" / "openclaw-agent.ops.sqlite"
    register(state, ("ops", str(ops)))
    path = state / "state" / "openclaw.sqlite"
    _age(path)
    registry = Registry(state)
    assert registry.databases() == [("ops", ops)] and registry.reads == 1
    for _ in range(5):
        assert registry.databases() == [("ops", ops)]
    assert registry.reads == 1, "read again though nothing changed"
    research = tmp_path / "stores" / "research" / "openclaw-agent.research.sqlite"
    register(state, ("research", str(research)))  # registered while the daemon runs: seen at the next sweep
    assert registry.databases() == [("ops", ops), ("research", research)]
    # Replaced by a new file (a restore): its size and mtime made the same as the old one's, only the inode differs.
    other = tmp_path / "restored" / "state"
    register(other, ("main", str(tmp_path / "shared" / "all.sqlite")), ("opz", str(ops)))
    replacement = other / "state" / "openclaw.sqlite"
    assert replacement.stat().st_size == path.stat().st_size
    _age(path)
    registry.databases()
    os.utime(replacement, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns))
    replacement.replace(path)
    assert registry.databases() == [("main", tmp_path / "shared" / "all.sqlite"), ("opz", ops)]
    path.unlink()
    assert registry.databases() == []  # gone: only the canonical databases are left
    assert transcript_dbs(state, [], registry) == []


def test_a_registry_changed_within_its_timestamps_tick_is_read_again(tmp_path: Path) -> None:
    """A write in the same mtime tick as the last read (same size too: a row updated in place) changes no stat:
    a stamp that recent is not trusted, so the next sweep reads again."""
    state = tmp_path / "state"
    register(state, ("ops", str(tmp_path / "a.sqlite")))
    registry = Registry(state)
    path = state / "state" / "openclaw.sqlite"
    registry.databases()
    stamp = path.stat()
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("UPDATE agent_databases SET path = ? WHERE agent_id = 'ops'", (str(tmp_path / "b.sqlite"),))
    conn.close()
    os.utime(path, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))  # as if in the same tick
    assert path.stat().st_size == stamp.st_size
    assert registry.databases() == [("ops", tmp_path / "b.sqlite")]


def test_a_database_registered_or_a_registry_replaced_while_the_daemon_runs_is_read(tmp_path: Path) -> None:
    state, data = tmp_path / "state", tmp_path / "data"
    create_database(canonical(state, "ops"), agent_id="ops")
    first = create_database(tmp_path / "stores" / "one" / "openclaw-agent.ops.sqlite", agent_id="ops")
    second = create_database(tmp_path / "stores" / "two" / "openclaw-agent.ops.sqlite", agent_id="ops")
    third = create_database(tmp_path / "stores" / "three" / "openclaw-agent.ops.sqlite", agent_id="ops")
    register(state, ("ops", str(first)))
    _age(state / "state" / "openclaw.sqlite")
    for db, text in ((first, "ops: the first store."), (second, "ops: the second store."),
                     (third, "ops: the third store.")):
        with OpenClawWriter(db, compress=False) as writer:
            writer.append(writer.create_session("agent:ops:main"), message_event(text, event_id=db.parent.name))
    with running_daemon(state, data) as daemon:
        def texts() -> set[str]:
            return {p["payload"]["data"] for p in daemon.export("ops")}

        wait_for(lambda: texts() == {"ops: the first store."}, timeout=60, what="the registered store read")
        register(state, ("ops", str(second)))
        wait_for(lambda: "ops: the second store." in texts(), timeout=60, what="a store registered later read")
        other = tmp_path / "new" / "state"
        register(other, ("ops", str(third)))
        (other / "state" / "openclaw.sqlite").replace(state / "state" / "openclaw.sqlite")
        wait_for(lambda: "ops: the third store." in texts(), timeout=60, what="the replaced registry's store read")
        daemon.wait_idle()
        assert sorted(texts()) == ["ops: the first store.", "ops: the second store.", "ops: the third store."]


def test_an_excluded_session_is_told_once_and_let_go_once_it_is_deleted(tmp_path: Path) -> None:
    """`session_excluded` is logged once per session and reason; what remembers that holds only the sessions the
    last poll found excluded (a session deleted is let go), so it does not grow with every session ever seen."""
    db = create_database(canonical(tmp_path / "state", "main"), agent_id="main")
    source = TranscriptDb(db, "main")
    feed = SqliteFeed(CursorStore(tmp_path / "cursors.sqlite"))
    policy = AdmissionPolicy(chat_types=frozenset({"group"}))
    with OpenClawWriter(db, compress=False) as writer:
        group = writer.create_session("agent:main:telegram:group:1")
        writer.append(group, message_event("in the group", event_id="g1"))
        writer.set_metadata(group, channel="telegram", chat_type="group")
    with structlog.testing.capture_logs() as logs:
        for _ in range(3):
            assert feed.poll(source, policy=policy) is not None
        assert [e["session"] for e in logs if e["event"] == "session_excluded"] == [group]
        assert feed._excluded_told == {source.key: {group: "chatType:group"}}
        with OpenClawWriter(db, compress=False) as writer:
            writer.delete_session(group)
        assert feed.poll(source, policy=policy) is not None
        assert feed._excluded_told == {source.key: {}}


# -- A JSONL-era `session.store` (OpenClaw before 2026.8), read in npm `openclaw@2026.7.35` and run there offline
# with the mock model. `resolveStorePath(cfg.session.store, {agentId})` (dist/paths-C2C4lJH6.js) is the agent's
# sessions.json: `{<session key>: {sessionId, sessionFile, ...}}`. A transcript goes where its entry's `sessionFile`
# says, resolved within the store's directory (`resolveSessionFilePath` with `resolveSessionFilePathOptions({agentId,
# storePath})`), and an entry without one is `<sessionId>.jsonl` in the store's directory
# (dist/session-accessor-ZRcpGzx8.js: `persistExpectedSessionTranscriptTurn`, `resolveSessionTranscriptReadTarget`:
# `resolveSessionTranscriptPathInDir(sessionId, dirname(storePath))`). The run showed `openclaw agent` turns naming
# `agents/<id>/sessions/<sessionId>.jsonl` (`resolveSessionTranscriptPath`, canonical, followed anyway) even so:
# the store's directory holds the transcripts of the other paths. A reset renames a transcript in place
# (dist/session-transcript-files.fs-Cj46Z9Oy.js, `archiveFileOnDisk`: `<file>.reset.<formatSessionArchiveTimestamp()>`).

def jsonl_transcript(directory: Path, session_id: str, *texts: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{session_id}.jsonl"
    append(path, header(session_id) + b"".join(message(f"{session_id}-{i}", "user", text)
                                                 for i, text in enumerate(texts, 1)))
    return path


def sessions_json(path: Path, entries: dict[str, str]) -> None:
    """sessions.json as OpenClaw writes it: session key -> entry (`sessionId`, `sessionFile`, `updatedAt`)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({key: {"sessionId": sid, "sessionFile": str(path.parent / f"{sid}.jsonl"),
                                      "updatedAt": 1783000000000} for key, sid in entries.items()}))


def test_a_jsonl_era_session_store_is_followed_per_agent(tmp_path: Path) -> None:
    """`{agentId}` gives each agent its own directory (all of it, archives included, is that agent's); a store
    without it is one directory the agents share, where a transcript is the agent's whose key names its session
    in sessions.json (and stays so once seen, after a reset renamed it and moved the key on). A transcript no key
    names could be anyone's: not read."""
    state, data = tmp_path / "state", tmp_path / "data"
    for agent in ("main", "ops"):
        (state / "agents" / agent / "agent").mkdir(parents=True)  # OpenClaw keeps the agent dirs, no sessions/
    own = tmp_path / "stores"
    (state / "openclaw.json").write_text(json.dumps({"session": {"store": str(own / "{agentId}" / "sessions.json")}}))
    sessions_json(own / "ops" / "sessions.json", {"agent:ops:main": "0a1b2c3d-0000-4000-8000-00000000000a"})
    jsonl_transcript(own / "ops", "0a1b2c3d-0000-4000-8000-00000000000a", "ops: the pager rotation starts Monday.")
    jsonl_transcript(own / "ops", "0a1b2c3d-0000-4000-8000-00000000000b", "ops: the old runbook is in the wiki.") \
        .rename(own / "ops" / "0a1b2c3d-0000-4000-8000-00000000000b.jsonl.reset.2026-07-01T10-00-00.000Z")
    jsonl_transcript(own / "main", "0a1b2c3d-0000-4000-8000-00000000000c", "main: my locker is number 12.")
    with running_daemon(state, data) as daemon:
        def texts(agent: str) -> set[str]:
            return {p["payload"]["data"] for p in daemon.export(agent)}

        wait_for(lambda: len(texts("ops")) == 2 and len(texts("main")) == 1, timeout=60, what="each agent's store")
        assert texts("main") == {"main: my locker is number 12."}
        # Then the store without `{agentId}`: one directory, one sessions.json, both agents' transcripts.
        shared = tmp_path / "shared"
        main_sid, ops_sid, nobody = ("5e5e0000-0000-4000-8000-000000000001", "5e5e0000-0000-4000-8000-000000000002",
                                     "5e5e0000-0000-4000-8000-000000000003")
        sessions_json(shared / "sessions.json", {"agent:main:main": main_sid, "agent:ops:main": ops_sid})
        main_file = jsonl_transcript(shared, main_sid, "main: the dentist moved to Thursday.")
        jsonl_transcript(shared, ops_sid, "ops: the TLS certificate expires in May.")
        jsonl_transcript(shared, nobody, "someone: the attic code is 9090.")
        (state / "openclaw.json").write_text(json.dumps({"session": {"store": str(shared / "sessions.json")}}))
        wait_for(lambda: "main: the dentist moved to Thursday." in texts("main")
                 and "ops: the TLS certificate expires in May." in texts("ops"), timeout=60, what="the shared store")
        # `/new` in main: the transcript is archived in place, the key moves on to a new session.
        append(main_file, message(f"{main_sid}-9", "user", "main: and bring the x-rays."))
        main_file.rename(shared / f"{main_sid}.jsonl.reset.2026-07-02T09-00-00.000Z")
        new_sid = "5e5e0000-0000-4000-8000-000000000004"
        jsonl_transcript(shared, new_sid, "main: a new conversation about the garden.")
        sessions_json(shared / "sessions.json", {"agent:main:main": new_sid, "agent:ops:main": ops_sid})
        wait_for(lambda: "main: a new conversation about the garden." in texts("main"), timeout=60,
                 what="the new session")
        daemon.wait_idle()
        assert texts("main") == {"main: my locker is number 12.", "main: the dentist moved to Thursday.",
                                 "main: and bring the x-rays.", "main: a new conversation about the garden."}
        assert texts("ops") == {"ops: the pager rotation starts Monday.", "ops: the old runbook is in the wiki.",
                                "ops: the TLS certificate expires in May."}
        assert len(daemon.export("main")) == 4 and len(daemon.export("ops")) == 3, "a memory stored twice"


def test_jsonl_era_store_directories_survive_an_openclaw_json_caught_half_written(tmp_path: Path) -> None:
    """The store's directories (and so their files' cursors) stay while openclaw.json cannot be parsed, as the
    admission policy does; a store path relative to nothing OpenClaw says is resolved from the state dir."""
    state = tmp_path / "state"
    (state / "agents" / "ops" / "agent").mkdir(parents=True)
    config = state / "openclaw.json"
    config.write_text(json.dumps({"session": {"store": "stores/{agentId}/sessions.json"}}))
    stores = JsonlSessionStores(state, {"OPENCLAW_STATE_DIR": str(state), "HOME": str(tmp_path)})
    agents = list(iter_agents(state))
    expected = [AgentDirs("ops", state / "stores" / "ops", canonical(state, "ops"))]
    assert stores.dirs(agents) == expected
    config.write_text('{"session": {"store": "stores/{agentId}/sess')  # caught half-written
    assert stores.dirs(agents) == expected
    config.write_text(json.dumps({"session": {}}))
    assert stores.dirs(agents) == []


def test_a_store_shared_in_an_agents_own_sessions_directory_gives_each_transcript_to_its_agent(tmp_path: Path) -> None:
    """A store without `{agentId}` that names one agent's own `agents/<id>/sessions/` (main's here): the other
    agents write their transcripts there too. A transcript whose key names ops is ops', not main's for being in
    main's directory; what no key names another agent's stays main's (its own directory, read as before)."""
    state = tmp_path / "state"
    for agent in ("main", "ops"):
        (state / "agents" / agent / "agent").mkdir(parents=True)
    here = state / "agents" / "main" / "sessions"
    (state / "openclaw.json").write_text(json.dumps({"session": {"store": str(here / "sessions.json")}}))
    main_sid, ops_sid, older = ("5e5e0000-0000-4000-8000-000000000001", "5e5e0000-0000-4000-8000-000000000002",
                                "5e5e0000-0000-4000-8000-000000000003")
    sessions_json(here / "sessions.json", {"agent:main:main": main_sid, "agent:ops:main": ops_sid})
    for sid in (main_sid, ops_sid, older):
        jsonl_transcript(here, sid, f"{sid}: a line.")
    agents = list(iter_agents(state))
    stores = JsonlSessionStores(state, {"OPENCLAW_STATE_DIR": str(state), "HOME": str(tmp_path)})
    tailer = JsonlTailer(state, {}, max_line_bytes=1 << 20, read_chunk_bytes=1 << 16)
    tailer.sweep([*stores.dirs(agents), *agents])  # as the daemon does
    owner = {Path(t.read.path).name.split(".")[0]: t.committed.agent_id for t in tailer.files.values()}
    assert owner == {main_sid: "main", ops_sid: "ops", older: "main"}
    # Restarted after ops' `/new`: its transcript archived in place, its key on a new session. No key names the
    # archive now, but its cursor says whose it is: main's listing leaves it (read again as main's, it was a leak).
    (here / f"{ops_sid}.jsonl").rename(here / f"{ops_sid}.jsonl.reset.2026-07-02T09-00-00.000Z")
    new_sid = "5e5e0000-0000-4000-8000-000000000004"
    sessions_json(here / "sessions.json", {"agent:main:main": main_sid, "agent:ops:main": new_sid})
    jsonl_transcript(here, new_sid, "ops: a new conversation.")
    saved = {key: t.committed for key, t in tailer.files.items()}
    stores = JsonlSessionStores(state, {"OPENCLAW_STATE_DIR": str(state), "HOME": str(tmp_path)})
    restarted = JsonlTailer(state, saved, max_line_bytes=1 << 20, read_chunk_bytes=1 << 16)
    for _ in range(2):  # and not at the next sweep either (its cursor is kept, not dropped as an orphan)
        restarted.sweep([*stores.dirs(agents), *agents])
    owner = {Path(t.read.path).name.split(".")[0]: t.committed.agent_id for t in restarted.files.values()}
    assert owner.get(ops_sid) != "main", "ops' archived transcript taken by main"
    assert owner == {main_sid: "main", new_sid: "ops", older: "main"}


def test_a_registry_that_cannot_be_read_for_a_moment_keeps_the_databases_last_read(tmp_path: Path) -> None:
    """Locked or caught damaged (`_read_registry` None): the databases last read stay listed (dropping them would
    close their readers until the next sweep), and the registry is read again at the next sweep."""
    state = tmp_path / "state"
    ops = tmp_path / "stores" / "ops" / "openclaw-agent.ops.sqlite"
    register(state, ("ops", str(ops)))
    path = state / "state" / "openclaw.sqlite"
    registry = Registry(state)
    assert registry.databases() == [("ops", ops)]
    good = path.read_bytes()
    path.write_bytes(b"not a database" * 300)
    assert registry.databases() == [("ops", ops)]
    reads = registry.reads
    assert registry.databases() == [("ops", ops)] and registry.reads == reads + 1, "a failed read was trusted"
    path.write_bytes(good)
    assert registry.databases() == [("ops", ops)]


def test_a_sessions_json_nested_past_the_parsers_depth_stops_no_sweep(tmp_path: Path) -> None:
    """A RecursionError, not a ValueError: read as unreadable (the last read kept), as openclaw.json is."""
    state, shared = tmp_path / "state", tmp_path / "shared"
    for agent in ("main", "ops"):
        (state / "agents" / agent / "agent").mkdir(parents=True)
    (state / "openclaw.json").write_text(json.dumps({"session": {"store": str(shared / "sessions.json")}}))
    sessions_json(shared / "sessions.json", {"agent:ops:main": "5e5e0000-0000-4000-8000-000000000002"})
    stores = JsonlSessionStores(state, {"OPENCLAW_STATE_DIR": str(state), "HOME": str(tmp_path)})
    agents = list(iter_agents(state))
    first = stores.dirs(agents)
    (shared / "sessions.json").write_text("[" * 200_000)
    assert stores.dirs(agents) == first
