"""Text -> sparse term vectors for the store's BM25 side (pure: no I/O, no clock, no state).

Documents get BM25 term-frequency weights (saturation `k1`, length normalisation `b`/`avg_len`);
queries get 1.0 per unique term. The store's sparse vector is configured with the IDF modifier,
which multiplies each matched term by its IDF at query time, so stored weight x IDF = BM25.

Tokens: NFKC + case folding; Latin/other scripts split on non-word characters and stemmed with
Snowball English; Chinese/Japanese/Korean runs (no spaces) become overlapping character
unigrams and bigrams. Term ids are the first 4 bytes of blake2b(token): stable across
processes, hosts and versions. Changing any of this changes the ids: bump `SPARSE_SCHEME`.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

import py_rust_stemmers

# Stored next to the sparse vectors: a store indexed under another scheme must be re-indexed.
SPARSE_SCHEME = "vw-bm25-v1"
# A word of the previous turn counts this much in a document (sparse_document's `context`). LoCoMo in
# process (bench/locomo_inproc.py), R@10 dev / left-out with the sparse list fused at 1.0: .802 / .760
# without it, .804 / .766 at 0.15, .806 / .764 at 0.3, .805 / .755 at 0.6 (README, fourth round). Term ids
# and queries are unchanged, so the scheme is too: documents stored before keep their turn-only weights.
CONTEXT_WEIGHT = 0.3

CjkGrams = Literal["unigram", "bigram", "both"]


@dataclass(frozen=True, slots=True)
class SparseVec:
    """A sparse vector: term ids sorted ascending and unique, one weight each."""

    indices: tuple[int, ...]
    values: tuple[float, ...]


@dataclass(frozen=True, slots=True)
class TokenizerConfig:
    """How text becomes terms and weights. Defaults are the measured choice (bench/retrieval_study.py)."""

    stem: bool = True
    stopwords: bool = False  # drop English stopwords from documents and queries
    query_stopwords: bool = False  # drop them from queries only (documents keep every term)
    cjk: CjkGrams = "both"
    k1: float = 1.2
    b: float = 0.75
    avg_len: float = 256.0  # in tokens; larger than real turns on purpose (measured better)


DEFAULT_CONFIG = TokenizerConfig()

# Han (incl. extension A, compatibility, supplementary planes and the 々 mark), kana, Hangul.
_CJK_CLASS = (
    "\u3005\u3007\u3040-\u309f\u30a0-\u30ff\u31f0-\u31ff\u3400-\u4dbf\u4e00-\u9fff"
    "\uac00-\ud7af\uf900-\ufaff\U00020000-\U0003134f"
)
_CJK_RUN = re.compile(f"[{_CJK_CLASS}]+")
# A word: letters/digits, with inner apostrophes kept so "don't" stays one token.
_WORD = re.compile(r"[^\W_]+(?:'[^\W_]+)*")

# The Snowball English stopword list (the one most BM25 set-ups use).
_STOPWORDS_TEXT = """
a about above after again against all am an and any are aren't as at be because been before being
below between both but by can't cannot could couldn't did didn't do does doesn't doing don't down
during each few for from further had hadn't has hasn't have haven't having he he'd he'll he's her
here here's hers herself him himself his how how's i i'd i'll i'm i've if in into is isn't it it's
its itself let's me more most mustn't my myself no nor not of off on once only or other ought our
ours ourselves out over own same shan't she she'd she'll she's should shouldn't so some such than
that that's the their theirs them themselves then there there's these they they'd they'll they're
they've this those through to too under until up very was wasn't we we'd we'll we're we've were
weren't what what's when when's where where's which while who who's whom why why's with won't would
wouldn't you you'd you'll you're you've your yours yourself yourselves
"""
ENGLISH_STOPWORDS = frozenset(_STOPWORDS_TEXT.split())

# Stateless after construction; building one per call would cost more than the stemming.
_STEMMER = py_rust_stemmers.SnowballStemmer("english")


def normalise(text: str) -> str:
    """NFKC (full-width forms -> ASCII, half-width kana -> full-width), case fold, one apostrophe."""
    return unicodedata.normalize("NFKC", text).casefold().replace("\u2019", "'")


def cjk_fraction(text: str) -> float:
    """Share of the letters and digits of `text` that are CJK (0.0 for text without any)."""
    folded = normalise(text)
    cjk = sum(map(len, _CJK_RUN.findall(folded)))
    if not cjk:
        return 0.0  # most texts: no word to count (a search asks this of every candidate)
    other = sum(map(len, _WORD.findall(_CJK_RUN.sub(" ", folded))))
    return cjk / (cjk + other)


def _cjk_grams(run: str, mode: CjkGrams) -> Iterator[str]:
    if mode != "bigram" or len(run) == 1:
        yield from run
    if mode != "unigram":
        for i in range(len(run) - 1):
            yield run[i : i + 2]


# Both caches are bounded small: a chat's vocabulary is mostly a few thousand words, while numbers, ids
# and names make the rest unique. At 262,144 and 65,536 entries, a daemon's 30,000-entry backfill held
# 36 MB in them (tracemalloc); at 16,384 the same LoCoMo turns tokenize as fast (40-55 us a text either
# way, none at all: 61-63 us).
@lru_cache(maxsize=16384)
def _stem(word: str) -> str:
    return str(_STEMMER.stem_word(word))


def _words(segment: str, config: TokenizerConfig, drop_stopwords: bool) -> Iterator[str]:
    for match in _WORD.finditer(segment):
        word = match.group()
        if drop_stopwords and word in ENGLISH_STOPWORDS:
            continue
        yield _stem(word) if config.stem else word


def tokens(text: str, config: TokenizerConfig = DEFAULT_CONFIG, *, is_query: bool = False) -> list[str]:
    """The terms of `text` in order, with repeats (documents count them)."""
    drop_stopwords = config.stopwords or (is_query and config.query_stopwords)
    folded = normalise(text)
    out: list[str] = []
    start = 0
    for run in _CJK_RUN.finditer(folded):
        out.extend(_words(folded[start : run.start()], config, drop_stopwords))
        out.extend(_cjk_grams(run.group(), config.cjk))
        start = run.end()
    out.extend(_words(folded[start:], config, drop_stopwords))
    return out


@lru_cache(maxsize=16384)
def token_index(token: str) -> int:
    """Stable 32-bit term id (Qdrant sparse indices are u32); Python's hash() is salted per process."""
    return int.from_bytes(hashlib.blake2b(token.encode("utf-8"), digest_size=4).digest(), "little")


