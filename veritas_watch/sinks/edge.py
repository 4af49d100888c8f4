"""Embedded store: Qdrant's in-process engine (Qdrant Edge, `qdrant-edge-py`), one shard on disk.

The shard is opened by one process at a time (the daemon); other processes reach it through the
daemon's HTTP port. All calls come from one worker thread (the `pipeline.Sink` store thread).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import qdrant_edge as qe

from veritas_watch.sinks.store import (
    DENSE,
    FLOAT_FIELDS,
    INTEGER_FIELDS,
    KEYWORD_FIELDS,
    SPARSE,
    Hit,
    SearchQuery,
    SparseVector,
    StoredPoint,
    StoreError,
    StoreMeta,
    filter_conditions,
)

if TYPE_CHECKING:
    from qdrant_edge import ConditionType  # a type alias of the stub only


def _filter(query: SearchQuery) -> qe.Filter | None:
    must: list[ConditionType] = []
    for c in filter_conditions(query):
        if c.equals is not None:
            must.append(qe.FieldCondition(c.field, match=qe.MatchValue(c.equals)))
        elif c.any_of is not None:
            must.append(qe.FieldCondition(c.field, match=qe.MatchAny(c.any_of)))
        elif c.between is not None:
            must.append(qe.FieldCondition(c.field, range=qe.RangeFloat(gte=c.between[0], lte=c.between[1])))
    return qe.Filter(must=must) if must else None


def _payload(raw: object) -> dict[str, object]:
    return dict(raw) if isinstance(raw, dict) else {}


class EdgeStore:
    def __init__(self, path: Path, meta: StoreMeta) -> None:
        self.meta = meta
        self.path = path
        try:
            if (path / "segments").exists() or any(path.glob("*")):
                self._shard = qe.EdgeShard.load(str(path))
            else:
                self._shard = qe.EdgeShard.create(str(path), self._config(meta.dim))
                self._create_indexes()
        except Exception as exc:  # the engine raises plain exceptions for locks, corruption, IO
            raise StoreError(f"cannot open Qdrant Edge shard at {path}: {exc}") from exc

    @staticmethod
    def _config(dim: int) -> qe.EdgeConfig:
        return qe.EdgeConfig(
            vectors={DENSE: qe.EdgeVectorParams(size=dim, distance=qe.Distance.Cosine)},
            sparse_vectors={SPARSE: qe.EdgeSparseVectorParams(modifier=qe.Modifier.Idf)},
            wal_enabled=True,
        )

    def _create_indexes(self) -> None:
        for name in KEYWORD_FIELDS:
            params = qe.KeywordIndexParams(is_tenant=name == "agent_id")
            self._shard.update(qe.UpdateOperation.create_field_index(name, params))
        for name in FLOAT_FIELDS:
            self._shard.update(qe.UpdateOperation.create_field_index(name, qe.PayloadSchemaType.Float))
        for name in INTEGER_FIELDS:
            self._shard.update(qe.UpdateOperation.create_field_index(name, qe.PayloadSchemaType.Integer))

    def upsert(self, points: Sequence[StoredPoint]) -> None:
        if not points:
            return
        batch = [
            qe.Point(
                uuid.UUID(p.id),
                {DENSE: list(p.dense), SPARSE: qe.SparseVector(list(p.sparse.indices), list(p.sparse.values))},
                p.payload,
            )
            for p in points
        ]
        try:
            self._shard.update(qe.UpdateOperation.upsert_points(batch))
        except Exception as exc:
            raise StoreError(f"upsert failed: {exc}") from exc

    def delete(self, ids: Sequence[str]) -> None:
        if ids:
            try:
                self._shard.update(qe.UpdateOperation.delete_points([uuid.UUID(i) for i in ids]))
            except Exception as exc:
                raise StoreError(f"delete failed: {exc}") from exc

    @staticmethod
    def _request(query: SearchQuery) -> qe.QueryRequest | None:
        """The engine's request for one query; None when there is nothing to search with."""
        flt = _filter(query)
        if query.order is not None:
            direction = qe.Direction.Asc if query.order == "asc" else qe.Direction.Desc
            return qe.QueryRequest(limit=query.limit, query=qe.OrderBy("position", direction=direction),
                                   filter=flt, with_payload=True)
        dense = qe.Query.Nearest(list(query.dense), using=DENSE) if query.dense is not None else None
        sparse = (
            qe.Query.Nearest(qe.SparseVector(list(query.sparse.indices), list(query.sparse.values)), using=SPARSE)
            if query.sparse is not None and query.sparse.indices
            else None
        )
        # IDF over the agent's points only (the engine refuses this parameter on a dense query).
        agent_flt = _filter(SearchQuery(query.agent_id, 1)) if query.agent_id is not None and query.agent_idf else None
        idf = qe.SearchParams(idf=qe.IdfParams(corpus=agent_flt)) if agent_flt is not None else None
        if query.mode == "hybrid" and dense is not None and sparse is not None:
            return qe.QueryRequest(
                limit=query.limit,
                prefetches=[
                    qe.Prefetch(limit=query.prefetch, query=dense, filter=flt),
                    qe.Prefetch(limit=query.prefetch, query=sparse, filter=flt, params=idf),
                ],
                query=qe.Fusion.Rrf(k=query.rrf_k),  # type: ignore[arg-type]  # the stub omits nested classes
                filter=flt,
                with_payload=True,
            )
        use_sparse = (query.mode == "sparse" and sparse is not None) or dense is None
        chosen = sparse if use_sparse else dense
        if chosen is None:
            return None
        return qe.QueryRequest(limit=query.limit, query=chosen, filter=flt, with_payload=True,
                               params=idf if use_sparse else None)

    def search(self, query: SearchQuery) -> list[Hit]:
        return self.search_batch([query])[0]

    def search_batch(self, queries: Sequence[SearchQuery]) -> list[list[Hit]]:
        requests = [self._request(q) for q in queries]
        runnable = [r for r in requests if r is not None]
        try:
            results = self._shard.query_batch(qe.QueryBatchRequest(runnable)) if runnable else []
        except Exception as exc:
            raise StoreError(f"query failed: {exc}") from exc
        answers = iter(results)
        return [
            [Hit(str(p.id), float(p.score), _payload(p.payload)) for p in next(answers)] if r is not None else []
            for r in requests
        ]

    def scroll(self, agent_id: str | None = None, with_vectors: bool = False, page: int = 256,
               session_id: str | None = None) -> Iterator[tuple[str, dict[str, object], StoredPoint | None]]:
        flt = _filter(SearchQuery(agent_id=agent_id, limit=page, session_id=session_id))
        offset: qe.PointId | None = None
        while True:
            records, offset = self._shard.scroll(
                qe.ScrollRequest(offset=offset, limit=page, filter=flt, with_payload=True, with_vector=with_vectors)
            )
            for r in records:
                payload = _payload(r.payload)
                point = None
                if with_vectors and isinstance(r.vector, dict):
                    dense, sparse = r.vector.get(DENSE), r.vector.get(SPARSE)
                    point = StoredPoint(
                        str(r.id),
                        [float(x) for x in dense] if isinstance(dense, list) else [],  # type: ignore[arg-type]
                        SparseVector(tuple(sparse.indices), tuple(sparse.values))
                        if isinstance(sparse, qe.SparseVector) else SparseVector((), ()),
                        payload,
                    )
                yield str(r.id), payload, point
            if offset is None:
                return

    def retrieve(self, ids: Sequence[str]) -> list[Hit]:
        records = self._shard.retrieve([uuid.UUID(i) for i in ids], with_payload=True, with_vector=False)
        return [Hit(str(r.id), 0.0, _payload(r.payload)) for r in records]

    def count(self, agent_id: str | None = None) -> int:
        return int(self._shard.count(qe.CountRequest(exact=True, filter=_filter(SearchQuery(agent_id, 1)))))

    def flush(self) -> None:
        self._shard.flush()

    def optimize(self) -> None:
        self._shard.optimize()

    def close(self) -> None:
        self._shard.flush()
        self._shard.close()
