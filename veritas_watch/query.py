"""Search over stored memory, the same from the daemon's HTTP API and from the CLI on a stopped daemon.

Hybrid search (the measured choice, bench/retrieval_study.py and bench/locomo.py):
1. dense top-50 and sparse top-50 of the agent's points (one store batch; sparse IDF over the
   agent's own points on Qdrant Edge), both under the request's role and time filters;
2. the relevance floor on the best dense cosine: below it nothing stored is about the query;
3. score fusion of the two lists (min-max normalised, the sparse list weighted down as the query
   is more Chinese/Japanese), then a boost for sessions that match in several turns;
4. context expansion: the previous and next turn of the 20 best hits join the ranking at a
   discount (the question with its answer), then the first `limit`.

Split in two so the daemon can run each half on its worker thread: `embed_request` needs the
embedder only, `run_search` the store only.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

from veritas_watch.search import (
    DEFAULT_RANKING,
    RankingConfig,
    expand_context,
    fuse_hybrid,
    passes_floor,
    session_boost,
)
from veritas_watch.sinks.embed import Embedder
from veritas_watch.sinks.store import Hit, SearchMode, SearchQuery, SparseVector, Store
from veritas_watch.transforms.tokenize import TokenizerConfig, sparse_query

RESULT_FIELDS = ("score", "agent_id", "session_id", "entry_id", "role", "text", "timestamp", "source")
CANDIDATES = 50  # per side before fusion (measured: deeper lists do not help)
NEIGHBOUR_FETCH = 4  # points per neighbour lookup: a turn split in chunks shares one position
# English stopwords dropped from the query only (stored vectors keep every term, so no re-index):
# measured on LoCoMo, sparse R@10 .602 -> .637, hybrid .763 -> .772 (bench/locomo.py).
QUERY_TOKENIZER = TokenizerConfig(query_stopwords=True)


class CrossAgentRefused(ValueError):
    """A search without an agent while `search.allow_cross_agent` is off."""


@dataclass(frozen=True, slots=True)
class MemoryRequest:
    agent_id: str | None  # None: every agent (only when the operator allows it)
    text: str
    limit: int = 10
    mode: SearchMode = "hybrid"
    roles: tuple[str, ...] = ()
    since: float | None = None  # epoch seconds, inclusive
    until: float | None = None
    expand: bool = True  # neighbouring turns of the best hits join the results
    floor: float | None = None  # best dense cosine below this: no results (None: no floor; sparse mode: none)


@dataclass(frozen=True, slots=True)
class QueryVectors:
    dense: list[float] | None
    sparse: SparseVector | None


@dataclass(frozen=True, slots=True)
class MemoryHit:
    id: str
    score: float
    payload: dict[str, object]
    neighbour_of: str | None = None  # set when shown as the neighbouring turn of that hit


def check_agent(agent_id: str | None, allow_cross_agent: bool) -> None:
    if agent_id is None and not allow_cross_agent:
        raise CrossAgentRefused("agent_id is required (search.allow_cross_agent is off)")


def embed_request(embedder: Embedder, request: MemoryRequest) -> QueryVectors:
    """The query's vectors (sparse mode: no dense vector, hence no floor: a keyword match is its own evidence)."""
    dense = embedder.embed_query(request.text).tolist() if request.mode != "sparse" else None
    sparse = sparse_query(request.text, QUERY_TOKENIZER) if request.mode != "dense" else None
    return QueryVectors(dense, SparseVector(sparse.indices, sparse.values) if sparse else None)


def _base_query(request: MemoryRequest, limit: int) -> SearchQuery:
    return SearchQuery(agent_id=request.agent_id, limit=limit, roles=request.roles,
                       since=request.since, until=request.until)


def _ranked(hits: Sequence[Hit]) -> list[tuple[str, float]]:
    return [(h.id, h.score) for h in hits]


def _session_of(payloads: dict[str, dict[str, object]]) -> Callable[[str], Hashable]:
    def session(key: str) -> Hashable:
        p = payloads.get(key, {})
        return (str(p.get("agent_id")), str(p.get("session_id")))

    return session


