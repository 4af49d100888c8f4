"""veritas-watch against the real OpenClaw 2026.9.6 (npm registry), driven offline by a mock model.

One world per module (starting the gateway costs ~10 s, each agent's first turn ~15-30 s): three
agents under `agents.entries` with explicit ownership (one with its own `workspace`), English,
Japanese and Chinese text, a tool call whose large result OpenClaw stores zstd-compressed, secrets
that OpenClaw masks before writing, a heartbeat turn, `/new` and `/reset` with a stale and with a
fresh STATE.md, a compaction, a trim, a fork and a rewind, sub-agents, cron jobs, two agents talking
through `sessions_send`, webhooks (`/hooks/agent`, `/hooks/wake`), commands and a queued message sent as the
Control UI sends them, a session forgotten with `openclaw memory forget`, and a deleted session; veritas-watch
runs the whole time, as it would in production.
The tests then compare what veritas-watch stored, logged and wrote with what OpenClaw wrote.

Skipped, with the reason, only where the npm registry cannot be reached and `CI` is not set.
"""

from __future__ import annotations

import itertools
import json
import re
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyrage
import pytest

from tests.daemon_harness import DaemonProcess, read_db_cursors, time_scale, wait_for
from tests.mock_model import Plan
from tests.openclaw_harness import (
    OpenClawGateway,
    OpenClawInstall,
    TranscriptRow,
    install_or_skip,
    running_gateway,
)

pytestmark = pytest.mark.long  # minutes: started first (tests/conftest.py)

# What a user pastes: real-looking values of the shapes OpenClaw 2026.9 masks. None of them is a live key.
OPENAI_KEY = "sk-proj-Q7vX2mN9pL4kR8sT1wY6zA3bC5dE0fG2hJ4kL6mN8pQ1rS3tU5vW7xY9zHNzL"
GITHUB_TOKEN = "ghp_Tj8kL2mN4pQ6rS8tU0vW2xY4zA6bC8dQjwR"
DB_PASSWORD = "Vq8rT2yW6nK4mZ9x"
AWS_SECRET = "wJalrXUtnFEMI7K7MDENGbPxRfiCYzQ4mT9vB2nL"
# and secrets a person holds, which OpenClaw does not mask: a wallet's seed phrase (BIP-39, its checksum holds) and
# a card number (Luhn-valid, not a published test card)
SEED_PHRASE = "moon inside ask convince notable champion wait disease right oak method innocent"
CARD_NUMBER = "4539 1488 0343 6467"
SECRETS = (OPENAI_KEY, GITHUB_TOKEN, DB_PASSWORD, AWS_SECRET, SEED_PHRASE, CARD_NUMBER)

STALE_STATE = "# STATE\n\nLast sync: 2020-01-01T00:00:00Z\n"


def fresh_state() -> str:
    return f"# STATE\n\nLast sync: {datetime.now(UTC).strftime('%Y-%m-%dT%H:%M:%S')}Z\n"


@pytest.fixture(scope="module")
def openclaw() -> OpenClawInstall:
    return install_or_skip()


@dataclass
class World:
    gateway: OpenClawGateway
    daemon: DaemonProcess
    identity: pyrage.x25519.Identity  # the operator's key: the daemon only ever has its public half
    expected: dict[str, list[str]] = field(default_factory=dict)  # agent -> texts that must be memories
    with_secret: dict[str, list[str]] = field(default_factory=dict)  # agent -> clean part of secret messages
    credentials: dict[str, int] = field(default_factory=dict)  # agent -> credentials given
    gaps_before_restart: list[dict[str, Any]] = field(default_factory=list)
    gaps_after_restart: list[dict[str, Any]] = field(default_factory=list)
    notes: dict[str, Any] = field(default_factory=dict)

    def say(self, agent: str, text: str, reply: str, *, session_key: str | None = None) -> None:
        """One turn; both sides must become memories."""
        self.gateway.model.plan(text, Plan(reply=reply))
        got = self.gateway.agent(agent, text, session_key=session_key)
        assert reply in got.reply, f"unexpected reply {got.reply!r}"
        self.expected.setdefault(agent, []).extend([text, reply])

    def say_all(self, agent: str, turns: list[tuple[str, str]], *, session_key: str | None = None) -> None:
        """Turns in a row, then wait until veritas-watch has stored them all."""
        for text, reply in turns:
            self.say(agent, text, reply, session_key=session_key)
        self.settle()

    def command(self, agent: str, text: str) -> None:
        """A slash command: acted on by the gateway, never a memory."""
        self.gateway.agent(agent, text)

    def send(self, agent: str, text: str, **params: Any) -> Callable[[Callable[[TranscriptRow], bool]], bool]:
        """`text` sent as the Control UI sends it (`chat.send` into the agent's main session, returning at once);
        returns a test for rows OpenClaw wrote since."""
        gw = self.gateway
        written = {(r.session_id, r.seq) for r in gw.transcript_rows(agent)}
        gw.run("gateway", "call", "chat.send", "--params", json.dumps({
            "sessionKey": f"agent:{agent}:main", "message": text, "idempotencyKey": f"send-{agent}-{len(written)}",
            **params}), "--json")
        return lambda test: any(test(r) for r in gw.transcript_rows(agent) if (r.session_id, r.seq) not in written)

    def control(self, agent: str, text: str) -> None:
        """A command as the Control UI sends it (the CLI would pass it to the model as text): OpenClaw writes it
        as typed and answers it itself (gateway-injected). Neither is a memory."""
        since = self.send(agent, text)
        wait_for(lambda: since(lambda r: r.event.get("message", {}).get("model") == "gateway-injected"),
                 timeout=120, interval=0.3, what=f"OpenClaw's answer to {text}")

    def while_busy(self, agent: str, turn: tuple[str, str], queued: tuple[str, str]) -> None:
        """`queued` sent while the model is still answering `turn` (queue mode collect): OpenClaw holds it and
        sends it after that run under its `[Queued messages while agent was busy]` banner. All four are memories."""
        self.gateway.model.plan(turn[0], Plan(reply=turn[1], delay=10))
        self.gateway.model.plan(queued[0], Plan(reply=queued[1]))
        self.send(agent, turn[0])
        time.sleep(2)
        since = self.send(agent, queued[0], queueMode="collect")
        wait_for(lambda: since(lambda r: r.text == queued[1]), timeout=120, interval=0.3, what="the queued reply")
        self.expected.setdefault(agent, []).extend([*turn, *queued])

    def settle(self) -> None:
        wait_settled(self.gateway, self.daemon)


