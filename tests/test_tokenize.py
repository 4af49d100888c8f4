"""The sparse side: tokens, stable term ids, BM25 weights, and what Qdrant Edge's IDF makes of them."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from veritas_watch.transforms.tokenize import (
    CONTEXT_WEIGHT,
    DEFAULT_CONFIG,
    SparseVec,
    TokenizerConfig,
    bm25_weight,
    sparse_document,
    sparse_query,
    token_index,
    tokens,
)

REPO = Path(__file__).resolve().parents[1]

# Text from every script the tokenizer treats differently, for the property tests.
mixed_text = st.text(
    alphabet=st.sampled_from(
        list("abcXYZ019 '’-_.,!?\n\t") + list("我喜欢吃苹果东京に行きましたカタカナ한국어ＡＢＣ１２３éßİ々〇")
    ),
    max_size=80,
)


def index_of(token: str, vec: SparseVec) -> float | None:
    index = token_index(token)
    return vec.values[vec.indices.index(index)] if index in vec.indices else None


# ------------------------------------------------------------------ tokens


def test_english_is_case_folded_and_stemmed() -> None:
    assert tokens("Running RUNS run") == ["run", "run", "run"]
    assert tokens("Paintings") == tokens("painting")


def test_stemming_can_be_turned_off() -> None:
    assert tokens("Running runs", TokenizerConfig(stem=False)) == ["running", "runs"]


def test_full_width_forms_fold_to_ascii() -> None:
    assert tokens("ＡＰＩ　ＫＥＹ１２") == tokens("api key12")


def test_inner_apostrophes_keep_a_word_whole_whatever_the_quote() -> None:
    assert tokens("don't") == tokens("don’t") == ["don't"]


def test_chinese_becomes_unigrams_and_bigrams() -> None:
    assert tokens("苹果手机") == ["苹", "果", "手", "机", "苹果", "果手", "手机"]
    assert tokens("苹果手机", TokenizerConfig(cjk="bigram")) == ["苹果", "果手", "手机"]
    assert tokens("苹果手机", TokenizerConfig(cjk="unigram")) == ["苹", "果", "手", "机"]


def test_a_lone_cjk_character_is_kept_in_bigram_mode() -> None:
    assert tokens("猫", TokenizerConfig(cjk="bigram")) == ["猫"]


def test_japanese_kana_and_kanji_form_one_run() -> None:
    terms = tokens("東京に行く")
    assert "東京" in terms and "京に" in terms and "行く" in terms


def test_latin_words_inside_cjk_text_stay_words() -> None:
    terms = tokens("我用Python写脚本")
    assert "python" in terms
    assert terms == ["我", "用", "我用", "python", "写", "脚", "本", "写脚", "脚本"]  # no gram spans scripts


def test_stopwords_are_dropped_only_when_asked() -> None:
    assert "the" in tokens("the cat")
    assert tokens("the cat", TokenizerConfig(stopwords=True)) == ["cat"]
    query_only = TokenizerConfig(query_stopwords=True)
    assert tokens("the cat", query_only) == ["the", "cat"]
    assert tokens("the cat", query_only, is_query=True) == ["cat"]


@given(mixed_text)
def test_tokens_are_never_empty_and_never_contain_separators(text: str) -> None:
    for term in tokens(text):
        assert term
        assert not any(ch.isspace() for ch in term)
        assert "_" not in term and "," not in term


# ------------------------------------------------------------------ term ids


def test_term_ids_are_32_bit_and_known_values_never_change() -> None:
    # Ids are stored in every sparse vector: a change here silently breaks every existing store.
    assert token_index("memory") == 429982191
    assert token_index("记忆") == 3906661228
    for token in ("a", "memory", "记忆", "x" * 500):
        assert 0 <= token_index(token) < 2**32


def test_vectors_are_identical_in_another_process_with_another_hash_seed() -> None:
    text = "Caroline went to the LGBTQ support group; 我喜欢吃苹果; 東京に行きました"
    code = (
        "from veritas_watch.transforms.tokenize import sparse_document as d;"
        f"v = d({text!r}); print(list(v.indices)); print(list(v.values))"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, check=True
    ).stdout.splitlines()
    here = sparse_document(text)
    assert out == [str(list(here.indices)), str(list(here.values))]


# ------------------------------------------------------------------ vectors


@given(mixed_text)
@settings(max_examples=200)
def test_sparse_vectors_are_sorted_unique_and_positive(text: str) -> None:
    for vec in (sparse_document(text), sparse_query(text)):
        assert len(vec.indices) == len(vec.values)
        assert list(vec.indices) == sorted(set(vec.indices))
        assert all(v > 0 for v in vec.values)
        assert bool(vec.indices) == bool(tokens(text))


def test_empty_and_punctuation_only_texts_give_empty_vectors() -> None:
    for text in ("", "   ", "!?,.—"):
        assert sparse_document(text) == SparseVec((), ())
        assert sparse_query(text) == SparseVec((), ())


def test_query_weights_are_one_per_unique_term() -> None:
    vec = sparse_query("cat cat dog")
    assert vec.values == (1.0, 1.0)
    assert set(vec.indices) == {token_index("cat"), token_index("dog")}


def test_document_weights_saturate_with_term_frequency() -> None:
    once, twice, many = (index_of("cat", sparse_document(" ".join(["cat"] * n + ["dog"]))) for n in (1, 2, 20))
    assert once is not None and twice is not None and many is not None
    assert once < twice < many < DEFAULT_CONFIG.k1 + 1.0


def test_longer_documents_weigh_a_term_less() -> None:
    short = index_of("cat", sparse_document("cat dog"))
    long = index_of("cat", sparse_document("cat " + " ".join(f"word{i}" for i in range(300))))
    assert short is not None and long is not None and long < short


def test_the_previous_turn_s_words_count_at_the_context_weight() -> None:
    reply, previous = "Wow, me too!", "I adopted a puppy named Biscuit"
    vec = sparse_document(reply, context=previous)
    own, context = tokens(reply), tokens(previous)
    length = len(own) + CONTEXT_WEIGHT * len(context)
    assert index_of("wow", vec) == pytest.approx(bm25_weight(1, length))
    assert 0 < index_of("biscuit", vec) == pytest.approx(bm25_weight(CONTEXT_WEIGHT, length))  # type: ignore[operator]
    # a turn that says the word itself outweighs a reply that only follows it
    says_it = index_of("biscuit", sparse_document("Biscuit was adopted today!", context="How was your day?"))
    assert says_it is not None and says_it > index_of("biscuit", vec)  # type: ignore[operator]
    assert sparse_document(reply, context="") == sparse_document(reply)
    assert sparse_document("!!!", context=previous).indices  # a reply of no words is found by what it answers


def test_bm25_weight_matches_the_textbook_formula() -> None:
    cfg = TokenizerConfig(k1=1.5, b=0.5, avg_len=10.0)
    tf, length = 3, 20
    expected = tf * 2.5 / (tf + 1.5 * (1 - 0.5 + 0.5 * length / 10.0))
    assert bm25_weight(tf, length, cfg) == pytest.approx(expected)


# ------------------------------------------------------------------ through Qdrant Edge


@pytest.fixture
def idf_shard() -> Iterator[object]:
    import qdrant_edge as qe

    with tempfile.TemporaryDirectory() as path:
        config = qe.EdgeConfig(sparse_vectors={"sparse": qe.EdgeSparseVectorParams(modifier=qe.Modifier.Idf)})
        shard = qe.EdgeShard.create(path, config)
        yield shard
        shard.close()


def test_edge_idf_modifier_completes_bm25(idf_shard: object) -> None:
    """The engine's score must equal sum(idf x stored weight): what the design relies on."""
    import qdrant_edge as qe

    docs = ["the cat sat on the mat", "a dog and a cat", "the dog barked", "birds sing", "cat cat cat"]
    vecs = [sparse_document(d) for d in docs]
    points = [qe.Point(i, {"sparse": qe.SparseVector(list(v.indices), list(v.values))}, {}) for i, v in enumerate(vecs)]
    idf_shard.update(qe.UpdateOperation.upsert_points(points))  # type: ignore[attr-defined]
    query = sparse_query("cat mat")
    found = idf_shard.query(  # type: ignore[attr-defined]
        qe.QueryRequest(
            limit=10, query=qe.Query.Nearest(qe.SparseVector(list(query.indices), list(query.values)), using="sparse")
        )
    )
    n_docs = len(docs)

    def idf(term: str) -> float:
        df = sum(1 for v in vecs if token_index(term) in v.indices)
        return math.log(1 + (n_docs - df + 0.5) / (df + 0.5))

    expected = {
        i: sum(idf(t) * w for t in ("cat", "mat") if (w := index_of(t, v)) is not None) for i, v in enumerate(vecs)
    }
    got = {int(p.id): p.score for p in found}
    assert set(got) == {i for i, s in expected.items() if s > 0}
    for i, score in got.items():
        assert score == pytest.approx(expected[i], rel=1e-3)
    assert max(got, key=got.__getitem__) == 0  # "mat" is rarer than "cat": the doc with both wins
