"""A backup restored into the real OpenClaw 2026.9.6 while veritas-watch runs: memory must not go back in time.

`openclaw backup sqlite create --agent main` snapshots the agent's database; more is said (and a `/new` ends a
conversation); then, the gateway stopped, the snapshot is restored (`backup sqlite restore` into a fresh file,
moved into place of the live one, the gateway started: "Restore a database" in OpenClaw's
docs/install/backups.md) and the gateway goes on from it. OpenClaw's transcript no longer holds what was said
since the backup, and its next turns take the seqs the lost ones had, under the same rewrite generation
(OpenClaw rotates it only for its own destructive rewrites). veritas-watch keeps what was said since the
backup (held nowhere else now), stores the turns after the restore as well, ends the conversation the restore
removed (begun at a `/new` said after the backup: nothing in OpenClaw will end it now) once, at its last stored
turn, and reports the `/new` that ends the restored conversation though an earlier `/new`, now lost, had that seq.

Skipped, with the reason, only where the npm registry cannot be reached (and `CI` is not set).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.daemon_harness import DaemonProcess
from tests.mock_model import Plan
from tests.openclaw_harness import OpenClawGateway, TranscriptRow, install_or_skip, running_gateway
from tests.test_openclaw_real import STALE_STATE, restarted, wait_settled

pytestmark = pytest.mark.long  # minutes: started first (tests/conftest.py)

BACKED_UP = ("The crew meets at the clubhouse.", "Clubhouse, noted.")
LOST = [("The spinnaker needs a new sheet.", "New spinnaker sheet, noted."),  # said after the backup
        ("Fenders go in the port locker.", "Port locker for the fenders, noted.")]  # after a /new too
AFTER_RESTORE = ("The trailer tyres were replaced.", "New trailer tyres, noted.")


@dataclass
class World:
    gateway: OpenClawGateway
    daemon: DaemonProcess
    rows_before_restore: list[TranscriptRow] = field(default_factory=list)
    notes: dict[str, Any] = field(default_factory=dict)


def say(gw: OpenClawGateway, turn: tuple[str, str]) -> None:
    gw.model.plan(turn[0], Plan(reply=turn[1]))
    assert turn[1] in gw.agent("main", turn[0]).reply


@contextlib.contextmanager
def stale_main(tmp_path_factory: pytest.TempPathFactory, name: str) -> Iterator[tuple[OpenClawGateway, DaemonProcess]]:
    """The real gateway with one agent, main, whose STATE.md is stale (every conversation end is a gap), and a
    veritas-watch daemon for it, not started yet (stopped at the end if it runs)."""
    root = tmp_path_factory.mktemp(name)
    with running_gateway(install_or_skip(), root, {"main": {"name": "Main"}}) as gw:
        gw.workspace("main").mkdir(parents=True, exist_ok=True)
        (gw.workspace("main") / "STATE.md").write_text(STALE_STATE)
        daemon = DaemonProcess(gw.state_dir, root / "vw-data", {"HOME": str(gw.home)})
        try:
            yield gw, daemon
        finally:
            if daemon.running:
                daemon.stop()


def restore(gw: OpenClawGateway, snapshot_repo: Path) -> None:
    """The snapshot put in place of main's live database, the gateway stopped meanwhile."""
    gw.stop()
    (snapshot,) = [p for p in snapshot_repo.iterdir() if p.is_dir()]
    restored = gw.root / "restored.sqlite"
    gw.run("backup", "sqlite", "restore", str(snapshot), "--target", str(restored), "--json")
    db = gw.agent_db("main")
    for stale in (db.with_name(db.name + "-wal"), db.with_name(db.name + "-shm"), db):
        stale.unlink(missing_ok=True)
    restored.rename(db)
    gw.restart()


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    with stale_main(tmp_path_factory, "openclaw-restore") as (gw, daemon):
        w = World(gw, daemon.start())
        say(gw, BACKED_UP)
        repo = gw.root / "backups"
        gw.run("backup", "sqlite", "create", "--agent", "main", "--repository", str(repo), "--json")
        say(gw, LOST[0])
        gw.agent("main", "/new")
        say(gw, LOST[1])
        wait_settled(gw, daemon)
        w.rows_before_restore = gw.transcript_rows("main")
        restore(gw, repo)
        say(gw, AFTER_RESTORE)
        gw.agent("main", "/new")
        wait_settled(gw, daemon)
        w.notes["export"] = daemon.export()
        w.notes["kept"] = daemon.events("restored_points_kept")
        w.notes["gaps"] = daemon.events("gap_detected")
        w.notes["ended"] = daemon.events("conversation_ended")
        w.notes["gaps_after_restart"] = restarted(gw, daemon)
        yield w


def points(w: World) -> list[dict[str, Any]]:
    return [p["payload"] for p in w.notes["export"]]


def test_openclaw_went_back_to_the_backup_and_reused_the_lost_turns_seqs(world: World) -> None:
    before = {r.seq: r for r in world.rows_before_restore}
    now = world.gateway.transcript_rows("main")
    texts = [r.text for r in now]
    assert BACKED_UP[0] in texts and AFTER_RESTORE[0] in texts
    assert not {t for turn in LOST for t in turn} & set(texts)
    assert len({r.session_id for r in now}) == 1, "one session throughout"
    reused = [r.seq for r in now if r.seq in before and r.event.get("id") != before[r.seq].event.get("id")]
    assert reused, "the turns after the restore took the seqs of the lost ones"


def test_what_was_said_since_the_backup_stays_in_memory_with_what_came_after_the_restore(world: World) -> None:
    stored = sorted(p["data"] for p in points(world))
    assert stored == sorted(t for turn in (BACKED_UP, *LOST, AFTER_RESTORE) for t in turn), stored
    assert sum(e["points"] for e in world.notes["kept"]) == 2 * len(LOST), world.notes["kept"]
    hits = world.daemon.search("main", "Where do the fenders go?")
    assert hits and "port locker" in hits[0]["text"].lower(), hits


def test_the_restore_ends_the_conversation_it_removed_and_the_new_after_it_the_restored_one(world: World) -> None:
    ts = {p["data"]: p["timestamp"] for p in points(world)}
    # the /new after the first lost turn; the restore, ending the conversation begun at that /new (lost with it);
    # the /new after the restore (its seq was handed on before)
    assert [g["session_end"] for g in world.notes["gaps"]] == [ts[LOST[0][1]], ts[LOST[1][1]], ts[AFTER_RESTORE[1]]], \
        world.notes["gaps"]
    assert [e["reason"] for e in world.notes["ended"]] == ["new", "restored", "new"], world.notes["ended"]
    assert not world.notes["gaps_after_restart"], world.notes["gaps_after_restart"]