def wait_settled(gateway: OpenClawGateway, daemon: DaemonProcess, timeout: float = 120) -> None:
    """Every row OpenClaw wrote is committed by veritas-watch (but those of a forgotten session: never read),
    and a full sweep ran after that."""

    def caught_up() -> bool:
        seqs = read_db_cursors(daemon.data_dir)
        for agent_dir in (gateway.state_dir / "agents").iterdir():
            db = gateway.agent_db(agent_dir.name)
            last: dict[str, int] = {}
            for row in gateway.transcript_rows(agent_dir.name):
                last[row.session_id] = max(last.get(row.session_id, -1), row.seq)
            forgotten = gateway.forgotten(agent_dir.name)
            for sid, seq in last.items():
                if sid in forgotten:
                    continue
                if seqs.get((str(db), sid), 0) <= seq:
                    return False
        return True

    wait_for(caught_up, timeout=timeout, interval=0.1, what="veritas-watch caught up with OpenClaw")
    daemon.wait_idle(timeout)  # and one more full sweep (gap checks run after each)


def restarted(gateway: OpenClawGateway, daemon: DaemonProcess) -> list[dict[str, Any]]:
    """Stop the daemon cleanly and start it again on the same dirs; once it caught up, the gaps it reported
    since (a gap reported again after a restart is a duplicate)."""
    before = len(daemon.events("gap_detected"))  # one log file across restarts
    assert daemon.stop() == 0
    daemon.start()
    wait_settled(gateway, daemon)
    return daemon.events("gap_detected")[before:]


