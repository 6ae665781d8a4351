"""The real floor: ``pwrite`` into space that was zero-filled and synced beforehand, then ``fdatasync``.

(Both in one ``pwritev(..., RWF_DSYNC)`` where the platform has it, as convmem's appends do.)

Each conversation is one file. Before any timed append, :meth:`Floor.reserve`
writes zeros over the space the workload will use and syncs the file and its
directory, the way PostgreSQL zero-fills a WAL segment before use. An append
then overwrites already allocated blocks, so its ``fdatasync`` flushes data
only: no block allocation, no file-size change, no journal commit. That is
the least work any engine with a sync per acknowledged batch can do; today's
``floor-extending`` (:class:`bench.backends.Floor`) grows the file on every
sync and pays a journal commit for it.

Reads use item offsets kept in memory and one ``pread``. When an append runs
past the reserved space (only while building read data) the file is extended
in 4 MiB zeroed chunks.
"""

from __future__ import annotations

import os
import threading
from typing import Any

import msgspec

_enc = msgspec.json.Encoder()
_dec_list = msgspec.json.Decoder(type=list[dict[str, Any]])

#: ``os.RWF_DSYNC`` where the platform has it: the write and the data sync of its range in one
#: call, the cheapest way this machine makes bytes durable (convmem's appends use it too,
#: ``logstore.fileio.pwrite_synced``); else ``pwrite`` then ``fdatasync``.
RWF_DSYNC: int | None = getattr(os, "RWF_DSYNC", None) if hasattr(os, "pwritev") else None

CHUNK = 4 << 20
_ZEROS = bytes(1 << 20)


class _File:
    __slots__ = ("allocated", "fd", "lock", "offsets")

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.offsets = [0]
        self.allocated = 0
        self.lock = threading.Lock()


class Floor:
    """Pre-zeroed, synced files; one ``pwrite`` and one ``fdatasync`` per batch."""

    def __init__(self, root: str, name: str = "floor") -> None:
        self.root = root
        self.name = name
        #: False only while bulk-loading data that is read back (``Ctx.setup_mode``).
        self.sync = True
        os.makedirs(root, exist_ok=True)
        self._files: dict[tuple[str, str], _File] = {}
        self._lock = threading.Lock()

    def path(self, site: str, conv: str) -> str:
        return os.path.join(self.root, f"{site}.{conv}.log")

    def _file(self, site: str, conv: str) -> _File:
        key = (site, conv)
        f = self._files.get(key)
        if f is None:
            with self._lock:
                f = self._files.get(key)
                if f is None:
                    fd = os.open(self.path(site, conv), os.O_RDWR | os.O_CREAT, 0o644)
                    f = self._files[key] = _File(fd)
                    f.allocated = os.fstat(fd).st_size
        return f

    def _zero_fill(self, f: _File, upto: int) -> None:
        """Write zeros from the allocated end up to ``upto`` (rounded to a chunk) and sync them."""
        target = -(-upto // CHUNK) * CHUNK
        pos = f.allocated
        while pos < target:
            n = min(len(_ZEROS), target - pos)
            os.pwrite(f.fd, _ZEROS[:n], pos)
            pos += n
        if self.sync:
            os.fsync(f.fd)
            dfd = os.open(self.root, os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
        f.allocated = target

    def reserve(self, site: str, conv: str, nbytes: int) -> None:
        """Zero-fill and sync room for ``nbytes`` more bytes (call before timing)."""
        f = self._file(site, conv)
        with f.lock:
            need = f.offsets[-1] + nbytes
            if need > f.allocated:
                self._zero_fill(f, need)

    def append(self, site: str, conv: str, items: list[dict[str, Any]]) -> None:
        encoded = [_enc.encode(p) for p in items]
        data = b",".join(encoded) + b","
        f = self._file(site, conv)
        with f.lock:
            pos = f.offsets[-1]
            if pos + len(data) > f.allocated:
                self._zero_fill(f, pos + len(data))
            if not self.sync:
                os.pwrite(f.fd, data, pos)
            elif RWF_DSYNC is not None:
                os.pwritev(f.fd, [data], pos, RWF_DSYNC)  # the write and its sync in one call, as convmem's
            else:
                os.pwrite(f.fd, data, pos)
                os.fdatasync(f.fd)
            for e in encoded:
                pos += len(e) + 1
                f.offsets.append(pos)

    def end(self, site: str, conv: str) -> int:
        """Where the conversation's data ends in its file (the rest is zeros)."""
        return self._file(site, conv).offsets[-1]

    def range(self, site: str, conv: str, start: int, limit: int) -> list[Any]:
        f = self._file(site, conv)
        offsets = f.offsets
        stop = min(start + limit, len(offsets) - 1)
        if start >= stop:
            return []
        lo, hi = offsets[start], offsets[stop]
        return _dec_list.decode(b"[" + os.pread(f.fd, hi - lo - 1, lo) + b"]")

    def tail(self, site: str, conv: str, n: int) -> list[Any]:
        f = self._file(site, conv)
        return self.range(site, conv, max(len(f.offsets) - 1 - n, 0), n)

    def close(self) -> None:
        with self._lock:
            for f in self._files.values():
                os.close(f.fd)
            self._files.clear()
