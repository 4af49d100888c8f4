"""The gap hook of config.example.toml, run against the real OpenClaw 2026.9.6 (mock model).

`openclaw agent --agent main --message "[cron:veritas-sync] ..."` does not run in a session of its own:
OpenClaw puts the prompt into the agent's main session, right after the `/new` that ended the
conversation. What the person says next in that session must still become memory (a new user found it
all dropped as a "cron session"), the prompt and the agent's reply to it must not, and the end of the
person's next conversation must be reported like any other.

Skipped, with the reason, only where the npm registry cannot be reached and `CI` is not set.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import pytest

from tests.daemon_harness import DaemonProcess, wait_for
from tests.mock_model import Plan
from tests.openclaw_harness import OpenClawGateway, OpenClawInstall, install_or_skip, running_gateway
from tests.test_openclaw_real import STALE_STATE, wait_settled

pytestmark = pytest.mark.long  # minutes: started first (tests/conftest.py)

SYNC_PROMPT = ("[cron:veritas-sync] Session {session_id} ended at {ended_at} but STATE.md was last updated at "
               "{state_time}. Read {transcript} and bring STATE.md up to date.")  # config.example.toml's
SYNC_REPLY = "STATE.md now records the Lisbon offsite."
BEFORE = ("Planning: the offsite is in Lisbon on 12 February.", "Lisbon on 12 February, noted.")
AFTER = ("My dentist is Dr. Okafor on Baker Street.", "Dr. Okafor on Baker Street, noted.")


@dataclass
class World:
    gateway: OpenClawGateway
    daemon: DaemonProcess
    notes: dict[str, Any] = field(default_factory=dict)

    def say(self, text: str, reply: str) -> None:
        self.gateway.model.plan(text, Plan(reply=reply))
        assert reply in self.gateway.agent("main", text).reply

    def settle(self) -> None:
        wait_settled(self.gateway, self.daemon)


def hook_runs(daemon: DaemonProcess) -> list[dict[str, Any]]:
    return daemon.events("gap_hook_finished")


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    openclaw: OpenClawInstall = install_or_skip()
    root = tmp_path_factory.mktemp("openclaw-gap-hook")
    agents = {"main": {"name": "Main"}, "ops": {"name": "Ops"}}
    with running_gateway(openclaw, root, agents) as gw:
        config = {"gaps": {"on_gap": [str(openclaw.openclaw), "agent", "--agent", "{agent}", "--message", SYNC_PROMPT],
                           "tolerance": 0.0, "hook_timeout": 300.0}}
        # the hook runs with the daemon's environment: node on PATH, OpenClaw's state dir, as under systemd
        env = {k: v for k, v in gw.env().items() if k in ("PATH", "HOME", "OPENCLAW_STATE_DIR", "TMPDIR")}
        daemon = DaemonProcess(gw.state_dir, root / "vw-data", env, config=config).start()
        w = World(gw, daemon)
        try:
            gw.workspace("main").mkdir(parents=True, exist_ok=True)
            gw.model.plan("[cron:veritas-sync]", Plan(reply=SYNC_REPLY))
            w.say(*BEFORE)
            w.settle()
            (gw.workspace("main") / "STATE.md").write_text(STALE_STATE)
            gw.agent("main", "/new")
            wait_for(lambda: hook_runs(daemon), timeout=300, interval=0.5, what="the gap hook ran")
            w.say(*AFTER)
            w.settle()
            w.notes["first_gaps"] = daemon.events("gap_detected")
            gw.agent("main", "/new")  # STATE.md is still stale: the person's second conversation is a gap too
            wait_for(lambda: len(daemon.events("gap_detected")) >= 2, timeout=120, interval=0.5,
                     what="the second conversation's gap")
            wait_for(lambda: len(hook_runs(daemon)) >= 2, timeout=300, interval=0.5, what="the hook ran again")
            w.settle()
            w.notes["export"] = daemon.export("main")
            yield w
        finally:
            daemon.stop()


def test_openclaw_puts_the_hook_s_prompt_into_the_person_s_session(world: World) -> None:
    rows = world.gateway.transcript_rows("main")
    prompt = next(r for r in rows if r.role == "user" and "[cron:veritas-sync]" in r.text)
    told = next(r for r in rows if r.role == "user" and AFTER[0] in r.text)
    assert prompt.session_id == told.session_id and prompt.seq < told.seq
    assert hook_runs(world.daemon)[0]["exit_status"] == 0


def test_what_the_person_says_after_the_hook_is_memory_and_the_hook_is_not(world: World) -> None:
    texts = [str(p["payload"]["data"]) for p in world.notes["export"]]
    for said in (*BEFORE, *AFTER):
        assert sum(said in t for t in texts) == 1, (said, texts)
    assert not [t for t in texts if "veritas-sync" in t or SYNC_REPLY in t], texts


def test_the_conversation_after_the_hook_is_reported_when_it_ends(world: World) -> None:
    first, second = world.daemon.events("gap_detected")[:2]
    assert (first["agent"], second["agent"]) == ("main", "main") and first["session"] == second["session"]
    assert len(world.notes["first_gaps"]) == 1  # the hook's own run was no session end
    rows = world.gateway.transcript_rows("main")
    reply = next(r for r in rows if r.role == "assistant" and AFTER[1] in r.text)  # the conversation's last entry
    stamp = datetime.fromisoformat(str(second["session_end"]).replace("Z", "+00:00"))
    assert abs(stamp.timestamp() * 1000 - reply.created_at) < 5_000, (second, reply.created_at)
