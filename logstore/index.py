"""The sparse seq-to-offset index of one segment.

An index file holds a 32-byte header and then 8-byte entries
``(u32 seq - base_seq, u32 byte offset of the record that starts there)``,
one every ``interval`` bytes of segment or so. It is derived data: it is never
synced, and any entry is verified against the segment before it is trusted;
a missing, stale or damaged index is rebuilt from the segment.

Header: ``magic b"CVMIDX\\x00\\x01" | u32 version | u32 0 | u64 base_seq | u64 salt``
(the salt of the segment it indexes, so an index left from an earlier file of
the same name never applies).
"""

from __future__ import annotations

import bisect
import os
import struct

from . import fileio

INDEX_MAGIC = b"CVMIDX\x00\x01"
INDEX_HEADER = struct.Struct("<8sIIQQ")
INDEX_HEADER_SIZE = INDEX_HEADER.size  # 32
ENTRY = struct.Struct("<II")
ENTRY_SIZE = ENTRY.size


class SparseIndex:
    """Entries ``(seq, offset)`` in memory, strictly increasing in both."""

    __slots__ = ("base_seq", "complete", "offsets", "salt", "seqs")

    def __init__(self, base_seq: int, salt: int) -> None:
        self.base_seq = base_seq
        self.salt = salt
        #: False when loading dropped malformed entries (the file needs rewriting).
        self.complete = True
        self.seqs: list[int] = []
        self.offsets: list[int] = []

    def add(self, seq: int, offset: int) -> None:
        self.seqs.append(seq)
        self.offsets.append(offset)

    def floor(self, seq: int) -> tuple[int, int] | None:
        """The entry with the largest seq not past ``seq``, or None."""
        i = bisect.bisect_right(self.seqs, seq) - 1
        return (self.seqs[i], self.offsets[i]) if i >= 0 else None

    def last_offset(self) -> int:
        return self.offsets[-1] if self.offsets else 0

    def truncate_before_offset(self, offset: int) -> None:
        """Drop every entry at or after byte ``offset``."""
        i = bisect.bisect_left(self.offsets, offset)
        del self.seqs[i:]
        del self.offsets[i:]

    def drop_from(self, i: int) -> None:
        del self.seqs[i:]
        del self.offsets[i:]

    def header_bytes(self) -> bytes:
        return INDEX_HEADER.pack(INDEX_MAGIC, 1, 0, self.base_seq, self.salt)

    def entry_bytes(self, seq: int, offset: int) -> bytes:
        return ENTRY.pack(seq - self.base_seq, offset)

    def to_bytes(self) -> bytes:
        parts = [self.header_bytes()]
        parts.extend(ENTRY.pack(s - self.base_seq, o) for s, o in zip(self.seqs, self.offsets, strict=True))
        return b"".join(parts)


def load(path: str, base_seq: int, salt: int, segment_size: int) -> SparseIndex | None:
    """Read an index file; None when missing or not this segment's.

    Returns the longest prefix of entries that is well-formed (increasing,
    inside the segment). Entries still have to be verified against the
    segment before use.
    """
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return None
    if len(data) < INDEX_HEADER_SIZE:
        return None
    magic, version, _, base, file_salt = INDEX_HEADER.unpack_from(data)
    if magic != INDEX_MAGIC or version != 1 or base != base_seq or file_salt != salt:
        return None
    idx = SparseIndex(base_seq, salt)
    idx.complete = (len(data) - INDEX_HEADER_SIZE) % ENTRY_SIZE == 0
    prev_seq, prev_off = -1, 0
    for rel, off in ENTRY.iter_unpack(
        data[INDEX_HEADER_SIZE : len(data) - (len(data) - INDEX_HEADER_SIZE) % ENTRY_SIZE]
    ):
        seq = base_seq + rel
        if seq <= prev_seq or off <= prev_off or off >= segment_size:
            idx.complete = False
            break
        idx.add(seq, off)
        prev_seq, prev_off = seq, off
    return idx


def write(path: str, idx: SparseIndex) -> None:
    """Replace the index file with ``idx`` (atomic rename, not synced: derived data)."""
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, fileio.FILE_MODE), "wb") as f:
        f.write(idx.to_bytes())
    os.replace(tmp, path)


def open_for_append(path: str, idx: SparseIndex) -> int:
    """Write ``idx`` whole and return a descriptor positioned for new entries."""
    write(path, idx)
    return os.open(path, os.O_WRONLY | os.O_APPEND)
