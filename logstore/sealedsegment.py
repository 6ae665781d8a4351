"""Rolling: the active segment sealed and cut to its records, the next one created whole.

When a group's first record would take the active segment past
``Options.segment_bytes`` (or it already ends with a seal), the segment is
sealed (:meth:`SegmentRoll._roll`): no extension is running, a seal record is
written after the last record, the preallocated zeros are cut away and the
file synced, and its index file completed, all before the next segment
exists. A sealed segment is never written again. The next segment is created
whole (:meth:`SegmentRoll._create_segment`): header and first chunk of zeros
written and synced under a temporary name, then renamed into place and the
directory synced.
"""

from __future__ import annotations

import os

from . import fileio, frame, index
from .activesegment import ActiveSegment
from .activewrites import ActiveWrites
from .frame import KIND_SEAL, SEGMENT_HEADER_SIZE


class SegmentRoll(ActiveWrites):
    """Seals the active segment and starts the next."""

    def _roll(self) -> None:
        """Seal the active segment and start the next one."""
        self._settle()  # no extension may write zeros into a sealed segment
        seg = self.active
        assert seg is not None
        fd = seg.fd
        synced = True
        if not seg.sealed:
            seal = frame.encode_record(seg.salt, KIND_SEAL, self._next_seq, 0, self._last_us, b"")
            fileio.pwrite_all(fd, seal, seg.end)
            seg.end += len(seal)
            seg.sealed = True
            synced = False
        if seg.alloc > seg.end:
            # A sealed segment keeps no preallocated space: cut it, durably (this sync
            # covers the seal too), before the next segment exists.
            fileio.truncate(fd, seg.end)
            seg.alloc = seg.end
        elif not synced:
            fileio.fdatasync(fd)
        fileio.crashpoint("segment-roll-sealed")
        if seg.idx_lazy:
            seg.create_index_file()  # a sealed segment has its index file, even without entries
        seg.write_index_entries()  # the sealed segment's index is complete, and nobody else writes it
        self._sealed_cache.clear()
        self._create_segment(self._next_seq)
        fileio.crashpoint("segment-roll-created")

    def _create_segment(self, base: int) -> None:
        """Create, sync and publish an empty segment starting at seq ``base``."""
        salt = frame.new_salt()
        final = self._seg_path(base)
        tmp = final + ".tmp"
        fd = fileio.open_create(tmp, os.O_RDWR | os.O_TRUNC)
        size = self._first_chunk()
        try:
            # The header and the first chunk of preallocated (zero) space.
            fileio.pwrite_all(fd, frame.encode_segment_header(base, salt) + bytes(size - SEGMENT_HEADER_SIZE), 0)
            fileio.fdatasync(fd)
            fileio.rename(tmp, final)
            fileio.crashpoint("after-file-create")
            fileio.fsync_dir(self.path)
        except BaseException:
            os.close(fd)
            raise
        self._close_active()
        seg = self.active = ActiveSegment(self.path, base, fd, salt)
        seg.end = SEGMENT_HEADER_SIZE
        seg.alloc = size
        self._segments.append(base)
        seg.idx = index.SparseIndex(base, salt)
        seg.idx_fd = index.open_for_append(seg.index_path(), seg.idx)
