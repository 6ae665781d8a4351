"""Where one append's wall time goes, convmem against the floor: ``python -m bench.probes.append_split [ITEMS ...]``.

One conversation per backend in a fresh data directory under the current
directory (on the project's disk), its first batch untimed; then N appends
(default 2,000) of ITEMS items of about 1 KiB (default 1 and 10), convmem and
the pre-zeroed floor (:mod:`bench.floor_peer`) taking turns op by op. Each
append's wall time is split into the time inside the system calls that make
the batch durable (``pwritev``, ``pwrite`` and ``fdatasync``, timed by
wrapping them in this process) and the rest: the interpreter's work and every
other system call of the append. Prints the p50 of each part per backend:
the durable calls cost both backends the same, so the difference between
their totals is what convmem adds to the floor.
"""

from __future__ import annotations

import argparse
import functools
import os
import shutil
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

from bench.floor_peer import Floor
from bench.util import payloads
from convmem.logstore.filestore import open_store

SITE = "site-split"
CONV = "conversation-split"


def timed_durable_calls(names: tuple[str, ...] = ("pwritev", "pwrite", "fdatasync"), calling_thread_only: bool = False
                        ) -> list[float]:
    """Wrap the ``os`` functions ``names`` so that their time adds up in the list's one slot.

    ``calling_thread_only``: only the calls made on the thread that wraps them
    count (not those of sync helpers or background jobs).
    """
    spent = [0.0]
    clock = time.perf_counter
    me = threading.get_ident()

    def wrap(real: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any) -> Any:
            if calling_thread_only and threading.get_ident() != me:
                return real(*args)
            t = clock()
            try:
                return real(*args)
            finally:
                spent[0] += clock() - t

        return call

    for name in names:
        setattr(os, name, wrap(getattr(os, name)))
    return spent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("items", nargs="*", type=int, default=[1, 10])
    ap.add_argument("-n", type=int, default=2000, help="appends per backend")
    args = ap.parse_args()
    spent = timed_durable_calls()
    clock = time.perf_counter
    for items in args.items:
        root = tempfile.mkdtemp(prefix="append-split-", dir=".")
        try:
            batch = payloads(items, 1024)
            store = open_store(os.path.join(root, "convmem"))
            floor = Floor(os.path.join(root, "floor"))
            store.append(SITE, CONV, batch)
            floor.append(SITE, CONV, batch)
            floor.reserve(SITE, CONV, (args.n + 1) * items * (1024 + 64))
            calls: dict[str, Callable[[], object]] = {
                "convmem": functools.partial(store.append, SITE, CONV, batch),
                "floor": functools.partial(floor.append, SITE, CONV, batch),
            }
            total: dict[str, list[float]] = {k: [] for k in calls}
            durable: dict[str, list[float]] = {k: [] for k in calls}
            for i in range(args.n):
                for name in (("convmem", "floor") if i % 2 else ("floor", "convmem")):
                    spent[0] = 0.0
                    t = clock()
                    calls[name]()
                    total[name].append(clock() - t)
                    durable[name].append(spent[0])
            store.close()
            floor.close()
        finally:
            shutil.rmtree(root, ignore_errors=True)
        load = os.getloadavg()[0]
        for name in calls:
            rest = [a - b for a, b in zip(total[name], durable[name], strict=True)]
            print(f"{items:3d} items, {name:7s}: p50 {statistics.median(total[name]) * 1e3:.3f} ms = durable calls "
                  f"{statistics.median(durable[name]) * 1e3:.3f} ms + the rest {statistics.median(rest) * 1e6:.0f} us "
                  f"(p50 of each; load {load:.2f})")


if __name__ == "__main__":
    main()
