"""Rolling: the active segment sealed and cut to its records, the next one created whole.

When a group's first record would take the active segment past
``Options.segment_bytes`` (or it already ends with a seal), the segment is
sealed (:meth:`SegmentRoll._roll`): no extension is running, and
:meth:`logstore.activesegment.ActiveSegment.seal` writes a seal record after
the last record, cuts the preallocated zeros away and syncs the file, and
completes its index file, all before the next segment exists. A sealed
segment is never written again (:mod:`logstore.sealedsegment`). The next segment is created
whole (:meth:`SegmentRoll._create_segment`): header and first chunk of zeros
written and synced under a temporary name, then renamed into place and the
directory synced.
"""

from __future__ import annotations

import os

from . import fileio, frame, index
from .activesegment import ActiveSegment
from .activewrites import ActiveWrites
from .frame import SEGMENT_HEADER_SIZE


class SegmentRoll(ActiveWrites):
    """Seals the active segment and starts the next."""

    def _roll(self) -> None:
        """Seal the active segment and start the next one."""
        self._settle()  # no extension may write zeros into a sealed segment
        seg = self.active
        assert seg is not None
        seg.seal(self._next_seq, self._last_us)
        self.sealed_cache.clear()
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
