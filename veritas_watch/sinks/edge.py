"""Embedded store: Qdrant's in-process engine (Qdrant Edge, `qdrant-edge-py`), one shard on disk.

The shard is opened by one process at a time (the daemon); other processes reach it through the
daemon's HTTP port. Writes come from one worker thread (the `pipeline.Sink` store thread), reads from
its read thread.

Layout (issue 16, measured by bench/scale.py): the growing segment takes new points; `optimize()`, called
by the daemon when it has grown by `EdgeTuning.segment_points` and after a backfill, turns it into an
optimized segment whose original vectors, payload and sparse index stay on disk (mmap, not pre-warmed)
and whose dense vectors are also kept quantized in RAM, 4 bits a dimension (searches scan those, then
rescore each segment's best with the originals; stores created before keep int8). No HNSW graph is
built (m=0): qdrant-edge-py 0.9 holds the GIL while it optimizes, and a graph over 12k points froze the
whole process for 10.4 s; without one, converting a segment costs ~0.1 ms per point and one agent's 100k
points are scanned in 13-28 ms (load 5).
`flush()` makes every acknowledged write durable and trims the WAL; `release_memory()` drops the pages of
the mapped files from the process's RSS when the daemon's memory budget asks for it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import stat
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import qdrant_edge as qe

from veritas_watch.footprint import drop_mapped_pages, release_freed_heap
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
    if query.ids:
        must.append(qe.HasIdCondition({uuid.UUID(i) for i in query.ids}))
    return qe.Filter(must=must) if must else None


def _payload(raw: object) -> dict[str, object]:
    return raw if isinstance(raw, dict) else {}  # the engine builds a new dict for every answer: no copy


Quantization = Literal["turbo4", "int8"]


@dataclass(frozen=True)
class EdgeTuning:
    """How the shard keeps its data in memory and on disk (bench/scale.py compares the settings)."""

    compact: bool = True  # on-disk originals, payload and sparse index; quantized dense vectors in RAM
    quantization: Quantization = "turbo4"  # of a new store; an existing one keeps its own (`stored_quantization`)
    segment_points: int = 10_000  # points the growing segment takes before optimize() converts it
    max_segments: int = 16  # optimized segments before the smallest are merged


def stored_quantization(path: Path) -> Quantization | None:
    """The quantization a compact store was created with (None: a new store, or one before issue 16).

    A store keeps it: switching re-quantizes every segment in one optimization that holds the GIL (57 s for
    100k points at load 13, longer than the watchdog waits for the pipeline)."""
    try:
        config = json.loads((path / "edge_config.json").read_text())
        quantized = config["vectors"][DENSE]["quantization_config"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if isinstance(quantized, dict) and "scalar" in quantized:
        return "int8"
    return "turbo4" if isinstance(quantized, dict) and "turbo" in quantized else None


DEFAULT_TUNING = EdgeTuning()
LEGACY_TUNING = EdgeTuning(compact=False)  # the store before issue 16: everything in RAM, one segment
# Each segment's best `limit` by the quantized vectors, rescored with the originals. Oversampling 2 found
# nothing more (one agent's 100k points, 200 queries: the exact top 10 and top 50 in full either way; LoCoMo
# R@10 .800/.766 vs .801/.765) but read twice the originals: after a release, one query mapped 22-29 vs 17 MB
# of store pages (smaps), which the memory budget then had to release again, in 6.7-8.5 vs 5.7 ms.
_RESCORE = qe.SearchParams(quantization=qe.QuantizationSearchParams(rescore=True, oversampling=1.0))


# The engine writes its WAL and its segments through memory maps of files it creates whole but sparse (a new
# store: 189 MB of files, 0.2-16 MB of them on disk); filling a hole on a full filesystem is SIGBUS, which kills
# the process without a word. So no write starts unless the filesystem has room for every hole the store's
# files still have, plus MIN_FREE_BYTES for the files the engine creates next (a WAL segment is 32 MB); it
# fails as a StoreError instead (retried, logged, the cursors wait).
MIN_FREE_BYTES = 64 * 1024 * 1024


def unbacked_bytes(path: Path) -> int:
    """Bytes the files under `path` claim but the filesystem has not allocated yet: what their maps may fill."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                st = os.lstat(os.path.join(root, name))
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode):
                total += max(0, st.st_size - st.st_blocks * 512)
    return total


def require_room(path: Path, what: str, unbacked: int = 0) -> None:
    """StoreError unless the filesystem holding `path` has `unbacked` + MIN_FREE_BYTES free."""
    try:
        free = shutil.disk_usage(path if path.exists() else path.parent).free
    except OSError:
        return  # what cannot be measured is left to the write itself
    needed = MIN_FREE_BYTES + unbacked
    if free < needed:
        raise StoreError(f"{what} held back, free some space: {free // 2**20} MiB free, {needed // 2**20} MiB needed "
                         f"(the store's files have {unbacked // 2**20} MiB not yet on disk that its memory maps may "
                         f"fill, and a write to a full disk would kill the daemon) on the filesystem of {path}")