def _position(payload: dict[str, object]) -> int | None:
    position = payload.get("position")
    return position if isinstance(position, int) and not isinstance(position, bool) else None


def _matches(request: MemoryRequest, payload: dict[str, object]) -> bool:
    """Whether a neighbouring turn passes the request's own filters (role, time range)."""
    if request.roles and payload.get("role") not in request.roles:
        return False
    if request.since is not None or request.until is not None:
        ts = payload.get("ts")
        if not isinstance(ts, (int, float)):
            return False
        if (request.since is not None and ts < request.since) or (request.until is not None and ts > request.until):
            return False
    return True


def _neighbours(store: Store, request: MemoryRequest, hits: Sequence[tuple[str, float]],
                payloads: dict[str, dict[str, object]], offsets: Sequence[int]) -> dict[tuple[str, int], str]:
    """{(hit id, offset): neighbour id} for the previous (-1) and next (+1) stored turn of each hit.

    Neighbours are found by position order in the hit's session, not position +- 1: tool calls
    and other lines that are not memory sit between turns in a transcript. One store batch.
    """
    lookups: list[tuple[str, int, SearchQuery]] = []
    for key, _ in hits:
        payload = payloads.get(key, {})
        position, session, agent = _position(payload), payload.get("session_id"), payload.get("agent_id")
        if position is None or not isinstance(session, str) or not isinstance(agent, str):
            continue
        for offset in offsets:
            if offset not in (1, -1):
                continue  # only adjacent turns are looked up (the measured expansion)
            after = offset > 0
            lookups.append((key, offset, SearchQuery(
                agent_id=agent, limit=NEIGHBOUR_FETCH, session_id=session, order="asc" if after else "desc",
                min_position=position + 1 if after else None, max_position=None if after else position - 1,
            )))
    if not lookups:
        return {}
    found: dict[tuple[str, int], str] = {}
    for (key, offset, _), points in zip(lookups, store.search_batch([q for _, _, q in lookups]), strict=True):
        placed = [(_position(p.payload), int(str(p.payload.get("chunk") or 0)), p) for p in points]
        turns = [(position, chunk, p) for position, chunk, p in placed if position is not None]
        if not turns:
            continue
        # the nearest turn; the next one from its first chunk, the previous one by its last
        # (the text nearest the hit)
        pick = min if offset > 0 else max
        nearest = pick(turns, key=lambda t: (t[0], t[1]))
        chunk = nearest[2]
        if not _matches(request, chunk.payload):
            continue
        payloads.setdefault(chunk.id, chunk.payload)
        found[(key, offset)] = chunk.id
    return found


def run_search(store: Store, request: MemoryRequest, vectors: QueryVectors,
               ranking: RankingConfig = DEFAULT_RANKING) -> list[MemoryHit]:
    """Ranked hits for an embedded request (store calls only; run it on the store thread)."""
    depth = max(CANDIDATES, request.limit)
    base = _base_query(request, depth)
    queries: list[SearchQuery] = []
    if vectors.dense is not None:
        queries.append(dataclasses.replace(base, mode="dense", dense=vectors.dense))
    if request.mode != "dense" and vectors.sparse is not None:
        queries.append(dataclasses.replace(base, mode="sparse", sparse=vectors.sparse))
    results = store.search_batch(queries) if queries else []
    dense = results[0] if vectors.dense is not None else []
    sparse = results[-1] if request.mode != "dense" and vectors.sparse is not None else []
    if request.floor is not None and request.mode != "sparse" and not passes_floor(dense[0].score if dense else None,
                                                      dataclasses.replace(ranking, floor=request.floor)):
        return []
    payloads = {h.id: h.payload for h in (*dense, *sparse)}
    if request.mode == "hybrid":
        ranked = fuse_hybrid(_ranked(dense), _ranked(sparse), request.text, ranking)
        ranked = session_boost(ranked, _session_of(payloads), ranking.session_boost, ranking.session_top)
    else:
        ranked = _ranked(dense if request.mode == "dense" else sparse)
    if not request.expand or not ranked:
        return [MemoryHit(key, score, payloads[key]) for key, score in ranked[:request.limit]]
    top = ranked[:max(ranking.expand_depth, request.limit)]
    links = _neighbours(store, request, top, payloads, list(ranking.expand))
    slots = expand_context(top, lambda key, offset: links.get((key, offset)), ranking.expand)
    return [MemoryHit(s.key, s.score, payloads[s.key], s.neighbour_of) for s in slots[:request.limit]]


