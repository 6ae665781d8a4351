"""The CPU time of an append, with the sync taken out: ``python -m bench.probes.append_cpu [ITEMS ...]``.

Appends round-robin to 8 conversations (new ones each round, their first
append untimed) of a store on tmpfs (``/dev/shm``, where ``fdatasync`` costs
under a microsecond; elsewhere a temporary directory, and the figure then
includes the disk), 1,500 appends per round, 5 rounds, and prints the
process CPU time per append (best and median round) for each batch size.
To compare two versions of the engine, run it under each (e.g.
``PYTHONPATH=/path/to/other/checkout``) alternately, several times: the
machine's other load moves the figures. ``--profile`` prints a cProfile of
one round instead.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import shutil
import tempfile
import time

from convmem import logstore
from convmem.logstore.filestore import open_store

CONVS = 8


def _round(store: logstore.FileStore, batch: list[dict[str, object]], n: int, r: int) -> float:
    """CPU µs per append of ``n`` appends over round ``r``'s own conversations (created untimed first)."""
    convs = [f"conv-{r:04d}-{c:02d}" for c in range(CONVS)]
    for conv in convs:
        store.append("site", conv, batch)
    started = time.process_time()
    for i in range(n):
        store.append("site", convs[i % CONVS], batch)
    return (time.process_time() - started) / n * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("items", nargs="*", type=int, default=[1, 10, 100])
    ap.add_argument("--appends", type=int, default=1500, help="appends per round")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--sort", default="tottime", help="with --profile: the pstats sort key")
    args = ap.parse_args()
    where = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    print(f"engine: {os.path.dirname(logstore.__file__)}; data on {where or tempfile.gettempdir()}")
    for items in args.items:
        d = tempfile.mkdtemp(dir=where, prefix="append-cpu-")
        try:
            store = open_store(d)
            batch: list[dict[str, object]] = [{"role": "user", "text": f"hi {i}", "n": i} for i in range(items)]
            _round(store, batch, args.appends, -1)  # warm-up
            if args.profile:
                prof = cProfile.Profile()
                prof.enable()
                _round(store, batch, args.appends, 0)
                prof.disable()
                pstats.Stats(prof).sort_stats(args.sort).print_stats(25)
            else:
                rounds = sorted(_round(store, batch, args.appends, r) for r in range(args.rounds))
                median = rounds[len(rounds) // 2]
                print(f"{items:4d} items: {rounds[0]:6.1f} µs CPU per append (median round {median:.1f})")
            store.close()
        finally:
            shutil.rmtree(d)


if __name__ == "__main__":
    main()
