"""An idle daemon is idle (issue 38: 0.42 % of a core with 1,000 watched transcripts and nothing happening).

Its own reads must not wake it: the safety sweep opens transcripts to check them, and an inotify watch that
asks for IN_OPEN / IN_CLOSE_NOWRITE queued two events per file opened, each read and dispatched by watchdog's
threads, only to be ignored. The kernel's own list of this process's watches (`/proc/<pid>/fdinfo`) says which
events are asked for. (The CPU figure itself: bench/ingest.py's idle line.)
"""

from __future__ import annotations

import os
from pathlib import Path

from tests.daemon_harness import DaemonProcess, header, message

IN_ACCESS, IN_CLOSE_NOWRITE, IN_OPEN = 0x1, 0x10, 0x20
IN_MODIFY, IN_CLOSE_WRITE, IN_CREATE, IN_MOVED_TO = 0x2, 0x8, 0x100, 0x80


def inotify_masks(pid: int) -> list[int]:
    masks = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") != "anon_inode:inotify":
                continue
            info = Path(f"/proc/{pid}/fdinfo/{fd}").read_text()
        except OSError:
            continue
        for line in info.splitlines():
            if line.startswith("inotify "):
                fields = dict(part.split(":", 1) for part in line.split()[1:] if ":" in part)
                masks.append(int(fields["mask"], 16))
    return masks


def test_the_watch_asks_for_changes_not_for_reads(tmp_path: Path) -> None:
    sessions = tmp_path / "state" / "agents" / "main" / "sessions"
    sessions.mkdir(parents=True)
    (sessions / "s1.jsonl").write_bytes(header("s1") + message("u1", "user", "The gate squeaks."))
    daemon = DaemonProcess(tmp_path / "state", tmp_path / "data").start()
    try:
        daemon.wait_idle()
        assert daemon.proc is not None and daemon.status()["watcher"]["mode"] == "inotify"
        masks = inotify_masks(daemon.proc.pid)
        assert len(masks) >= 3, masks  # the state dir, agents/ and below
        for mask in masks:
            assert not mask & (IN_OPEN | IN_CLOSE_NOWRITE | IN_ACCESS), hex(mask)
            assert mask & IN_CREATE and mask & IN_MOVED_TO, hex(mask)  # what the sweep must hear of
        assert any(mask & IN_MODIFY and mask & IN_CLOSE_WRITE for mask in masks)
    finally:
        daemon.stop()
