"""The two store backends the store tests run on: embedded Qdrant Edge, and qdrant-client in local
mode standing in for a Qdrant server. `conftest.py` offers them as the `store` fixture."""

from __future__ import annotations

from pathlib import Path

from qdrant_client import QdrantClient

from veritas_watch.sinks.edge import EdgeStore
from veritas_watch.sinks.server import ServerStore
from veritas_watch.sinks.store import Store, StoreMeta

META = StoreMeta(1, "test-embedder", 8)
# With the cross-language vector (4 dimensions here).
XLING_META = StoreMeta(1, "test-embedder", 8, {"xling": "test-xling", "xling_dim": 4})
BACKENDS = ("edge", "server")


def open_backend(kind: str, root: Path, meta: StoreMeta = META) -> Store:
    """An empty store of that kind (one of BACKENDS) under root."""
    if kind == "edge":
        return EdgeStore(root / "edge", meta)
    return ServerStore(QdrantClient(path=str(root / "local")), "veritas_memory", meta)
