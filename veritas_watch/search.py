"""Hybrid search: the pure ranking helpers (fusion, relevance floor, context expansion planning).

No store I/O here yet: these take ranked candidate lists (from the dense and sparse prefetches)
and return what to show. Keys are whatever identifies a point (a point id, a turn reference).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

K = TypeVar("K", bound=Hashable)

Ranked = Sequence[tuple[K, float]]  # (key, score), best first


def rrf_fuse(
    ranked_lists: Sequence[Sequence[K]], weights: Sequence[float] | None = None, k: float = 60.0
) -> list[tuple[K, float]]:
    """Weighted reciprocal rank fusion: score = sum over lists of w / (k + rank), rank from 1.

    Qdrant Edge 0.9.0's server-side weighted RRF computes 1 / (k - 1 + rank / w) instead (a
    weight flattens a list rather than scaling it), hence this client-side version.
    """
    if weights is None:
        weights = [1.0] * len(ranked_lists)
    if len(weights) != len(ranked_lists):
        raise ValueError("one weight per ranked list")
    scores: dict[K, float] = {}
    for ranked, weight in zip(ranked_lists, weights, strict=True):
        for rank, key in enumerate(ranked, start=1):
            scores[key] = scores.get(key, 0.0) + weight / (k + rank)
    return sorted(scores.items(), key=lambda item: -item[1])


def score_fuse(ranked_lists: Sequence[Ranked[K]], weights: Sequence[float]) -> list[tuple[K, float]]:
    """Weighted sum of scores, each list divided by its best score (a key missing from a list adds 0).

    Dividing by the top score keeps a list's absolute confidence (unlike min-max, which stretches
    a list of uniformly weak matches to [0, 1]) while making BM25's unbounded scale comparable
    to cosine similarity.
    """
    if len(weights) != len(ranked_lists):
        raise ValueError("one weight per ranked list")
    scores: dict[K, float] = {}
    for ranked, weight in zip(ranked_lists, weights, strict=True):
        if not ranked:
            continue
        top = ranked[0][1]
        if top <= 0.0:
            continue
        for key, score in ranked:
            scores[key] = scores.get(key, 0.0) + weight * score / top
    return sorted(scores.items(), key=lambda item: -item[1])


def apply_floor(ranked: Ranked[K], floor: float) -> list[tuple[K, float]]:
    """Drop results scoring below the relevance floor (so an unrelated query returns nothing)."""
    return [(key, score) for key, score in ranked if score >= floor]


@dataclass(frozen=True, slots=True)
class ContextSlot:
    """One result after context expansion: a hit, or a neighbour shown because of a hit."""

    key: Hashable
    score: float  # own score, or the hit's score times the offset's discount if that is higher
    neighbour_of: Hashable | None = None  # None when the score is the point's own


def expand_context(
    ranked: Ranked[K],
    neighbours: Callable[[K, int], K | None],
    discounts: Mapping[int, float],
) -> list[ContextSlot]:
    """Hits plus their neighbouring turns, ranked together (the question with its answer).

    Each hit lends `score x discounts[offset]` to the turn `offset` places away (+1 = the next
    turn, -1 = the previous); a turn keeps the best of its own score and what it was lent.
    Ties keep the order of first appearance, so with discount 1.0 a neighbour follows its hit.
    The list is ranked, so any prefix is the best result for that limit.
    `neighbours` returns None when there is no such turn (session start or end).
    """
    slots: dict[Hashable, ContextSlot] = {}

    def offer(slot: ContextSlot) -> None:
        held = slots.get(slot.key)
        if held is None or slot.score > held.score:
            slots[slot.key] = slot

    for key, score in ranked:
        offer(ContextSlot(key, score))
        for offset, discount in discounts.items():
            neighbour = neighbours(key, offset)
            if neighbour is not None:
                offer(ContextSlot(neighbour, score * discount, neighbour_of=key))
    return sorted(slots.values(), key=lambda slot: -slot.score)


def neighbour_keys(
    hits: Sequence[K], neighbours: Callable[[K, int], K | None], offsets: Sequence[int]
) -> list[K]:
    """The neighbour keys to fetch from the store for these hits (deduplicated, hits excluded)."""
    wanted: dict[K, None] = {}
    hit_set = set(hits)
    for key in hits:
        for offset in offsets:
            neighbour = neighbours(key, offset)
            if neighbour is not None and neighbour not in hit_set:
                wanted[neighbour] = None
    return list(wanted)


def sequence_neighbours(positions: Mapping[K, tuple[Hashable, int]], by_position: Mapping[tuple[Hashable, int], K]) -> Callable[[K, int], K | None]:
    """A `neighbours` callable from (session, seq) positions: the turn `offset` seqs away, if any."""

    def neighbour(key: K, offset: int) -> K | None:
        place = positions.get(key)
        if place is None:
            return None
        return by_position.get((place[0], place[1] + offset))

    return neighbour
