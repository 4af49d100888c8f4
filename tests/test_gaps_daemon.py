"""Gap detection wired into the real daemon: reset renames, start-up scan, restart, closing."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from tests.daemon_harness import DaemonProcess, header, message, running_daemon, wait_for

HOOK = """
import json, sys
with open(sys.argv[1], "a") as out:
    out.write(json.dumps(sys.argv[2:]) + "\\n")
"""


def setup(tmp_path: Path) -> tuple[Path, Path, Path, Path, dict[str, str]]:
    state, data = tmp_path / "state", tmp_path / "data"
    sessions = state / "agents" / "ops" / "sessions"
    sessions.mkdir(parents=True)
    workspace = state / "workspace-ops"
    workspace.mkdir()
    hook = tmp_path / "hook.py"
    hook.write_text(HOOK)
    calls = tmp_path / "calls.jsonl"
    config = tmp_path / "veritas.toml"
    config.write_text(
        "[gaps]\n"
        f"on_gap = [{json.dumps(sys.executable)}, {json.dumps(str(hook))}, {json.dumps(str(calls))}, "
        '"{agent}", "{session_id}", "{transcript}", "{ended_at}", "{workspace}"]\n'
        "tolerance = 0\n"
        "[watch]\nsweep_interval = 0.5\n"
    )
    return state, data, sessions, calls, {"VERITAS_WATCH_CONFIG": str(config)}


def session(path: Path, sid: str, ts: str) -> None:
    path.write_bytes(header(sid) + message("u1", "user", "Fix the nginx cert renewal", ts=ts)
                     + message("a1", "assistant", "Renewed the cert and reloaded nginx.", ts=ts))


def hook_calls(calls: Path) -> list[list[str]]:
    return [json.loads(raw) for raw in calls.read_text().splitlines()] if calls.exists() else []


def reset_and_wait_for_the_hook(daemon: DaemonProcess, live: Path, calls: Path) -> Path:
    """Once what is on disk is stored, end the session (`/reset` renames its transcript), until the hook ran."""
    daemon.wait_idle()
    archived = live.with_name(f"{live.name}.reset.2026-03-20T11-00-00.000Z")
    live.rename(archived)
    wait_for(lambda: hook_calls(calls), what="hook run")
    return archived


def test_reset_with_stale_state_fires_once_and_closes(tmp_path: Path) -> None:
    state, data, sessions, calls, env = setup(tmp_path)
    (state / "workspace-ops" / "STATE.md").write_text("## Events\n- 2026-03-19 08:00 UTC deployed v1\n")
    live = sessions / "s-1.jsonl"
    session(live, "s-1", "2026-03-20T10:00:00.000Z")
    with running_daemon(state, data, extra_env=env) as daemon:
        archived = reset_and_wait_for_the_hook(daemon, live, calls)
        (call,) = hook_calls(calls)
        assert call[:3] == ["ops", "s-1", str(archived)]
        assert call[3].startswith("2026-03-20T10:00:00")
        assert call[4] == str(state / "workspace-ops")
        gaps = daemon.get("/status")["gaps"]
        assert [g["session_id"] for g in gaps] == ["s-1"]
        events = [e for e in daemon.log_events() if e.get("event") == "gap_detected"]
        assert len(events) == 1
        # The sync writes STATE.md: the gap closes.
        (state / "workspace-ops" / "STATE.md").write_text("## Events\n- 2026-03-20 10:30 UTC synced s-1\n")
        wait_for(lambda: not daemon.get("/status")["gaps"], what="gap closed")
        assert any(e.get("event") == "gap_closed" for e in daemon.log_events())


def test_state_newer_than_session_is_no_gap(tmp_path: Path) -> None:
    state, data, sessions, calls, env = setup(tmp_path)
    (state / "workspace-ops" / "STATE.md").write_text("- 2026-03-20T12:00:00Z synced\n")
    live = sessions / "s-2.jsonl"
    session(live, "s-2", "2026-03-20T10:00:00.000Z")
    with running_daemon(state, data, extra_env=env) as daemon:
        daemon.wait_idle()
        live.rename(sessions / "s-2.jsonl.reset.2026-03-20T11-00-00.000Z")
        daemon.wait_idle()
        wait_for(lambda: daemon.get("/status")["entries"]["stored"] >= 2, what="stored")
        assert not daemon.get("/status")["gaps"]
    assert not hook_calls(calls)


def test_reset_while_down_found_at_startup_and_not_refired_after_restart(tmp_path: Path) -> None:
    state, data, sessions, calls, env = setup(tmp_path)
    live = sessions / "s-3.jsonl"
    session(live, "s-3", "2026-03-20T10:00:00.000Z")
    with running_daemon(state, data, extra_env=env) as daemon:
        daemon.wait_idle()
    live.rename(sessions / "s-3.jsonl.reset.2026-03-20T11-00-00.000Z")  # no STATE.md at all: a gap
    with running_daemon(state, data, extra_env=env) as daemon:
        wait_for(lambda: hook_calls(calls), what="startup gap hook")
        assert [g["session_id"] for g in daemon.get("/status")["gaps"]] == ["s-3"]
    daemon = DaemonProcess(state, data, extra_env=env).start()
    try:
        daemon.wait_idle()
        wait_for(lambda: daemon.get("/status")["gaps"], what="open gap survives restart")
    finally:
        daemon.stop()
    assert len(hook_calls(calls)) == 1
    # With the daemon stopped, `status` reads the open gaps from the data dir: plain and --json.
    offline = json.loads(daemon.cli("status", "--json").stdout)
    assert offline["running"] is False and [g["session_id"] for g in offline["gaps"]] == ["s-3"]
    assert offline["agents"]["ops"]["open_gaps"] == 1
    text = daemon.cli("status").stdout.decode()
    assert "open gap: ops session s-3 ended 2026-03-20T10:00:00" in text, text


def test_a_backfill_records_the_gaps_of_the_history_it_read(tmp_path: Path) -> None:
    """`backfill` is the first pass over the history: the conversations that ended in it are checked when it
    ends (they were handed on to a start-up scan that a backfill never ran, and lost for every later run)."""
    state, data, sessions, calls, env = setup(tmp_path)
    (state / "workspace-ops" / "STATE.md").write_text("- 2026-03-01 10:00 UTC synced\n")
    for n in range(30):  # enough for the pass to stay busy until it ends
        session(sessions / f"s-{n}.jsonl", f"s-{n}", f"2026-03-{10 + n % 9:02d}T10:00:00.000Z")
    (sessions / "s-0.jsonl").rename(sessions / "s-0.jsonl.reset.2026-03-12T01-04-30.000Z")
    backfill = DaemonProcess(state, data, extra_env=env).start("backfill")
    assert backfill.proc is not None and backfill.proc.wait(timeout=600) == 0
    (gap,) = backfill.events("gap_detected")
    assert (gap["agent"], gap["session"]) == ("ops", "s-0")
    offline = json.loads(backfill.cli("status", "--json").stdout)
    assert [g["session_id"] for g in offline["gaps"]] == ["s-0"]
    with running_daemon(state, data, extra_env=env) as daemon:  # recorded once: the daemon does not report it again
        daemon.wait_idle()
        wait_for(lambda: hook_calls(calls), what="the hook, run by the daemon")
        assert len(daemon.events("gap_detected")) == 1


def test_sqlite_reset_is_a_session_end(tmp_path: Path) -> None:
    from tests.sqlite_fixture import OpenClawWriter, create_database, message_event

    state, data, _, calls, env = setup(tmp_path)
    path = state / "agents" / "ops" / "agent" / "openclaw-agent.sqlite"
    path.parent.mkdir(parents=True)
    create_database(path, "v24", agent_id="ops")
    with OpenClawWriter(path) as writer, running_daemon(state, data, extra_env=env) as daemon:
        sid = writer.create_session("agent:ops:main")
        writer.append(sid, message_event("Rotate the backup disks on Friday", event_id="q1"))
        daemon.wait_idle()
        wait_for(lambda: daemon.get("/status")["sqlite"][0]["lag_rows"] == 0, what="caught up")
        writer.reset("agent:ops:main")
        (call,) = wait_for(lambda: hook_calls(calls), what="hook after sqlite reset")
        assert call[:3] == ["ops", sid, f"{path}#{sid}:1"]  # where its last row read is (the end no reset marks)


def test_an_agent_openclaw_deleted_gets_no_gap_for_the_sessions_deleted_with_it(tmp_path: Path) -> None:
    """`openclaw agents delete ops` (seen on the real 2026.9.6) takes ops out of openclaw.json's roster, deletes
    its sessions (each an end of a conversation) and moves its workspace to the Trash: there is no one left to
    sync, so no gap and no hook run, only `gap_skipped`. While ops is still configured, or its workspace is
    still there, the same end is a gap; one still open when the agent goes is closed (`agent_removed`)."""
    state, data, sessions, calls, env = setup(tmp_path)
    (state / "openclaw.json").write_text(json.dumps({"agents": {"ownership": "explicit", "entries": {"main": {}}}}))
    (state / "workspace-ops").rmdir()
    live = sessions / "s-1.jsonl"
    session(live, "s-1", "2026-03-20T10:00:00.000Z")
    with running_daemon(state, data, extra_env=env) as daemon:
        daemon.wait_idle()
        live.rename(sessions / "s-1.jsonl.deleted.2026-03-20T11-00-00.000Z")
        wait_for(lambda: daemon.events("gap_skipped"), what="gap skipped")
        (skipped,) = daemon.events("gap_skipped")
        assert (skipped["agent"], skipped["session"], skipped["reason"]) == ("ops", "s-1", "agent_removed")
        assert not daemon.events("gap_detected") and not hook_calls(calls)
        # configured again (or never removed): the next end is a gap as ever
        (state / "openclaw.json").write_text(json.dumps({"agents": {"ownership": "explicit",
                                                                    "entries": {"main": {}, "ops": {}}}}))
        again = sessions / "s-2.jsonl"
        session(again, "s-2", "2026-03-21T10:00:00.000Z")
        daemon.wait_idle()
        again.rename(sessions / "s-2.jsonl.reset.2026-03-21T11-00-00.000Z")
        wait_for(lambda: hook_calls(calls), what="hook run")
        assert [g["session"] for g in daemon.events("gap_detected")] == ["s-2"]
        # deleted while its gap is open (OpenClaw ends the sessions before it takes the agent out): it closes
        (state / "openclaw.json").write_text(json.dumps({"agents": {"ownership": "explicit", "entries": {"main": {}}}}))
        wait_for(lambda: not daemon.get("/status")["gaps"], what="gap of a removed agent closed")
        (closed,) = daemon.events("gap_closed")
        assert (closed["session"], closed["reason"]) == ("s-2", "agent_removed")


# -- the hook runs values, never code

ENV_HOOK = """
import json, os, sys
with open(sys.argv[1], "a") as out:
    out.write(json.dumps({"argv": sys.argv[2:],
                          "env": {k: v for k, v in os.environ.items() if k.startswith("VERITAS_GAP_")}}) + "\\n")
