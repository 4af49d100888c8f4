"""Search over stored memory, the same from the daemon's HTTP API and from the CLI on a stopped daemon."""

from __future__ import annotations

from veritas_watch.sinks.embed import Embedder
from veritas_watch.sinks.store import Hit, SearchMode, SearchQuery, SparseVector, Store
from veritas_watch.transforms.tokenize import sparse_query

RESULT_FIELDS = ("score", "agent_id", "session_id", "entry_id", "role", "text", "timestamp", "source")


def build_query(embedder: Embedder, agent_id: str | None, text: str, limit: int,
                mode: SearchMode = "hybrid") -> SearchQuery:
    dense = embedder.embed_query(text).tolist() if mode != "sparse" else None
    sparse = sparse_query(text) if mode != "dense" else None
    return SearchQuery(agent_id=agent_id, limit=limit, mode=mode, dense=dense,
                       sparse=SparseVector(sparse.indices, sparse.values) if sparse else None)


def hit_to_result(hit: Hit) -> dict[str, object]:
    p = hit.payload
    return {
        "score": round(hit.score, 6),
        "agent_id": p.get("agent_id"),
        "session_id": p.get("session_id"),
        "entry_id": p.get("entry_id"),
        "role": p.get("role"),
        "text": p.get("data"),
        "timestamp": p.get("timestamp"),
        "source": p.get("source"),
    }


def search_memory(store: Store, embedder: Embedder, agent_id: str | None, text: str, limit: int,
                  mode: SearchMode = "hybrid") -> list[dict[str, object]]:
    return [hit_to_result(h) for h in store.search(build_query(embedder, agent_id, text, limit, mode))]
