"""The active segment: the one segment of a conversation that is written, as an object.

Only the last segment of a conversation (the active one) is ever written.
:class:`ActiveSegment` is that segment as a conversation holds it open (one
per conversation, ``None`` when none is open): its base seq, salt,
descriptors (segment and index), committed end, allocated end, sparse index
and the entries of it not yet in the index file. Its invariants:
``[end, alloc)`` is preallocated space, all zero (FORMAT.md, "Preallocated
space"); ``end`` never covers a record that is not durable (a group is
adopted, :meth:`ActiveSegment.adopt`, only once its one write and one
``fdatasync``, :meth:`ActiveSegment.write`, returned); the entries in
``idx_unwritten`` are in ``idx`` and not yet in the index file. Index entries
of our own records are written to the index file in groups (derived data: a
crash loses at most a group, and opening then scans a few more records).
After a failed write or sync the group is cut away
(:meth:`ActiveSegment.cut_back`) and the handle never trusted again
(:mod:`logstore.activewrites`). How the space ahead grows is
:mod:`logstore.preallocation`'s; :meth:`ActiveSegment.seal` makes it a sealed one
(:mod:`logstore.sealedsegment`) when the conversation rolls (:mod:`logstore.segmentroll`).
"""

from __future__ import annotations

import os

from . import fileio, frame, index, layout
from .frame import KIND_SEAL, SEGMENT_HEADER_SIZE
from .groupcommit import Batch

_INDEX_WRITE_GROUP = 16


class ActiveSegment:
    """The conversation's active segment, open read-write (a writer's) or read-only (a reader's)."""

    __slots__ = ("alloc", "base", "directory", "end", "fd", "idx", "idx_fd", "idx_lazy", "idx_unwritten",
                 "pending_end", "salt", "sealed")

    def __init__(self, directory: str, base: int, fd: int, salt: int = 0) -> None:
        self.directory = directory
        self.base = base
        self.fd = fd  # the segment file
        self.idx_fd: int | None = None  # its index file, open for appending (a writer's)
        self.salt = salt
        self.end = 0  # committed end
        # Size of the file as last seen or set by us: [end, alloc) is preallocated space, all zero.
        self.alloc = 0
        self.sealed = False  # the segment ends with a seal record
        self.idx = index.SparseIndex(0, 0)
        #: The writer holds the segment without an index file: it has no entry yet, and the file
        #: is created with the first one (see :meth:`write_index_entries`).
        self.idx_lazy = False
        # Entries of our own appends not yet in the index file (see note_index_entry).
        self.idx_unwritten: list[bytes] = []
        #: Where the group being written starts: the end to cut back to if it fails (None: nothing to cut).
        self.pending_end: int | None = None

    def index_path(self) -> str:
        return os.path.join(self.directory, layout.index_name(self.idx.base_seq))

    def write(self, data: bytes, offset: int) -> None:
        """A group's one write and one ``fdatasync``, in one call where it can (``mutex`` released)."""
        fileio.pwrite_synced(self.fd, data, offset, ("before-data-sync",))
        fileio.crashpoint("after-data-sync")

    def adopt(self, records: list[bytes], todo: list[Batch], offset: int, interval: int) -> int:
        """Adopt ``records`` (of ``todo``'s batches), durable from byte ``offset``; their bytes."""
        idx = self.idx
        for rec, b in zip(records, todo, strict=True):
            if offset - idx.last_offset() >= interval and offset > SEGMENT_HEADER_SIZE:
                self.note_index_entry(b.result[0], offset)
            offset += len(rec)
        self.end = offset
        return sum(map(len, records))

    def note_index_entry(self, seq: int, offset: int) -> None:
        """Index a record we wrote: at once in memory, in groups in the file.

        Writing each entry as it comes would dirty the index file on every
        append, and its inode update would ride in the journal commit of the
        next fdatasync. Entries not yet written are only derived data: a crash
        loses them, and opening then scans a few more records.
        """
        self.idx.add(seq, offset)
        self.idx_unwritten.append(self.idx.entry_bytes(seq, offset))
        if len(self.idx_unwritten) >= _INDEX_WRITE_GROUP:
            self.write_index_entries()

    def create_index_file(self) -> None:
        """Create the segment's index file, holding every entry in memory (it had none on disk)."""
        self.idx_unwritten.clear()
        self.idx_lazy = False
        try:
            self.idx_fd = index.open_for_append(self.index_path(), self.idx)
        except OSError:
            pass  # derived data: a missing index only costs a longer scan (and is rebuilt)

    def write_index_entries(self) -> None:
        if self.idx_unwritten and self.idx_lazy:
            self.create_index_file()  # the segment's first entries
            return
        if self.idx_unwritten and self.idx_fd is not None:
            try:
                fileio.append(self.idx_fd, b"".join(self.idx_unwritten))
            except OSError:
                pass  # derived data: a missing entry only costs a longer scan
        self.idx_unwritten.clear()

    def seal(self, next_seq: int, last_us: int) -> None:
        """Seal the segment: a seal record after the last record (unless it has one), no zeros after it, synced.

        The seal record carries ``next_seq`` and the last batch's time
        ``last_us``. The preallocated space is cut away, durably (that sync
        covers the seal too); then the index file is completed (and created,
        even without entries): nobody writes the segment or its index again.
        """
        fd = self.fd
        synced = True
        if not self.sealed:
            seal = frame.encode_record(self.salt, KIND_SEAL, next_seq, 0, last_us, b"")
            fileio.pwrite_all(fd, seal, self.end)
            self.end += len(seal)
            self.sealed = True
            synced = False
        if self.alloc > self.end:
            # A sealed segment keeps no preallocated space: cut it, durably (this sync
            # covers the seal too), before the next segment exists.
            fileio.truncate(fd, self.end)
            self.alloc = self.end
        elif not synced:
            fileio.fdatasync(fd)
        fileio.crashpoint("segment-roll-sealed")
        if self.idx_lazy:
            self.create_index_file()  # a sealed segment has its index file, even without entries
        self.write_index_entries()  # the sealed segment's index is complete, and nobody else writes it

    def cut_back(self) -> None:
        """After a failed write or sync: cut the failed group away, so it can never later read as acknowledged."""
        if self.pending_end is not None:
            try:
                fileio.truncate(self.fd, self.pending_end)
            except OSError:
                pass

    def close(self, *, quiet: bool) -> None:
        """Close both descriptors (``quiet``: ignoring errors)."""
        for fd in (self.fd, self.idx_fd):
            if fd is not None:
                if quiet:
                    try:
                        os.close(fd)
                    except OSError:
                        pass
                else:
                    os.close(fd)

    def allocated_bytes(self) -> int:
        """What the disk holds for the segment and its index (``st_blocks``)."""
        total = 0
        for fd in (self.fd, self.idx_fd):
            if fd is not None:
                total += os.fstat(fd).st_blocks * 512
        return total
