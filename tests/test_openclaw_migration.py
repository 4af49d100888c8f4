"""The upgrade every JSONL-era user makes, done by the real OpenClaw 2026.9.6 while veritas-watch runs.

A real pre-2026.9 history (`../shared/fixtures/openclaw/zapabob-main`: `sessions.json`, live transcripts and
`.reset.*` archives) is laid out as the old OpenClaw kept it, and veritas-watch stores it. Then, the daemon
still running, `openclaw doctor --fix` imports it into `openclaw-agent.sqlite` and moves the live
transcripts into `session-sqlite-import-archive/`; the upgraded gateway goes on in the migrated session.
Nothing may be stored twice or lost, the move is no end of a conversation (no gap), and the conversation
that began in JSONL and goes on in SQLite ends, on `/new`, exactly once.

Skipped, with the reason, only where the npm registry cannot be reached (and `CI` is not set) or
`../shared` is absent.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from fixture_paths import shared_dir

from tests.daemon_harness import DaemonProcess
from tests.mock_model import MockModel, Plan
from tests.openclaw_harness import OpenClawGateway, install_or_skip
from tests.test_openclaw_real import STALE_STATE, fresh_state, wait_settled

pytestmark = pytest.mark.long  # minutes: started first (tests/conftest.py)

AFTER = ("After the upgrade: the regatta moved to Sunday.", "Regatta on Sunday, noted.")


@dataclass
class World:
    gateway: OpenClawGateway
    daemon: DaemonProcess
    legacy: dict[str, Any]  # the old sessions.json
    notes: dict[str, Any] = field(default_factory=dict)


def point_set(points: list[dict[str, Any]]) -> dict[str, tuple[str, str]]:
    return {p["id"]: (p["payload"]["session_id"], p["payload"]["data"]) for p in points}


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    shared = shared_dir()
    if shared is None:
        pytest.skip("../shared (the real JSONL-era history) is absent")
    source = shared / "fixtures" / "openclaw" / "zapabob-main"
    openclaw = install_or_skip()
    root = tmp_path_factory.mktemp("openclaw-migration")
    model = MockModel().start()
    gw = OpenClawGateway(openclaw, root, model, {"main": {"name": "Main"}}).prepare()
    sessions = gw.state_dir / "agents" / "main" / "sessions"
    shutil.copytree(source / "sessions", sessions)
    shutil.copy(source / "sessions.json", sessions / "sessions.json")
    daemon = DaemonProcess(gw.state_dir, root / "vw-data", {"HOME": str(gw.home)})
    workspace = Path(json.loads(daemon.cli("status", "--json").stdout)["agents"]["main"]["workspace"])
    workspace.mkdir(parents=True, exist_ok=True)
    (workspace / "STATE.md").write_text(fresh_state())  # the old history was synced
    w = World(gw, daemon.start(), json.loads((source / "sessions.json").read_text()))
    try:
        daemon.wait_idle(300)
        w.notes["before"] = daemon.export()
        w.notes["ends_before"] = len(daemon.events("conversation_ended"))

        doctor = gw.run_once_more_if_locked("doctor", "--fix", "--non-interactive", timeout=600)
        w.notes["doctor"] = doctor.stdout
        w.notes["live_after_doctor"] = sorted(p.name for p in sessions.glob("*.jsonl"))
        w.notes["imported"] = sorted(p.name for p in (sessions.parent / "session-sqlite-import-archive").iterdir())
        wait_settled(gw, daemon, timeout=300)
        w.notes["after_doctor"] = daemon.export()
        w.notes["ends_after_doctor"] = len(daemon.events("conversation_ended"))

        gw.restart()  # the upgraded gateway (it refuses to start on a legacy store: now it must start)
        model.plan(AFTER[0], Plan(reply=AFTER[1]))
        assert AFTER[1] in gw.agent("main", AFTER[0]).reply
        wait_settled(gw, daemon)
        (workspace / "STATE.md").write_text(STALE_STATE)
        gw.agent("main", "/new")
        wait_settled(gw, daemon)
        w.notes["after_new"] = daemon.export()
        w.notes["gaps"] = daemon.events("gap_detected")
        assert daemon.stop() == 0
        again = DaemonProcess(gw.state_dir, root / "vw-data", {"HOME": str(gw.home)}).start()
        w.daemon = again
        wait_settled(gw, again)
        w.notes["after_restart"] = again.export()
        w.notes["gaps_after_restart"] = again.events("gap_detected")[len(w.notes["gaps"]):]  # one log file
        yield w
    finally:
        if w.daemon.running:
            w.daemon.stop()
        gw.stop()
        model.stop()


def test_doctor_imported_the_history_into_sqlite(world: World) -> None:
    """The precondition, as OpenClaw did it: the live transcripts left `sessions/` for the import archive and
    their rows are in the agent's database."""
    assert world.notes["live_after_doctor"] == [], world.notes["live_after_doctor"]
    assert any(".jsonl.imported-" in name for name in world.notes["imported"]), world.notes["imported"]
    main_session = world.legacy["agent:main:main"]["sessionId"]
    rows = world.gateway.transcript_rows("main")
    assert any(r.session_id == main_session for r in rows), "the main session was not imported"


def test_the_import_stores_nothing_twice_and_loses_nothing(world: World) -> None:
    before, after = point_set(world.notes["before"]), point_set(world.notes["after_doctor"])
    assert len(before) > 100, len(before)
    assert after == before, (
        f"new: {sorted(set(after.values()) - set(before.values()))[:5]}, "
        f"lost: {sorted(set(before.values()) - set(after.values()))[:5]}")


def test_moving_the_transcripts_is_no_end_and_no_gap(world: World) -> None:
    assert world.notes["ends_after_doctor"] == world.notes["ends_before"]
    assert len(world.notes["gaps"]) == 1, world.notes["gaps"]  # the /new below, nothing from the import


def test_the_migrated_conversation_goes_on_and_ends_once(world: World) -> None:
    """The upgraded gateway writes the next turn into the migrated session (same id): stored once, under
    that session; `/new` with a stale STATE.md ends that conversation, which began in JSONL: one gap, at
    the last turn, not repeated after a restart."""
    main_session = world.legacy["agent:main:main"]["sessionId"]
    new = [p["payload"] for p in world.notes["after_new"] if p["id"] not in point_set(world.notes["after_doctor"])]
    assert sorted(p["data"] for p in new) == sorted(AFTER), new
    assert {p["session_id"] for p in new} == {main_session}
    [gap] = world.notes["gaps"]
    assert gap["agent"] == "main" and gap["session"] == main_session, gap
    assert gap["session_end"] == max(p["timestamp"] for p in new), gap
    assert point_set(world.notes["after_restart"]) == point_set(world.notes["after_new"])
    assert world.notes["gaps_after_restart"] == [], world.notes["gaps_after_restart"]
