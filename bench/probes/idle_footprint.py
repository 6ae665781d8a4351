"""What idle conversations hold on disk: ``python -m bench.probes.idle_footprint [N] [--busy K]``.

Builds a site of N conversations (default 100,000), each with one batch of
one small item, in a fresh data directory under the current one (the
project's disk), with the engine's syncs off (the bytes on disk are the
same; see ``bench.util.engine_sync_disabled``); ``--busy K`` first writes K
of them busily (``--batches`` batches of 10 items of about 1 KiB, back to
back: the zero-filled space ahead grows to its largest chunks). Then it
closes the store (which gives unused zeros back, ``logstore.zerofill.trim``)
and walks the directory: apparent bytes (``st_size``), allocated bytes
(``st_blocks * 512``) of files and of directories themselves, files and directories, for the whole data directory
and per conversation, and apart for the segments: their data (records) and
the zeros after it.
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import tempfile

from bench.util import engine_sync_disabled
from convmem.logstore import layout, open_store

SITE = "idle"


def _walk(root: str) -> tuple[dict[str, list[int]], int]:
    """Per kind of file (``dir`` for the directories themselves): [files, apparent, allocated]; and directories."""
    kinds: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0, 0])
    dirs = 0
    for dirpath, dirnames, filenames in os.walk(root):
        dirs += len(dirnames)
        for name in dirnames:
            st = os.lstat(os.path.join(dirpath, name))
            k = kinds["dir"]
            k[0] += 1
            k[1] += st.st_size
            k[2] += st.st_blocks * 512
        for name in filenames:
            st = os.lstat(os.path.join(dirpath, name))
            kind = name.rsplit(".", 1)[-1] if "." in name else name
            k = kinds[kind]
            k[0] += 1
            k[1] += st.st_size
            k[2] += st.st_blocks * 512
    return kinds, dirs


def _segment_zeros(root: str) -> tuple[int, int]:
    """Bytes of the segments' records, and of the zeros after them."""
    data = zeros = 0
    for dirpath, _dirs, filenames in os.walk(os.path.join(root, layout.SITES_DIR)):
        for name in filenames:
            if name.endswith(".seg"):
                with open(os.path.join(dirpath, name), "rb") as f:
                    raw = f.read()
                kept = len(raw.rstrip(b"\x00"))
                data += kept
                zeros += len(raw) - kept
    return data, zeros


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("n", nargs="?", type=int, default=100_000)
    ap.add_argument("--busy", type=int, default=0, help="conversations written busily first")
    ap.add_argument("--batches", type=int, default=300, help="batches per busy conversation")
    args = ap.parse_args()
    root = tempfile.mkdtemp(prefix="idle-footprint-", dir=".")
    try:
        store = open_store(root)
        small = [{"role": "user", "text": "hello"}]
        big = [{"role": "user", "text": "x" * 1000, "n": i} for i in range(10)]
        with engine_sync_disabled():
            for i in range(args.busy):
                for _ in range(args.batches):
                    store.append(SITE, f"conv-{i:08d}", big)
            for i in range(args.busy, args.n):
                store.append(SITE, f"conv-{i:08d}", small)
            store.close()
        kinds, dirs = _walk(root)
        files = sum(k[0] for kind, k in kinds.items() if kind != "dir")
        apparent = sum(k[1] for k in kinds.values())
        allocated = sum(k[2] for k in kinds.values())
        data, zeros = _segment_zeros(root)
        n = args.n
        print(f"{n:,} conversations ({args.busy:,} of them written busily, {args.batches} batches each): "
              f"{apparent:,} bytes apparent, {allocated:,} allocated (directories included), {files:,} files, "
              f"{dirs:,} directories")
        print(f"per conversation: {apparent / n:,.0f} B apparent, {allocated / n:,.0f} B allocated, "
              f"{files / n:.2f} files, {dirs / n:.2f} directories")
        print(f"segments: {data:,} bytes of records, {zeros:,} bytes of zeros after them ({zeros / n:,.0f} B each)")
        for kind, (count, size, blocks) in sorted(kinds.items(), key=lambda kv: -kv[1][2]):
            print(f"  {kind}: {count:,} files, {size:,} B apparent, {blocks:,} B allocated")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
