"""BM25 lookups from several threads, with SQLite's heap statistics on and off.

``python -m bench.probes.fts_threads [--threads N] [--lookups N] [--pairs N]``
builds, in a child process per run, the lexical index of a 10,000-memory
site (the bench's synthetic memories) and ranks the labelled set's hints
through its read connections (:meth:`LexicalIndex.reading`), first on one
thread, then on ``--threads`` threads at once. Each pair runs a child with
the statistics on (``CONVMEM_SQLITE_MEMSTATUS=1``) and one where
:func:`~logstore.memories.sqlite_statistics.turn_off_sqlite_statistics` ran
first, as ``convmem serve`` runs it, alternating. Prints, per child,
lookups per second and the process's CPU per lookup, alone and with the
threads, and the load average. Not part of the bench's ratios: the bench's
``ltm_search_inflight_vs_alone`` is the whole search (encoder, fusion) the
same way.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time

_CHILD = "--child"


def _child(threads: int, lookups: int) -> dict[str, object]:
    from bench.ltm_eval import queries
    from bench.memory import synthetic_docs
    from convmem.logstore.memories._lexical import LexicalIndex, query_terms
    from convmem.logstore.memories.sqlite_statistics import turn_off_sqlite_statistics

    outcome = turn_off_sqlite_statistics()
    index = LexicalIndex()
    index.put_many((i, d.subject, d.summary, d.details, d.tags) for i, d in enumerate(synthetic_docs(10_000)))
    hints = [t for t in (query_terms(q.text) for q in queries()) if t]

    def work(n: int, start: int) -> None:
        with index.reading() as db:
            for i in range(n):
                index.rank(hints[(start + i) % len(hints)], limit=10, db=db)

    work(len(hints), 0)  # warm: the pages, the read connection

    def timed(n_threads: int) -> tuple[float, float]:
        per = lookups // n_threads
        pool = [threading.Thread(target=work, args=(per, k * 7)) for k in range(n_threads)]
        cpu, wall = time.process_time(), time.perf_counter()
        for t in pool:
            t.start()
        for t in pool:
            t.join()
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        return per * n_threads / wall, cpu * 1e3 / (per * n_threads)

    alone, together = timed(1), timed(threads)
    index.close()
    return {"statistics_off": outcome.off, "detail": outcome.detail, "alone_per_s": alone[0],
            "alone_cpu_ms": alone[1], "together_per_s": together[0], "together_cpu_ms": together[1]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.probes.fts_threads", description=__doc__.split("\n")[0])
    p.add_argument("--threads", type=int, default=8)
    p.add_argument("--lookups", type=int, default=4_000, help="lookups per timed phase (default 4,000)")
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument(_CHILD, action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(_child(args.threads, args.lookups)))
        return 0
    print(f"{'statistics':<11} {'alone/s':>8} {'cpu ms':>7} {f'{args.threads} thr/s':>9} {'cpu ms':>7}  load")
    for _ in range(args.pairs):
        for keep in ("1", "0"):
            env = dict(os.environ, CONVMEM_SQLITE_MEMSTATUS=keep)
            out = subprocess.run([sys.executable, "-m", "bench.probes.fts_threads", _CHILD, "--threads",
                                  str(args.threads), "--lookups", str(args.lookups)],
                                 env=env, check=True, capture_output=True, text=True).stdout
            r = json.loads(out.strip().splitlines()[-1])
            state = "off" if r["statistics_off"] else "on"
            print(f"{state:<11} {r['alone_per_s']:>8,.0f} {r['alone_cpu_ms']:>7.3f} {r['together_per_s']:>9,.0f} "
                  f"{r['together_cpu_ms']:>7.3f}  {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
