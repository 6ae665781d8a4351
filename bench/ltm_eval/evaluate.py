"""Recall of the long-term-memory retrieval on the labelled set, per ranking and per query group.

``python -m bench.ltm_eval.evaluate`` prints the table and the abstention
figures; the benchmark's ``memory`` workload reports the same figures. ``--at-scale 10000`` ranks the
labelled queries with the labelled memories among 10,000 synthetic ones
instead; ``--depth`` and ``--common-share`` try other settings.
"""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Sequence
from dataclasses import replace

from convmem.logstore.memories._semantic import Vectors
from convmem.logstore.memories.encoder import Encoder
from convmem.logstore.memories.retrieval import MemoryDoc, Retriever, Tuning

from . import Query, memories, no_answer, queries

KS = (1, 2, 5)
MODES = ("bm25", "embeddings", "fusion")


def mode_tuning(mode: str, base: Tuning | None = None) -> Tuning:
    """The tuning that ranks by one half alone, or by the fusion (``base``, default the shipped one)."""
    t = base or Tuning()
    if mode == "bm25":
        return replace(t, semantic=0.0, lexical=1.0)
    if mode == "embeddings":
        return replace(t, lexical=0.0, semantic=1.0)
    return t


class Memo:
    """An embedder that remembers every text's vector: tuning runs encode each text once."""

    def __init__(self, inner: Encoder) -> None:
        self.inner = inner
        self.dim = inner.dim
        self.model_id = inner.model_id
        self._seen: dict[str, Vectors] = {}
        self._queries: dict[tuple[str, tuple[str, ...]], tuple[Vectors, Vectors]] = {}

    def _get(self, text: str) -> Vectors:
        v = self._seen.get(text)
        if v is None:
            v = self._seen[text] = self.inner.embed_one(text)
        return v

    def embed_one(self, text: str) -> Vectors:
        return self._get(text)

    def embed_query(self, text: str, words: Sequence[str]) -> tuple[Vectors, Vectors]:
        key = (text, tuple(words))
        got = self._queries.get(key)
        if got is None:
            got = self._queries[key] = self.inner.embed_query(text, words)
        return got

    def embed(self, texts: Sequence[str]) -> Vectors:
        import numpy as np

        return np.stack([self._get(t) for t in texts]) if texts else self.inner.embed(texts)


class DocsOnly(Memo):
    """Remembers memory texts (``embed``) but encodes every query (``embed_one``) anew: for timing searches."""

    def embed_one(self, text: str) -> Vectors:
        return self.inner.embed_one(text)

    def embed_query(self, text: str, words: Sequence[str]) -> tuple[Vectors, Vectors]:
        return self.inner.embed_query(text, words)


_memo: list[Memo] = []


def shared_embedder() -> Memo:
    """One remembering wrapper of the shipped encoder for the whole run."""
    if not _memo:
        from convmem.logstore.memories.encoder import default_encoder

        _memo.append(Memo(default_encoder()))
    return _memo[0]


def docs_only() -> DocsOnly:
    """A :class:`DocsOnly` sharing :func:`shared_embedder`'s remembered memory vectors."""
    m = shared_embedder()
    d = DocsOnly(m.inner)
    d._seen = m._seen
    return d


def surfaced(r: Retriever, text: str, k: int = 2) -> list[str]:
    """What the auto-surface shows for ``text``: the relevant hits among the top ``k`` + 2, at most ``k``."""
    return [h.memory_id for h in r.search(text, limit=k + 2) if h.relevant][:k]


def surface_recall(r: Retriever, qs: Sequence[Query], k: int = 2) -> float:
    """:func:`recall` of what the auto-surface shows (relevant hits only)."""
    if not qs:
        return float("nan")
    return sum(len(set(surfaced(r, q.text, k)) & set(q.targets)) / min(len(q.targets), k) for q in qs) / len(qs)


def abstention(r: Retriever, hints: Sequence[Query], k: int = 2) -> float:
    """The share of ``hints`` (no memory relevant) for which the auto-surface shows nothing."""
    if not hints:
        return float("nan")
    return sum(not surfaced(r, h.text, k) for h in hints) / len(hints)


def recall(r: Retriever, qs: Sequence[Query], k: int) -> float:
    """Mean over ``qs`` of the share of each query's targets found in the top ``k`` (of at most k targets)."""
    if not qs:
        return float("nan")
    total = 0.0
    for q in qs:
        got = {h.memory_id for h in r.search(q.text, limit=k)}
        total += len(got & set(q.targets)) / min(len(q.targets), k)
    return total / len(qs)


def groups(qs: Sequence[Query]) -> dict[str, list[Query]]:
    return {
        "all": list(qs),
        "paraphrase": [q for q in qs if q.kind == "para"],
        "rest": [q for q in qs if q.kind != "para"],
    }


