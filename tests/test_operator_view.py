"""What an operator sees: `veritas-watch backfill` on a terminal (a progress bar that ends at 100% and that
log lines never print over, through a real pseudo-terminal), and a daemon pointed at a state dir with no
agents saying so instead of looking quiet."""

from __future__ import annotations

import os
import pty
import re
import subprocess
import sys
import time
from pathlib import Path

from tests.daemon_harness import DaemonProcess, header, message, wait_for

REPO = Path(__file__).resolve().parents[1]


def test_the_backfill_bar_ends_at_100_and_log_lines_are_not_printed_over_it(tmp_path: Path) -> None:
    sessions = tmp_path / "state" / "agents" / "main" / "sessions"
    sessions.mkdir(parents=True)
    for s in range(3):
        body = header(f"s{s}") + b"".join(
            message(f"m{s}-{i}", "user" if i % 2 == 0 else "assistant", f"Session {s} turn {i}: the ferry leaves "
                    f"pier {i} at {8 + i % 10}:15 and the harbour office closes at noon.")
            for i in range(40))
        (sessions / f"s{s}.jsonl").write_bytes(body)
    (sessions / "broken.jsonl").write_bytes(header("broken") + b"{not json\n")  # one log line on the way
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VERITAS_", "OPENCLAW_"))}
    env.update({"OPENCLAW_STATE_DIR": str(tmp_path / "state"), "VERITAS_WATCH_DATA_DIR": str(tmp_path / "data"),
                "OPENCLAW_HOME": str(tmp_path / "home"), "PYTHONUNBUFFERED": "1"})
    leader, follower = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "veritas_watch.cli", "backfill"], cwd=REPO, env=env,
                            stdin=subprocess.DEVNULL, stdout=follower, stderr=follower)
    os.close(follower)
    out = bytearray()
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the terminal closed: the process is done
            break
        if not chunk:
            break
        out += chunk
    os.close(leader)
    assert proc.wait(timeout=60) == 0, out.decode(errors="replace")[-2000:]
    text = out.decode(errors="replace")
    bars = re.findall(r"backfill \[[#.]+\]\s+([\d.]+)% .*?(\d+) entries stored", text)
    assert bars, text[-2000:]
    assert bars[-1] == ("100.0", "120"), bars[-3:]
    # Every log line starts on a cleared line: never glued to the end of a bar.
    for line in text.split("\r\n"):
        assert not re.search(r"entries stored \([\d.]+/s\)\S", line), line
    assert "line_invalid" in text


def test_a_state_dir_without_agents_is_said_once(tmp_path: Path) -> None:
    (tmp_path / "state").mkdir()  # exists, but holds no agents/: a mistyped path, most likely
    daemon = DaemonProcess(tmp_path / "state", tmp_path / "data").start()
    try:
        wait_for(lambda: daemon.events("no_agents_found"), timeout=30, what="no_agents_found")
        daemon.wait_idle()
        daemon.wait_idle()
        assert len(daemon.events("no_agents_found")) == 1, "said once, not every sweep"
        sessions = tmp_path / "state" / "agents" / "main" / "sessions"
        sessions.mkdir(parents=True)
        (sessions / "s.jsonl").write_bytes(header("s") + message("m1", "user", "The boat is at berth 7."))
        wait_for(lambda: daemon.export("main"), timeout=60, what="the agent found later is stored")
    finally:
        daemon.stop()
