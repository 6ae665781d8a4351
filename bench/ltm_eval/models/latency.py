"""Per-query encode latency (single thread) and RSS of one embedder, in a fresh process.

Usage (from the repository root, in the kit's venv; one model per process)::

    $CONVMEM_MODELS_DIR/venv/bin/python -m bench.ltm_eval.models.latency NAME [--out FILE]

Measures p50/p95 ms of ``embed_one`` over the 266 eval queries (3 passes, after 30 warm-up calls), both
in the form the Retriever passes it (the joined query terms) and as typed (raw); RSS before and after
loading the model; and p50/p95 of a whole ``Retriever.search`` (shipped tuning, fusion, limit 4, no
answer cache, query vectors not cached) over the 304 labelled memories with this embedder. Prints one
JSON line, and appends it to ``--out`` when given (one file per round: latency.jsonl, latency2.jsonl, ...).
"""

from __future__ import annotations

import os

# before numpy or any model library is loaded
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import argparse
import gc
import json
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import psutil

from bench.ltm_eval import memories, queries
from bench.ltm_eval.models import embedders
from convmem.logstore.memories._lexical import query_terms
from convmem.logstore.memories.retrieval import Retriever


def rss_mb() -> float:
    return float(psutil.Process().memory_info().rss / 2**20)


def pct(xs: Sequence[float], p: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, round(p / 100 * (len(s) - 1)))]


def timeit(fn: Callable[[str], object], texts: Sequence[str], passes: int = 3, warm: int = 30) -> dict[str, float]:
    """p50/p95 ms of ``fn`` over ``passes`` rounds of ``texts``, after ``warm`` warm-up calls."""
    for t in texts[:warm]:
        fn(t)
    ms = []
    for _ in range(passes):
        for t in texts:
            t0 = time.perf_counter()
            fn(t)
            ms.append((time.perf_counter() - t0) * 1000)
    return {"p50": round(statistics.median(ms), 3), "p95": round(pct(ms, 95), 3), "n": len(ms)}


def measure(name: str) -> dict[str, Any]:
    qs = queries()
    raw_q = [q.text for q in qs]
    terms_q = [" ".join(query_terms(q.text)) for q in qs]
    # import the heavy libraries first so that the RSS delta counts the model only
    import onnxruntime  # noqa: F401
    import tokenizers  # noqa: F401

    gc.collect()
    r0 = rss_mb()
    t0 = time.perf_counter()
    emb = embedders.make(name, cache=False)
    load_s = time.perf_counter() - t0
    emb.embed_one("warm up")
    r1 = rss_mb()
    out: dict[str, Any] = {"model": name, "dim": emb.dim, "load_s": round(load_s, 2), "rss_before_mb": round(r0, 1),
                           "rss_after_load_mb": round(r1, 1), "rss_delta_mb": round(r1 - r0, 1)}
    out["encode_terms"] = timeit(emb.embed_one, terms_q)
    out["encode_raw"] = timeit(emb.embed_one, raw_q)
    if isinstance(emb, embedders.M2V):
        out["encode_terms_fastpath"] = timeit(emb.fast_one, terms_q)
        out["encode_raw_fastpath"] = timeit(emb.fast_one, raw_q)
        # the fast path must give model2vec's own vector
        out["fastpath_max_abs_diff"] = max(
            float(np.abs(emb.fast_one(t) - emb.encode([t], True)[0]).max()) for t in raw_q[:50])
    with tempfile.TemporaryDirectory(prefix="ltm-models-") as tmp:
        r = Retriever(tmp, embedder=emb, answers_kept=0)
        r.load(memories())
        out["search_limit4"] = timeit(lambda t: r.search(t, limit=4), raw_q)
        r.close()
    out["rss_end_mb"] = round(rss_mb(), 1)
    out["loadavg_1m_at_end"] = os.getloadavg()[0]
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.ltm_eval.models.latency", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("name", help=f"one model: {', '.join(embedders.NAMES)}, m2v-<dir>")
    ap.add_argument("--out", type=Path, help="also append the JSON line to this file")
    a = ap.parse_args(argv)
    line = json.dumps(measure(a.name))
    print(line, flush=True)
    if a.out is not None:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        with a.out.open("a") as f:
            f.write(line + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
