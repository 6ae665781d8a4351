"""The system-call floor of a first append, by creating the conversation (``python -m bench.probes.newconv_floor``).

Raw ``os`` calls only (no engine), interleaved op by op, each variant in its
own site directory, against an ordinary append (``pwrite`` into a pre-zeroed,
synced file plus ``fdatasync``):

* ``in-place``: what the engine does without a pool: ``mkdir`` of the missing
  fan-out directories and of the conversation, lock and segment files
  created, the first record written, then the data sync and the syncs of the
  conversation directory and of every new directory above it, at once;
* ``pool/mkdir``: a pre-created, synced entry renamed into place, its new
  fan-out directory made by ``mkdir``; data sync beside the syncs of the
  parents and of the pool directory;
* ``pool/spare``: the same with the fan-out directory an empty, synced spare
  renamed into place (the engine's layout, FORMAT.md 1 and 6);
* ``once/1file``: one sync for the claim, the engine's way (FORMAT.md 6, "A
  first append in one sync": the identity is a record of the segment, in the
  batch's write): the record and the conversation's identity written into
  the entry's segment, one ``fdatasync``, the spares and the entry renamed
  into place with no directory sync (the engine renames first, then writes;
  the system calls are the same);
* ``once/2files``: the same with the identity in a second pre-zeroed, synced
  file of the entry (its ``lock`` file made 512 bytes long): two
  ``fdatasync`` at once, then the renames (what engines before identity
  records did);
* ``log/append``: the owner's example design, measured for the choice: the
  record appended (``O_APPEND``) to the site's already-open activity log and
  synced there (the directory and segment made later, not timed);
* ``log/zeroed``: the same into a log whose space was written with zeros and
  synced ahead (so its ``fdatasync`` commits no new size);
* ``one-level``: a layout the engine does not have, measured for comparison:
  one level of fan-out, every ``c/<aa>`` made with the site, an entry renamed
  from ``pool/`` straight into ``c/<aa>/``: the data sync beside the syncs of
  ``<aa>`` and ``pool/``;
* ``flat``: another such layout: every conversation directly in ``c/``, with
  the ready entries kept in ``c/`` too, so a claim is a rename within one
  directory: the data sync beside the sync of ``c/`` alone. (A directory of
  that many subdirectories needs a filesystem without a small limit on them:
  ext4 with ``dir_nlink``, XFS, btrfs.)

``--fresh`` measures a new site (most ``<aa>`` directories new too, except in
``one-level``, which makes them all with the site);
otherwise every ``<aa>`` exists (the case of a site with a few hundred
conversations). The preparation of each entry (pool, spare) is not timed.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import hashlib
import os
import statistics
import tempfile
import time
from collections.abc import Callable

_POOL = concurrent.futures.ThreadPoolExecutor(4)
ZERO = bytes(4096)
RECORD = os.urandom(1400)


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _sync_all(fd: int, dirs: list[str]) -> None:
    futures = [_POOL.submit(_fsync_dir, d) for d in dirs]
    os.fdatasync(fd)
    for f in futures:
        f.result()


def _fan(i: int) -> tuple[str, str, str]:
    h = hashlib.md5(str(i).encode()).hexdigest()
    return h[:2], h[2:4], f"{i:08x}"


class _Site:
    def __init__(self, root: str, name: str, fresh: bool, spares: bool) -> None:
        self.dir = os.path.join(root, name)
        self.c = os.path.join(self.dir, "c")
        self.pool = os.path.join(self.dir, "pool")
        os.makedirs(self.c)
        os.makedirs(self.pool)
        if not fresh:
            for a in range(256):
                os.mkdir(os.path.join(self.c, f"{a:02x}"))
        self.spares = spares
        for d in [self.c, *(os.path.join(self.c, n) for n in os.listdir(self.c))]:
            _fsync_dir(d)
        _fsync_dir(self.dir)

    def entry(self, i: int, where: str | None = None, lock_bytes: int = 0) -> str:
        """A ready entry, made and synced (not timed), in ``pool/`` or in ``where``."""
        where = self.pool if where is None else where
        p = os.path.join(where, f"e-{i}" if where == self.pool else f".e-{i}")
        os.mkdir(p)
        fd = os.open(os.path.join(p, "seg"), os.O_RDWR | os.O_CREAT, 0o600)
        os.pwrite(fd, ZERO, 0)
        os.fdatasync(fd)
        os.close(fd)
        fd = os.open(os.path.join(p, "lock"), os.O_RDWR | os.O_CREAT, 0o600)
        if lock_bytes:
            os.pwrite(fd, bytes(lock_bytes), 0)
            os.fdatasync(fd)
        os.close(fd)
        _fsync_dir(p)
        _fsync_dir(where)
        return p

    def spare(self, parent: str) -> None:
        s = os.path.join(parent, ".spare")
        if os.path.isdir(parent) and not os.path.isdir(s):
            os.mkdir(s)
            _fsync_dir(s)


def _place(site: _Site, path: str, dirs: list[str]) -> None:
    parent = os.path.dirname(path)
    if os.path.isdir(path):
        return
    spare = os.path.join(parent, ".spare")
    if site.spares and os.path.isdir(spare):
        os.rename(spare, path)
    else:
        os.mkdir(path)
    dirs.append(parent)


def _zeroed_appends(fd: int) -> Callable[[int], float]:
    """Timed appends of a record into the pre-zeroed, synced file ``fd``, one after the other, each synced."""
    offset = [0]

    def op(i: int) -> float:
        t = time.perf_counter()
        os.pwrite(fd, RECORD, offset[0])
        os.fdatasync(fd)
        offset[0] += len(RECORD)
        return time.perf_counter() - t

    return op


def run(n: int, fresh: bool) -> dict[str, list[float]]:
    root = tempfile.mkdtemp(prefix="convmem-newconv-floor-")
    sites = {
        "in-place": _Site(root, "inplace", fresh, False),
        "pool/mkdir": _Site(root, "pool", fresh, False),
        "pool/spare": _Site(root, "spare", fresh, True),
    }
    afd = os.open(os.path.join(root, "append.seg"), os.O_RDWR | os.O_CREAT, 0o600)
    os.pwrite(afd, bytes(8 << 20), 0)
    os.fsync(afd)
    _fsync_dir(root)
    append = _zeroed_appends(afd)

    def in_place(i: int) -> float:
        s = sites["in-place"]
        a, b, h = _fan(i)
        t = time.perf_counter()
        pa, pb = os.path.join(s.c, a), os.path.join(s.c, a, b)
        dirs: list[str] = []
        for d in (pa, pb):
            if not os.path.isdir(d):
                os.mkdir(d)
                dirs.append(os.path.dirname(d))
        conv = os.path.join(pb, h)
        os.mkdir(conv)
        os.close(os.open(os.path.join(conv, "lock"), os.O_RDWR | os.O_CREAT, 0o600))
        fd = os.open(os.path.join(conv, "seg"), os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        os.pwrite(fd, RECORD + ZERO[len(RECORD) :], 0)
        _sync_all(fd, [conv, pb, *dirs])
        dt = time.perf_counter() - t
        os.close(fd)
        return dt

    def claim(name: str) -> Callable[[int], float]:
        def op(i: int) -> float:
            s = sites[name]
            a, b, h = _fan(i)
            pa = os.path.join(s.c, a)
            if s.spares:
                s.spare(s.c)
                s.spare(pa)
            entry = s.entry(i)
            t = time.perf_counter()
            dirs = [s.pool]
            _place(s, pa, dirs)
            pb = os.path.join(pa, b)
            _place(s, pb, dirs)
            conv = os.path.join(pb, h)
            os.rename(entry, conv)
            dirs.append(pb)
            fd = os.open(os.path.join(conv, "seg"), os.O_RDWR)
            os.pwrite(fd, RECORD, 0)
            _sync_all(fd, sorted(set(dirs)))
            dt = time.perf_counter() - t
            os.close(fd)
            return dt

        return op

    once = {"once/1file": _Site(root, "once1", fresh, True), "once/2files": _Site(root, "once2", fresh, True)}
    identity = b"cmclaim1" + f"{0:016x}".encode() * 4

    def claim_once(name: str) -> Callable[[int], float]:
        two = name == "once/2files"

        def op(i: int) -> float:
            s = once[name]
            a, b, h = _fan(i)
            pa = os.path.join(s.c, a)
            s.spare(s.c)
            s.spare(pa)
            entry = s.entry(i, lock_bytes=512 if two else 0)
            t = time.perf_counter()
            fd = os.open(os.path.join(entry, "seg"), os.O_RDWR)
            if two:
                lfd = os.open(os.path.join(entry, "lock"), os.O_RDWR)
                os.pwrite(fd, RECORD, 0)
                os.pwrite(lfd, identity, 0)
                other = _POOL.submit(os.fdatasync, lfd)
                os.fdatasync(fd)
                other.result()
                os.close(lfd)
            else:
                os.pwrite(fd, RECORD + ZERO[len(RECORD) : -len(identity)] + identity, 0)
                os.fdatasync(fd)
            _place(s, pa, [])
            pb = os.path.join(pa, b)
            _place(s, pb, [])
            os.rename(entry, os.path.join(pb, h))
            dt = time.perf_counter() - t
            os.close(fd)
            return dt

        return op

    lfd = os.open(os.path.join(root, "activity.log"), os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
    os.fsync(lfd)
    zfd = os.open(os.path.join(root, "activity-zeroed.log"), os.O_RDWR | os.O_CREAT, 0o600)
    os.pwrite(zfd, bytes(max(8 << 20, (n + 1) * len(RECORD))), 0)
    os.fsync(zfd)
    _fsync_dir(root)

    def log_append(i: int) -> float:
        t = time.perf_counter()
        os.write(lfd, RECORD)
        os.fdatasync(lfd)
        return time.perf_counter() - t

    log_zeroed = _zeroed_appends(zfd)

    flat = _Site(root, "flat", True, False)
    one = _Site(root, "one", False, False)

    def flat_claim(i: int) -> float:
        h = _fan(i)[2]
        entry = flat.entry(i, flat.c)
        t = time.perf_counter()
        conv = os.path.join(flat.c, h)
        os.rename(entry, conv)
        fd = os.open(os.path.join(conv, "seg"), os.O_RDWR)
        os.pwrite(fd, RECORD, 0)
        _sync_all(fd, [flat.c])
        dt = time.perf_counter() - t
        os.close(fd)
        return dt

    def one_level_claim(i: int) -> float:
        a, _b, h = _fan(i)
        entry = one.entry(i)
        t = time.perf_counter()
        conv = os.path.join(one.c, a, h)
        os.rename(entry, conv)
        fd = os.open(os.path.join(conv, "seg"), os.O_RDWR)
        os.pwrite(fd, RECORD, 0)
        _sync_all(fd, [os.path.join(one.c, a), one.pool])
        dt = time.perf_counter() - t
        os.close(fd)
        return dt

    ops = {"append": append, "in-place": in_place, "pool/mkdir": claim("pool/mkdir"), "pool/spare": claim("pool/spare"),
           "once/1file": claim_once("once/1file"), "once/2files": claim_once("once/2files"),
           "log/append": log_append, "log/zeroed": log_zeroed, "one-level": one_level_claim, "flat": flat_claim}
    out: dict[str, list[float]] = {k: [] for k in ops}
    for i in range(n):
        for k, f in ops.items():
            out[k].append(f(i))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-n", type=int, default=300, help="operations per variant")
    ap.add_argument("--fresh", action="store_true", help="a new site: the <aa> directories are new too")
    args = ap.parse_args()
    res = run(args.n, args.fresh)
    base = statistics.median(res["append"])
    for k, v in res.items():
        v.sort()
        p50 = statistics.median(v)
        print(f"{k:12s} p50 {p50 * 1e3:6.3f} ms  p90 {v[int(len(v) * 0.9)] * 1e3:6.3f} ms  {p50 / base:5.2f}x append")


if __name__ == "__main__":
    main()
