"""Server store: a Qdrant server or cluster through qdrant-client (`store.url`).

qdrant-client's local mode (`path=`) speaks the same API; the tests use it as the stand-in server.

The layout matches the embedded store's (issue 16): original vectors, payload, sparse index and payload
indexes on disk, dense vectors also as int8 in RAM, searched with rescoring. The server builds its HNSW
graphs in the background itself.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Collection, Iterator, Sequence
from typing import Any

from qdrant_client import QdrantClient, models

from veritas_watch.sinks.store import (
    DENSE,
    FLOAT_FIELDS,
    INTEGER_FIELDS,
    KEYWORD_FIELDS,
    SPARSE,
    XLING,
    Hit,
    SearchQuery,
    SparseVector,
    StoredPoint,
    StoreError,
    StoreMeta,
    filter_conditions,
    order_start,
)

_INT8 = models.ScalarQuantization(scalar=models.ScalarQuantizationConfig(
    type=models.ScalarType.INT8, quantile=0.99, always_ram=True))
# as the embedded store's (sinks/edge.py: oversampling 2 found nothing more at 100k points)
_RESCORE = models.SearchParams(quantization=models.QuantizationSearchParams(rescore=True, oversampling=1.0))


def _filter(query: SearchQuery) -> models.Filter | None:
    must: list[Any] = []
    for c in filter_conditions(query):
        if c.equals is not None:
            must.append(models.FieldCondition(key=c.field, match=models.MatchValue(value=c.equals)))
        elif c.any_of is not None:
            must.append(models.FieldCondition(key=c.field, match=models.MatchAny(any=c.any_of)))
        elif c.between is not None:
            must.append(models.FieldCondition(key=c.field, range=models.Range(gte=c.between[0], lte=c.between[1])))
    if query.ids:
        must.append(models.HasIdCondition(has_id=[str(uuid.UUID(i)) for i in query.ids]))
    return models.Filter(must=must) if must else None


class ServerStore:
    def __init__(self, client: QdrantClient, collection: str, meta: StoreMeta) -> None:
        self._client = client
        self._collection = collection
        try:
            if client.collection_exists(collection):
                info = client.get_collection(collection)
                stored = info.config.metadata or {}
                self.meta = StoreMeta.from_json(json.dumps(stored)) if "schema" in stored else meta
                self._create_indexes(skip=set(info.payload_schema or {}))  # fields added since it was created
            else:
                self.meta = meta
                self._create(meta)
        except StoreError:
            raise
        except Exception as exc:
            raise StoreError(f"cannot open collection {collection}: {exc}") from exc

    def _create(self, meta: StoreMeta) -> None:
        vectors = {DENSE: models.VectorParams(size=meta.dim, distance=models.Distance.COSINE, on_disk=True)}
        if meta.xling_dim is not None:
            vectors[XLING] = models.VectorParams(size=meta.xling_dim, distance=models.Distance.COSINE, on_disk=True)
        self._client.create_collection(
            self._collection,
            vectors_config=vectors,
            sparse_vectors_config={SPARSE: models.SparseVectorParams(
                modifier=models.Modifier.IDF, index=models.SparseIndexParams(on_disk=True))},
            on_disk_payload=True,
            quantization_config=_INT8,
            metadata={"schema": meta.schema, "embedder": meta.embedder, "dim": meta.dim, **meta.extra},
        )
        self._create_indexes()

    def _create_indexes(self, skip: Collection[str] = ()) -> None:
        schemas: dict[str, Any] = {
            **{name: models.KeywordIndexParams(type=models.KeywordIndexType.KEYWORD, is_tenant=name == "agent_id",
                                               on_disk=True) for name in KEYWORD_FIELDS},
            **{name: models.FloatIndexParams(type=models.FloatIndexType.FLOAT, on_disk=True) for name in FLOAT_FIELDS},
            **{name: models.IntegerIndexParams(type=models.IntegerIndexType.INTEGER, lookup=True, range=True,
                                               on_disk=True) for name in INTEGER_FIELDS},
        }
        for name, schema in schemas.items():
            if name not in skip:
                self._client.create_payload_index(self._collection, name, schema)

    def upsert(self, points: Sequence[StoredPoint]) -> None:
        if not points:
            return
        structs = []
        for p in points:
            vector: dict[str, Any] = {
                DENSE: list(p.dense),
                SPARSE: models.SparseVector(indices=list(p.sparse.indices), values=list(p.sparse.values)),
            }
            if self.meta.xling_dim is not None:
                if p.xling is None:
                    raise StoreError(f"point {p.id} has no {XLING} vector, which this collection holds")
                vector[XLING] = list(p.xling)
            structs.append(models.PointStruct(id=p.id, vector=vector, payload=p.payload))
        try:
            self._client.upsert(self._collection, structs, wait=True)
        except Exception as exc:
            raise StoreError(f"upsert failed: {exc}") from exc

    def delete(self, ids: Sequence[str]) -> None:
        if ids:
            try:
                self._client.delete(self._collection, models.PointIdsList(points=list(ids)), wait=True)
            except Exception as exc:
                raise StoreError(f"delete failed: {exc}") from exc

    @staticmethod
    def _request(query: SearchQuery) -> models.QueryRequest | None:
        """The request for one query; None when there is nothing to search with.

        IDF is the collection's: a Qdrant server has no per-request IDF corpus (`agent_idf` is Edge's).
        """
        flt = _filter(query)
        if query.order is not None:
            direction = models.Direction.ASC if query.order == "asc" else models.Direction.DESC
            order = models.OrderByQuery(order_by=models.OrderBy(key=query.order_field, direction=direction,
                                                                start_from=order_start(query)))
            return models.QueryRequest(query=order, filter=flt, limit=query.limit, with_payload=True)
        sparse = (
            models.SparseVector(indices=list(query.sparse.indices), values=list(query.sparse.values))
            if query.sparse is not None and query.sparse.indices
            else None
        )
        dense = list(query.dense) if query.dense is not None else None
        if query.mode == "hybrid" and dense is not None and sparse is not None:
            return models.QueryRequest(
                prefetch=[
                    models.Prefetch(query=dense, using=query.using, limit=query.prefetch, filter=flt,
                                    params=_RESCORE),
                    models.Prefetch(query=sparse, using=SPARSE, limit=query.prefetch, filter=flt),
                ],
                query=models.RrfQuery(rrf=models.Rrf(k=query.rrf_k)),
                filter=flt,
                limit=query.limit,
                with_payload=True,
            )
        use_sparse = (query.mode == "sparse" and sparse is not None) or dense is None
        vector: Any = sparse if use_sparse else dense
        if vector is None:
            return None
        return models.QueryRequest(query=vector, using=SPARSE if use_sparse else query.using, filter=flt,
                                   limit=query.limit, with_payload=query.with_payload,
                                   params=None if use_sparse else _RESCORE)

    def search(self, query: SearchQuery) -> list[Hit]:
        return self.search_batch([query])[0]

    def search_batch(self, queries: Sequence[SearchQuery]) -> list[list[Hit]]:
        requests = [self._request(q) for q in queries]
        runnable = [r for r in requests if r is not None]
        try:
            results = self._client.query_batch_points(self._collection, requests=runnable) if runnable else []
        except Exception as exc:
            raise StoreError(f"query failed: {exc}") from exc
        answers = iter(results)
        return [
            [Hit(str(p.id), float(p.score), dict(p.payload or {})) for p in next(answers).points]
            if r is not None else []
            for r in requests
        ]

    def scroll(self, agent_id: str | None = None, with_vectors: bool = False, page: int = 256,
               session_id: str | None = None) -> Iterator[tuple[str, dict[str, object], StoredPoint | None]]:
        flt = _filter(SearchQuery(agent_id=agent_id, limit=page, session_id=session_id))
        offset: Any = None
        while True:
            records, offset = self._client.scroll(
                self._collection, scroll_filter=flt, limit=page, offset=offset,
                with_payload=True, with_vectors=with_vectors,
            )
            for r in records:
                payload = dict(r.payload or {})
                point = None
                if with_vectors and isinstance(r.vector, dict):
                    sparse = r.vector.get(SPARSE)
                    dense = r.vector.get(DENSE)
                    xling = r.vector.get(XLING)
                    point = StoredPoint(
                        str(r.id),
                        list(dense) if isinstance(dense, list) else [],  # type: ignore[arg-type]
                        SparseVector(tuple(sparse.indices), tuple(sparse.values))
                        if isinstance(sparse, models.SparseVector) else SparseVector((), ()),
                        payload,
                        list(xling) if isinstance(xling, list) else None,  # type: ignore[arg-type]
                    )
                yield str(r.id), payload, point
            if offset is None:
                return

    def retrieve(self, ids: Sequence[str]) -> list[Hit]:
        records = self._client.retrieve(self._collection, [str(uuid.UUID(i)) for i in ids], with_payload=True)
        return [Hit(str(r.id), 0.0, dict(r.payload or {})) for r in records]

    def count(self, agent_id: str | None = None) -> int:
        flt = _filter(SearchQuery(agent_id, 1))
        return int(self._client.count(self._collection, count_filter=flt, exact=True).count)

    def flush(self) -> None:
        """The server persists on acknowledgement (`wait=True`)."""

    def optimize(self) -> bool:
        """The server optimizes by itself."""
        return False

    def release_memory(self) -> None:
        """The server's memory is its own."""

    def close(self) -> None:
        self._client.close()