@pytest.fixture(scope="module")
def world(openclaw: OpenClawInstall, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    root = tmp_path_factory.mktemp("openclaw-real")
    agents = {"main": {"name": "Main"}, "ops": {"name": "Ops"},
              "research": {"name": "Research", "workspace": str(root / "research-workspace")}}
    heartbeat = {"agents": {"defaults": {"heartbeat": {"agentId": "main", "every": "24h", "target": "none"}}},
                 # tools offered by name (not behind Tool Search): the mock model calls `sessions_spawn` directly
                 "tools": {"toolSearch": False},
                 # webhooks for main, persistent `hook:` sessions allowed (as the Gmail preset needs them)
                 "hooks": {"enabled": True, "token": "veritas-test-hook-token-0123456789abcdef", "path": "/hooks",
                           "allowedAgentIds": ["main"], "allowRequestSessionKey": True,
                           "allowedSessionKeyPrefixes": ["hook:"]}}
    # With a vault recipient, the values behind OpenClaw's masks are captured from its task_runs.
    identity = pyrage.x25519.Identity.generate()
    config = {"credentials": {"vault_recipient": str(identity.to_public())}}
    with running_gateway(openclaw, root, agents, extra_config=heartbeat) as gw:
        daemon = DaemonProcess(gw.state_dir, root / "vw-data", {"HOME": str(gw.home)}, config=config).start()
        w = World(gw, daemon, identity)
        try:
            drive(w)
            w.settle()
            w.gaps_before_restart = daemon.events("gap_detected")
            w.notes["status"] = json.loads(daemon.cli("status", "--json").stdout)
            w.notes["export"] = daemon.export()
            assert daemon.stop() == 0
            w.notes["log_before_restart"] = daemon.log_text()
            offline_session(w)
            # A restart while every agent has a live conversation (each run marked "done" by OpenClaw).
            restarted = DaemonProcess(gw.state_dir, root / "vw-data", {"HOME": str(gw.home)}, config=config).start()
            w.daemon = restarted
            w.settle()
            w.gaps_after_restart = restarted.events("gap_detected")[len(w.gaps_before_restart):]  # one log file
            yield w
        finally:
            if w.daemon.running:
                w.daemon.stop()


BUSY = ("Please summarise the harbour rules for the regatta.", "Harbour rules: no wake inside the breakwater.")
QUEUED = ("Also: bring the spare sail on Sunday.", "The spare sail for Sunday, noted.")
OFFLINE = ("Offline note: the backup window moves to 02:00 UTC.", "Backup window at 02:00 UTC, noted.")


def offline_session(w: World) -> None:
    """While veritas-watch is stopped, a side session is created and deleted: OpenClaw's compressed
    deletion archive is all that is left of it."""
    gw = w.gateway
    gw.model.plan(OFFLINE[0], Plan(reply=OFFLINE[1]))
    gw.agent("ops", OFFLINE[0], session_key="agent:ops:scratch-2")
    w.notes["offline_session"] = next(r.session_id for r in gw.transcript_rows("ops") if r.text == OFFLINE[0])
    gw.run("sessions", "delete", "agent:ops:scratch-2", "--agent", "ops", "--yes", "--json")
    assert not [r for r in gw.transcript_rows("ops") if r.session_id == w.notes["offline_session"]]


def drive(w: World) -> None:
    gw = w.gateway
    for agent in ("main", "ops", "research"):
        gw.workspace(agent).mkdir(parents=True, exist_ok=True)
    # main: English, a tool call with a large result, secrets, a heartbeat, /new (stale), Japanese,
    # /reset (fresh), Chinese.
    w.say("main", "Hi, I'm Ada. I keep my sailing boat Seabird at berth 7 in Kiel harbour.",
          "Nice to meet you, Ada. Seabird at berth 7 in Kiel, noted.")
    inventory = "".join(f"host-{i:04d} 10.0.{i // 250}.{i % 250} rack-{i % 17} owner=team-{i % 5} ok\n"
                        for i in range(400))
    (gw.workspace("main") / "inventory.txt").write_text(inventory)
    text = "Please read inventory.txt and tell me how many hosts we run."
    gw.model.plan(text, Plan(reply="The inventory lists 400 hosts across 17 racks.", tool="read",
                             arguments={"path": "inventory.txt"}, narration="Let me read the inventory first."))
    gw.agent("main", text)
    w.expected["main"] += [text, "The inventory lists 400 hosts across 17 racks."]
    secret_text = (f"For the deploy: OPENAI_API_KEY={OPENAI_KEY} and the GitHub token {GITHUB_TOKEN}; "
                   f"the database is postgres://deploy:{DB_PASSWORD}@db.internal:5432/app")
    gw.model.plan("For the deploy", Plan(reply="Thanks, I have the deploy settings."))
    gw.agent("main", secret_text)
    w.expected["main"].append("Thanks, I have the deploy settings.")
    w.with_secret["main"] = ["For the deploy"]
    w.credentials["main"] = 3
    gw.system_event("main", "Check whether the nightly backup finished.")
    wait_for(lambda: any(r.event.get("message", {}).get("provenance") for r in gw.transcript_rows("main")),
             timeout=120, interval=0.5, what="the heartbeat turn")
    w.settle()
    (gw.workspace("main") / "STATE.md").write_text(STALE_STATE)
    w.command("main", "/new")
    w.settle()
    w.notes["main_gaps_after_new"] = len(w.daemon.events("gap_detected"))
    w.say("main", "東京の新しいオフィスは来月十五日に渋谷で開きます。",
          "承知しました。渋谷の新オフィスは来月十五日ですね。")
    w.settle()
    time.sleep(1.1)  # STATE.md's stamp has second precision: make it later than every entry
    (gw.workspace("main") / "STATE.md").write_text(fresh_state())
    w.command("main", "/reset")
    w.say("main", "下周三我们要和客户开会讨论明年的预算。", "好的，下周三和客户讨论明年预算，已记下。")

    # ops: Chinese, a secret, /new (fresh), English, /reset (stale), then a deleted side session.
    w.say("ops", "我们明天晚上八点部署新版本，回滚方案已经准备好了。", "明白，明晚八点部署，回滚方案已就绪。")
    gw.model.plan("staging box", Plan(reply="Got it, the staging AWS secret is noted."))
    gw.agent("ops", f"The staging box uses export AWS_SECRET_ACCESS_KEY={AWS_SECRET} for backups.")
    w.expected["ops"].append("Got it, the staging AWS secret is noted.")
    gw.model.plan("cold wallet", Plan(reply="Noted the wallet and the card for the hosting bill."))
    gw.agent("ops", f"For the cold wallet the seed phrase is {SEED_PHRASE}. The hosting bill goes on card "
                    f"{CARD_NUMBER}.")
    w.expected["ops"].append("Noted the wallet and the card for the hosting bill.")
    w.with_secret["ops"] = ["staging box", "cold wallet"]
    w.credentials["ops"] = 3
    w.settle()
    time.sleep(1.1)
    (gw.workspace("ops") / "STATE.md").write_text(fresh_state())
    w.command("ops", "/new")
    w.say("ops", "The load balancer certificate expires on March 3rd; renew it a week early.",
          "I'll remind you to renew the load balancer certificate by February 24th.")
    (gw.workspace("ops") / "STATE.md").write_text(STALE_STATE)
    w.command("ops", "/reset")
    w.settle()
    w.notes["ops_gaps_after_reset"] = [e for e in w.daemon.events("gap_detected") if e.get("agent") == "ops"]
    w.say("ops", "Scratch: the vendor call moved to Thursday at 10:00.", "Vendor call Thursday 10:00, noted.",
          session_key="agent:ops:scratch-1")
    w.settle()
    gw.run("sessions", "delete", "agent:ops:scratch-1", "--agent", "ops", "--yes", "--json")

    # research: its own workspace, a stale STATE.md and no reset: OpenClaw marks each run "done",
    # which is not the end of the session.
    (gw.workspace("research") / "STATE.md").write_text(STALE_STATE)
    w.say("research", "The survey results are due on the 12th; Lena is collecting them.",
          "Survey results due on the 12th, collected by Lena.")
    w.say("research", "Remind me that the lab is closed on Friday.", "The lab is closed on Friday, noted.")
    # A compaction (the CLI's way to what `/compact` does in a chat): OpenClaw appends a `compaction` row
    # whose summary repeats the conversation, in the same session, which goes on after it.
    compacted = json.loads(gw.run("sessions", "compact", "agent:research:main", "--agent", "research",
                                  "--json").stdout)
    assert compacted.get("compacted"), compacted
    w.say("research", "The lab reopens on Monday at eight.", "Lab reopens Monday at 8, noted.")
    # A side session trimmed to its last lines (`sessions compact --max-lines`): OpenClaw keeps its header and
    # those lines, renumbered, and archives nothing; the session goes on.
    notes = "agent:research:notes"
    w.say_all("research", [("Notes: the microscope booking moved to room 4.", "Microscope booking, room 4, noted."),
                           ("Notes: the reagent order arrives on Tuesday.", "Reagent order on Tuesday, noted.")],
              session_key=notes)
    trimmed = json.loads(gw.run("sessions", "compact", notes, "--agent", "research", "--max-lines", "3",
                                "--json").stdout)
    assert trimmed.get("kept") == 3, trimmed
    w.say("research", "Notes: the seminar starts at noon.", "Seminar at noon, noted.", session_key=notes)
    # A fork and a rewind (the Control UI's, through the gateway's RPC): OpenClaw copies the session's rows into
    # a session of the fork's own key, and for the rewind into a new session of the same key; new turns follow.
    drafts = "agent:research:drafts"
    w.say_all("research", [("Drafts: the grant report is due in May.", "Grant report due in May, noted."),
                           ("Drafts: the poster goes to print on Friday.", "Poster to print on Friday, noted.")],
              session_key=drafts)
    poster = next(r.event["id"] for r in gw.transcript_rows("research")
                  if r.text == "Drafts: the poster goes to print on Friday.")
    forked = json.loads(gw.run("gateway", "call", "sessions.fork", "--params",
                               json.dumps({"sessionKey": drafts, "entryId": poster}), "--json").stdout)
    w.say("research", "Fork: the poster could be A1 instead.", "A1 poster, noted.", session_key=forked["sessionKey"])
    gw.run("gateway", "call", "sessions.rewind", "--params", json.dumps({"sessionKey": drafts, "entryId": poster}),
           "--json")
    w.say("research", "Drafts: the poster goes to print on Monday.", "Poster to print on Monday, noted.",
          session_key=drafts)
    w.notes["drafts_sessions"] = sorted({r.session_id for r in gw.transcript_rows("research")
                                         if r.text == "Drafts: the grant report is due in May."})
    runtime_runs(w)
    agent_to_agent(w)
    webhooks(w)
    w.control("main", "/verbose on")
    w.control("main", "/think low")
    w.while_busy("main", BUSY, QUEUED)
    w.notes["queued_row"] = next(r.text for r in gw.transcript_rows("main") if QUEUED[0] in r.text)
    forgotten_session(w)


# What the runtime runs for itself in an agent's store: sub-agents and automations (cron jobs).
@dataclass(frozen=True)
class Child:
    """A sub-agent the person asks research for: their request and the parent's reply (memories), the task the
    parent's `sessions_spawn` hands the child and the child's result (neither is)."""

    ask: str
    reply: str
    task: str
    result: str
    options: dict[str, Any]  # the rest of `sessions_spawn`'s arguments

    def spawn(self, w: World) -> None:
        w.gateway.model.plan(self.task, Plan(reply=self.result))
        w.gateway.model.plan(self.ask, Plan(reply=self.reply, tool="sessions_spawn",
                                            arguments={"task": self.task, **self.options}))
        w.gateway.agent("research", self.ask)
        w.expected["research"] += [self.ask, self.reply]


SPAWN = Child("Research: ask a helper to compare the moving company quotes.", "A helper is comparing the quotes.",
              "Compare three moving company quotes for a 2-bedroom flat in Leeds",
              "Cheapest quote: Pennine Movers at 640 pounds.", {"label": "movers", "context": "isolated"})
FORK = Child("Research: fork a helper to check the school catchment.", "A forked helper is checking it.",
             "Check the school catchment for Roundhay", "Roundhay is inside the Allerton Grange catchment.",
             {"label": "schools", "context": "fork"})
VISIBLE = Child("Research: open a session to plan the garden.", "A garden planning session is open.",
                "Plan the garden layout for spring", "Draft: tomatoes by the south fence.",
                {"label": "garden", "visible": True})
FOLLOW_UP = ("Garden: put the herbs near the kitchen door.", "Herbs by the kitchen door, noted.")
CRON_TASK = "Summarize the overnight build queue"
CRON_RESULT = "Nightly build queue: 3 jobs green, 1 flaky test in payments."


A2A = ("Please ask ops when the VPN gateway was replaced.", "I asked Ops about the VPN gateway.")
A2A_QUESTION = "Main asks: when was the VPN gateway replaced?"
A2A_ANSWER = "The VPN gateway was replaced on Monday."


def agent_to_agent(w: World) -> None:
    """main's person asks; main asks ops through `sessions_send` (ops answers, then OpenClaw lets the two agents
    go on in a ping-pong of a few turns, each answered by the mock's default reply)."""
    gw = w.gateway
    gw.model.plan(A2A_QUESTION, Plan(reply=A2A_ANSWER))
    gw.model.plan(A2A[0], Plan(reply=A2A[1], tool="sessions_send", arguments={
        "sessionKey": "agent:ops:main", "message": A2A_QUESTION, "timeoutSeconds": 120}))
    gw.agent("main", A2A[0])
    w.expected["main"] += list(A2A)

    def a2a_rows() -> int:
        return sum(1 for agent in ("main", "ops") for r in gw.transcript_rows(agent)
                   if r.event.get("message", {}).get("provenance", {}).get("kind") == "inter_session")

    # at least the question, its answer and one ping-pong exchange: a pause of OpenClaw's under load longer than
    # `quiet` must not end the wait before the ping-pong has begun (seen once at load 9: 2 rows)
    w.notes["a2a_rows"] = wait_stable(a2a_rows, 4, "the agents' ping-pong settled")


# What external services send main through OpenClaw's webhooks: two emails (`POST /hooks/agent`, run as cron jobs:
# one isolated, one in a persistent `hook:gmail:` session) and a notification (`POST /hooks/wake`) that main's
# heartbeat turns into an alert for the person.
EMAILS = (("New email: invoice 4411 from Acme, 340 EUR due Friday.", "Invoice 4411 from Acme: 340 EUR due Friday."),
          ("New email: the dentist moved the appointment to Tuesday 9:30.", "Dentist appointment now Tuesday 9:30."))
WAKE = ("The nightly import completed with 3 warnings", "Heads up: the nightly import finished with 3 warnings.")


def webhooks(w: World) -> None:
    gw = w.gateway
    for (email, summary), session in zip(EMAILS, ({}, {"sessionKey": "hook:gmail:18c2f0", "sessionMode": "persistent"}),
                                         strict=True):
        gw.model.plan(email, Plan(reply=summary))
        done = gw.hook("agent", {"message": email, "name": "Gmail", "agentId": "main", "waitForCompletion": True,
                                 **session})
        assert done.get("completion", {}).get("status") == "ok", done
    gw.model.alert(WAKE[0], WAKE[1])
    gw.hook("wake", {"text": WAKE[0], "mode": "now", "agentId": "main"})

    def wakes() -> int:  # each email's completion (delivered as an event) and the notification wake main
        return sum(1 for r in gw.transcript_rows("main")
                   if r.event.get("message", {}).get("provenance", {}).get("sourceTool") == "hook")

    wait_stable(wakes, 1, "main's wake turns settled")
    wait_for(lambda: any(r.text == WAKE[1] for r in gw.transcript_rows("main")), timeout=120, interval=0.5,
             what="the alert")
    w.notes["hook_keys"] = sorted(key for (key,) in gw.query(
        "main", "SELECT DISTINCT session_key FROM session_windows WHERE session_key NOT LIKE 'agent:main:main%'"))


PRIVATE = (("Private: my therapist is Dr. Lee on Harbour Street.", "Dr. Lee on Harbour Street, noted."),
           ("Private: and my pharmacist is Ms. Park.", "Ms. Park, noted."))
PRIVATE_KEY = "agent:main:private"


def forgotten_session(w: World) -> None:
    """A side session the person has OpenClaw forget (`openclaw memory forget --session`, memory-core's: a
    tombstone, the rows stay), then goes on in and finally deletes (OpenClaw archives it)."""
    gw = w.gateway
    for text, reply in PRIVATE:
        gw.model.plan(text, Plan(reply=reply))
    gw.agent("main", PRIVATE[0][0], session_key=PRIVATE_KEY)
    w.settle()
    w.notes["private_stored"] = sum(p["payload"]["data"] in PRIVATE[0] for p in w.daemon.export("main"))
    forgot = json.loads(gw.run("memory", "forget", "--agent", "main", "--session", PRIVATE_KEY, "--json").stdout)
    w.notes["private_session"] = forgot["sessionIds"][0]
    wait_for(lambda: w.daemon.events("session_forgotten"), timeout=60, interval=0.2, what="the session forgotten")
    gw.agent("main", PRIVATE[1][0], session_key=PRIVATE_KEY)
    w.settle()
    gw.run("sessions", "delete", PRIVATE_KEY, "--agent", "main", "--yes", "--json")


def wait_stable(count: Callable[[], int], at_least: int, what: str, quiet: float = 8) -> int:
    """Wait until `count()` is at least `at_least` and has not changed for `quiet` seconds (OpenClaw's
    asynchronous follow-ups are over); returns it."""
    seen: list[tuple[float, int]] = []

    def settled() -> bool:
        now = count()
        if not seen or seen[-1][1] != now:
            seen.append((time.monotonic(), now))
        return now >= at_least and time.monotonic() - seen[-1][0] > quiet * time_scale()

    wait_for(settled, timeout=240, interval=0.5, what=what)
    return seen[-1][1]


def runtime_runs(w: World) -> None:
    """Three sub-agents on research (`sessions_spawn`: one isolated, one forking the conversation, one in a
    visible session the person then types in), an isolated cron job on research and a main-session reminder
    on main; then the isolated child's session is deleted (research's STATE.md is stale: an end that needed a
    sync would be a gap)."""
    gw = w.gateway

    def announced() -> dict[str, str]:  # the parent's replies that carry a child's result to the person, by event
        # id (the forked child holds copies of what the parent said before it)
        return {r.event["id"]: r.text for r in gw.transcript_rows("research") if r.role == "assistant"
                and str(r.event["message"].get("__openclaw", {}).get("runId", "")).startswith("announce:")}

    for done, child in enumerate((SPAWN, FORK), 1):
        child.spawn(w)
        # A child that finishes while the parent runs a later turn is steered into it (OpenClaw skips that turn's
        # pending tool call "to process an incoming message"): the next turn waits for this child's result.
        wait_stable(lambda: len(announced()), done, "the sub-agent's result announced")
    VISIBLE.spawn(w)

    def visible_child() -> str | None:  # its key is a dashboard session's, not a sub-agent's
        windows = gw.query("research", "SELECT session_key, session_id FROM session_windows"
                                       " WHERE spawned_by IS NOT NULL AND session_key NOT LIKE '%:subagent:%'")
        done = {r.session_id for r in gw.transcript_rows("research") if r.text == VISIBLE.result}
        return next((key for key, sid in windows if sid in done), None)

    wait_for(visible_child, timeout=180, interval=0.5, what="the visible sub-agent's first run")
    w.say("research", *FOLLOW_UP, session_key=visible_child())
    wait_stable(lambda: len(announced()), 3, "the sub-agents' results announced")
    w.notes["announced"] = list(announced().values())
    w.expected["research"] += w.notes["announced"]
    job = json.loads(gw.run("cron", "add", "--agent", "research", "--name", "Nightly brief", "--every", "24h",
                            "--session", "isolated", "--message", CRON_TASK, "--no-deliver", "--json").stdout)
    gw.model.plan(CRON_TASK, Plan(reply=CRON_RESULT))
    gw.run("cron", "run", job["id"], "--json")
    # a main-session job is for the default agent only (OpenClaw refuses it for another)
    reminder = json.loads(gw.run("cron", "add", "--agent", "main", "--name", "Stretch", "--every", "24h",
                                 "--session", "main", "--system-event", "Reminder: stand up and stretch",
                                 "--wake", "now", "--json").stdout)
    gw.run("cron", "run", reminder["id"], "--json")

    def ran() -> bool:
        return (any(r.text == CRON_RESULT for r in gw.transcript_rows("research"))
                and any(r.event.get("message", {}).get("provenance", {}).get("sourceTool") == "cron"
                        for r in gw.transcript_rows("main")))

    wait_for(ran, timeout=180, interval=0.5, what="both automations ran")
    w.settle()
    children = gw.query("research", "SELECT DISTINCT session_key FROM session_windows WHERE spawned_by IS NOT NULL")
    w.notes["subagent_keys"] = sorted(key for (key,) in children)
    isolated = next(r.session_id for r in gw.transcript_rows("research") if SPAWN.task in r.text)
    w.notes["subagent_deleted"] = isolated
    [(key,)] = gw.query("research", "SELECT session_key FROM session_windows WHERE session_id = ?", (isolated,))
    gw.run("sessions", "delete", key, "--agent", "research", "--yes", "--json")


# -- what was stored ----------------------------------------------------------------------------------

def points_of(world: World, agent: str) -> list[dict[str, Any]]:
    return [p for p in world.notes["export"] if p["payload"]["agent_id"] == agent]


def normal(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


@pytest.mark.parametrize("agent", ["main", "ops", "research"])
def test_every_conversational_message_is_stored_exactly_once_and_nothing_else(world: World, agent: str) -> None:
    points = points_of(world, agent)
    texts = Counter(normal(p["payload"]["data"]) for p in points if p["payload"]["chunk"] == 0)
    expected = [normal(t) for t in world.expected[agent]]
    # Once per event OpenClaw wrote: one, unless the harness had to resend a turn OpenClaw failed itself
    # (a deleted session's rows have left the database: its archive holds them once; a fork or a rewind copies
    # rows into another session with their event ids: still one event).
    written = {row.event.get("id"): normal(row.text) for row in world.gateway.transcript_rows(agent)
               if row.role in ("user", "assistant")}
    for text in expected:
        rows = max(1, sum(1 for w in written.values() if w.endswith(text)))
        assert rows == 1 or world.gateway.transient_failures, f"{agent}: {text!r} written {rows} times"
        assert texts[text] == rows, f"{agent}: {text!r} stored {texts[text]} times, OpenClaw wrote it {rows} times"
    secret_lines = [t for t in texts if any(marker in t for marker in world.with_secret.get(agent, []))]
    assert len(secret_lines) == len(world.with_secret.get(agent, [])), secret_lines
    assert all(texts[t] == 1 for t in secret_lines), secret_lines
    extra = set(texts) - set(expected) - set(secret_lines)
    by_id = {r.event.get("id"): r for r in world.gateway.transcript_rows(agent)}
    where = [(p["payload"]["source"], getattr(by_id.get(p["payload"]["entry_id"]), "event", None))
             for p in points if normal(p["payload"]["data"]) in extra]
    assert not extra, f"{agent}: stored what is not conversation: {sorted(extra)[:10]} {where[:3]}"
    ids = [p["id"] for p in points]
    assert len(ids) == len(set(ids))


def test_tool_traffic_heartbeats_and_commands_are_not_memory(world: World) -> None:
    rows = world.gateway.transcript_rows("main")
    assert any(r.compressed and r.role == "toolResult" for r in rows), "OpenClaw stored no zstd tool result"
    assert any(r.type == "reset" for r in rows)
    data = " ".join(p["payload"]["data"] for p in points_of(world, "main"))
    assert any(r.text == "/verbose on" for r in rows), "the command as typed"
    for noise in ("host-0042", "Let me read the inventory first.", "NO_REPLY", "HEARTBEAT", "heartbeat poll",
                  "/new", "/reset", "bootstrap", "/verbose", "Verbose", "/think", "Thinking level"):
        assert noise not in data
    assert not [e for e in world.daemon.events("line_invalid")], "a real OpenClaw row was reported invalid"


def test_a_message_queued_while_the_agent_was_busy_is_stored_without_its_banner(world: World) -> None:
    """As OpenClaw 2026.9.6 writes it: the banner, then `---` and `Queued #1 (from <sender>)` before the
    message (the exact-once test above holds the message itself as the memory)."""
    assert world.notes["queued_row"].startswith("[Queued messages while agent was busy]"), world.notes["queued_row"]
    assert "Queued #1 (from " in world.notes["queued_row"], world.notes["queued_row"]
    data = " ".join(p["payload"]["data"] for p in points_of(world, "main"))
    assert "Queued" not in data and QUEUED[0] in data


def test_search_finds_each_language_for_its_own_agent_only(world: World) -> None:
    def top(agent: str, query: str) -> list[str]:
        result = world.daemon.post("/memory/search", {"agent_id": agent, "query": query, "limit": 3})
        return [r["text"] for r in result["results"]]

    assert any("渋谷" in t for t in top("main", "東京の新しいオフィスはいつ開きますか")), "Japanese"
    assert any("预算" in t for t in top("main", "下周三开会讨论什么")), "Chinese"
    assert any("Seabird" in t for t in top("main", "Where is Ada's boat kept?")), "English"
    assert not any("渋谷" in t for t in top("ops", "東京の新しいオフィスはいつ開きますか"))


# -- session ends -------------------------------------------------------------------------------------

def gaps(events: list[dict[str, Any]], agent: str) -> list[dict[str, Any]]:
    return [e for e in events if e.get("agent") == agent]


def test_new_with_a_stale_state_md_is_one_gap_and_reset_with_a_fresh_one_none(world: World) -> None:
    main = gaps(world.gaps_before_restart, "main")
    assert world.notes["main_gaps_after_new"] == 1, "/new with a stale STATE.md: exactly one gap"
    assert len(main) == 1, f"/reset with a fresh STATE.md must not add a gap: {main}"
    rows = world.gateway.transcript_rows("main")
    reset_new = next(r for r in rows if r.type == "reset" and r.event.get("reason") == "new")
    # The conversation ended with its last memory (the heartbeat's NO_REPLY after it is not one).
    before = [p["payload"]["timestamp"] for p in points_of(world, "main") if p["payload"]["position"] < reset_new.seq]
    assert main[0]["session_end"] == max(before), main[0]


def test_reset_with_a_stale_state_md_is_one_gap_and_new_with_a_fresh_one_none(world: World) -> None:
    ops = world.notes["ops_gaps_after_reset"]
    assert len(ops) == 1, ops
    rows = world.gateway.transcript_rows("ops")
    reset = next(r for r in rows if r.type == "reset" and r.event.get("reason") == "reset")
    assert f"#{reset.session_id}:{reset.seq}" in ops[0]["transcript"]


def test_a_deleted_session_is_a_session_end(world: World) -> None:
    ops = gaps(world.gaps_before_restart, "ops")
    assert len(ops) == 2, ops  # the /reset above and the deleted side session (STATE.md still stale)
    assert any(e["session_end"] for e in ops)


def test_a_finished_run_is_not_a_session_end_even_after_a_restart(world: World) -> None:
    windows = world.gateway.query(  # a person's runs
        "research", "SELECT status, ended_at FROM session_windows WHERE spawned_by IS NULL")
    assert windows and all(status == "done" and ended_at for status, ended_at in windows), windows
    assert not gaps(world.gaps_before_restart, "research")
    again = [g for g in world.gaps_after_restart if g.get("session") != world.notes["offline_session"]]
    assert not again, f"a restart reported gaps again or for live sessions: {again}"


def test_a_compaction_is_neither_memory_nor_a_session_end(world: World) -> None:
    rows = world.gateway.transcript_rows("research")
    main = {sid for (sid,) in world.gateway.query(
        "research", "SELECT session_id FROM session_windows WHERE session_key = 'agent:research:main'")}
    # the row OpenClaw wrote, not the forked child's copy of it (a copy keeps the event and its time)
    compaction = next(r for r in rows if r.type == "compaction" and r.session_id in main)
    summary = str(compaction.event.get("summary") or "")
    assert "lab" in summary.lower(), "OpenClaw's summary should repeat the conversation"
    after = [r for r in rows if r.seq > compaction.seq and r.session_id == compaction.session_id and r.role == "user"]
    assert after, "the session goes on after its compaction"
    stored = [p["payload"] for p in points_of(world, "research") if p["payload"]["session_id"] == compaction.session_id]
    assert not [p for p in stored if p["position"] == compaction.seq], "the summary is not a memory"
    assert any(p["position"] > compaction.seq for p in stored), "what follows a compaction is stored"
    assert not gaps(world.gaps_before_restart, "research"), "a compaction does not end the conversation"


def test_a_session_trimmed_to_its_last_lines_keeps_its_memories(world: World) -> None:
    """OpenClaw no longer holds the turns before the lines it kept, anywhere: veritas-watch's memory of them
    is the only copy, and stays (the exact-once test above counts every turn of the session)."""
    rows = world.gateway.transcript_rows("research")
    session = next(r.session_id for r in rows if r.text == "Notes: the seminar starts at noon.")
    held = " ".join(r.text for r in rows if r.session_id == session)
    assert "microscope" not in held, "OpenClaw trimmed the session's first turns"
    stored = [p["payload"] for p in points_of(world, "research") if p["payload"]["session_id"] == session]
    assert any("microscope" in p["data"] for p in stored), "the trimmed turns stay in memory"
    assert any("seminar" in p["data"] for p in stored), "what follows the trim is stored"
    assert [e for e in world.daemon.events("trimmed_points_kept") if e.get("agent") == "research"]
    hits = world.daemon.post("/memory/search", {"agent_id": "research", "query": "Where is the microscope booked?",
                                                "limit": 3})["results"]
    assert any("room 4" in h["text"] for h in hits)


def test_a_fork_and_a_rewind_store_each_turn_once_and_end_no_conversation(world: World) -> None:
    """OpenClaw copies the turns into the fork's session and into the rewind's new session (three sessions hold
    the first turn); veritas-watch stores each turn once, from the session that wrote it (the exact-once test
    above counts them), and the drafts key moving on to its rewound copy is no end (no research gap)."""
    assert len(world.notes["drafts_sessions"]) == 3, world.notes["drafts_sessions"]
    stored = [p["payload"] for p in points_of(world, "research")]
    first = [p for p in stored if p["data"] == "Drafts: the grant report is due in May."]
    assert len(first) == 1, first
    texts = Counter(p["data"] for p in stored if p["chunk"] == 0)
    for text in ("Drafts: the poster goes to print on Friday.", "Fork: the poster could be A1 instead.",
                 "Drafts: the poster goes to print on Monday."):
        assert texts[text] == 1, (text, texts[text])
    ends = [e for e in world.daemon.events("conversation_ended") if e.get("agent") == "research"]
    assert not ends, f"a fork or a rewind ended a conversation: {ends}"


def test_subagent_and_automation_runs_are_not_memory_and_end_no_conversation(world: World) -> None:
    """Sub-agents and cron jobs run in sessions of their own (OpenClaw's memory does not promote them either):
    their briefs, prompts, work and results are not stored; what a child found reaches memory once, in the
    parent's reply to the person (counted by the exact-once test above). Deleting a child's session is no gap.
    A visible child's session becomes the person's conversation once they type in it."""
    keys = world.notes["subagent_keys"]
    assert len(keys) == 3 and sum(":subagent:" in key for key in keys) == 2, keys
    stored = [p["payload"] for p in points_of(world, "research")]
    data = " ".join(p["data"] for p in stored)
    for runtime_text in ("[Subagent", SPAWN.task, FORK.task, VISIBLE.task, "[cron:", CRON_TASK, CRON_RESULT):
        assert runtime_text not in data, runtime_text
    main = " ".join(p["payload"]["data"] for p in points_of(world, "main"))
    assert "cron wake" not in main and "stand up and stretch" not in main
    for child in (SPAWN, FORK, VISIBLE):  # a result is stored only where the parent's reply says it
        assert child.result not in data or any(child.result in text for text in world.notes["announced"]), child
    follow_up = [p for p in stored if p["data"] in FOLLOW_UP]
    visible = {r.session_id for r in world.gateway.transcript_rows("research") if VISIBLE.task in r.text}
    assert len(follow_up) == 2 and {p["session_id"] for p in follow_up} == visible, follow_up
    child_sessions = {r.session_id for r in world.gateway.transcript_rows("research") if FORK.task in r.text}
    assert child_sessions and not [p for p in stored if p["session_id"] in child_sessions], "a fork child's copies"
    assert not gaps(world.gaps_before_restart, "research")
    archives = list(world.gateway.sessions_dir("research").glob(f"{world.notes['subagent_deleted']}.jsonl.deleted.*"))
    assert len(archives) == 1, "OpenClaw archived the deleted child session"


def test_webhook_runs_and_wakes_are_not_memory(world: World) -> None:
    """A `POST /hooks/agent` payload is external content run as a cron job (OpenClaw's memory does not promote
    it): neither the wrapped email nor main's summary of it is stored, in an isolated run's `cron:` session or a
    persistent `hook:` one. A `POST /hooks/wake` is a heartbeat run: its alert is not stored either. main's person
    is undisturbed: their turns around it are stored (the exact-once test) and no gap is reported."""
    keys = world.notes["hook_keys"]
    assert any(":cron:" in key for key in keys) and "agent:main:hook:gmail:18c2f0" in keys, keys
    rows = world.gateway.transcript_rows("main")
    assert any(r.text.startswith("Job ID: ") and "EXTERNAL_UNTRUSTED_CONTENT" in r.text for r in rows)
    assert any(r.text == WAKE[1] for r in rows), "the alert reached main's transcript"
    data = " ".join(p["payload"]["data"] for p in points_of(world, "main"))
    for text in ("Job ID", "[external content]", "unattended", "invoice 4411", "Invoice 4411", "dentist",
                 "Dentist", "session event", "nightly import"):
        assert text not in data, text
    assert len(gaps(world.gaps_before_restart, "main")) == 1, "only the /new with a stale STATE.md"


def test_a_session_forgotten_in_openclaw_leaves_memory_for_good(world: World) -> None:
    """What `openclaw memory forget` removes from OpenClaw's memory goes from veritas-watch's too: stored
    before, gone after, and neither the turn that followed, nor the session's deletion archive, nor the
    daemon's restart brings it back (or reports its end: main's one gap is the stale /new's)."""
    assert world.notes["private_stored"] == 2, "stored before it was forgotten"
    [event] = [e for e in world.daemon.log_events() if e.get("event") == "session_forgotten"][:1]
    assert event["session_id"] == world.notes["private_session"] and event["points"] == 2, event
    archives = list(world.gateway.sessions_dir("main").glob(f"{world.notes['private_session']}.jsonl.deleted.*"))
    assert archives, "OpenClaw archived the deleted session"
    private = {text for turn in PRIVATE for text in turn}
    for points in (world.notes["export"], world.daemon.export()):  # before and after the restart
        assert not [p for p in points if p["payload"]["data"] in private or "Dr. Lee" in p["payload"]["data"]]
    hits = world.daemon.post("/memory/search", {"agent_id": "main", "query": "Who is my therapist?", "limit": 5})
    assert not [h for h in hits["results"] if "Dr. Lee" in h["text"] or "Park" in h["text"]], hits


def test_what_agents_say_to_each_other_is_not_memory(world: World) -> None:
    """`sessions_send`: main's person asks, main asks ops, ops answers main, and the two agents go on in a
    ping-pong. Only the person's question and main's answer to them are memories (the exact-once test counts
    them); ops' answer and every reply in the ping-pong went to the other agent, not to a person."""
    main, ops = (world.gateway.transcript_rows(agent) for agent in ("main", "ops"))
    assert any(r.text == A2A_ANSWER for r in ops), "ops answered through OpenClaw"
    assert [r for r in main if r.role == "user" and A2A_ANSWER in r.text], "the answer came back to main"
    assert world.notes["a2a_rows"] >= 4, "OpenClaw's ping-pong"
    for agent in ("main", "ops"):
        data = " ".join(p["payload"]["data"] for p in points_of(world, agent))
        assert A2A_ANSWER not in data and "Inter-session" not in data and A2A_QUESTION not in data, agent


def test_a_session_created_and_deleted_while_stopped_is_read_from_its_archive(world: World) -> None:
    """Its compressed `.deleted` archive is read at the restart: both turns stored once, and its end (ops'
    STATE.md is stale) is one gap."""
    archives = list(world.gateway.sessions_dir("ops").glob(f"{world.notes['offline_session']}.jsonl.deleted.*.zst"))
    assert len(archives) == 1, archives
    points = [p for p in world.daemon.export() if p["payload"]["agent_id"] == "ops"]
    texts = Counter(normal(p["payload"]["data"]) for p in points)
    assert [texts[normal(t)] for t in OFFLINE] == [1, 1], texts
    assert len({p["id"] for p in points}) == len(points)
    before = {p["id"] for p in world.notes["export"] if p["payload"]["agent_id"] == "ops"}
    assert before <= {p["id"] for p in points}, "the scratch-1 archive read live added no second copy"
    assert len(points) == len(before) + 2, "only the offline session's two turns are new"
    offline = [g for g in world.gaps_after_restart if g.get("session") == world.notes["offline_session"]]
    assert len(offline) == 1, world.gaps_after_restart
    # ended by its archive and again by OpenClaw's store: told once (a lossless trial saw it logged twice)
    ends = [e for e in world.daemon.events("conversation_ended") if e.get("session") == world.notes["offline_session"]]
    assert len(ends) == 1, ends


# -- credentials, workspaces, status ------------------------------------------------------------------

def index_rows(path: Path) -> list[str]:
    return [line for line in path.read_text().splitlines()
            if line.startswith("|") and "Fingerprint" not in line and not re.match(r"^\|[\s:|-]+\|$", line)]


@pytest.mark.parametrize("agent", ["main", "ops"])
def test_credentials_index_in_the_real_workspace_one_row_per_credential(world: World, agent: str) -> None:
    index = world.gateway.workspace(agent) / "CREDENTIALS_INDEX.md"
    assert index.is_file(), f"no index in {index.parent}"
    rows = index_rows(index)
    assert len(rows) == world.credentials[agent], rows
    # OpenClaw masked every key it was given; what a person holds it passes on as typed
    personal = [row for row in rows if "| SEED_PHRASE |" in row or "| CARD_NUMBER |" in row]
    assert len(personal) == (2 if agent == "ops" else 0), rows
    assert all("masked" in row for row in rows if row not in personal), rows
    assert oct(index.stat().st_mode & 0o777) == "0o600"


def test_values_behind_openclaws_masks_reach_the_vault_and_nothing_else(world: World) -> None:
    vault = world.daemon.data_dir / "credentials.vault"
    values = [json.loads(pyrage.decrypt(json.loads(line)["age"].encode(), [world.identity]))["value"]
              for line in vault.read_text().splitlines()]
    assert sorted(values) == sorted(SECRETS), "each credential given through the gateway is kept, once"


def test_no_openclaw_home_or_workspace_is_created(world: World) -> None:
    assert not (world.gateway.home / ".openclaw").exists()
    assert not (world.gateway.state_dir / "workspace").exists()  # the pre-2026.9 default agent's place
    assert not (world.gateway.workspace("research") / "CREDENTIALS_INDEX.md").exists()


def test_no_secret_anywhere_veritas_watch_writes(world: World) -> None:
    written: list[tuple[str, bytes]] = []
    for path in world.daemon.data_dir.rglob("*"):
        if path.is_file() and path.stat().st_size < 256 * 1024 * 1024:
            written.append((str(path), path.read_bytes()))
    written.append(("log", world.notes["log_before_restart"].encode() + world.daemon.log_text().encode()))
    written.append(("export", json.dumps(world.notes["export"]).encode()))
    written.append(("status", json.dumps(world.notes["status"]).encode()))
    for agent in ("main", "ops", "research"):
        index = world.gateway.workspace(agent) / "CREDENTIALS_INDEX.md"
        if index.exists():
            written.append((str(index), index.read_bytes()))
    for secret in SECRETS:
        if secret == SEED_PHRASE:
            # A seed phrase is made of everyday words (" method " is in any log): two of its words in
            # a row is the piece that gives part of it away.
            words = secret.split()
            pieces = {f"{a} {b}".encode() for a, b in itertools.pairwise(words)}
        else:
            # Any 8 consecutive characters of a value: more than OpenClaw's own mask ever shows (6 + 4).
            pieces = {secret[i:i + 8].encode() for i in range(len(secret) - 7)}
        leaks = [(where, piece) for where, data in written for piece in pieces if piece in data]
        assert not leaks, f"secret material found: {leaks[:3]}"
    stored = " ".join(p["payload"]["data"] for p in world.notes["export"])
    for tail in (OPENAI_KEY[-4:], GITHUB_TOKEN[-4:]):
        assert tail not in stored, f"OpenClaw's masked tail {tail!r} reached the store"


def test_status_per_agent_counts_sqlite_entries_sessions_time_and_credentials(world: World) -> None:
    agents = world.notes["status"]["agents"]
    for agent in ("main", "ops", "research"):
        points = points_of(world, agent)
        row = agents[agent]
        assert row["entries_stored"] == len(points), (agent, row)
        newest = max(p["payload"]["timestamp"] for p in points)
        assert row["last_entry_at"] == newest, (agent, row)
        sessions = {r.session_id for r in world.gateway.transcript_rows(agent)}
        assert row["sessions"] == len(sessions), (agent, row, sessions)
        assert row["credentials_captured"] == world.credentials.get(agent, 0), (agent, row)


def test_the_transcript_rows_are_what_the_harness_says(world: World) -> None:
    """Guards the other tests: OpenClaw really wrote what they rely on."""
    rows: list[TranscriptRow] = world.gateway.transcript_rows("main")
    assert {r.event.get("reason") for r in rows if r.type == "reset"} == {"new", "reset"}
    users = [r.text for r in rows if r.role == "user"]
    assert any("sk-pro…" in t for t in users), "OpenClaw no longer masks the key: the credential tests need a look"
    assert datetime.now(UTC) - datetime.fromtimestamp(rows[-1].created_at / 1000, UTC) < timedelta(hours=1)
