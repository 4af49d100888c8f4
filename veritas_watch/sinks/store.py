"""The store protocol: the one interface the pipeline, search and export see.

Two backends sit behind it: `edge.py` (embedded Qdrant Edge, the default) and `server.py`
(qdrant-client against a Qdrant server or cluster). Only those two modules import qdrant.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, Literal, Protocol

from veritas_watch.transforms.tokenize import SparseVec

# Bump when the collection layout changes; `open_store` migrates older data instead of failing.
SCHEMA_VERSION = 1
DENSE: Final = "dense"
SPARSE: Final = "sparse"
# The second dense vector, from a model that aligns languages (an English query finds a Chinese or
# Japanese memory): stored when the store meta names it (`xling`, `xling_dim`), searched beside DENSE.
XLING: Final = "xling"
DenseName = Literal["dense", "xling"]
# Payload fields with an index: tenant isolation and the filters search offers.
KEYWORD_FIELDS = ("agent_id", "session_id", "role", "type", "entry_id")
FLOAT_FIELDS = ("ts",)
INTEGER_FIELDS = ("position", "session_order")

SearchMode = Literal["dense", "sparse", "hybrid"]
PositionOrder = Literal["asc", "desc"]
# What `order` and the position range read: `position` (within the session filter), or `session_order`
# (model.session_order: one session's turns as one range, absent from points stored before it existed).
OrderField = Literal["position", "session_order"]


# One sparse-vector type from the tokenizer to the engines (sorted unique term ids, one weight each).
SparseVector = SparseVec


class StoreError(RuntimeError):
    """The store did not acknowledge an operation (down, disk full, locked, ...)."""


@dataclass(frozen=True, slots=True)
class StoredPoint:
    id: str
    dense: Sequence[float]
    sparse: SparseVector
    payload: dict[str, object]
    xling: Sequence[float] | None = None  # the cross-language vector, when the store has one


@dataclass(frozen=True, slots=True)
class Hit:
    id: str
    score: float
    payload: dict[str, object]


@dataclass(frozen=True, slots=True)
class SearchQuery:
    """A filtered query. `agent_id=None` means "all agents" and is only built when allowed."""

    agent_id: str | None
    limit: int
    mode: SearchMode = "hybrid"
    dense: Sequence[float] | None = None
    sparse: SparseVector | None = None
    roles: tuple[str, ...] = ()
    since: float | None = None  # epoch seconds, inclusive
    until: float | None = None
    prefetch: int = 50  # candidates per side before fusion
    rrf_k: int = 60
    session_id: str | None = None
    entry_id: str | None = None  # the chunks of one entry (with session_id: one memory)
    positions: tuple[int, ...] = ()
    min_position: int | None = None  # inclusive, on `order_field`
    max_position: int | None = None
    # Set: no vector ranking, the filtered points in `position` order (a session's neighbouring turns).
    order: PositionOrder | None = None
    order_field: OrderField = "position"
    # Sparse IDF counted over the agent's own points (Qdrant Edge), so that one agent's ranking never
    # depends on what another agent stored. A server computes IDF over the whole collection.
    agent_idf: bool = True
    using: DenseName = DENSE  # which dense vector `dense` is compared with (dense mode)
    ids: tuple[str, ...] = ()  # only these points: one list's scores for the candidates other lists found
    with_payload: bool = True  # False: ids and scores only (hits with an empty payload)


def store_meta_for(embedder_name: str, dim: int, sparse_scheme: str, dense_scheme: str,
                   xling: tuple[str, int] | None = None) -> StoreMeta:
    """`xling`: (model name, dim) of the cross-language vector, None for a store without one."""
    extra: dict[str, object] = {"sparse": sparse_scheme, "dense": dense_scheme}
    if xling is not None:
        extra.update(xling=xling[0], xling_dim=xling[1])
    return StoreMeta(SCHEMA_VERSION, embedder_name, dim, extra)


@dataclass(frozen=True)
class StoreMeta:
    """What the stored vectors were made with; a mismatch means migrate."""

    schema: int
    embedder: str
    dim: int
    extra: dict[str, object] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps({"schema": self.schema, "embedder": self.embedder, "dim": self.dim, **self.extra})

    @classmethod
    def from_json(cls, text: str) -> StoreMeta:
        raw = json.loads(text)
        return cls(int(raw.pop("schema")), str(raw.pop("embedder")), int(raw.pop("dim")), raw)

    @property
    def xling_dim(self) -> int | None:
        """The cross-language vector's size, None when the store has none."""
        dim = self.extra.get("xling_dim")
        return dim if isinstance(dim, int) and not isinstance(dim, bool) and dim > 0 else None

    def without_xling(self) -> StoreMeta:
        return StoreMeta(self.schema, self.embedder, self.dim,
                         {k: v for k, v in self.extra.items() if k not in ("xling", "xling_dim")})


class Store(Protocol):
    meta: StoreMeta

    def upsert(self, points: Sequence[StoredPoint]) -> None:
        """Returns only once the store acknowledged the write; raises StoreError otherwise."""

    def delete(self, ids: Sequence[str]) -> None: ...

    def search(self, query: SearchQuery) -> list[Hit]: ...

    def search_batch(self, queries: Sequence[SearchQuery]) -> list[list[Hit]]:
        """Several queries planned as one batch; one hit list per query, in order."""

    def scroll(self, agent_id: str | None = None, with_vectors: bool = False, page: int = 256,
               session_id: str | None = None) -> Iterator[tuple[str, dict[str, object], StoredPoint | None]]:
        """Every point (optionally of one agent / session), in pages, as (id, payload, point-with-vectors)."""

    def retrieve(self, ids: Sequence[str]) -> list[Hit]: ...

    def count(self, agent_id: str | None = None) -> int: ...

    def flush(self) -> None:
        """Make every acknowledged write durable (the cursors of what it covers may then be committed)."""

    def optimize(self) -> bool:
        """Optimize the segments that grew; True if anything changed. Slow: call it off the hot path."""

    def release_memory(self) -> None:
        """Give back the memory the store holds only as a cache (the daemon's memory budget asks for it)."""

    def close(self) -> None: ...


def meta_path(store_dir: Path) -> Path:
    return store_dir / "veritas-meta.json"


@dataclass(frozen=True, slots=True)
class Condition:
    """One filter condition in backend-neutral form; each backend maps it to its own types."""

    field: str
    equals: str | None = None
    any_of: list[str] | list[int] | None = None
    between: tuple[float | None, float | None] | None = None


def order_start(query: SearchQuery) -> int | None:
    """Where an ordered read starts: the engine walks its index from there, not from the range's start."""
    return query.min_position if query.order == "asc" else query.max_position


def filter_conditions(query: SearchQuery) -> list[Condition]:
    conditions: list[Condition] = []
    if query.agent_id is not None:
        conditions.append(Condition("agent_id", equals=query.agent_id))
    if query.session_id is not None:
        conditions.append(Condition("session_id", equals=query.session_id))
    if query.entry_id is not None:
        conditions.append(Condition("entry_id", equals=query.entry_id))
    if query.roles:
        conditions.append(Condition("role", any_of=list(query.roles)))
    if query.positions:
        conditions.append(Condition("position", any_of=list(query.positions)))
    if query.min_position is not None or query.max_position is not None:
        conditions.append(Condition(query.order_field, between=(query.min_position, query.max_position)))
    if query.since is not None or query.until is not None:
        conditions.append(Condition("ts", between=(query.since, query.until)))
    return conditions
