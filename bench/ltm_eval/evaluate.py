"""Recall of the long-term-memory retrieval on the labelled set, per ranking and per query group.

``python -m bench.ltm_eval.evaluate`` prints the table; the benchmark's
``memory`` workload reports the same figures.
"""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Sequence
from dataclasses import replace

from logstore.memories.retrieval import MemoryDoc, Retriever, Tuning

from . import Query, memories, queries

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
            r = Retriever(tmp, tuning=mode_tuning(mode, base))
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
        r = Retriever(tmp, tuning=base)
        r.load(docs)
        out = {h: {k: recall(r, part, k) for k in KS} for h, part in halves.items()}
        r.close()
    return out


def table(res: dict[str, dict[str, dict[int, float]]]) -> str:
    lines = [f"{'ranking':<11} {'group':<11} " + " ".join(f"R@{k:<5}" for k in KS)]
    for mode, by_group in res.items():
        for g, by_k in by_group.items():
            lines.append(f"{mode:<11} {g:<11} " + " ".join(f"{by_k[k]:<7.3f}" for k in KS))
    return "\n".join(lines)


def main() -> int:
    qs = queries()
    for name, part in (("dev", [q for q in qs if q.dev]), ("test", [q for q in qs if not q.dev]), ("all", qs)):
        print(f"== {name} ({len(part)} queries)")
        print(table(evaluate(qs=part)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
