"""What the real OpenClaw 2026.9.6 does over time: automatic resets and a gateway restart in mid-turn.

An automatic reset is the end of a conversation.

With `session.reset` set to `idle` (or `daily`), OpenClaw writes nothing when a session expires; the next
message starts the next conversation, in one of two ways depending on how it arrives:
- through the reply pipeline (channels, the Control UI's `chat.send`): a `reset` event with `reason` `idle`
  appended to the same session, as `/new` does;
- through `openclaw agent` (the gateway's agent command): a new `session_windows` row of the same key,
  its `previous_session_id` the expired session, and no `reset` event.
veritas-watch must take either for the end of the conversation before it: one `conversation_ended` each,
one gap each while STATE.md is stale, none again after a restart, and every turn stored once.

A gateway restart while a turn is running is no end: after it OpenClaw finishes the interrupted turn,
prompting the model with a `[System] Your previous turn was interrupted by a gateway restart...` message
that it writes as a user row (provenance `internal_system`). That prompt is not memory; the person's
message and the answer are, once. (It runs on another agent, `ops`, while `main` waits out its timer.)

Skipped, with the reason, only where the npm registry cannot be reached (and `CI` is not set).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from tests.daemon_harness import DaemonProcess, wait_for
from tests.mock_model import Plan
from tests.openclaw_harness import OpenClawGateway, install_or_skip, running_gateway
from tests.test_openclaw_real import STALE_STATE, restarted, wait_settled

pytestmark = pytest.mark.long  # minutes (most of it OpenClaw's idle timer): started first (tests/conftest.py)

IDLE_MINUTES = 1  # the least OpenClaw accepts
FIRST = ("The dinghy's mooring is buoy 14.", "Buoy 14 for the dinghy, noted.")
SECOND = ("The regatta briefing is at nine.", "Briefing at nine, noted.")
THIRD = ("Ada's new boat is called Petrel.", "Petrel, noted.")
WARM = ("The ops rota starts on Monday.", "Rota from Monday, noted.")
LONG = ("Draft the harbour evacuation plan.", "Evacuation plan: muster at the east slipway.")
RECOVERY = "Your previous turn was interrupted by a gateway restart"


@dataclass
class World:
    gateway: OpenClawGateway
    daemon: DaemonProcess
    notes: dict[str, Any] = field(default_factory=dict)


def agent_turn(gw: OpenClawGateway, turn: tuple[str, str], agent: str = "main") -> float:
    """Through `openclaw agent`, into the agent's main session; returns when it was answered (OpenClaw's idle
    timer runs from the run's last write)."""
    gw.model.plan(turn[0], Plan(reply=turn[1]))
    assert turn[1] in gw.agent(agent, turn[0]).reply
    return time.monotonic()


def chat_send(gw: OpenClawGateway, agent: str, text: str) -> None:
    """Through the reply pipeline: `chat.send`, as the Control UI sends it (returns at once)."""
    gw.run("gateway", "call", "chat.send", "--params", json.dumps({
        "sessionKey": f"agent:{agent}:main", "message": text, "idempotencyKey": f"send-{text[:12]}"}), "--json")


def written(gw: OpenClawGateway, agent: str, text: str) -> None:
    wait_for(lambda: any(r.text == text for r in gw.transcript_rows(agent)), timeout=180, interval=0.3,
             what=f"OpenClaw wrote {text!r}")


def chat_turn(gw: OpenClawGateway, turn: tuple[str, str]) -> None:
    gw.model.plan(turn[0], Plan(reply=turn[1]))
    chat_send(gw, "main", turn[0])
    written(gw, "main", turn[1])


def interrupted_turn(gw: OpenClawGateway) -> None:
    """ops' model is still answering when the gateway restarts (SIGTERM, then SIGKILL after 5 s)."""
    agent_turn(gw, WARM, "ops")
    gw.model.plan(LONG[0], Plan(reply=LONG[1], delay=30))
    chat_send(gw, "ops", LONG[0])
    written(gw, "ops", LONG[0])
    time.sleep(2)  # the model request is out
    gw.model.plan(LONG[0], Plan(reply=LONG[1]))  # answered at once when OpenClaw resumes the turn
    gw.restart()
    written(gw, "ops", LONG[1])


def expire(w: World, since: float) -> int:
    """Wait out main's idle timer, started at `since` (OpenClaw writes nothing); the conversation ends seen."""
    time.sleep(max(0.0, since + IDLE_MINUTES * 60 + 10 - time.monotonic()))
    wait_settled(w.gateway, w.daemon)
    return len([e for e in w.daemon.events("conversation_ended") if e["agent"] == "main"])


