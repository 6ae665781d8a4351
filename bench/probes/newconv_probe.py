"""Where a first append's time goes, in the engine (``python -m bench.probes.newconv_probe``).

Three kinds of call, interleaved op by op in one process, each in its own
store (so that one's background work never falls into another's call), the
background jobs (pool refills, extend-ahead) waited for between calls and
not timed, as ``python -m bench`` does:

* ``pool``: a first append of 10 items (``--item-bytes`` each) to a new conversation, with the
  site's pool of conversation directories on (what a claim costs);
* ``in-place``: the same, with the pool off (the conversation's directory,
  lock file and first segment created on the append's path);
* ``next``: an ordinary 10-item append to an existing conversation.

For each it prints the p50 of the wall time and of the calling thread's CPU
time (``time.thread_time``: the interpreter's work and the system calls made
on that thread, not the syncs run on helper threads), and the background
time per call, and the p50 of the time inside the system calls that make a
batch durable (``pwritev``, ``pwrite``, ``fdatasync``, ``fsync``, timed by
wrapping them on the calling thread, :func:`bench.probes.append_split.timed_durable_calls`) and
of the rest of the call. ``--profile`` then runs ``--profile-n`` pool claims under
``cProfile`` and prints the functions by their own time. Run it against
another copy of the engine with ``PYTHONPATH=/that/copy`` (a store without a
pool option runs ``in-place`` and ``next`` only).
"""

from __future__ import annotations

import argparse
import cProfile
import inspect
import os
import pstats
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

from bench.probes.append_split import timed_durable_calls
from bench.util import payloads
from convmem import logstore
from convmem.logstore import FileStore
from convmem.logstore.preallocation import wait_for_extensions


def _store(root: str, pool: bool | None) -> FileStore:
    if pool is None:
        return FileStore(root)
    return FileStore(root, conversation_pool=pool)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.probes.newconv_probe", description=__doc__.splitlines()[0])
    p.add_argument("-n", type=int, default=300, help="calls of each kind (default 300)")
    p.add_argument("--dir", help="directory to work in (default: a temporary one on the working disk)")
    p.add_argument("--item-bytes", type=int, default=1024,
                   help="bytes of each of the batch's 10 items (default 1024, as python -m bench)")
    p.add_argument("--profile", action="store_true", help="then profile pool claims")
    p.add_argument("--profile-n", type=int, default=300)
    args = p.parse_args(argv)
    spent = timed_durable_calls(("pwritev", "pwrite", "fdatasync", "fsync"), calling_thread_only=True)
    items = payloads(10, args.item_bytes)
    has_pool = "conversation_pool" in inspect.signature(FileStore.__init__).parameters
    base = tempfile.mkdtemp(prefix="newconv-probe-", dir=args.dir or os.getcwd())
    print(f"engine: {os.path.dirname(logstore.__file__)}")
    try:
        stores: dict[str, FileStore] = {}
        if has_pool:
            stores["pool"] = _store(os.path.join(base, "pool"), True)
        stores["in-place"] = _store(os.path.join(base, "inplace"), False if has_pool else None)
        stores["next"] = _store(os.path.join(base, "next"), False if has_pool else None)
        for s in stores.values():
            s.append("site-one", "warm-up-conversation", items)  # the site, its manifest (and its pool) exist
        wait_for_extensions()
        counter = [0]

        def first(s: FileStore) -> Callable[[], Any]:
            return lambda: s.append("site-one", f"conversation-{counter[0]:07d}", items)

        fns: dict[str, Callable[[], Any]] = {k: first(s) for k, s in stores.items() if k != "next"}
        fns["next"] = lambda: stores["next"].append("site-one", "warm-up-conversation", items)
        wall: dict[str, list[float]] = {k: [] for k in fns}
        cpu: dict[str, list[float]] = {k: [] for k in fns}
        durable: dict[str, list[float]] = {k: [] for k in fns}
        bg: dict[str, float] = dict.fromkeys(fns, 0.0)
        for i in range(args.n):
            counter[0] = i
            for k, fn in fns.items():
                spent[0] = 0.0
                c0, t0 = time.thread_time(), time.perf_counter()
                fn()
                t1, c1 = time.perf_counter(), time.thread_time()
                wall[k].append(t1 - t0)
                durable[k].append(spent[0])
                cpu[k].append(c1 - c0)
                wait_for_extensions()
                bg[k] += time.perf_counter() - t1
        nxt = statistics.median(wall["next"])
        print(f"{'kind':<10} {'p50 ms':>8} {'p90 ms':>8} {'CPU p50 ms':>11} {'bg µs/call':>11} {'p50 / next':>11} "
              f"{'durable p50':>12} {'rest p50':>9}")
        for k in fns:
            w = sorted(wall[k])
            print(f"{k:<10} {statistics.median(w) * 1e3:8.3f} {w[int(len(w) * 0.9)] * 1e3:8.3f} "
                  f"{statistics.median(cpu[k]) * 1e3:11.3f} {bg[k] / args.n * 1e6:11.0f} "
                  f"{statistics.median(w) / nxt:11.2f} {statistics.median(durable[k]) * 1e3:12.3f} "
                  f"{statistics.median([a - b for a, b in zip(wall[k], durable[k], strict=True)]) * 1e3:9.3f}")
        if args.profile and has_pool:
            s = stores["pool"]
            prof = cProfile.Profile()
            for i in range(args.profile_n):
                name = f"profiled-{i:07d}"
                prof.enable()
                s.append("site-one", name, items)
                prof.disable()
                wait_for_extensions()
            st = pstats.Stats(prof)
            st.sort_stats("tottime").print_stats(25)
        for s in stores.values():
            s.close()
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