def evaluate(base: Tuning | None = None, docs: Sequence[MemoryDoc] | None = None,
             qs: Sequence[Query] | None = None) -> dict[str, dict[str, dict[int, float]]]:
    """``{mode: {group: {k: recall}}}`` over ``qs`` (default: every query)."""
    docs = list(docs if docs is not None else memories())
    qs = list(qs if qs is not None else queries())
    out: dict[str, dict[str, dict[int, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="ltm-eval-") as tmp:
        for mode in MODES:
            r = Retriever(tmp, tuning=mode_tuning(mode, base), embedder=shared_embedder())
            r.load(docs)
            out[mode] = {g: {k: recall(r, gq, k) for k in KS} for g, gq in groups(qs).items()}
            r.close()
    return out


def at_scale(distractors: Sequence[MemoryDoc], base: Tuning | None = None,
             qs: Sequence[Query] | None = None) -> dict[str, dict[int, float]]:
    """Fused recall ``{half: {k: recall}}`` (halves dev, test, all) with the labelled memories among ``distractors``.

    The distractors' ids are prefixed so that none can collide with a labelled id.
    """
    qs = list(qs if qs is not None else queries())
    docs = [replace(d, memory_id="distractor_" + d.memory_id) for d in distractors] + memories()
    halves = {"dev": [q for q in qs if q.dev], "test": [q for q in qs if not q.dev], "all": qs}
    with tempfile.TemporaryDirectory(prefix="ltm-eval-") as tmp:
        r = Retriever(tmp, tuning=base, embedder=shared_embedder())
        r.load(docs)
        out = {h: {k: recall(r, part, k) for k in KS} for h, part in halves.items()}
        r.close()
    return out


def abstention_figures(base: Tuning | None = None) -> dict[str, dict[str, float]]:
    """``{half: {figure: value}}`` for halves dev, test, all: abstention on the no-answer hints (all, near,
    far), the auto-surface's recall@2 on the answerable queries (all, paraphrases) and the ranking's recall@2,
    under ``base``."""
    qs, hints = queries(), no_answer()
    out: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="ltm-eval-") as tmp:
        r = Retriever(tmp, tuning=base, embedder=shared_embedder())
        r.load(memories())
        for half, keep in (("dev", lambda q: q.dev), ("test", lambda q: not q.dev), ("all", lambda q: True)):
            h = [x for x in hints if keep(x)]
            out[half] = {
                "abstention": abstention(r, h),
                "abstention_near": abstention(r, [x for x in h if x.kind == "near"]),
                "abstention_far": abstention(r, [x for x in h if x.kind == "far"]),
                "surface_recall2": surface_recall(r, [q for q in qs if keep(q)]),
                "surface_para_recall2": surface_recall(r, [q for q in qs if keep(q) and q.kind == "para"]),
                "recall2": recall(r, [q for q in qs if keep(q)], 2),
            }
        r.close()
    return out


def table(res: dict[str, dict[str, dict[int, float]]]) -> str:
    lines = [f"{'ranking':<11} {'group':<11} " + " ".join(f"R@{k:<5}" for k in KS)]
    for mode, by_group in res.items():
        for g, by_k in by_group.items():
            lines.append(f"{mode:<11} {g:<11} " + " ".join(f"{by_k[k]:<7.3f}" for k in KS))
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m bench.ltm_eval.evaluate", description=__doc__)
    ap.add_argument("--at-scale", type=int, metavar="N",
                    help="instead: fused recall with the labelled memories among N synthetic ones (bench/memory.py's)")
    ap.add_argument("--depth", type=int, help="fusion depth (default: the shipped Tuning's)")
    ap.add_argument("--common-share", type=float, help="the common-word cut's share (default: the shipped one)")
    args = ap.parse_args(argv)
    base = Tuning() if args.depth is None else Tuning(depth=args.depth)
    if args.common_share is not None:
        from convmem.logstore.memories import _lexical

        _lexical.COMMON_SHARE = args.common_share
    qs = queries()
    if args.at_scale is not None:
        import statistics
        import time

        from bench.memory import synthetic_docs

        distractors = synthetic_docs(args.at_scale)
        res = at_scale(distractors, base, qs)
        for half, by_k in res.items():
            print(f"{half:<5} " + " ".join(f"R@{k} {by_k[k]:.3f}" for k in KS))
        docs = [replace(d, memory_id="distractor_" + d.memory_id) for d in distractors] + memories()
        with tempfile.TemporaryDirectory(prefix="ltm-eval-") as tmp:
            r = Retriever(tmp, tuning=base, answers_kept=0)
            r.load(docs)
            ms = []
            for q in qs:
                t0 = time.perf_counter()
                r.search(q.text, limit=4)
                ms.append((time.perf_counter() - t0) * 1000)
            r.close()
        print(f"search (limit 4) p50 {statistics.median(ms):.2f} ms over {len(qs)} queries")
        return 0
    for name, part in (("dev", [q for q in qs if q.dev]), ("test", [q for q in qs if not q.dev]), ("all", qs)):
        print(f"== {name} ({len(part)} queries)")
        print(table(evaluate(base, qs=part)))
    print("== abstention (no-answer hints that surface nothing) and the auto-surface's recall@2")
    for half, figs in abstention_figures(base).items():
        print(f"{half:<5} " + " ".join(f"{k} {v:.3f}" for k, v in figs.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
