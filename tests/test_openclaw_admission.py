"""OpenClaw's memory admission policy and forgetting, on the real OpenClaw 2026.9.6.

The person writes `plugins.entries.memory-core.config.memoryPolicy.excludeSessions` in openclaw.json (memory-core's
config; with veritas-watch in the memory slot it is still where the policy lives): Gmail hook sessions and every
group chat out. main gets an email through the Gmail preset (`POST /hooks/gmail`: OpenClaw records the run's
source, `gmail`), a webhook (`POST /hooks/agent`, a persistent `hook:` session: always source `webhook`, which
the rule does not name), a group chat and two direct chats. Only the direct chats become memory; status and
the log name the exclusions. `openclaw config unset` takes the rule away: the next sweep reads both sessions from
their first row. `openclaw memory forget --session` on the direct chat that held a credential: no memory, no
CREDENTIALS_INDEX.md row, no vault entry are left, also after a restart.

A group chat needs a channel, and none runs offline: its session carries what OpenClaw's channel pipeline records
for a group (`chat_type` 'group' and the channel on its window, `chatType` and `channel` in its entry), written
while the gateway is stopped, the one thing not done by OpenClaw itself.

Skipped, with the reason, only where the npm registry cannot be reached (and `CI` is not set).
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator

import pyrage
import pytest

from tests.daemon_harness import DaemonProcess, read_db_cursors, wait_for
from tests.mock_model import Plan
from tests.openclaw_harness import OpenClawGateway, install_or_skip, running_gateway
from tests.test_openclaw_cold_storage import World, say
from veritas_watch.features.credentials import INDEX_FILE, read_index

pytestmark = pytest.mark.long

POLICY = {"hookExternalContentSources": ["gmail"], "chatTypes": ["group"]}
HOOKS = {"enabled": True, "token": "veritas-test-hook-token-0123456789abcdef", "path": "/hooks",
         "allowedAgentIds": ["main"], "allowRequestSessionKey": True, "allowedSessionKeyPrefixes": ["hook:"],
         "presets": ["gmail"]}
GROUP_KEY = "agent:main:telegram:group:-1001234"
PRIVATE_KEY = "agent:main:private"
TOKEN = "ghp_Q7r8S9t0U1v2W3x4Y5z6A7b8C9d0E1f2G3h4"
DIRECT = ("I'm Ada; my boat Seabird is at berth 7 in Kiel.", "Seabird at berth 7 in Kiel, noted.")
PRIVATE = (f"For the deploy the GitHub token is {TOKEN}, keep it.", "Got the deploy token.")
GROUP = ("Crew: the regatta moved to Sunday, bring the spare sail.", "Sunday regatta, spare sail: noted.")
GMAIL = {"messages": [{"id": "18c2f0", "from": "billing@acme.example", "subject": "Invoice 4411",
                        "snippet": "340 EUR due Friday", "body": "Invoice 4411 from Acme: 340 EUR, due Friday."}]}
MAIL_SUMMARY = "Acme invoice 4411: 340 EUR due Friday."
WEBHOOK = ("New ticket: the marina gate code changes on Monday.", "Marina gate code changes Monday.")
WEBHOOK_KEY = "hook:tickets:77"


def session_of(gw: OpenClawGateway, key: str) -> str:
    ((sid,),) = gw.query("main", "SELECT session_id FROM session_windows WHERE session_key = ?", (key,))
    return str(sid)


def make_group(gw: OpenClawGateway, key: str) -> None:
    """What a channel's inbound pipeline records of a group conversation (the gateway stopped)."""
    with sqlite3.connect(gw.agent_db("main")) as db:
        (entry_json,) = db.execute("SELECT entry_json FROM session_nodes WHERE session_key = ?", (key,)).fetchone()
        entry = json.loads(entry_json)
        entry.update({"chatType": "group", "channel": "telegram"})
        db.execute("UPDATE session_nodes SET entry_json = ? WHERE session_key = ?", (json.dumps(entry), key))
        db.execute("UPDATE session_windows SET chat_type = 'group', channel = 'telegram' WHERE session_key = ?", (key,))


def texts(daemon: DaemonProcess) -> list[str]:
    return sorted(p["payload"]["data"] for p in daemon.export("main"))


