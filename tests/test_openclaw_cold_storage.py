"""OpenClaw's cold transcript storage, done by the real OpenClaw 2026.9.6, before veritas-watch first runs.

With `session.maintenance.coldStorage` on, OpenClaw moves the rows of sessions inactive for `afterDays`
out of its database into `agents/<id>/sessions/cold/<sha256>.jsonl.zst`. A person who installs
veritas-watch on such a machine must find those conversations in memory too: they are read from the
archive (verified by size and SHA-256 as OpenClaw verifies it), once, under their session.

Time is the one thing shifted: the side session's activity times (the `session_nodes` columns and its
`entry_json`, and `session_windows`) are set three days back while the gateway is stopped, since
`afterDays` counts whole days; the archiving is OpenClaw's own, at its start-up check.

Skipped, with the reason, only where the npm registry cannot be reached (and `CI` is not set).
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from tests.daemon_harness import DaemonProcess, wait_for
from tests.mock_model import Plan
from tests.openclaw_harness import OpenClawGateway, install_or_skip, running_gateway
from tests.test_openclaw_real import restarted, wait_settled

pytestmark = pytest.mark.long  # a minute: started first (tests/conftest.py)

OLD_KEY = "agent:main:boatyard"
OLD = ("The boatyard invoice is due on the 14th.", "Invoice due on the 14th, noted.")
NOW = ("The regatta starts at ten.", "Regatta at ten, noted.")


@dataclass
class World:
    gateway: OpenClawGateway
    daemon: DaemonProcess
    notes: dict[str, Any] = field(default_factory=dict)


def say(gw: OpenClawGateway, turn: tuple[str, str], session_key: str | None = None) -> None:
    gw.model.plan(turn[0], Plan(reply=turn[1]))
    assert turn[1] in gw.agent("main", turn[0], session_key=session_key).reply


def age(gw: OpenClawGateway, session_key: str, days: float) -> None:
    """Shift one session's activity `days` into the past (the gateway stopped)."""
    then = int((time.time() - days * 86400) * 1000)
    with sqlite3.connect(gw.agent_db("main")) as db:
        (entry_json,) = db.execute("SELECT entry_json FROM session_nodes WHERE session_key = ?",
                                   (session_key,)).fetchone()
        entry = json.loads(entry_json)
        for name in ("updatedAt", "lastInteractionAt", "lastActivityAt"):
            if name in entry:
                entry[name] = then
        db.execute("UPDATE session_nodes SET entry_json = ?, updated_at = ?, last_activity_at = ?,"
                   " last_interaction_at = ? WHERE session_key = ?", (json.dumps(entry), then, then, then, session_key))
        db.execute("UPDATE session_windows SET updated_at = ?, transcript_updated_at = ? WHERE session_key = ?",
                   (then, then, session_key))


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    openclaw = install_or_skip()
    root = tmp_path_factory.mktemp("openclaw-cold")
    policy = {"session": {"maintenance": {"coldStorage": {"enabled": True, "afterDays": 1}}}}
    with running_gateway(openclaw, root, {"main": {"name": "Main"}}, extra_config=policy) as gw:
        say(gw, OLD, OLD_KEY)
        say(gw, NOW)
        gw.stop()
        age(gw, OLD_KEY, days=3)
        gw.restart()
        wait_for(lambda: gw.query("main", "SELECT count(*) FROM session_transcript_cold_archives")[0][0] == 1,
                 timeout=120, interval=0.5, what="OpenClaw's cold storage archived the old session")
        daemon = DaemonProcess(gw.state_dir, root / "vw-data", {"HOME": str(gw.home)}).start()
        w = World(gw, daemon)
        try:
            wait_settled(gw, daemon)
            daemon.wait_idle(120)
            w.notes["export"] = daemon.export()
            w.notes["gaps_after_restart"] = restarted(gw, daemon)
            w.notes["export_after_restart"] = daemon.export()
            yield w
        finally:
            if daemon.running:
                daemon.stop()


def cold_session(w: World) -> str:
    ((sid,),) = w.gateway.query("main", "SELECT session_id FROM session_windows WHERE session_key = ?", (OLD_KEY,))
    return str(sid)


def test_openclaw_moved_the_old_session_out_of_its_database(world: World) -> None:
    sid = cold_session(world)
    assert not [r for r in world.gateway.transcript_rows("main") if r.session_id == sid]
    ((name, storage),) = world.gateway.query(
        "main", "SELECT archive_name, storage FROM session_transcript_cold_archives WHERE session_id = ?", (sid,))
    assert storage == "file" and (world.gateway.sessions_dir("main") / "cold" / name).is_file()


def test_a_conversation_in_cold_storage_is_memory_once_and_stays_so_after_a_restart(world: World) -> None:
    sid = cold_session(world)
    stored = sorted((p["payload"]["session_id"], p["payload"]["data"]) for p in world.notes["export"])
    assert [(s, d) for s, d in stored if d in OLD] == sorted((sid, t) for t in OLD), stored
    assert sorted(d for _, d in stored) == sorted([*OLD, *NOW])
    again = sorted((p["id"], p["payload"]["data"]) for p in world.notes["export_after_restart"])
    assert again == sorted((p["id"], p["payload"]["data"]) for p in world.notes["export"])
    hits = world.daemon.search("main", "When is the boatyard invoice due?")
    assert hits and "14th" in hits[0]["text"], hits