def hit_to_result(hit: Hit | MemoryHit) -> dict[str, object]:
    p = hit.payload
    result: dict[str, object] = {
        "id": hit.id,
        "score": round(hit.score, 6),
        "agent_id": p.get("agent_id"),
        "session_id": p.get("session_id"),
        "entry_id": p.get("entry_id"),
        "role": p.get("role"),
        "type": p.get("type"),
        "text": p.get("data"),
        "timestamp": p.get("timestamp"),
        "source": p.get("source"),
    }
    if p.get("speaker") is not None:  # a group member's message: who said it
        result["speaker"] = p.get("speaker")
    if isinstance(hit, MemoryHit):
        result["neighbour_of"] = hit.neighbour_of
    return result


def build_query(embedder: Embedder, agent_id: str | None, text: str, limit: int,
                mode: SearchMode = "hybrid") -> SearchQuery:
    """One store query (the store's own fusion in hybrid mode); `run_search` is what search uses."""
    vectors = embed_request(embedder, MemoryRequest(agent_id, text, limit, mode))
    return SearchQuery(agent_id=agent_id, limit=limit, mode=mode, dense=vectors.dense, sparse=vectors.sparse)


def search_memory(store: Store, embedder: Embedder, agent_id: str | None, text: str, limit: int = 10,
                  mode: SearchMode = "hybrid", *, roles: tuple[str, ...] = (), since: float | None = None,
                  until: float | None = None, expand: bool = True, floor: float | None = None,
                  allow_cross_agent: bool = False, ranking: RankingConfig = DEFAULT_RANKING) -> list[dict[str, object]]:
    """Search in one thread (the CLI on a stopped daemon); raises CrossAgentRefused."""
    check_agent(agent_id, allow_cross_agent)
    request = MemoryRequest(agent_id, text, limit, mode, roles, since, until, expand, floor)
    return [hit_to_result(h) for h in run_search(store, request, embed_request(embedder, request), ranking)]


CONTEXT_HEADER = "Relevant memory from earlier conversations (oldest first):"


def _when(payload: dict[str, object]) -> str:
    stamp = payload.get("timestamp")
    return stamp[:16].replace("T", " ") if isinstance(stamp, str) and len(stamp) >= 16 else ""


def context_block(hits: Sequence[MemoryHit], max_chars: int) -> str:
    """A compact block to prepend to a prompt: one line per memory, in the order they were said.

    Which memories go in is decided by rank (the best first, while they fit in `max_chars`);
    the lines are then put back in time order so a question reads before its answer.
    Empty when there is nothing to say (no hit, or the floor held everything back).
    """
    budget = max_chars - len(CONTEXT_HEADER) - 1
    chosen: list[tuple[float, int, int, str]] = []
    for rank, hit in enumerate(hits):
        p = hit.payload
        text = " ".join(str(p.get("data") or "").split())
        if not text:
            continue
        when = _when(p)
        who = p.get("speaker") or p.get("role")  # a group member is named, not just "user"
        label = f"[{when} {who or ''}]".replace("[ ", "[") if when else f"[{who or 'memory'}]"
        if p.get("type") == "knowledge":
            label = f"[{when} noted]".replace("[ ", "[")
        line = f"- {label} {text}"
        room = budget - sum(len(c[3]) + 1 for c in chosen)
        if room < 40:
            break
        if len(line) + 1 > room:
            line = line[: room - 2] + "…"
        ts = p.get("ts")
        position = _position(p)
        chosen.append((float(ts) if isinstance(ts, (int, float)) else float("inf"),
                       position if position is not None else 0, rank, line))
    if not chosen:
        return ""
    chosen.sort(key=lambda c: (c[0], c[1], c[2]))
    return "\n".join([CONTEXT_HEADER, *(c[3] for c in chosen)])
