"""A sealed segment: one that is never written again, as a reader holds it.

Every segment but a conversation's last is sealed: it ends with a seal
record, keeps no preallocated space (its data ends with the file) and has a
complete index file (:meth:`logstore.activesegment.ActiveSegment.seal`).
:class:`SealedSegment` is what a read needs of one: its base seq, salt, end
and sparse index (read-only: only a rebuild replaces it, with a new object).
:class:`SealedCache` keeps the ones read lately; an entry stands only while
the file still has the inode and size it was read with, so a segment that a
repair replaced is read afresh. Reading and verifying one is
:meth:`logstore.recovery.Recovery._sealed`'s job.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from . import index


@dataclass(frozen=True, slots=True)
class SealedSegment:
    """A sealed segment as read: ``end`` is its file's size, ``ident`` that file's (inode, size)."""

    base: int
    salt: int
    end: int
    idx: index.SparseIndex
    ident: tuple[int, int]


class SealedCache:
    """Sealed segments read lately, by base seq (at most :attr:`SIZE`; the oldest entry goes first)."""

    SIZE = 8

    def __init__(self) -> None:
        self._by_base: dict[int, SealedSegment] = {}

    def get(self, base: int, st: os.stat_result) -> SealedSegment | None:
        """The segment ``base`` read lately, if its file (``st``) is still the one it was read from."""
        cached = self._by_base.get(base)
        if cached is not None and cached.ident == (st.st_ino, st.st_size):
            return cached
        return None

    def add(self, seg: SealedSegment) -> None:
        """Keep ``seg``, letting the oldest entry go when the cache is full."""
        if len(self._by_base) >= self.SIZE:
            self._by_base.pop(next(iter(self._by_base)))
        self._by_base[seg.base] = seg

    def replace(self, seg: SealedSegment) -> None:
        """Keep ``seg`` in place of the entry of its base (its index rebuilt)."""
        self._by_base[seg.base] = seg

    def clear(self) -> None:
        self._by_base.clear()
