"""chunk_entry: one chunk when short, bounded overlapping windows at sensible boundaries otherwise."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from veritas_watch.model import Entry, SourceRef
from veritas_watch.transforms.chunk import chunk_entry, chunk_spans


def entry(text: str) -> Entry:
    return Entry(
        agent_id="main",
        session_id="s1",
        entry_id="e1",
        role="assistant",
        text=text,
        timestamp="2026-03-16T22:08:54.585Z",
        source=SourceRef(kind="jsonl", path="/state/agents/main/sessions/s1.jsonl", line=5),
    )


def test_short_text_is_one_chunk() -> None:
    chunks = chunk_entry(entry("やっほー、はくあだよ。なにする？"))
    assert [(c.index, c.text) for c in chunks] == [(0, "やっほー、はくあだよ。なにする？")]
    assert chunks[0].entry.entry_id == "e1"


def test_empty_and_whitespace_text_give_no_chunks() -> None:
    assert chunk_entry(entry("")) == ()
    assert chunk_entry(entry(" \n\t ")) == ()


def test_long_english_breaks_at_paragraphs_then_sentences() -> None:
    paragraph = "The gateway was unreachable on port 18789. We fixed PATH first. " * 6
    text = "\n\n".join([paragraph.strip()] * 6)
    chunks = chunk_entry(entry(text), max_chars=1000, overlap=200)
    assert len(chunks) > 1
    for chunk in chunks:
        assert len(chunk.text) <= 1000
        assert chunk.text.endswith(".")  # every cut landed on a sentence or paragraph end
    for left, right in itertools.pairwise(chunks):
        assert right.text[:40] in left.text  # consecutive chunks overlap


def test_japanese_without_spaces_breaks_after_sentence_marks() -> None:
    sentence = "LINEプラグインが入っていても、実際に返信できるかはチャネルの設定次第です。「確認してね。」"
    chunks = chunk_entry(entry(sentence * 40), max_chars=300, overlap=60)
    assert len(chunks) > 1
    for chunk in chunks[:-1]:
        assert len(chunk.text) <= 300
        assert chunk.text.endswith(("。", "」"))


def test_text_without_any_boundary_is_cut_hard_within_bounds() -> None:
    text = "あ" * 2500
    spans = chunk_spans(text, max_chars=1000, overlap=200)
    assert all(0 < end - start <= 1000 for start, end in spans)
    assert spans[0] == (0, 1000)
    assert spans[-1][1] == 2500


def test_hard_cuts_do_not_split_emoji_sequences() -> None:
    family = "👨\u200d👩\u200d👧"  # 5 code points joined by ZWJ
    text = family * 100
    for start, end in chunk_spans(text, max_chars=23, overlap=4):
        chunk = text[start:end]
        assert not chunk.startswith("\u200d") and not chunk.endswith("\u200d")


def test_chunks_are_deterministic_and_ids_distinct() -> None:
    text = "Sentence number one is here. " * 200
    first, second = chunk_entry(entry(text)), chunk_entry(entry(text))
    assert first == second
    ids = [chunk.point_id for chunk in first]
    assert len(set(ids)) == len(ids)
    assert [chunk.index for chunk in first] == list(range(len(first)))


@pytest.mark.parametrize(("max_chars", "overlap"), [(0, 0), (10, 10), (10, -1), (10, 11)])
def test_invalid_settings_raise(max_chars: int, overlap: int) -> None:
    with pytest.raises(ValueError):
        chunk_spans("text", max_chars=max_chars, overlap=overlap)


_alphabet = st.sampled_from(list("abc xyz.!?\n\t、。！？「」あいう漢字👍\u200d\u0301"))


@settings(max_examples=400, deadline=None)
@given(
    text=st.text(alphabet=_alphabet, max_size=1500),
    max_chars=st.integers(min_value=1, max_value=400),
    data=st.data(),
)
def test_chunk_properties(text: str, max_chars: int, data: st.DataObject) -> None:
    overlap = data.draw(st.integers(min_value=0, max_value=max_chars - 1))
    spans = chunk_spans(text, max_chars=max_chars, overlap=overlap)
    assert spans == chunk_spans(text, max_chars=max_chars, overlap=overlap)  # deterministic
    covered = [False] * len(text)
    for index, (start, end) in enumerate(spans):
        piece = text[start:end]
        assert 0 < end - start <= max_chars  # bounded, never empty
        assert piece == piece.strip() and piece  # stripped and not blank
        for position in range(start, end):
            covered[position] = True
        if index:
            previous_start, previous_end = spans[index - 1]
            assert start > previous_start  # always progresses
            assert start >= previous_end - overlap  # never overlaps more than asked
    for position, char in enumerate(text):
        assert covered[position] or char.isspace(), (position, char)  # every visible character is kept
    chunks = chunk_entry(entry(text), max_chars=max_chars, overlap=overlap)
    assert [chunk.text for chunk in chunks] == [text[start:end] for start, end in spans]
