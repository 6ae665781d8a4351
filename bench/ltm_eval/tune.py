"""Choose the fusion knobs and the relevance threshold on the dev half of the labelled set; report the test half.

``python -m bench.ltm_eval.tune`` runs two grids, both judged on the dev half only:

1. fusion: ``lexical_gate`` x ``semantic`` weight x ``min_similarity``, best fused recall@2 (ties: recall@5,
   then the smaller change from the shipped values);
2. the relevance threshold under the chosen fusion: the highest abstention on the dev no-answer hints whose
   auto-surface recall@2 on the dev queries stays within ``--slack`` (default 0.01) of its recall@2 without a
   threshold.

Every line prints the test half beside the dev half; nothing of the test half steers a choice.
"""

from __future__ import annotations

import itertools
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import replace

from convmem.logstore.memories.retrieval import Retriever, Tuning

from . import memories, no_answer, queries
from .evaluate import abstention, recall, shared_embedder, surface_recall

GATES = (0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5)
SEMANTIC = (1.0, 1.5, 2.0, 3.0)
MIN_SIM = (0.1, 0.2, 0.3)
RELEVANCE = tuple(round(0.2 + 0.025 * i, 3) for i in range(17))  # 0.2 .. 0.6


def _retriever(tmp: str, t: Tuning) -> Retriever:
    r = Retriever(tmp, tuning=t, embedder=shared_embedder())
    r.load(memories())
    return r


def main(argv: Sequence[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m bench.ltm_eval.tune", description=__doc__)
    ap.add_argument("--slack", type=float, default=0.01)
    args = ap.parse_args(argv)
    qs = queries()
    dev, test = [q for q in qs if q.dev], [q for q in qs if not q.dev]
    base = Tuning()
    best: tuple[tuple[float, float, float], Tuning] | None = None
    with tempfile.TemporaryDirectory(prefix="ltm-tune-") as tmp:
        for gate, sem, ms in itertools.product(GATES, SEMANTIC, MIN_SIM):
            t = replace(base, lexical_gate=gate, semantic=sem, min_similarity=ms, relevance=-1.0)
            r = _retriever(tmp, t)
            d2, d5 = recall(r, dev, 2), recall(r, dev, 5)
            t2 = recall(r, test, 2)
            r.close()
            dist = abs(gate - base.lexical_gate) + abs(sem - base.semantic) + abs(ms - base.min_similarity)
            print(f"gate {gate:<5} semantic {sem:<4} min_sim {ms:<4} R@2 dev {d2:.3f} test {t2:.3f}  R@5 dev {d5:.3f}")
            score = (d2, d5, -dist)
            if best is None or score > best[0]:
                best = (score, t)
        assert best is not None
        chosen = best[1]
        print(f"chosen fusion: lexical_gate {chosen.lexical_gate}, semantic {chosen.semantic}, "
              f"min_similarity {chosen.min_similarity}")
        hints = no_answer()
        hdev, htest = [h for h in hints if h.dev], [h for h in hints if not h.dev]
        r = _retriever(tmp, chosen)
        floor = recall(r, dev, 2) - args.slack
        r.close()
        pick: tuple[float, float] | None = None
        for rel in RELEVANCE:
            r = _retriever(tmp, replace(chosen, relevance=rel))
            a_dev, a_test = abstention(r, hdev), abstention(r, htest)
            s_dev, s_test = surface_recall(r, dev), surface_recall(r, test)
            r.close()
            ok = s_dev >= floor
            print(f"relevance {rel:<6} abstention dev {a_dev:.3f} test {a_test:.3f}  "
                  f"surface R@2 dev {s_dev:.3f} test {s_test:.3f}{'' if ok else '  (recall not held)'}")
            if ok and (pick is None or a_dev > pick[1]):
                pick = (rel, a_dev)
        print(f"chosen relevance threshold: {pick[0] if pick else 'none holds the recall'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
