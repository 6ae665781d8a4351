"""One conversation's log: recovery on open, durable append, verified reads.

A conversation is a directory of segments named by their base seq. Only the
last segment (the active one) is ever written; earlier ones are sealed and
immutable. Several processes can share a data directory: the state kept in
memory is re-derived from the files whenever another may have changed them.

The parts, each in its own module: :mod:`logstore.convstate` (state, files,
locks), :mod:`logstore.recovery` (finding and verifying the tail on open),
:mod:`logstore.writer` (the append path, itself in parts: group commit,
conversation creation, sealing, the active segment, preallocation) and
:mod:`logstore.reader` (reads).
The bytes are described in FORMAT.md only.
"""

from __future__ import annotations

import os

from . import fileio
from .convstate import ManifestHook, Options, Tip
from .reader import Reader
from .writer import Writer

__all__ = ["Conversation", "ManifestHook", "Options", "Tip"]


class Conversation(Writer, Reader):
    """The log of one conversation of one site."""

    def busy(self) -> bool:
        """Whether :meth:`close` would wait: a group commit or an extend-ahead job is running (``mutex`` held)."""
        return bool(self._inflight or self._queue or self._growing)

    def close(self) -> None:
        """Release every descriptor, writing our pending index entries if still in order. Caller holds ``mutex``."""
        while self.busy():
            self._cond.wait()  # a group commit is writing, batches wait for one, or an extension runs
        self.closed = True  # (first: an unlock from here on keeps no lease)
        self._release_lease()
        seg = self.active
        if seg is not None and seg.idx_unwritten and self._lock_fd is not None:
            try:
                if fileio.try_lock(self._lock_fd, True):
                    try:
                        # Only when nobody appended after us:
                        if os.fstat(seg.fd).st_size == seg.alloc and not self._moved_on():
                            seg.write_index_entries()
                    finally:
                        fileio.unlock(self._lock_fd)
            except OSError:
                pass  # derived data
        self._give_back_zeros()
        if self._claim is not None:
            self._claim.release()
            self._claim = None
        self._close_files()
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None
        self.closed = True

