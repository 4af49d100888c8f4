"""Entry -> Chunks small enough for the embedding model (pure, deterministic).

A short entry is one chunk. A long one becomes overlapping windows of at most `max_chars`
characters, each ending at the best boundary found in the second half of its window: a paragraph
break, then a line break, then a sentence end (`. ! ?` before whitespace; `。！？` and friends need
no space, which is what makes Japanese and Chinese text break sensibly), then a clause mark
(`、，；` ...), then whitespace; only when there is none is the window cut hard (never inside a
combining sequence). The next window starts `overlap` characters before the previous end, moved
forward to the next word or sentence start if one is near. Chunks are stripped of surrounding
whitespace and never empty; together they cover every non-whitespace character of the text.

Chunk indexes are part of point ids: changing `max_chars`/`overlap` re-chunks, so stored chunks of
an entry must be replaced as a whole when these settings change.
"""

from __future__ import annotations

import unicodedata
from typing import Final

from veritas_watch.model import Chunk, Entry

DEFAULT_MAX_CHARS: Final = 1000
DEFAULT_OVERLAP: Final = 200

_SENTENCE_END_CJK: Final = frozenset("。！？｡…‼⁇⁈⁉")
_SENTENCE_END_LATIN: Final = frozenset(".!?")
_CLAUSE_MARKS: Final = frozenset("、，；：,;:")
# Closing quotes/brackets that belong to the sentence before the break: 「…。」 ends after 」.
_CLOSERS: Final = frozenset("」』）)]}〉》】〕'\"’”")
_JOINERS: Final = frozenset("\u200d\ufe0e\ufe0f")  # ZWJ and variation selectors: never split around them


def chunk_entry(entry: Entry, max_chars: int = DEFAULT_MAX_CHARS, overlap: int = DEFAULT_OVERLAP) -> tuple[Chunk, ...]:
    """Split an entry's text into overlapping chunks of at most `max_chars` characters."""
    text = entry.text
    return tuple(
        Chunk(entry=entry, index=index, text=text[start:end])
        for index, (start, end) in enumerate(chunk_spans(text, max_chars, overlap))
    )


def chunk_spans(
    text: str, max_chars: int = DEFAULT_MAX_CHARS, overlap: int = DEFAULT_OVERLAP
) -> tuple[tuple[int, int], ...]:
    """The `(start, end)` offsets of each chunk of `text`: each non-empty, stripped, at most `max_chars` long."""
    if max_chars < 1:
        raise ValueError(f"max_chars must be >= 1, got {max_chars}")
    if not 0 <= overlap < max_chars:
        raise ValueError(f"overlap must be in [0, max_chars), got {overlap}")
    n = len(text)
    windows: list[tuple[int, int]] = []
    start = 0
    while start < n:
        limit = start + max_chars
        if limit >= n:
            windows.append((start, n))
            break
        # The break must leave the next window starting after this one (progress), and should
        # not make tiny chunks: search only the later part of the window.
        earliest = start + max(overlap + 1, max_chars // 2)
        end = _best_break(text, earliest, limit)
        windows.append((start, end))
        start = _next_start(text, end - overlap, end) if overlap else end
    spans: list[tuple[int, int]] = []
    for lo, hi in windows:
        lo, hi = _trim(text, lo, hi)
        if lo >= hi:
            continue
        if spans and spans[-1][0] == lo:
            # Only whitespace between the two window starts: the earlier span is inside this one.
            spans[-1] = (lo, hi)
        else:
            spans.append((lo, hi))
    return tuple(spans)


def _best_break(text: str, earliest: int, limit: int) -> int:
    """End offset (exclusive) of a chunk ending in (earliest, limit]; the best boundary, else a safe cut."""
    found = text.rfind("\n\n", earliest, limit)
    if found != -1:
        return found + 2
    found = text.rfind("\n", earliest, limit)
    if found != -1:
        return found + 1
    clause = space = -1
    for i in range(limit - 1, earliest - 1, -1):
        char = text[i]
        if char in _SENTENCE_END_CJK:
            return _after_closers(text, i + 1, limit)
        if char in _SENTENCE_END_LATIN and i + 1 < len(text) and text[i + 1].isspace():
            return i + 1
        if clause == -1 and char in _CLAUSE_MARKS:
            clause = i + 1
        elif space == -1 and char.isspace():
            space = i + 1
    if clause != -1:
        return clause
    if space != -1:
        return space
    return _safe_cut(text, limit, earliest)


def _after_closers(text: str, end: int, limit: int) -> int:
    while end < limit and text[end] in _CLOSERS:
        end += 1
    return end


def _splits_cluster(text: str, i: int) -> bool:
    """True if a cut before `text[i]` would separate a character from its combining mark or joiner."""
    return 0 < i < len(text) and (unicodedata.combining(text[i]) != 0 or text[i] in _JOINERS or text[i - 1] in _JOINERS)


def _safe_cut(text: str, cut: int, earliest: int) -> int:
    """Move a hard cut back so it does not split a base character from its combining marks or joiners."""
    while cut > earliest and _splits_cluster(text, cut):
        cut -= 1
    return cut


def _next_start(text: str, target: int, end: int) -> int:
    """Start of the next window: `target`, moved forward to a word/sentence start within reach."""
    reach = min(end, target + max(1, (end - target) // 4))
    for i in range(target, reach):
        char = text[i - 1]
        if (char.isspace() or char in _SENTENCE_END_CJK or char in _CLAUSE_MARKS) and not _splits_cluster(text, i):
            return i
    start = target
    while start < end - 1 and _splits_cluster(text, start):
        start += 1
    return start


def _trim(text: str, lo: int, hi: int) -> tuple[int, int]:
    while lo < hi and text[lo].isspace():
        lo += 1
    while hi > lo and text[hi - 1].isspace():
        hi -= 1
    return lo, hi
