"""16 writers on distinct conversations: where their time goes. ``python -m bench.probes.writers16``.

The bench's ``concurrency`` case (threads, distinct conversations) alone: W
threads (default 16), each appending N batches (default 200) of 10 items of
about 1 KiB to a conversation of its own, created (first batch untimed)
before a barrier. Data in a fresh directory under the current one (the
project's disk). Prints batches/s from the barrier to the last writer's end
(background jobs waited for, as the bench does) and the p50/p99 of a batch.

Options that take the run apart:

* ``--backend floor``: the bench's pre-zeroed floor (:mod:`bench.floor_peer`)
  instead of convmem, in the same process, for the figure at the same load.
* ``--no-ahead``: extend-ahead jobs never run (``preallocation.run_extension`` is a
  no-op): appends extend the file themselves when the zeros run out.
* ``--syncs``: count every sync through the I/O seam's recorder
  (``logstore.fileio.recorder``), by who made it (an append's thread or a
  background job's) and what it synced (segment, site manifest, directory),
  and the appends whose write grew the segment file (a size change: metadata
  for the append's ``fdatasync``). Costs some CPU per operation.
* ``--timers``: wall time per batch in the manifest intent (its write, and its mutex and
  file lock when it is not leased), in segment ``fdatasync`` on the appends' threads, and
  what remains (CPU, the interpreter lock, other waits).

Repeat ``--rounds`` times (fresh conversations each round) and print each.
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

from bench.floor_peer import Floor
from convmem.logstore import fileio, manifest, open_store, preallocation

SITE = "probe"


def _items() -> list[dict[str, Any]]:
    return [{"role": "user", "text": "x" * 1000, "n": i} for i in range(10)]


class SyncCounter:
    """The recorder: syncs and growing writes, by thread (append or background) and file kind."""

    def __init__(self) -> None:
        self.syncs: collections.Counter[tuple[str, str]] = collections.Counter()
        self.grew = 0
        self._size: dict[str, int] = {}  # segment path -> its size, as the writes and cuts seen made it
        self._lock = threading.Lock()

    @staticmethod
    def _kind(path: str) -> str:
        if path.endswith(".seg"):
            return "segment"
        if "manifest" in path or path.endswith(".log"):
            return "manifest"
        return os.path.basename(path) or path

    def __call__(self, op: str, *args: Any) -> None:
        who = "background" if threading.current_thread().name.startswith("logstore-bg") else "append"
        if op == "sync":
            try:
                path = os.readlink(f"/proc/self/fd/{args[0]}")
            except OSError:
                path = "?"
            with self._lock:
                self.syncs[(who, self._kind(path))] += 1
        elif op == "dirsync":
            with self._lock:
                self.syncs[(who, "directory")] += 1
        elif op in ("write", "truncate"):
            try:
                path = os.readlink(f"/proc/self/fd/{args[0]}")
            except OSError:
                return
            if not path.endswith(".seg"):
                return
            with self._lock:
                if op == "truncate":
                    self._size[path] = args[1]
                    return
                end = args[1] + len(args[2])
                known = self._size.get(path)
                if known is None:  # first seen after its write: the size now, less what this write added
                    known = os.fstat(args[0]).st_size if end < os.fstat(args[0]).st_size else args[1]
                if end > known and who == "append":
                    self.grew += 1
                self._size[path] = max(known, end)


class Timers:
    """Wall seconds spent in the manifest intent and in the appends' segment syncs, summed over threads."""

    def __init__(self) -> None:
        self.intent = 0.0
        self.sync = 0.0
        self._lock = threading.Lock()
        real_intent = manifest.SiteManifest.intent
        real_sync = fileio.fdatasync

        def intent(m: manifest.SiteManifest, *a: Any, **k: Any) -> None:
            t = time.perf_counter()
            try:
                real_intent(m, *a, **k)
            finally:
                with self._lock:
                    self.intent += time.perf_counter() - t

        def fdatasync(fd: int) -> None:
            t = time.perf_counter()
            try:
                real_sync(fd)
            finally:
                if not threading.current_thread().name.startswith("logstore-bg"):
                    with self._lock:
                        self.sync += time.perf_counter() - t

        manifest.SiteManifest.intent = intent  # type: ignore[method-assign,assignment]
        fileio.fdatasync = fdatasync


