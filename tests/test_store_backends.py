"""One contract, two backends: embedded Qdrant Edge, and qdrant-client (local mode stands in for a server)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
from qdrant_client import QdrantClient

from tests.backends import BACKENDS, META
from veritas_watch.model import point_id
from veritas_watch.sinks.factory import open_server_collection, open_store
from veritas_watch.sinks.store import SearchQuery, SparseVector, Store, StoredPoint, StoreMeta, meta_path


def vector(seed: int) -> list[float]:
    v = np.random.default_rng(seed).normal(size=8)
    return list(v / np.linalg.norm(v))


def point(agent: str, n: int, text: str) -> StoredPoint:
    pid = point_id(agent, "s1", f"e{n}", 0)
    payload: dict[str, object] = {"agent_id": agent, "type": "conversation", "data": text, "session_id": "s1",
                                  "entry_id": f"e{n}", "role": "user" if n % 2 else "assistant", "ts": float(n),
                                  "position": n, "chunk": 0, "timestamp": None, "source": f"f:{n}"}
    return StoredPoint(pid, vector(n), SparseVector((n, 1000 + n), (1.0, 0.5)), payload)


def test_contract(store: Store) -> None:
    points = [point("a", n, f"alpha {n}") for n in range(10)] + [point("b", n, f"beta {n}") for n in range(10)]
    store.upsert(points)
    store.upsert(points[:3])  # a replay is an overwrite, not a new point
    assert store.count() == 20
    assert store.count("a") == 10

    hits = store.search(SearchQuery("a", 5, mode="dense", dense=vector(3)))
    assert hits[0].payload["data"] == "alpha 3"
    assert all(h.payload["agent_id"] == "a" for h in hits)
    sparse = store.search(SearchQuery("b", 5, mode="sparse", sparse=SparseVector((1004,), (1.0,))))
    assert [h.payload["data"] for h in sparse] == ["beta 4"]
    hybrid = store.search(SearchQuery("a", 3, dense=vector(7), sparse=SparseVector((7,), (1.0,))))
    assert hybrid[0].payload["data"] == "alpha 7"
    # Filters: role, time range, neighbours by position.
    users = store.search(SearchQuery("a", 10, mode="dense", dense=vector(1), roles=("user",)))
    assert {h.payload["role"] for h in users} == {"user"}
    window = store.search(SearchQuery("a", 10, mode="dense", dense=vector(1), since=2.0, until=4.0))
    assert sorted(h.payload["ts"] for h in window) == [2.0, 3.0, 4.0]
    around = store.search(SearchQuery("a", 10, mode="dense", dense=vector(1), session_id="s1", positions=(4, 5)))
    assert sorted(h.payload["position"] for h in around) == [4, 5]

    exported = list(store.scroll("b", page=3))
    assert len(exported) == 10 and all(p["agent_id"] == "b" for _, p, _ in exported)
    assert {h.id for h in store.retrieve([points[0].id, points[15].id])} == {points[0].id, points[15].id}
    store.delete([points[0].id])
    assert store.count("a") == 9


def reembed_with(dim: int) -> object:
    def reembed(rows: Sequence[tuple[str, dict[str, object]]]) -> list[StoredPoint]:
        return [StoredPoint(pid, [1.0] + [0.0] * (dim - 1), SparseVector((), ()), payload) for pid, payload in rows]

    return reembed


@pytest.mark.parametrize("backend", BACKENDS)
def test_model_change_migrates_instead_of_failing(tmp_path: Path, backend: str) -> None:
    def opened(meta: StoreMeta) -> Store:
        if backend == "edge":
            return open_store("", "", "c", 5, tmp_path, meta, reembed_with(meta.dim))  # type: ignore[arg-type]
        client = QdrantClient(path=str(tmp_path / "local"))
        return open_server_collection(client, "c", meta, reembed_with(meta.dim))  # type: ignore[arg-type]

    first = opened(META)
    first.upsert([point("a", n, f"text {n}") for n in range(5)])
    first.close()
    new_meta = StoreMeta(1, "other-embedder", 4)
    second = opened(new_meta)
    try:
        assert second.meta == new_meta
        assert sorted(p["data"] for _, p, _ in second.scroll()) == [f"text {n}" for n in range(5)]
        hits = second.search(SearchQuery("a", 5, mode="dense", dense=[1.0, 0.0, 0.0, 0.0]))
        assert len(hits) == 5
    finally:
        second.close()
    if backend == "edge":
        assert json.loads(meta_path(tmp_path / "store").read_text())["embedder"] == "other-embedder"


class AddsCrossLanguage:
    """A migration's model: full re-embedding must not happen when only the cross-language vector is new."""

    def __init__(self) -> None:
        self.embedded: list[str] = []
        self.reembedded = 0

    def __call__(self, rows: Sequence[tuple[str, dict[str, object]]]) -> list[StoredPoint]:
        self.reembedded += len(rows)
        return [StoredPoint(pid, vector(0), SparseVector((), ()), payload, [0.0, 0.0, 0.0, 1.0])
                for pid, payload in rows]

    def cross_language(self, texts: Sequence[str]) -> list[list[float]]:
        self.embedded.extend(texts)
        return [[1.0, 0.0, 0.0, 0.0] for _ in texts]


@pytest.mark.parametrize("backend", BACKENDS)
def test_adding_the_cross_language_vector_keeps_the_others_and_embeds_only_it(tmp_path: Path, backend: str) -> None:
    from tests.backends import XLING_META

    model = AddsCrossLanguage()

    def opened(meta: StoreMeta) -> Store:
        if backend == "edge":
            return open_store("", "", "c", 5, tmp_path, meta, model)
        return open_server_collection(QdrantClient(path=str(tmp_path / "local")), "c", meta, model)

    first = opened(META)
    first.upsert([point("a", n, f"text {n}") for n in range(300)])  # more than one migration page
    first.close()
    second = opened(XLING_META)
    try:
        assert second.meta == XLING_META and model.reembedded == 0
        assert sorted(model.embedded) == sorted(f"text {n}" for n in range(300))
        hits = second.search(SearchQuery("a", 3, mode="dense", dense=vector(7)))
        assert hits[0].payload["data"] == "text 7"  # the dense vectors came along unchanged
        across = second.search(SearchQuery("a", 300, mode="dense", dense=[1.0, 0.0, 0.0, 0.0], using="xling"))
        assert len(across) == 300 and all(h.score == pytest.approx(1.0) for h in across)
        assert second.count("a") == 300
    finally:
        second.close()
    # Turning it off again copies the points without it, embedding nothing.
    third = opened(META)
    try:
        assert third.meta == META and model.reembedded == 0 and len(model.embedded) == 300
        assert third.search(SearchQuery("a", 1, mode="dense", dense=vector(9)))[0].payload["data"] == "text 9"
    finally:
        third.close()


def test_point_ids_are_deterministic_uuids() -> None:
    assert point_id("a", "s", "e", 0) == point_id("a", "s", "e", 0)
    assert len({point_id("a", "s", "e", 0), point_id("b", "s", "e", 0), point_id("a", "s", "e", 1)}) == 3
    uuid.UUID(point_id("a", "s", "e", 0))
