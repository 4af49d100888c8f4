"""From the real OpenClaw's write to searchable in veritas-watch: median and p95, measured in one run.

Installs (once, cached) Node and OpenClaw 2026.9.6 from the npm registry, runs its gateway offline
against the tests' mock model, starts the real veritas-watch daemon on the same state dir, and
drives `--turns` turns through `openclaw agent`. A watcher thread asks the daemon for each agent's
points every `--poll-ms` and records when each entry id first appears. Latency is that moment minus
the `created_at` OpenClaw gave the row (its own clock, the moment of the write), so the model, the
CLI and the gateway are not counted, only what veritas-watch adds.

    .venv/bin/python bench/openclaw_latency.py [--turns 20] [--poll-ms 20]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.daemon_harness import DaemonProcess
from tests.mock_model import Plan
from tests.openclaw_harness import install, running_gateway

TOPICS = ("the harbour crane schedule", "Lena's survey deadline", "the staging database migration",
          "the rack PDU order", "the VPN key rotation", "the quarterly budget review", "the new Kiel office",
          "the certificate renewal", "the vendor call", "the backup retention policy")


class Watcher(threading.Thread):
    """Polls the daemon's export and notes when each entry id first shows up (wall clock)."""

    def __init__(self, daemon: DaemonProcess, agent: str, interval: float) -> None:
        super().__init__(daemon=True)
        self.daemon, self.agent, self.interval = daemon, agent, interval
        self.seen: dict[str, float] = {}
        self.stop = threading.Event()

    def run(self) -> None:
        request = urllib.request.Request(f"{self.daemon.base}/export?agent={self.agent}", headers=self.daemon.auth)
        while not self.stop.is_set():
            with urllib.request.urlopen(request, timeout=30) as response:
                body = response.read()
            now = time.time()
            for raw in body.decode().splitlines():
                if raw.strip():
                    entry = json.loads(raw)["payload"]["entry_id"]
                    self.seen.setdefault(entry, now)
            self.stop.wait(self.interval)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--poll-ms", type=float, default=20)
    args = parser.parse_args()
    found = install()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        with running_gateway(found, root, {"main": {"name": "Main"}}) as gateway:
            daemon = DaemonProcess(gateway.state_dir, root / "vw-data", {"HOME": str(gateway.home)}).start()
            watcher: Watcher | None = None
            try:
                turn_s = []
                for n in range(args.turns):
                    text = f"Note {n}: please remember {TOPICS[n % len(TOPICS)]} (item {n})."
                    gateway.model.plan(text, Plan(reply=f"Noted item {n} about {TOPICS[n % len(TOPICS)]}."))
                    result = gateway.agent("main", text)
                    turn_s.append(result.finished - result.started)
                    if watcher is None:  # the first turn also creates the database; start watching after it
                        watcher = Watcher(daemon, "main", args.poll_ms / 1000)
                        watcher.start()
                deadline = time.time() + 60
                rows = [r for r in gateway.transcript_rows("main") if r.role in ("user", "assistant")]
                wanted = {str(r.event["id"]): r.created_at / 1000 for r in rows}
                while watcher is not None and set(wanted) - set(watcher.seen) and time.time() < deadline:
                    time.sleep(0.1)
            finally:
                if watcher is not None:
                    watcher.stop.set()
                    watcher.join()
                daemon.stop()
    assert watcher is not None
    # The first turn's rows were written before the watcher started: their latency is not measurable.
    first = {str(r.event["id"]) for r in rows[:2]}
    latencies = [(watcher.seen[e] - written) * 1000 for e, written in wanted.items()
                 if e in watcher.seen and e not in first]
    missing = sorted(set(wanted) - set(watcher.seen))
    print(f"OpenClaw {gateway.install.prefix.name}: {args.turns} turns, {len(latencies)} messages measured "
          f"(watcher polls every {args.poll_ms:g} ms), {len(missing)} never searchable")
    print(f"write -> searchable: median {statistics.median(latencies):.0f} ms, "
          f"p95 {percentile(latencies, .95):.0f} ms, max {max(latencies):.0f} ms")
    print(f"for scale, one OpenClaw turn through the CLI: median {statistics.median(turn_s):.2f} s")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
