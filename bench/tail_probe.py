"""Which appends make the tail: time each 10-item append to one conversation and note whether the segment grew.

``python -m bench.tail_probe [N]`` appends N (default 2,000) batches of 10
items of about 1 KiB to one new conversation in a fresh data directory under
the current directory (so on the same disk as the project), then prints the
p50, p99 and p99.9 of all appends and, apart, of those whose segment file
grew (the appends that extended the preallocated space). Not part of the
bench's ratios: a probe that shows where ``append10_p99_over_p50`` comes from.
"""

from __future__ import annotations

import os
import shutil
import statistics
import sys
import tempfile
import time

from logstore import FileStore, layout


def main(n: int) -> None:
    root = tempfile.mkdtemp(prefix="tail-probe-", dir=".")
    try:
        store = FileStore(root)
        items = [{"role": "user", "text": "x" * 1000, "n": i} for i in range(10)]
        store.append("probe", "tail-probe", items)
        conv = layout.conversation_dir(root, "probe", "tail-probe")
        lat: list[float] = []
        grew: list[bool] = []
        for _ in range(n):
            seg = os.path.join(conv, max(f for f in os.listdir(conv) if f.endswith(".seg")))
            before = os.path.getsize(seg)
            t = time.perf_counter()
            store.append("probe", "tail-probe", items)
            lat.append((time.perf_counter() - t) * 1000)
            grew.append(os.path.getsize(seg) != before)
        store.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    q = statistics.quantiles(lat, n=1000)
    print(f"{n} appends: p50 {q[499]:.3f} ms, p99 {q[989]:.3f} ms, p99.9 {q[998]:.3f} ms")
    ext = [x for x, g in zip(lat, grew, strict=True) if g]
    rest = [x for x, g in zip(lat, grew, strict=True) if not g]
    if ext:
        print(f"{len(ext)} extended the segment: median {statistics.median(ext):.3f} ms, max {max(ext):.3f} ms")
    print(f"{len(rest)} wrote into preallocated space: median {statistics.median(rest):.3f} ms")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 2000)
