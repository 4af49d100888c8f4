"""Open the configured store, migrating data written with an older schema or another embedder."""

from __future__ import annotations

import dataclasses
import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import structlog

from veritas_watch.safepath import make_dirs
from veritas_watch.sinks.store import Store, StoredPoint, StoreError, StoreMeta, meta_path

if TYPE_CHECKING:
    from qdrant_client import QdrantClient

log = structlog.get_logger()

# Re-embeds stored payloads (their `data` text) into points for the new layout.
Reembed = Callable[[Sequence[tuple[str, dict[str, object]]]], list[StoredPoint]]


class AddsCrossLanguage(Protocol):
    """A `Reembed` that can also embed texts with the cross-language model alone (pipeline.Reembedder)."""

    def __call__(self, rows: Sequence[tuple[str, dict[str, object]]]) -> list[StoredPoint]: ...

    def cross_language(self, texts: Sequence[str]) -> list[list[float]]: ...


def _keeps_vectors(stored: StoreMeta, meta: StoreMeta, reembed: Reembed | None) -> bool:
    """Whether a migration can copy the stored vectors: only the cross-language vector is added or dropped."""
    if stored.without_xling() != meta.without_xling():
        return False
    return meta.xling_dim is None or hasattr(reembed, "cross_language")


def open_store(url: str, api_key: str, collection: str, timeout: float, data_dir: Path,
               meta: StoreMeta, reembed: Reembed | None, segment_points: int | None = None) -> Store:
    """`reembed=None`: refuse (StoreError) rather than migrate; only the daemon migrates.
    `segment_points`: the embedded store's growing-segment size (`store.segment_points`)."""
    if url:
        return _open_server(url, api_key, collection, timeout, meta, reembed)
    return _open_edge(data_dir / "store", meta, reembed, segment_points)


def _open_edge(path: Path, meta: StoreMeta, reembed: Reembed | None, segment_points: int | None = None) -> Store:
    """Migration copies into `store.next` and swaps only once the copy is complete (meta written last),
    so an interrupted migration leaves the old store untouched and is simply redone."""
    from veritas_watch.sinks.edge import DEFAULT_TUNING, EdgeStore

    tuning = DEFAULT_TUNING if segment_points is None else dataclasses.replace(DEFAULT_TUNING,
                                                                              segment_points=segment_points)

    staged = path.with_name(path.name + ".next")
    if not path.exists() and _read_meta(staged) is not None:
        staged.rename(path)  # crashed between the two renames of a finished migration
    for leftover in path.parent.glob(path.name + ".old-*"):
        shutil.rmtree(leftover, ignore_errors=True)
    stored = _read_meta(path)
    if stored is not None and stored != meta:
        if reembed is None:
            raise StoreError(f"the store at {path} was written with {stored.to_json()}, not {meta.to_json()}: "
                             "start the daemon once to migrate it")
        log.warning("store_migration_started", old=stored.to_json(), new=meta.to_json())
        shutil.rmtree(staged, ignore_errors=True)
        old = EdgeStore(path, stored)
        new = EdgeStore(staged, meta)
        moved = _copy(old, new, reembed, keep_vectors=_keeps_vectors(stored, meta, reembed))
        old.close()
        new.close()
        meta_path(staged).write_text(meta.to_json())  # the completeness marker
        retired = path.with_name(f"{path.name}.old-{int(time.time())}")
        path.rename(retired)
        staged.rename(path)
        shutil.rmtree(retired, ignore_errors=True)
        log.warning("store_migration_finished", points=moved)
        return EdgeStore(path, meta, tuning)
    shutil.rmtree(staged, ignore_errors=True)  # an unfinished migration: redone from the intact store
    make_dirs(path)
    store = EdgeStore(path, meta, tuning)
    if stored is None:
        meta_path(path).write_text(meta.to_json())
    return store


def _open_server(url: str, api_key: str, collection: str, timeout: float, meta: StoreMeta,
                 reembed: Reembed | None) -> Store:
    from qdrant_client import QdrantClient

    try:
        client = QdrantClient(url=url, api_key=api_key or None, timeout=int(timeout))
    except Exception as exc:
        raise StoreError(f"cannot connect to {url}: {exc}") from exc
    return open_server_collection(client, collection, meta, reembed)


def open_server_collection(client: QdrantClient, collection: str, meta: StoreMeta,
                           reembed: Reembed | None) -> Store:
    from veritas_watch.sinks.server import ServerStore

    store = ServerStore(client, collection, meta)
    if store.meta == meta:
        return store
    if reembed is None:
        raise StoreError(f"collection {collection} was written with {store.meta.to_json()}, not {meta.to_json()}: "
                         "start the daemon once to migrate it")
    # Keep the collection's name stable: re-embed into a temporary collection, then recreate.
    temp = f"{collection}__migrating"
    log.warning("store_migration_started", old=store.meta.to_json(), new=meta.to_json())
    if client.collection_exists(temp):
        client.delete_collection(temp)
    staged = ServerStore(client, temp, meta)
    moved = _copy(store, staged, reembed, keep_vectors=_keeps_vectors(store.meta, meta, reembed))
    client.delete_collection(collection)
    fresh = ServerStore(client, collection, meta)
    _copy(staged, fresh, None)
    client.delete_collection(temp)
    log.warning("store_migration_finished", points=moved)
    return fresh


def _copy(old: Store, new: Store, reembed: Reembed | None, page: int = 256, keep_vectors: bool = False) -> int:
    """Copy every point; re-embedding their text, or (reembed=None) with their stored vectors.

    keep_vectors: the stored vectors are copied and only the cross-language vector is made (when the new
    store has one it the old did not), from the stored text."""
    rows: list[tuple[str, dict[str, object]]] = []
    points: list[StoredPoint] = []
    moved = 0
    copy_vectors = reembed is None or keep_vectors
    add_xling = keep_vectors and new.meta.xling_dim is not None and old.meta.xling_dim is None

    def flush() -> None:
        nonlocal points
        if add_xling and points:
            adds: AddsCrossLanguage = reembed  # type: ignore[assignment]  # checked by _keeps_vectors
            vectors = adds.cross_language([str(p.payload.get("data") or "") for p in points])
            points = [dataclasses.replace(p, xling=v) for p, v in zip(points, vectors, strict=True)]
        new.upsert(points + (reembed(rows) if reembed and rows else []))

    for point_id, payload, point in old.scroll(page=page, with_vectors=copy_vectors):
        if point is not None:
            points.append(point)
        else:
            rows.append((point_id, payload))
        if len(rows) + len(points) >= page:
            flush()
            moved += len(rows) + len(points)
            rows, points = [], []
    if rows or points:
        flush()
        moved += len(rows) + len(points)
    return moved


def _read_meta(path: Path) -> StoreMeta | None:
    try:
        return StoreMeta.from_json(meta_path(path).read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError) as exc:
        raise StoreError(f"store metadata {meta_path(path)} unreadable: {exc}") from exc
