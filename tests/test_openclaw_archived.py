"""Archived sessions on the real OpenClaw 2026.9.6: history the person had, so memory like any other.

`sessions.patch` with `archived: true` (the `sessions` tool's and the Control UI's archive; maintenance's
`archiveDashboardAfter`, `pruneAfter` and `maxEntries` cap write the same mark) archives a session in place:
`session_nodes.archived_at` and the entry's `archivedAt` are set, its window, rows and rewrite generation stay,
and OpenClaw refuses new work in it until it is restored (`archived: false`). OpenClaw's own memory (memory-core)
goes on indexing an archived session's transcript, so veritas-watch reads it like any other: one archived before
the daemon first ran included, a restore duplicating nothing. Archiving ends no conversation: OpenClaw emits no
`session_end` for it (that hook's reasons are new, reset, idle, daily, compaction, deleted, shutdown, restart),
and a restored session goes on with its context, so what the person says after restoring it belongs to the same
conversation, which ends where OpenClaw ends it (here a `/new`), once.

Skipped, with the reason, only where the npm registry cannot be reached (and `CI` is not set).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.mock_model import Plan
from tests.openclaw_harness import OpenClawGateway
from tests.test_openclaw_backup_restore import stale_main
from tests.test_openclaw_cold_storage import World, say
from tests.test_openclaw_real import restarted, wait_settled

pytestmark = pytest.mark.long  # a minute: started first (tests/conftest.py)

GARDEN = "agent:main:garden"  # archived before veritas-watch first runs, restored later
BOAT = "agent:main:boat"  # archived while veritas-watch runs
GARDEN_BEFORE = ("The roses get pruned in March.", "Roses pruned in March, noted.")
MAIN = ("The plumber comes on Tuesday.", "Plumber on Tuesday, noted.")
BOAT_TURN = ("The mooring fee went up to 400.", "Mooring fee 400, noted.")
GARDEN_AFTER = ("And the hedge gets trimmed in May.", "Hedge trimmed in May, noted.")
REFUSED = "Is the garden session still open?"


def session_id(gw: OpenClawGateway, key: str) -> str:
    ((sid,),) = gw.query("main", "SELECT current_session_id FROM session_nodes WHERE session_key = ?", (key,))
    return str(sid)


def archive(gw: OpenClawGateway, key: str, archived: bool) -> None:
    """What the `sessions` tool and the Control UI do: the gateway's `sessions.patch`, the session's id expected."""
    gw.run("gateway", "call", "sessions.patch", "--params",
           json.dumps({"key": key, "archived": archived, "expectedSessionId": session_id(gw, key)}), "--json")


def on_disk(gw: OpenClawGateway, key: str) -> dict[str, Any]:
    """What OpenClaw keeps of one session: its archive mark, rows and rewrite generation."""
    sid = session_id(gw, key)
    ((archived_at, entry_json),) = gw.query("main", "SELECT archived_at, entry_json FROM session_nodes"
                                                    " WHERE session_key = ?", (key,))
    generation = gw.query("main", "SELECT generation FROM transcript_rewrite_watermarks WHERE session_id = ?", (sid,))
    return {"archived_at": archived_at, "entry_archived_at": json.loads(entry_json).get("archivedAt"),
            "rows": [(r.seq, r.event.get("id")) for r in gw.transcript_rows("main") if r.session_id == sid],
            "generation": generation, "windows": gw.query("main", "SELECT session_id FROM session_windows"
                                                                  " WHERE session_key = ?", (key,))}


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    with stale_main(tmp_path_factory, "openclaw-archived") as (gw, daemon):
        w = World(gw, daemon)
        say(gw, GARDEN_BEFORE, GARDEN)
        w.notes["garden_before"] = on_disk(gw, GARDEN)
        archive(gw, GARDEN, True)
        w.notes["garden_archived"] = on_disk(gw, GARDEN)
        gw.model.plan(REFUSED, Plan(reply="It is."))
        w.notes["refused"] = gw.run("agent", "--agent", "main", "--message", REFUSED, "--session-key", GARDEN,
                                    "--json", check=False)
        say(gw, MAIN)
        daemon.start()  # its first run: the garden session is archived already
        wait_settled(gw, daemon)
        say(gw, BOAT_TURN, BOAT)
        wait_settled(gw, daemon)
        archive(gw, BOAT, True)
        wait_settled(gw, daemon)
        w.notes["ended_while_archived"] = daemon.events("conversation_ended")
        # OpenClaw's own memory, asked to index again from scratch, with both sessions archived
        gw.run("memory", "index", "--agent", "main", "--force")
        w.notes["indexed"] = {str(p) for (p,) in gw.query("main", "SELECT path FROM memory_index_sources"
                                                                  " WHERE source = 'sessions'")}
        w.notes["boat_sid"] = session_id(gw, BOAT)
        archive(gw, GARDEN, False)
        w.notes["garden_restored"] = on_disk(gw, GARDEN)
        say(gw, GARDEN_AFTER, GARDEN)
        gw.agent("main", "/new", session_key=GARDEN)
        wait_settled(gw, daemon)
        w.notes["export"] = daemon.export()
        w.notes["gaps"] = daemon.events("gap_detected")
        w.notes["gaps_after_restart"] = restarted(gw, daemon)
        w.notes["export_after_restart"] = daemon.export()
        yield w


def stored(export: list[dict[str, Any]]) -> list[str]:
    return sorted(p["payload"]["data"] for p in export)


def test_archiving_marks_the_session_in_place_and_refuses_new_work_in_it(world: World) -> None:
    before, archived, restored = (world.notes[k] for k in ("garden_before", "garden_archived", "garden_restored"))
    assert before["archived_at"] is None and before["entry_archived_at"] is None, before
    assert archived["archived_at"] and archived["entry_archived_at"] == archived["archived_at"], archived
    # the same window, the same rows under the same generation: nothing moved, nothing rewritten
    assert {k: archived[k] for k in ("rows", "generation", "windows")} \
        == {k: before[k] for k in ("rows", "generation", "windows")}
    assert restored["archived_at"] is None and restored["rows"] == before["rows"], restored
    refused = world.notes["refused"]
    assert refused.returncode != 0 and "is archived" in refused.stdout + refused.stderr, refused


def test_openclaws_own_memory_indexes_archived_sessions(world: World) -> None:
    assert f"sessions/main/{world.notes['boat_sid']}.jsonl" in world.notes["indexed"], world.notes["indexed"]


def test_archived_sessions_are_memory_once_archived_before_the_first_run_and_restored(world: World) -> None:
    expected = sorted(t for turn in (GARDEN_BEFORE, MAIN, BOAT_TURN, GARDEN_AFTER) for t in turn)
    assert stored(world.notes["export"]) == expected, stored(world.notes["export"])
    assert stored(world.notes["export_after_restart"]) == expected
    hits = world.daemon.search("main", "When are the roses pruned?")
    assert hits and "march" in hits[0]["text"].lower(), hits


def test_archiving_ends_no_conversation_and_the_restored_one_ends_once(world: World) -> None:
    assert not world.notes["ended_while_archived"], world.notes["ended_while_archived"]
    ts = {p["payload"]["data"]: p["payload"]["timestamp"] for p in world.notes["export"]}
    # one end: the garden conversation, begun before its archiving and ended by the /new after its restore
    assert [g["session_end"] for g in world.notes["gaps"]] == [ts[GARDEN_AFTER[1]]], world.notes["gaps"]
    assert not world.notes["gaps_after_restart"], world.notes["gaps_after_restart"]
