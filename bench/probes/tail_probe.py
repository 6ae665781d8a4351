"""Which appends make the tail: time each 10-item append to one conversation, back to back, by class.

``python -m bench.probes.tail_probe [N]`` appends N (default 2,000) batches of 10
items of about 1 KiB to one new conversation in a fresh data directory under
the current directory (so on the same disk as the project), one after the
other with nothing between them (unlike the bench's interleaved appends, where
the other backends' calls leave gaps), then prints the p50, p99 and p99.9 of
all appends and, apart, the appends of each class:

* those that ran while an extend-ahead job was writing or syncing zeros
  (``logstore.preallocation``: the job's I/O competes with the append's sync);
* those whose segment file grew during the call with no job running (the
  append extended the file itself, records and zeros in one write and sync;
  or a segment roll);
* the rest: writes into space already zeroed and synced.

Not part of the bench's ratios: a probe that shows where
``append10_p99_over_p50`` comes from. It times the jobs by wrapping
``Preallocated._extend_ahead`` in this process.
"""

from __future__ import annotations

import os
import shutil
import statistics
import sys
import tempfile
import time

from convmem.logstore import FileStore, layout
from convmem.logstore.preallocation import Preallocated, wait_for_extensions


def _spans() -> list[tuple[float, float]]:
    """Start and end of every extend-ahead job run from now on (the job wrapped in place)."""
    spans: list[tuple[float, float]] = []
    job = Preallocated._extend_ahead

    def timed(self: Preallocated) -> None:
        t = time.perf_counter()
        try:
            job(self)
        finally:
            spans.append((t, time.perf_counter()))

    Preallocated._extend_ahead = timed  # type: ignore[method-assign]
    return spans


def _line(name: str, xs: list[float]) -> str:
    if not xs:
        return f"{name}: none"
    return f"{len(xs)} {name}: median {statistics.median(xs):.3f} ms, max {max(xs):.3f} ms"


def main(n: int) -> None:
    jobs = _spans()
    root = tempfile.mkdtemp(prefix="tail-probe-", dir=".")
    try:
        store = FileStore(root)
        items = [{"role": "user", "text": "x" * 1000, "n": i} for i in range(10)]
        store.append("probe", "tail-probe", items)
        conv = layout.conversation_dir(root, "probe", "tail-probe")
        calls: list[tuple[float, float, bool]] = []
        for _ in range(n):
            seg = os.path.join(conv, max(f for f in os.listdir(conv) if f.endswith(".seg")))
            before = os.path.getsize(seg)
            t = time.perf_counter()
            store.append("probe", "tail-probe", items)
            calls.append((t, time.perf_counter(), os.path.getsize(seg) != before))
        wait_for_extensions()
        store.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    lat = [(e - t) * 1000 for t, e, _g in calls]
    q = statistics.quantiles(lat, n=1000)
    print(f"{n} appends: p50 {q[499]:.3f} ms, p99 {q[989]:.3f} ms, p99.9 {q[998]:.3f} ms, "
          f"p99/p50 {q[989] / q[499]:.2f}; {len(jobs)} extend-ahead jobs")
    overlapped, grew, rest = [], [], []
    for (t, e, g), x in zip(calls, lat, strict=True):
        if any(a < e and b > t for a, b in jobs):
            overlapped.append(x)
        elif g:
            grew.append(x)
        else:
            rest.append(x)
    print(_line("ran beside an extend-ahead job", overlapped))
    print(_line("grew the segment themselves (extension or roll)", grew))
    print(_line("wrote into space already there", rest))


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 2000)
