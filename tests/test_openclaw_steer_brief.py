"""`/steer` and a sub-agent's brief, on the real OpenClaw 2026.9.6.

`/steer <text>` (alias `/tell`), sent as the Control UI sends it (`chat.send`): OpenClaw writes the line as typed,
once, and hands the model only the text, into the running turn or, with none running, as a turn of its own.
veritas-watch stores the person's words without the command.

`sessions_spawn` into another agent (`subagents.allowAgents`) with a brief that carries the person's GitHub token
(OpenClaw writes it masked) and card number (written in clear): the child session, in the helper agent, is no
memory, but both credentials are indexed in the helper's CREDENTIALS_INDEX.md at the brief's line; main's index
keeps one row each, at the person's message, also after a second child in main itself got the same brief. Neither
value reaches the store, the log or an index.

Skipped, with the reason, only where the npm registry cannot be reached (and `CI` is not set).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.daemon_harness import DaemonProcess, wait_for
from tests.mock_model import Plan
from tests.openclaw_harness import OpenClawGateway, TranscriptRow, install_or_skip, running_gateway
from tests.test_openclaw_cold_storage import World, say
from tests.test_openclaw_real import wait_settled
from veritas_watch.features.credentials import INDEX_FILE, IndexRow, given_at, read_index

pytestmark = pytest.mark.long

TOKEN = "ghp_Zq8kL2mN4pQ6rS8tU0vW2xY4zA6bC8dQjwR1"
CARD = "4556 7375 8689 9855"  # Luhn-valid, not a published test card
HELLO = ("Hi, I'm Ada; the team site deploys from the staging repo.", "Hi Ada, staging repo noted.")
BUSY = ("Plan the deploy checklist for the team site.", "Deploy checklist: build, test, tag, ship.")
STEER = ("Steer: keep the checklist to five steps at most.", "Five steps at most, understood.")
TELL = ("Tell: the release is on Thursday evening.", "Thursday evening release, noted.")
ASK = (f"Have the helper agent deploy the site; my GitHub token is {TOKEN} and the hosting bill goes on card {CARD}.",
       "The helper agent is deploying the site.")
TASK = f"Deploy the team site to staging with the GitHub token {TOKEN}, then pay the hosting bill with card {CARD}"
CHILD_REPLY = "Deployed to staging; hosting bill paid."
ASK_AGAIN = ("Have a helper here check the repo access as well.", "A helper is checking the repo access.")
TASK_AGAIN = f"Check the staging repo access with the GitHub token {TOKEN}"
CHILD_AGAIN_REPLY = "Repo access confirmed."


def send(gw: OpenClawGateway, text: str, n: int) -> None:
    """`text` as the Control UI sends it to main's main session (`chat.send` returns at once)."""
    gw.run("gateway", "call", "chat.send", "--params", json.dumps({
        "sessionKey": "agent:main:main", "message": text, "idempotencyKey": f"steer-brief-{n}"}), "--json")


def row_with(gw: OpenClawGateway, agent: str, text: str, *, start: str = "") -> TranscriptRow | None:
    return next((r for r in gw.transcript_rows(agent) if text in r.text and r.text.startswith(start)), None)