def committed(daemon: DaemonProcess, gw: OpenClawGateway, sid: str) -> bool:
    return (str(gw.agent_db("main")), sid) in read_db_cursors(daemon.data_dir)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    openclaw = install_or_skip()
    root = tmp_path_factory.mktemp("openclaw-admission")
    extra = {"hooks": HOOKS, "plugins": {"entries": {"memory-core": {"config": {
        "memoryPolicy": {"excludeSessions": POLICY}}}}}}
    identity = pyrage.x25519.Identity.generate()
    config: dict[str, dict[str, object]] = {"credentials": {"vault_recipient": str(identity.to_public())},
                                            "watch": {"sweep_max_interval": 2.0}}
    agents = {"main": {"name": "Main", "workspace": str(root / "main-workspace")}}
    with running_gateway(openclaw, root, agents, extra_config=extra) as gw:
        gw.workspace("main").mkdir(parents=True, exist_ok=True)
        say(gw, GROUP, GROUP_KEY)
        gw.stop()
        make_group(gw, GROUP_KEY)
        gw.restart()
        gw.model.plan("Invoice 4411", Plan(reply=MAIL_SUMMARY))
        gw.hook("gmail", GMAIL)
        wait_for(lambda: any(r.text == MAIL_SUMMARY for r in gw.transcript_rows("main")), timeout=120,
                 interval=0.5, what="the Gmail hook's run")
        gw.model.plan(WEBHOOK[0], Plan(reply=WEBHOOK[1]))
        done = gw.hook("agent", {"message": WEBHOOK[0], "name": "Tickets", "agentId": "main",
                                 "waitForCompletion": True, "sessionKey": WEBHOOK_KEY, "sessionMode": "persistent"})
        assert done.get("completion", {}).get("status") == "ok", done
        say(gw, DIRECT)
        say(gw, PRIVATE, PRIVATE_KEY)
        w = World(gw, DaemonProcess(gw.state_dir, root / "vw-data", {"HOME": str(gw.home)}, config=config).start())
        daemon = w.daemon
        try:
            ((mail,),) = gw.query("main", "SELECT session_id FROM session_windows"
                                          " WHERE hook_external_content_source = 'gmail'")
            w.notes["mail"] = str(mail)
            w.notes["webhook"] = session_of(gw, f"agent:main:{WEBHOOK_KEY}")
            w.notes["group"] = session_of(gw, GROUP_KEY)
            w.notes["private"] = session_of(gw, PRIVATE_KEY)
            w.notes["metadata"] = gw.query(
                "main", "SELECT session_key, chat_type, channel, hook_external_content_source FROM session_windows")
            wait_for(lambda: PRIVATE[1] in texts(daemon) and DIRECT[1] in texts(daemon), what="the direct chats")
            daemon.wait_idle()
            w.notes["texts_excluded"] = texts(daemon)
            w.notes["status"] = json.loads(daemon.cli("status", "--json").stdout)
            w.notes["status_text"] = daemon.cli("status").stdout.decode()
            w.notes["excluded_logged"] = daemon.events("session_excluded")
            w.notes["index_before"] = read_index(gw.workspace("main") / INDEX_FILE)

            gw.run("config", "unset", "plugins.entries.memory-core.config.memoryPolicy")
            wait_for(lambda: GROUP[0] in texts(daemon) and committed(daemon, gw, w.notes["mail"]),
                     what="the sessions read once the rule is gone")
            daemon.wait_idle()
            w.notes["texts_admitted"] = texts(daemon)

            gw.run("memory", "forget", "--agent", "main", "--session", PRIVATE_KEY, "--json")
            wait_for(lambda: daemon.events("session_erased"), what="the forgotten session erased")
            daemon.wait_idle()
            w.notes["texts_forgotten"] = texts(daemon)
            w.notes["index_forgotten"] = read_index(gw.workspace("main") / INDEX_FILE)
            w.notes["vault_forgotten"] = (daemon.data_dir / "credentials.vault").read_text()
            assert daemon.stop() == 0
            daemon.start()
            daemon.wait_idle()
            w.notes["texts_restarted"] = texts(daemon)
            w.notes["index_restarted"] = read_index(gw.workspace("main") / INDEX_FILE)
            yield w
        finally:
            if daemon.running:
                daemon.stop()


def test_openclaw_records_the_hook_sources(world: World) -> None:
    meta = {key: (chat, channel, hook) for key, chat, channel, hook in world.notes["metadata"]}
    assert [hook for _, _, hook in meta.values()].count("gmail") == 1, meta  # the Gmail preset's run
    assert meta[f"agent:main:{WEBHOOK_KEY}"][2] == "webhook", meta  # `/hooks/agent` is always a webhook
    assert meta[GROUP_KEY][0] == "group"


def test_only_the_direct_chats_are_memory_while_the_policy_excludes_the_rest(world: World) -> None:
    stored = world.notes["texts_excluded"]
    assert len(stored) == 4 and {*DIRECT, PRIVATE[1]} <= set(stored), stored
    assert any(t.startswith("For the deploy the GitHub token is [REDACTED") for t in stored), stored
    assert not any("regatta" in t or "invoice" in t.lower() or "gate code" in t for t in stored)
    assert TOKEN not in json.dumps(stored)
    [row] = world.notes["index_before"]
    assert world.notes["private"] in row.location


def test_exclusions_are_visible_in_status_and_the_log(world: World) -> None:
    (db,) = world.notes["status"]["sqlite"]
    assert db["exclusions"] == {"chatType:group": 1, "hookExternalContentSource:gmail": 1}
    assert db["lag_rows"] == 0
    assert "kept out of memory: main: chatType:group=1 hookExternalContentSource:gmail=1" in world.notes["status_text"]
    told = sorted((e["session"], e["reason"]) for e in world.notes["excluded_logged"])  # once each, the webhook not
    assert told == sorted([(world.notes["mail"], "hookExternalContentSource:gmail"),
                           (world.notes["group"], "chatType:group")])


def test_removing_the_rule_reads_the_excluded_sessions(world: World) -> None:
    admitted = world.notes["texts_admitted"]
    assert GROUP[0] in admitted and GROUP[1] in admitted
    assert len(admitted) == len(set(admitted)) == len(world.notes["texts_excluded"]) + 2
    # the hook's run is read too; what it holds is external content run as a cron job: no memory (denoise)
    assert not any("invoice" in t.lower() for t in admitted)


def test_a_session_openclaw_forgot_leaves_no_memory_index_row_or_vault_entry(world: World) -> None:
    for stored in (world.notes["texts_forgotten"], world.notes["texts_restarted"]):
        assert not any(t.startswith("For the deploy") or t == PRIVATE[1] for t in stored)
        assert DIRECT[1] in stored and GROUP[0] in stored
    assert world.notes["index_forgotten"] == [] and world.notes["index_restarted"] == []
    vault = [json.loads(line) for line in world.notes["vault_forgotten"].splitlines() if line.strip()]
    assert vault == [{"n": 1, "forgotten": True}]
