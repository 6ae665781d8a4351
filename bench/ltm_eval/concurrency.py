"""Does ranking serialise? ``Retriever.search`` p50 with 8 calls in flight against its p50 alone.

``python -m bench.ltm_eval.concurrency [--threads 8] [--calls 240]``: one site's retriever over the labelled
memories (their vectors encoded once first), then ``--calls`` searches, each with a hint never searched
before (so each one runs the encoder), first one at a time, then from ``--threads`` threads at once. Prints
both p50s and their ratio, and the 1-minute load average before and after: on a shared machine the ratio is
only as good as the cores it got.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Sequence

from convmem.logstore.memories.retrieval import Retriever

from . import memories, no_answer, queries
from .evaluate import docs_only


def _hints(n: int) -> list[str]:
    base = [q.text for q in queries()] + [h.text for h in no_answer()]
    return [f"{base[i % len(base)]} ({i})" for i in range(n)]


def main(argv: Sequence[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m bench.ltm_eval.concurrency", description=__doc__)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--calls", type=int, default=240)
    a = ap.parse_args(argv)
    load0 = open("/proc/loadavg").read().split()[0]
    with tempfile.TemporaryDirectory(prefix="ltm-conc-") as tmp:
        r = Retriever(tmp, answers_kept=0, query_vectors_kept=0, embedder=docs_only())
        r.load(memories())
        for h in _hints(20):  # warm up
            r.search("warm " + h, limit=10)
        hints = _hints(2 * a.calls)
        alone = []
        for h in hints[: a.calls]:
            t0 = time.perf_counter()
            r.search(h, limit=10)
            alone.append((time.perf_counter() - t0) * 1000)
        together: list[float] = []
        lock = threading.Lock()
        todo = iter(hints[a.calls:])

        def worker() -> None:
            while True:
                with lock:
                    h = next(todo, None)
                if h is None:
                    return
                t0 = time.perf_counter()
                r.search(h, limit=10)
                ms = (time.perf_counter() - t0) * 1000
                with lock:
                    together.append(ms)

        threads = [threading.Thread(target=worker) for _ in range(a.threads)]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - t0
        r.close()
    p1, p8 = statistics.median(alone), statistics.median(together)
    load1 = open("/proc/loadavg").read().split()[0]
    print(f"search p50 alone {p1:.2f} ms; with {a.threads} in flight {p8:.2f} ms: {p8 / p1:.2f}x "
          f"({a.calls / wall:.0f} searches/s together, {1000 / p1:.0f}/s alone); load average {load0} -> {load1}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
