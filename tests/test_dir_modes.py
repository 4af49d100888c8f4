"""Directories veritas-watch makes have their mode whatever the umask (issue 37): under umask 000 the
workspace's `memory/archive` was made 0777 and a data dir's missing parents 0777."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from tests.daemon_harness import DaemonProcess, header, message, wait_for
from veritas_watch.safepath import make_dirs

UMASK_000 = ("sh", "-c", 'umask 000 && exec "$@"', "sh")


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_under_umask_000_every_directory_the_daemon_makes_is_its_owner_s_alone(tmp_path: Path) -> None:
    state = tmp_path / "state"
    sessions = state / "agents" / "ops" / "sessions"
    sessions.mkdir(parents=True)
    (sessions / "s-1.jsonl").write_bytes(header("s-1") + message("u1", "user", "Renew the nginx cert"))
    memory = state / "workspace-ops" / "memory"
    memory.mkdir(parents=True)
    for day in range(1, 5):  # more daily logs than the threshold, all older than keep_days
        (memory / f"2026-01-0{day}.md").write_text(f"- day {day}\n")
    data = tmp_path / "data"
    config = {"gaps": {"archive_daily_logs": True, "archive_threshold": 2, "archive_keep_days": 1}}
    daemon = DaemonProcess(state, data, config=config, wrapper=UMASK_000)
    try:
        daemon.start()
        daemon.wait_idle()
        wait_for(lambda: daemon.events("daily_log_archived"), what="daily logs archived")
        assert daemon.proc is not None
        status = Path(f"/proc/{daemon.proc.pid}/status").read_text()
        assert int(status.split("Umask:")[1].split()[0], 8) == 0  # the daemon really ran under umask 000
    finally:
        if daemon.running:
            daemon.stop()
    assert mode(memory / "archive") == 0o700
    assert mode(data) == 0o700
    ours = [p for p in data.rglob("*") if p.is_dir() and p.parent == data]  # what the daemon names itself
    assert ours and all(mode(p) == 0o700 for p in ours), {str(p): oct(mode(p)) for p in ours}


def test_make_dirs_sets_the_mode_whatever_the_umask(tmp_path: Path) -> None:
    old = os.umask(0o000)
    try:
        made = make_dirs(tmp_path / "a" / "b")
        make_dirs(tmp_path / "wide", 0o755)
    finally:
        os.umask(old)
    assert made == [tmp_path / "a", tmp_path / "a" / "b"]
    assert mode(tmp_path / "a") == mode(tmp_path / "a" / "b") == 0o700 and mode(tmp_path / "wide") == 0o755
    old = os.umask(0o277)  # a umask that would take the owner's own write bit: set back
    try:
        make_dirs(tmp_path / "c")
    finally:
        os.umask(old)
    assert mode(tmp_path / "c") == 0o700
    (tmp_path / "file").write_text("x")
    try:
        make_dirs(tmp_path / "file")
    except FileExistsError:
        pass
    else:
        raise AssertionError("a file in the way must raise")
    assert make_dirs(tmp_path / "a") == []  # exists: left as it is
