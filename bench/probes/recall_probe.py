"""Microseconds per recall: convmem's read path against the tuned SQLite, and against another copy of logstore.

``python -m bench.probes.recall_probe [--items N] [--ops N] [--baseline DIR]``
builds, in a fresh directory under the current one, a conversation of N
items (default 20,000) of about 1 KiB in 10-item batches and one of the same
length in 250-item batches, in convmem and in the bench's tuned SQLite
(:mod:`bench.sqlite_peer`), then times single calls, every backend taking
turns op by op: the last 50 items (``Tail(50)``, decoded and raw), the last
50 of the 250-item-batch conversation, a 1,000-item page of a replay, and
the last 50 raw through ``try_read_raw`` (what the MCP server calls first).

``--baseline DIR`` names a directory holding another copy of the engine as
the package ``logstore_main`` (for instance ``git archive main logstore |
tar -x -C DIR`` and renaming ``logstore`` to ``logstore_main``): it reads
the same data directory in the same process, interleaved with the others,
so a change is measured against the code it replaces in the same run.
Prints the median in microseconds and convmem's speed over each other's
(ratios of medians; the machine is shared, absolute times move).
Not part of the bench's ratios.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

from bench.sqlite_peer import Sqlite
from bench.util import engine_sync_disabled, payloads

SITE = "probe"
COUNT = 50
PAGE = 1000


def _build(store: Any, peer: Sqlite, conv: str, n: int, batch: int) -> None:
    chunk = payloads(1000)
    for start in range(0, n, batch):
        k = start % 1000
        items = [dict(p, n=start + i) for i, p in enumerate(chunk[k : k + min(batch, n - start)])]
        store.append(SITE, conv, items)
        peer.append(SITE, conv, items)


def _build_all(root: str, items: int) -> None:
    from convmem import logstore

    peer = Sqlite(f"{root}/sqlite.db")
    store = logstore.open_store(f"{root}/convmem")
    peer.set_synchronous("OFF")
    with engine_sync_disabled():
        _build(store, peer, "probe-narrow", items, 10)
        _build(store, peer, "probe-wide", items, 250)
    peer.set_synchronous("FULL")
    store.close()
    peer.close()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--items", type=int, default=20_000)
    ap.add_argument("--ops", type=int, default=3000)
    ap.add_argument("--baseline", help="directory holding the package logstore_main")
    ap.add_argument("--only", default="", help="comma-separated cases: tail,raw,wide,replay,try")
    ap.add_argument("--build-into", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    from convmem import logstore

    if args.build_into:
        _build_all(args.build_into, args.items)
        return
    stores: dict[str, Any] = {}
    root = tempfile.mkdtemp(prefix="recall-probe-", dir=".")
    try:
        # Built by a child process, so every reader here starts from the same fresh heap.
        build = ["--items", str(args.items), "--build-into", root]
        subprocess.run([sys.executable, "-m", "bench.probes.recall_probe", *build], check=True)
        peer = Sqlite(f"{root}/sqlite.db")
        stores["convmem"] = logstore.open_store(f"{root}/convmem")
        if args.baseline:
            sys.path.insert(0, args.baseline)
            base = importlib.import_module("logstore_main")
            stores["main"] = base.open_store(f"{root}/convmem")
        fns: dict[str, Callable[[], object]] = {}
        cases = {c for c in args.only.split(",") if c} or {"tail", "raw", "wide", "replay", "try"}
        page = {"start": 0}

        def replay_start(i: int) -> None:
            page["start"] = (i * PAGE) % args.items

        for name, s in stores.items():
            mod = sys.modules[type(s).__module__.rsplit(".", 1)[0]]
            tail, rng = mod.Tail(COUNT), mod.Range
            if "tail" in cases:
                fns[f"tail|{name}"] = functools.partial(s.read, SITE, "probe-narrow", tail)
            if "raw" in cases:
                fns[f"raw|{name}"] = functools.partial(s.read_raw, SITE, "probe-narrow", tail)
            if "try" in cases:
                fns[f"try|{name}"] = functools.partial(s.try_read_raw, SITE, "probe-narrow", tail, 1 << 20)
            if "wide" in cases:
                fns[f"wide|{name}"] = functools.partial(s.read, SITE, "probe-wide", tail)
            if "replay" in cases:
                fns[f"replay|{name}"] = functools.partial(_replay_page, s, rng, page)
        if cases & {"tail", "raw", "try"}:
            fns["tail|sqlite"] = lambda: peer.tail(SITE, "probe-narrow", COUNT)
        if "wide" in cases:
            fns["wide|sqlite"] = lambda: peer.tail(SITE, "probe-wide", COUNT)
        if "replay" in cases:
            fns["replay|sqlite"] = lambda: peer.range(SITE, "probe-narrow", page["start"], PAGE)
        for fn in fns.values():
            fn()
        out = _interleave(args.ops, fns, replay_start)
        for case in ("tail", "raw", "try", "wide", "replay"):
            keys = [k for k in out if k.startswith(case + "|")]
            if not keys:
                continue
            sq = statistics.median(out.get(f"{'tail' if case in ('raw', 'try') else case}|sqlite", [float("nan")]))
            for k in keys:
                med = statistics.median(out[k])
                print(f"{k:16s} p50 {med * 1e6:8.1f} us   vs sqlite {sq / med:5.2f}x"
                      + (f"   vs main {statistics.median(out[k.split('|')[0] + '|main']) / med:5.2f}x"
                         if f"{case}|main" in out and k.endswith("|convmem") else ""))
    finally:
        for s in stores.values():
            s.close()
        shutil.rmtree(root, ignore_errors=True)


def _replay_page(store: Any, rng: Any, page: dict[str, int]) -> object:
    """One replay page of the narrow conversation, from where ``page`` says the turn starts."""
    return store.read(SITE, "probe-narrow", rng(page["start"], PAGE))


def _interleave(n: int, fns: dict[str, Callable[[], object]], before: Callable[[int], None]) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {k: [] for k in fns}
    names = list(fns)
    clock = time.perf_counter
    rnd = random.Random(1)
    for i in range(n):
        before(i)
        # A fresh order every turn: a fixed cyclic order would give each call the same
        # predecessor (whose cache footprint it then always pays).
        rnd.shuffle(names)
        for name in names:
            fn = fns[name]
            t0 = clock()
            fn()
            out[name].append(clock() - t0)
    return out


if __name__ == "__main__":
    main()