def _run(append: Callable[[str], None], convs: list[str], n: int) -> tuple[float, list[float]]:
    barrier = threading.Barrier(len(convs))
    lats: list[float] = []
    starts: list[float] = []

    def work(conv: str) -> None:
        mine = []
        clock = time.perf_counter
        barrier.wait()
        starts.append(clock())
        for _ in range(n):
            s = clock()
            append(conv)
            mine.append(clock() - s)
        lats.extend(mine)

    threads = [threading.Thread(target=work, args=(c,)) for c in convs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    preallocation.wait_for_extensions()
    return len(convs) * n / (time.perf_counter() - min(starts)), lats


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--writers", type=int, default=16)
    ap.add_argument("--batches", type=int, default=200, help="batches per writer per round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--backend", choices=["convmem", "floor"], default="convmem")
    ap.add_argument("--no-ahead", action="store_true", help="no extend-ahead jobs")
    ap.add_argument("--syncs", action="store_true", help="count syncs (recorder)")
    ap.add_argument("--timers", action="store_true", help="time the manifest intent and the segment syncs")
    args = ap.parse_args()
    items = _items()
    root = tempfile.mkdtemp(prefix="writers16-", dir=".")
    counter = SyncCounter() if args.syncs else None
    timers = Timers() if args.timers else None
    if args.no_ahead:
        preallocation.run_extension = lambda job: None
    try:
        if args.backend == "floor":
            floor = Floor(root)
            backend: Any = floor
        else:
            backend = open_store(root)
        for r in range(args.rounds):
            convs = [f"w{args.writers}-r{r}-{i}" for i in range(args.writers)]
            for c in convs:
                backend.append(SITE, c, items)
                if args.backend == "floor":
                    floor.reserve(SITE, c, (args.batches + 1) * 10 * (1024 + 64))
            preallocation.wait_for_extensions()
            if counter is not None:
                counter.syncs.clear()
                counter.grew = 0
                fileio.recorder = counter
            if timers is not None:
                timers.intent = timers.sync = 0.0
            load = os.getloadavg()[0]
            cpu = time.process_time()
            rate, lats = _run(lambda conv: backend.append(SITE, conv, items), convs, args.batches)
            cpu = time.process_time() - cpu
            fileio.recorder = None
            q = statistics.quantiles(lats, n=100)
            total = len(lats)
            line = (f"round {r + 1}: {args.backend}{' no-ahead' if args.no_ahead else ''}, {args.writers} writers: "
                    f"{rate:,.0f} batches/s, p50 {q[49] * 1e3:.2f} ms, p99 {q[98] * 1e3:.2f} ms, process CPU "
                    f"{cpu / len(lats) * 1e6:.0f} us per batch, {cpu * rate / len(lats):.2f} cores (load {load:.2f})")
            print(line)
            if counter is not None:
                per = ", ".join(f"{who} {kind} {c / total:.3f}" for (who, kind), c in sorted(counter.syncs.items()))
                print(f"  syncs per batch: {per}; appends that grew the segment: {counter.grew / total:.3f}")
            if timers is not None:
                busy = sum(lats)
                rest = busy - timers.intent - timers.sync
                print(f"  per batch: manifest intent {timers.intent / total * 1e6:.0f} us, segment fdatasync "
                      f"{timers.sync / total * 1e6:.0f} us, the rest {rest / total * 1e6:.0f}"
                      f" us (of {busy / total * 1e6:.0f} us wall per batch)")
        backend.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