def spawn(gw: OpenClawGateway, ask: tuple[str, str], task: str, reply: str, **options: Any) -> None:
    gw.model.plan(task[:40], Plan(reply=reply))
    gw.model.plan(ask[0][:40], Plan(reply=ask[1], tool="sessions_spawn", arguments={"task": task, **options}))
    assert ask[1] in gw.agent("main", ask[0]).reply


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    openclaw = install_or_skip()
    root = tmp_path_factory.mktemp("openclaw-steer-brief")
    agents: dict[str, dict[str, Any]] = {"main": {"name": "Main", "subagents": {"allowAgents": ["helper"]}},
                                        "helper": {"name": "Helper"}}
    extra = {"tools": {"toolSearch": False}}  # the mock model calls `sessions_spawn` by name
    with running_gateway(openclaw, root, agents, extra_config=extra) as gw:
        for agent in agents:
            gw.workspace(agent).mkdir(parents=True, exist_ok=True)
        daemon = DaemonProcess(gw.state_dir, root / "vw-data", {"HOME": str(gw.home)}).start()
        w = World(gw, daemon)
        try:
            say(gw, HELLO)
            # /steer while a run is active: the model is still answering BUSY when it arrives
            gw.model.plan(BUSY[0], Plan(reply=BUSY[1], delay=15))
            gw.model.plan(STEER[0], Plan(reply=STEER[1]))
            asked = len(gw.model.requests)
            send(gw, BUSY[0], 1)
            wait_for(lambda: any(BUSY[0] in json.dumps(r) for r in gw.model.requests[asked:]), timeout=120,
                     interval=0.2, what="the model answering the busy turn")
            send(gw, f"/steer {STEER[0]}", 2)
            wait_for(lambda: row_with(gw, "main", STEER[1]), timeout=180, interval=0.3, what="the steered reply")
            # /tell (its alias) with no run active: a turn of its own
            gw.model.plan(TELL[0], Plan(reply=TELL[1]))
            send(gw, f"/tell {TELL[0]}", 3)
            wait_for(lambda: row_with(gw, "main", TELL[1]), timeout=180, interval=0.3, what="the /tell reply")
            # a child in the helper agent, then one in main, each with the token in its brief
            spawn(gw, ASK, TASK, CHILD_REPLY, agentId="helper", label="deploy")
            wait_for(lambda: row_with(gw, "helper", CHILD_REPLY), timeout=180, interval=0.5, what="the helper's run")
            spawn(gw, ASK_AGAIN, TASK_AGAIN, CHILD_AGAIN_REPLY, label="access")
            wait_for(lambda: row_with(gw, "main", CHILD_AGAIN_REPLY), timeout=180, interval=0.5,
                     what="main's child's run")
            wait_settled(gw, daemon)
            w.notes["export"] = {agent: daemon.export(agent) for agent in agents}
            w.notes["log"] = daemon.log_text()
            yield w
        finally:
            if daemon.running:
                daemon.stop()


def stored(w: World, agent: str = "main") -> list[str]:
    return [p["payload"]["data"] for p in w.notes["export"][agent]]


def index(w: World, agent: str) -> list[IndexRow]:
    return read_index(w.gateway.workspace(agent) / INDEX_FILE)


def place(row: TranscriptRow) -> str:
    return f"sqlite:{row.session_id}:{row.seq}"


def test_openclaw_writes_the_steer_as_typed_once(world: World) -> None:
    texts = [r.text for r in world.gateway.transcript_rows("main")]
    assert texts.count(f"/steer {STEER[0]}") == 1 and texts.count(f"/tell {TELL[0]}") == 1
    assert not [t for t in texts if t in (STEER[0], TELL[0])]  # nowhere without the command


def test_steered_words_are_memory_without_the_command(world: World) -> None:
    texts = stored(world)
    assert texts.count(STEER[0]) == 1 and texts.count(TELL[0]) == 1, texts
    assert not [t for t in texts if t.startswith(("/steer", "/tell"))]
    assert {*HELLO, *BUSY, STEER[1], TELL[1]} <= set(texts)


def test_a_brief_key_is_indexed_in_the_childs_agent_at_the_brief(world: World) -> None:
    brief = row_with(world.gateway, "helper", "[Subagent Task]", start="[Subagent Context]")
    assert brief is not None and "GitHub token ghp_" in brief.text and CARD in brief.text  # the token masked
    rows = index(world, "helper")
    assert sorted(r.key_name for r in rows) == ["CARD_NUMBER", "GITHUB_TOKEN"], rows
    assert {given_at(r.location) for r in rows} == {place(brief)}
    assert not [t for t in stored(world, "helper")]  # the child session is no memory


def test_a_key_already_indexed_from_the_parents_message_is_one_row(world: World) -> None:
    ask = row_with(world.gateway, "main", "", start=ASK[0][:40])
    child_brief = row_with(world.gateway, "main", TASK_AGAIN[:30], start="[Subagent Context]")
    assert ask is not None and child_brief is not None and child_brief.session_id != ask.session_id
    rows = index(world, "main")
    assert sorted(r.key_name for r in rows) == ["CARD_NUMBER", "GITHUB_TOKEN"], rows
    assert {given_at(r.location) for r in rows} == {place(ask)}


def test_the_values_reach_no_store_log_or_index(world: World) -> None:
    digits = CARD.replace(" ", "")
    places = {"store": json.dumps(world.notes["export"]), "log": world.notes["log"],
              **{f"{agent} index": (world.gateway.workspace(agent) / INDEX_FILE).read_text()
                 for agent in ("main", "helper")}}
    for name, text in places.items():
        assert TOKEN not in text and CARD not in text and digits not in text, name