class EdgeStore:
    def __init__(self, path: Path, meta: StoreMeta, tuning: EdgeTuning = DEFAULT_TUNING) -> None:
        self.meta = meta
        self.path = path
        self._unbacked = unbacked_bytes(path)  # refreshed after each flush and optimize (files come and go)
        require_room(path, "opening the store", self._unbacked)
        stored = stored_quantization(path)
        self.tuning = tuning = tuning if stored is None else dataclasses.replace(tuning, quantization=stored)
        self._xling = meta.xling_dim is not None
        self._edge_config = self._config(meta.dim, meta.xling_dim, tuning)
        self.points_since_optimize = 0  # points written since the last optimize(): the growing segment
        self.last_optimize = 0.0  # seconds the last optimize() took
        try:
            if (path / "segments").exists() or any(path.glob("*")):
                # An older store takes the current layout: its segments converge at the next optimize().
                self._shard = qe.EdgeShard.load(str(path), self._edge_config if tuning.compact else None)
                self._upgrade_indexes()
            else:
                self._shard = qe.EdgeShard.create(str(path), self._edge_config)
                self._create_indexes()
        except Exception as exc:  # the engine raises plain exceptions for locks, corruption, IO
            raise StoreError(f"cannot open Qdrant Edge shard at {path}: {exc}") from exc
        self._unbacked = unbacked_bytes(path)

    @staticmethod
    def _config(dim: int, xling_dim: int | None, tuning: EdgeTuning = DEFAULT_TUNING) -> qe.EdgeConfig:
        if not tuning.compact:
            vectors = {DENSE: qe.EdgeVectorParams(size=dim, distance=qe.Distance.Cosine)}
            if xling_dim is not None:
                vectors[XLING] = qe.EdgeVectorParams(size=xling_dim, distance=qe.Distance.Cosine)
            return qe.EdgeConfig(
                vectors=vectors,
                sparse_vectors={SPARSE: qe.EdgeSparseVectorParams(modifier=qe.Modifier.Idf)},
                wal_enabled=True,
            )
        # 4-bit TurboQuant rather than int8 (bench/scale.py --quantization-ab and --locomo, 100k points of one
        # agent): LoCoMo R@1/5/10 identical; the heap opening the store adds 23-26 instead of 36-43 MB; one
        # dense query p50 22.8 vs 26.4 and 9.3 vs 12.5 ms (two runs, each interleaved); conversion times within
        # the noise of a loaded machine (45 vs 29 s, 40 vs 66 s for the whole 100k).
        quantized: qe.TurboQuantQuantizationConfig | qe.ScalarQuantizationConfig = (
            qe.TurboQuantQuantizationConfig(bits=qe.TurboQuantBitSize.Bits4, memory=qe.Memory.Pinned)
            if tuning.quantization == "turbo4"
            else qe.ScalarQuantizationConfig(qe.ScalarType.Int8, quantile=0.99, memory=qe.Memory.Pinned))
        sizes = {DENSE: dim} | ({XLING: xling_dim} if xling_dim is not None else {})
        vectors = {name: qe.EdgeVectorParams(size=size, distance=qe.Distance.Cosine, memory=qe.Memory.Cold,
                                             quantization_config=quantized) for name, size in sizes.items()}
        segment_kb = max(1, tuning.segment_points * sum(sizes.values()) * 4 // 1024)
        return qe.EdgeConfig(
            vectors=vectors,
            sparse_vectors={SPARSE: qe.EdgeSparseVectorParams(modifier=qe.Modifier.Idf, memory=qe.Memory.Cold)},
            payload_memory=qe.Memory.Cold,
            hnsw_config=qe.HnswIndexConfig(m=0, ef_construct=100, full_scan_threshold=10_000, max_indexing_threads=1),
            optimizers=qe.EdgeOptimizersConfig(indexing_threshold=segment_kb // 2, max_segment_size=4 * segment_kb,
                                               default_segment_number=tuning.max_segments),
            wal_enabled=True,
        )

    def _index_params(self, name: str) -> qe.PayloadSchemaType | qe.KeywordIndexParams | qe.FloatIndexParams \
            | qe.IntegerIndexParams:
        on_disk = True if self.tuning.compact else None
        if name in KEYWORD_FIELDS:
            return qe.KeywordIndexParams(is_tenant=name == "agent_id", on_disk=on_disk)
        if not self.tuning.compact:
            return qe.PayloadSchemaType.Float if name in FLOAT_FIELDS else qe.PayloadSchemaType.Integer
        if name in FLOAT_FIELDS:
            return qe.FloatIndexParams(on_disk=True)
        return qe.IntegerIndexParams(lookup=True, range=True, on_disk=True)

    def _create_indexes(self) -> None:
        for name in (*KEYWORD_FIELDS, *FLOAT_FIELDS, *INTEGER_FIELDS):
            self._shard.update(qe.UpdateOperation.create_field_index(name, self._index_params(name)))

    def _upgrade_indexes(self) -> None:
        """Payload indexes of an older store: those it lacks created, the others rebuilt on disk (once: the
        shard remembers their parameters)."""
        schema = self._shard.info().payload_schema
        for name in (*KEYWORD_FIELDS, *FLOAT_FIELDS, *INTEGER_FIELDS):
            info = schema.get(name)
            params = info.params if info is not None else None
            if info is None or (self.tuning.compact and not getattr(params, "on_disk", False)):
                self._shard.update(qe.UpdateOperation.create_field_index(name, self._index_params(name)))

    def upsert(self, points: Sequence[StoredPoint]) -> None:
        if not points:
            return
        batch = []
        for p in points:
            vectors: dict[str, list[float] | qe.SparseVector] = {
                DENSE: list(p.dense), SPARSE: qe.SparseVector(list(p.sparse.indices), list(p.sparse.values))}
            if self._xling:
                if p.xling is None:
                    raise StoreError(f"point {p.id} has no {XLING} vector, which this store holds")
                vectors[XLING] = list(p.xling)
            batch.append(qe.Point(uuid.UUID(p.id), vectors, p.payload))  # type: ignore[arg-type]
        require_room(self.path, "a write", self._unbacked)
        try:
            self._shard.update(qe.UpdateOperation.upsert_points(batch))
        except Exception as exc:
            raise StoreError(f"upsert failed: {exc}") from exc
        self.points_since_optimize += len(batch)

    def delete(self, ids: Sequence[str]) -> None:
        if ids:
            require_room(self.path, "a delete", self._unbacked)
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
            order = qe.OrderBy(query.order_field, direction=direction, start_from=order_start(query))
            return qe.QueryRequest(limit=query.limit, query=order, filter=flt, with_payload=True)
        dense = qe.Query.Nearest(list(query.dense), using=query.using) if query.dense is not None else None
        # quantized candidates, rescored with the original vectors (no effect on a segment without quantization)
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
                    qe.Prefetch(limit=query.prefetch, query=dense, filter=flt, params=_RESCORE),
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
        return qe.QueryRequest(limit=query.limit, query=chosen, filter=flt, with_payload=query.with_payload,
                               params=idf if use_sparse else _RESCORE)

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
                    dense, sparse, xling = r.vector.get(DENSE), r.vector.get(SPARSE), r.vector.get(XLING)
                    point = StoredPoint(
                        str(r.id),
                        [float(x) for x in dense] if isinstance(dense, list) else [],  # type: ignore[arg-type]
                        SparseVector(tuple(sparse.indices), tuple(sparse.values))
                        if isinstance(sparse, qe.SparseVector) else SparseVector((), ()),
                        payload,
                        [float(x) for x in xling] if isinstance(xling, list) else None,  # type: ignore[arg-type]
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
        """Every acknowledged write durable on disk; the WAL is trimmed to what is not yet in segments."""
        require_room(self.path, "a flush", self._unbacked)
        try:
            self._shard.flush()
        except Exception as exc:
            raise StoreError(f"flush failed: {exc}") from exc
        self._unbacked = unbacked_bytes(self.path)  # WAL segments trimmed and created

    def optimize(self) -> bool:
        """Convert the grown segment (and merge small ones); True if anything changed. Blocks the process
        (qdrant-edge-py holds the GIL): about 0.1 ms per point of the grown segment.

        The conversion maps the segment it reads and the one it writes: a 100k-point daemon's RSS rose by
        ~110 MB of file pages for the seconds a 10k-point conversion took, and no release can run meanwhile
        (the GIL). So it starts with the store's mapped pages dropped and ends with what it touched dropped."""
        require_room(self.path, "an optimization", self._unbacked)
        try:
            started = time.perf_counter()
            self.release_memory()  # the growing segment's pages: ~50 MB before a 10k-point conversion
            changed = bool(self._shard.optimize())
            self.release_memory()  # its pages, and its buffers (freed, but otherwise kept by the allocator)
            self.points_since_optimize = 0
            self.last_optimize = time.perf_counter() - started
        except Exception as exc:
            raise StoreError(f"optimize failed: {exc}") from exc
        self._unbacked = unbacked_bytes(self.path)  # segments merged and created
        return changed

    def release_memory(self) -> None:
        """Stop counting the store's mapped files as this process's memory (`drop_mapped_pages`: ~15 ms for the
        655 mappings of a 100k-point store, where reopening the shard took ~1 s holding the GIL) and give the
        heap the engine freed (an optimization's buffers) back to the OS."""
        drop_mapped_pages(self.path)
        release_freed_heap()

    def segments(self) -> int:
        return int(self._shard.info().segments_count)

    def close(self) -> None:
        self._shard.flush()
        self._shard.close()