"""


def test_a_template_that_puts_a_value_into_shell_code_is_refused_at_start(tmp_path: Path) -> None:
    state, data, _sessions, _calls, env = setup(tmp_path)
    config = tmp_path / "shell.toml"
    config.write_text('[gaps]\non_gap = ["sh", "-c", "openclaw agent --message \'sync {session_id}\'"]\n')
    daemon = DaemonProcess(state, data, extra_env={**env, "VERITAS_WATCH_CONFIG": str(config)}).start(wait=False)
    assert daemon.proc is not None
    try:
        assert daemon.proc.wait(timeout=120) != 0
    finally:
        if daemon.running:  # today's code started it: do not leave it behind
            daemon.kill()
    log = daemon.log_text()
    assert "gaps.on_gap[2]" in log and "as code" in log and "VERITAS_GAP_SESSION_ID" in log, log[-2000:]
    assert not (data / "daemon.json").exists()


def test_hostile_ids_and_names_never_reach_the_hook(tmp_path: Path) -> None:
    """A session id holding shell code or an option, a transcript named with shell code: each gap is recorded,
    its hook never runs (not retried), and one gap_hook_refused line says which field and why. A later
    session's hook runs as usual (the barrier that the refused ones were ticked past)."""
    state, data, sessions, calls, env = setup(tmp_path)
    hostile = {  # file name -> the session id its header holds
        "s-1.jsonl": 'x" ; touch PWNED ; echo "',
        "s-2.jsonl": "--output=/tmp/pwned",
        "$(touch PWNED).jsonl": "s-3",
    }
    with running_daemon(state, data, extra_env=env) as daemon:
        for name, sid in hostile.items():
            session(sessions / name, sid, "2026-03-20T10:00:00.000Z")
        daemon.wait_idle()
        for name in hostile:
            (sessions / name).rename(sessions / f"{name}.reset.2026-03-20T11-00-00.000Z")
        wait_for(lambda: len(daemon.events("gap_hook_refused")) >= 3, what="three hooks refused")
        session(sessions / "s-4.jsonl", "s-4", "2026-03-20T12:00:00.000Z")
        daemon.wait_idle()
        (sessions / "s-4.jsonl").rename(sessions / "s-4.jsonl.reset.2026-03-20T13-00-00.000Z")
        wait_for(lambda: daemon.events("gap_hook_finished"), what="the valid session's hook")
        refused = daemon.events("gap_hook_refused")
        assert sorted(e["field"] for e in refused) == ["session_id", "session_id", "transcript"]
        # the value as log.echoed shows one: each of these is longer than a short repr may be, so only its length
        assert all(re.match(r"a string of \d+ characters: ", e["reason"]) for e in refused), refused
        assert not any("PWNED" in e["reason"] or "pwned" in e["reason"] for e in refused)
        gaps = {g["session_id"]: g for g in daemon.get("/status")["gaps"]}
        assert set(gaps) == {*[sid for sid in hostile.values()], "s-4"}
        assert {gaps[sid]["last_hook_status"] for sid in hostile.values()} == {"refused"}
    assert [call[:2] for call in hook_calls(calls)] == [["ops", "s-4"]]
    assert not list(tmp_path.rglob("PWNED")) and not (Path.cwd() / "PWNED").exists() and not Path("/tmp/pwned").exists()


def test_the_hook_gets_each_value_in_its_environment(tmp_path: Path) -> None:
    state, data, sessions, calls, env = setup(tmp_path)
    (tmp_path / "hook.py").write_text(ENV_HOOK)
    live = sessions / "s-1.jsonl"
    session(live, "s-1", "2026-03-20T10:00:00.000Z")
    with running_daemon(state, data, extra_env=env) as daemon:
        archived = reset_and_wait_for_the_hook(daemon, live, calls)
    (call,) = [json.loads(raw) for raw in calls.read_text().splitlines()]
    assert call["env"] == {
        "VERITAS_GAP_AGENT": "ops", "VERITAS_GAP_SESSION_ID": "s-1", "VERITAS_GAP_TRANSCRIPT": str(archived),
        "VERITAS_GAP_ENDED_AT": call["argv"][3], "VERITAS_GAP_WORKSPACE": str(state / "workspace-ops"),
        "VERITAS_GAP_STATE_TIME": "",
    }
    assert call["argv"][:3] == ["ops", "s-1", str(archived)] and call["argv"][3].startswith("2026-03-20T10:00:00")
