"""A configured `session.store` in the real OpenClaw 2026.9.6: transcripts outside `agents/<id>/agent/`.

With `session.store` set, OpenClaw writes no transcript to the agent's own database: a `sessions.json`-style
path (`{agentId}` templated here) gives each agent a database in that directory (`openclaw-agent.sqlite` for
the default agent, `openclaw-agent.<id>.sqlite` for the others) and puts the archives of deleted sessions beside
it; a path ending in `.sqlite` is one database that every agent's sessions share. Each database it opens is
recorded in its registry (`state/openclaw.sqlite`, `agent_databases`); changing the setting moves nothing, and the
registry then lists only the databases of the new value.

The world: main and ops talk under a templated store; while veritas-watch is stopped, an ops side session is
created and deleted (its archive, in ops's store directory, is the only copy left); then the store is changed
to one shared `.sqlite` and both agents talk again, ops's `/new` ending a conversation (STATE.md stale). Every
message is memory once, under the agent whose session said it: main never finds what ops was told, though the
two share a database; the deleted session and the `/new` are ops's gaps, not main's.

Skipped, with the reason, only where the npm registry cannot be reached (and `CI` is not set).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.daemon_harness import DaemonProcess, read_db_cursors, wait_for
from tests.mock_model import Plan
from tests.openclaw_harness import OpenClawGateway, install_or_skip, query, running_gateway, transcript_rows
from tests.test_openclaw_real import STALE_STATE
from veritas_watch.openclaw import TranscriptDb, registered_databases, session_key_agent

pytestmark = pytest.mark.long  # minutes: started first (tests/conftest.py)

TEMPLATED = [("main", "My sailing club meets at the Harbour Inn.", "Harbour Inn, noted."),
             ("ops", "The deploy window is Thursday at 14:00.", "Thursday 14:00, noted.")]
DELETED = ("ops", "Scratch note: the staging build number is 4471.", "Build 4471, noted.")
SHARED = [("main", "My niece's birthday is on the ninth of March.", "Ninth of March, noted."),
          ("ops", "The on-call rotation switches every Monday.", "Monday switches, noted.")]
SCRATCH_KEY = "agent:ops:scratch-store"


@dataclass
class World:
    gateway: OpenClawGateway
    daemon: DaemonProcess
    notes: dict[str, Any] = field(default_factory=dict)


def say(gw: OpenClawGateway, turn: tuple[str, str, str], session_key: str | None = None) -> None:
    agent, text, reply = turn
    gw.model.plan(text, Plan(reply=reply))
    assert reply in gw.agent(agent, text, session_key=session_key).reply


def databases(gw: OpenClawGateway) -> list[Path]:
    """Every agent database OpenClaw recorded (the registry lists each place it opened)."""
    return sorted({path for _, path in registered_databases(gw.state_dir) if path.exists()})


def caught_up(gw: OpenClawGateway, daemon: DaemonProcess) -> bool:
    """Every row of every recorded database committed by veritas-watch, under the agent its session key names."""
    cursors = read_db_cursors(daemon.data_dir)
    for db in databases(gw):
        keys = dict(query(db, "SELECT session_id, session_key FROM session_windows"))
        last: dict[str, int] = {}
        for row in transcript_rows(db):
            last[row.session_id] = max(last.get(row.session_id, -1), row.seq)
        owner = query(db, "SELECT agent_id FROM schema_meta WHERE meta_key = 'primary'")[0][0]
        for sid, seq in last.items():
            agent = session_key_agent(keys.get(sid)) or owner
            if cursors.get((TranscriptDb(db, agent).key, sid), 0) <= seq:
                return False
    return True


def settle(gw: OpenClawGateway, daemon: DaemonProcess) -> None:
    wait_for(lambda: caught_up(gw, daemon), timeout=120, interval=0.1, what="veritas-watch caught up with OpenClaw")
    daemon.wait_idle(120)


def use_store(gw: OpenClawGateway, store: Path) -> None:
    gw.extra_config = {**gw.extra_config, "session": {"store": str(store)}}
    gw.prepare()  # openclaw.json rewritten
    gw.restart()


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    openclaw = install_or_skip()
    root = tmp_path_factory.mktemp("openclaw-store")
    templated = root / "stores" / "{agentId}" / "sessions" / "sessions.json"
    with running_gateway(openclaw, root, {"main": {"name": "Main"}, "ops": {"name": "Ops"}},
                         extra_config={"session": {"store": str(templated)}}) as gw:
        gw.workspace("ops").mkdir(parents=True, exist_ok=True)
        (gw.workspace("ops") / "STATE.md").write_text(STALE_STATE)
        daemon = DaemonProcess(gw.state_dir, root / "vw-data", {"HOME": str(gw.home)}).start()
        w = World(gw, daemon)
        try:
            for turn in TEMPLATED:
                say(gw, turn)
            settle(gw, daemon)
            w.notes["databases"] = databases(gw)  # the registry forgets them once the store changes
            assert daemon.stop() == 0
            say(gw, DELETED, session_key=SCRATCH_KEY)
            deleted = gw.run("sessions", "delete", SCRATCH_KEY, "--agent", "ops", "--yes", "--json")
            w.notes["deleted"] = deleted.stdout
            daemon.start()
            use_store(gw, root / "shared" / "all.sqlite")
            for turn in SHARED:
                say(gw, turn)
            gw.agent("ops", "/new")
            settle(gw, daemon)
            w.notes["databases"] += databases(gw)
            w.notes["export"] = {agent: daemon.export(agent) for agent in ("main", "ops")}
            w.notes["gaps"] = daemon.events("gap_detected")
            w.notes["status"] = daemon.status()
            before = len(w.notes["gaps"])
            assert daemon.stop() == 0
            daemon.start()
            settle(gw, daemon)
            w.notes["export_after_restart"] = daemon.export()
            w.notes["gaps_after_restart"] = daemon.events("gap_detected")[before:]
            yield w
        finally:
            if daemon.running:
                daemon.stop()


def stored(w: World, agent: str) -> list[str]:
    return sorted(p["payload"]["data"] for p in w.notes["export"][agent])


def test_openclaw_wrote_outside_the_agents_own_databases(world: World) -> None:
    gw = world.gateway
    names = {str(p.relative_to(gw.root)) for p in world.notes["databases"]}
    assert {"stores/main/sessions/openclaw-agent.sqlite", "stores/ops/sessions/openclaw-agent.ops.sqlite",
            "shared/all.sqlite"} <= names, names
    for agent in ("main", "ops"):
        assert not gw.transcript_rows(agent), f"{agent}'s own database holds no transcript"
    shared = {key for (key,) in query(gw.root / "shared" / "all.sqlite", "SELECT session_key FROM session_windows")}
    assert {"agent:main:main", "agent:ops:main"} <= shared, shared
    assert ".jsonl.deleted." in world.notes["deleted"] and "/stores/ops/sessions/" in world.notes["deleted"]


def test_every_message_is_memory_once_under_the_agent_that_was_told(world: World) -> None:
    for agent in ("main", "ops"):
        turns = [t for t in (*TEMPLATED, DELETED, *SHARED) if t[0] == agent]
        assert stored(world, agent) == sorted(text for _, *pair in turns for text in pair), agent
    again = sorted((p["payload"]["agent_id"], p["payload"]["data"]) for p in world.notes["export_after_restart"])
    assert again == sorted((a, p["payload"]["data"]) for a in ("main", "ops") for p in world.notes["export"][a])


def test_an_agent_never_finds_what_another_was_told_in_a_shared_database(world: World) -> None:
    hits = world.daemon.search("main", "When does the on-call rotation switch?")
    assert all("monday" not in h["text"].lower() for h in hits), hits
    hits = world.daemon.search("ops", "When does the on-call rotation switch?")
    assert hits and "monday" in hits[0]["text"].lower(), hits
    hits = world.daemon.search("ops", "When is the niece's birthday?")
    assert all("march" not in h["text"].lower() for h in hits), hits


def test_conversations_end_as_gaps_of_the_agent_that_had_them(world: World) -> None:
    """ops's deleted side session (its archive, beside ops's store database) and ops's `/new` in the shared
    database: two ends of ops's conversations, STATE.md stale; none of main's."""
    gaps = world.notes["gaps"]
    where = sorted((g["agent"], "/stores/ops/sessions/" in g["transcript"] and ".jsonl.deleted." in g["transcript"],
                    "/shared/all.sqlite#" in g["transcript"]) for g in gaps)
    assert where == [("ops", False, True), ("ops", True, False)], gaps
    assert not world.notes["gaps_after_restart"], world.notes["gaps_after_restart"]


def test_status_counts_each_agents_sessions_in_every_store(world: World) -> None:
    agents = world.notes["status"]["agents"]
    for agent in ("main", "ops"):
        assert agents[agent]["entries_stored"] == len(stored(world, agent)), agents[agent]
    dbs = {(s["db"], s["agent"]) for s in world.notes["status"]["sqlite"]}
    shared = str(world.gateway.root / "shared" / "all.sqlite")
    assert {(shared, "main"), (shared, "ops")} <= dbs, dbs