def windows(w: World) -> list[tuple[Any, ...]]:
    """(session id, previous session id) of each window of main's main session, oldest first."""
    return w.gateway.query("main", "SELECT session_id, previous_session_id FROM session_windows"
                                   " WHERE session_key = 'agent:main:main' ORDER BY created_at")


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    openclaw = install_or_skip()
    root = tmp_path_factory.mktemp("openclaw-idle")
    policy = {"session": {"reset": {"mode": "idle", "idleMinutes": IDLE_MINUTES}}}
    agents = {"main": {"name": "Main"}, "ops": {"name": "Ops"}}
    with running_gateway(openclaw, root, agents, extra_config=policy) as gw:
        for agent in agents:
            gw.workspace(agent).mkdir(parents=True, exist_ok=True)
            (gw.workspace(agent) / "STATE.md").write_text(STALE_STATE)
        daemon = DaemonProcess(gw.state_dir, root / "vw-data", {"HOME": str(gw.home)}).start()
        w = World(gw, daemon)
        try:
            since = agent_turn(gw, FIRST)
            interrupted_turn(gw)
            w.notes["ends_at_expiry"] = [expire(w, since)]
            since = agent_turn(gw, SECOND)  # rolls the session over to a new window
            w.notes["windows_after_rollover"] = windows(w)
            w.notes["ends_at_expiry"].append(expire(w, since))
            chat_turn(gw, THIRD)  # a reset event in that window
            wait_settled(gw, daemon)
            w.notes["ended"] = daemon.events("conversation_ended")
            w.notes["gaps"] = daemon.events("gap_detected")
            w.notes["export"] = daemon.export()
            w.notes["gaps_after_restart"] = restarted(gw, daemon)
            yield w
        finally:
            if daemon.running:
                daemon.stop()


def sessions(w: World) -> tuple[str, str]:
    """The two windows, in order: the second rolled over from the first (checked as it was right after the
    rollover: by the end of the world OpenClaw had cleared `previous_session_id` again)."""
    rolled = w.notes["windows_after_rollover"]
    assert len(rolled) == 2 and rolled[1][1] == rolled[0][0], rolled
    assert [r[0] for r in windows(w)] == [r[0] for r in rolled]
    return rolled[0][0], rolled[1][0]


def idle_reset_seq(w: World) -> int:
    resets = [r for r in w.gateway.transcript_rows("main") if r.type == "reset"]
    assert [(r.session_id, r.event.get("reason")) for r in resets] == [(sessions(w)[1], "idle")], resets
    return resets[0].seq


def test_openclaw_rolled_over_through_its_agent_command_and_appended_a_reset_through_chat(world: World) -> None:
    sessions(world)
    idle_reset_seq(world)


def test_an_expiry_alone_ends_nothing(world: World) -> None:
    assert world.notes["ends_at_expiry"] == [0, 1], world.notes["ends_at_expiry"]  # the 1: the rollover's


def test_each_automatic_reset_ends_the_conversation_before_it_once(world: World) -> None:
    first, second = sessions(world)
    ended = [e for e in world.notes["ended"] if e["agent"] == "main"]
    assert [e["session"] for e in ended] == [first, second], ended


def test_with_a_stale_state_md_each_is_one_gap_at_its_conversations_last_memory(world: World) -> None:
    first, second = sessions(world)
    reset = idle_reset_seq(world)
    points = [p["payload"] for p in world.notes["export"]]
    last_first = max(p["timestamp"] for p in points if p["session_id"] == first)
    last_second = max(p["timestamp"] for p in points if p["session_id"] == second and p["position"] < reset)
    gaps = [g for g in world.notes["gaps"] if g["agent"] == "main"]
    assert [(g["session"], g["session_end"]) for g in gaps] == [(first, last_first), (second, last_second)], gaps
    assert not world.notes["gaps_after_restart"], world.notes["gaps_after_restart"]


def test_every_turn_is_memory_once(world: World) -> None:
    first, second = sessions(world)
    stored = [(p["payload"]["session_id"], p["payload"]["data"]) for p in world.notes["export"]
              if p["payload"]["agent_id"] == "main"]
    expected = [(first, t) for t in FIRST] + [(second, t) for t in (*SECOND, *THIRD)]
    assert sorted(stored) == sorted(expected), stored
    hits = world.daemon.search("main", "Which buoy is the dinghy moored at?")
    assert hits and "buoy 14" in hits[0]["text"].lower(), hits


# -- a gateway restart in mid-turn -------------------------------------------------------------------

def test_openclaw_finished_the_interrupted_turn_after_prompting_with_a_user_row(world: World) -> None:
    rows = [r for r in world.gateway.transcript_rows("ops") if r.type == "message"]
    texts = [(r.role, r.text) for r in rows]
    recovery = [t for t in texts if RECOVERY in t[1]]
    assert len(recovery) == 1 and recovery[0][0] == "user", texts
    assert texts.index(("user", LONG[0])) < texts.index(recovery[0]) < texts.index(("assistant", LONG[1]))


def test_a_restart_in_mid_turn_is_no_end_and_its_recovery_prompt_no_memory(world: World) -> None:
    ops = [p["payload"] for p in world.notes["export"] if p["payload"]["agent_id"] == "ops"]
    assert sorted(p["data"] for p in ops) == sorted([*WARM, *LONG]), [p["data"] for p in ops]
    assert not [e for e in world.notes["ended"] if e["agent"] == "ops"]
    assert not [g for g in world.notes["gaps"] if g["agent"] == "ops"]
