"""What the power-cut safe listing costs: first appends per epoch, and the first listing.

``python -m bench.probes.manifest_recovery [N] [--dir DIR]``. A site of N conversations
(one batch each) is written and closed; a new store (a restarted process) then
appends to each conversation three times, round-robin: the first append of
each conversation in this process and epoch syncs its intent to the manifest
log, the later ones do not. Then a new store times its first listing as after
a plain restart (nothing to check) and as after a reboot (every conversation
written before it is checked against its log). Prints the fdatasync/fsync
calls per append (counted through ``fileio.fault_hook``) and medians of times
over three runs.

To compare with another tree, run it with ``PYTHONPATH=/that/tree``.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

from convmem import logstore
from convmem.logstore import FileStore, ListSelector, bootid, fileio

SITE = "benchsite"


def _round(root: str, n: int, res: dict[str, list[float]]) -> None:
    store = FileStore(root)
    convs = [f"bench-conv-{i:05d}" for i in range(n)]
    for c in convs:
        store.append(SITE, c, [{"k": 0}])
    store.close()
    store = FileStore(root)
    first: list[float] = []
    later: list[float] = []
    syncs = [0, 0]
    for rep in range(3):

        def count(op: str, _i: int = min(rep, 1)) -> None:
            syncs[_i] += op in ("fdatasync", "fsync")

        fileio.fault_hook = count
        try:
            for c in convs:
                t = time.perf_counter()
                store.append(SITE, c, [{"role": "user", "text": "x" * 200}])
                (first if rep == 0 else later).append(time.perf_counter() - t)
        finally:
            fileio.fault_hook = None
    store.close()
    res["syncs per first append"].append(syncs[0] / n)
    res["syncs per later append"].append(syncs[1] / (2 * n))
    res["first append per conversation"].append(statistics.median(first))
    res["later appends"].append(statistics.median(later))
    for label, boot in (("first listing, restart", None), ("first listing, after a reboot", "bench-reboot")):
        saved = getattr(bootid, "boot_id", None)
        if boot is not None:
            if saved is None:
                continue  # a tree without boot records
            bootid.boot_id = boot
        try:
            store = FileStore(root)
            t = time.perf_counter()
            store.list_conversations(SITE, ListSelector(limit=50))
            res[label].append(time.perf_counter() - t)
            store.close()
        finally:
            if boot is not None and saved is not None:
                bootid.boot_id = saved


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("n", type=int, nargs="?", default=300, help="conversations (default 300)")
    ap.add_argument("--dir", default=None, help="where to create the data directories (default: the temp dir)")
    args = ap.parse_args()
    print(f"logstore from {logstore.__file__}, {args.n} conversations")
    res: dict[str, list[float]] = {
        "syncs per first append": [],
        "syncs per later append": [],
        "first append per conversation": [],
        "later appends": [],
        "first listing, restart": [],
        "first listing, after a reboot": [],
    }
    for _ in range(3):
        with tempfile.TemporaryDirectory(dir=args.dir) as d:
            _round(d, args.n, res)
    for k, v in res.items():
        if k.startswith("syncs"):
            print(f"{k}: {statistics.median(v):.2f}")
        elif v:
            runs = ", ".join(f"{x * 1e6:.0f}" for x in v)
            print(f"{k}: median {statistics.median(v) * 1e6:.0f} us (runs: {runs})")


if __name__ == "__main__":
    main()