def _as_sparse(weights: dict[int, float]) -> SparseVec:
    ordered = sorted(weights.items())
    return SparseVec(tuple(i for i, _ in ordered), tuple(w for _, w in ordered))


def _merge_by_index(counts: Iterable[tuple[str, int]]) -> dict[int, int]:
    # Two tokens may share a 32-bit id (rare): their counts add up, as one term.
    merged: dict[int, int] = {}
    for token, count in counts:
        index = token_index(token)
        merged[index] = merged.get(index, 0) + count
    return merged


def bm25_weight(tf: float, doc_len: float, config: TokenizerConfig = DEFAULT_CONFIG) -> float:
    """BM25's term-frequency part; the IDF part is applied by the store at query time."""
    norm = 1.0 - config.b + config.b * doc_len / config.avg_len
    return tf * (config.k1 + 1.0) / (tf + config.k1 * norm)


def sparse_document(text: str, config: TokenizerConfig = DEFAULT_CONFIG, *, context: str = "") -> SparseVec:
    """Sparse vector to store for `text` (empty if neither it nor `context` has terms).

    `context`, the session's previous turn, counts CONTEXT_WEIGHT a word, in the term frequencies and
    in the length: "Wow, me too!" is found by the words of what it answers, below a turn that says them.
    """
    terms = tokens(text, config)
    counts: dict[int, float] = dict(_merge_by_index(Counter(terms).items()))
    length = float(len(terms))
    if context:
        context_terms = tokens(context, config)
        for index, count in _merge_by_index(Counter(context_terms).items()).items():
            counts[index] = counts.get(index, 0.0) + CONTEXT_WEIGHT * count
        length += CONTEXT_WEIGHT * len(context_terms)
    return _as_sparse({i: bm25_weight(tf, length, config) for i, tf in counts.items()})


def sparse_query(text: str, config: TokenizerConfig = DEFAULT_CONFIG) -> SparseVec:
    """Sparse vector to search with: 1.0 per unique term (empty if it has no terms)."""
    return _as_sparse(dict.fromkeys((token_index(t) for t in tokens(text, config, is_query=True)), 1.0))
