"""The active segment: records written into its preallocated space, synced, and indexed in groups.

Only the last segment of a conversation (the active one) is ever written.
A group's records go in one write and one ``fdatasync``
(:meth:`ActiveSegment._write_records`), into space already allocated and
synced when they fit (the sync then flushes data only), else with the zeros of
an extension after them in the same write (:mod:`logstore.preallocation`).
Only once that sync returned are the records adopted (:meth:`ActiveSegment._written`):
the committed end, next seq and last ``recorded_at`` in memory never cover a
record that is not durable. After a failed write or sync the handle is never
trusted again (:meth:`ActiveSegment._poison`). Index entries of our own records
are written to the index file in groups (derived data: a crash loses at most a
group, and opening then scans a few more records).
"""

from __future__ import annotations

from . import fileio, frame, index
from .frame import KIND_BATCH, KIND_KEYED, SEGMENT_HEADER_SIZE
from .groupcommit import Batch
from .preallocation import Preallocated

_INDEX_WRITE_GROUP = 16


class ActiveSegment(Preallocated):
    """Writes, adopts and indexes the records of the conversation's active segment."""

    @staticmethod
    def _encode(todo: list[Batch], stamp: int, salt: int) -> list[bytes]:
        return [
            frame.encode_record(salt, KIND_BATCH if b.key is None else KIND_KEYED, b.result[0], b.count, stamp, b.body)
            for b in todo
        ]

    def _write_records(self, records: list[bytes], todo: list[Batch], stamp: int) -> None:
        """One write and one fdatasync for the group; ``mutex`` is released meanwhile (see the class doc)."""
        fd = self._fd
        assert fd is not None
        offset = self._end
        self._pending_end = offset
        data = records[0] if len(records) == 1 else b"".join(records)
        rec_end = offset + len(data)
        self._inflight = True
        try:
            while rec_end > self._alloc and self._growing:
                self._cond.wait()  # an extend-ahead job is writing the space we need: its next step
        except BaseException:
            self._inflight = False
            raise
        extend = rec_end > self._alloc
        if extend:
            # Extend the file in the same write: the records, then zeros up to the new
            # size. The one fdatasync below makes both durable (size included).
            self._measure_pace(offset)
            new_size = self._extended_size(rec_end)
            data += bytes(new_size - rec_end)
            self._growing = True
        # else: into space already allocated and synced, so the fdatasync flushes data only.
        self.mutex.release()
        try:
            fileio.pwrite_all(fd, data, offset)
            fileio.crashpoint("before-data-sync")
            fileio.fdatasync(fd)
            fileio.crashpoint("after-data-sync")
        finally:
            self.mutex.acquire()
            self._inflight = False
            if extend:
                self._growing = False
                self._cond.notify_all()
        if extend:
            self._alloc = new_size
        self._written(records, todo, stamp, offset)

    def _written(self, records: list[bytes], todo: list[Batch], stamp: int, offset: int) -> None:
        """Adopt ``records`` (of ``todo``'s batches), durable from byte ``offset`` of the active segment."""
        interval = self.options.index_interval
        for rec, b in zip(records, todo, strict=True):
            if offset - self._idx.last_offset() >= interval and offset > SEGMENT_HEADER_SIZE:
                self._note_index_entry(b.result[0], offset)
            offset += len(rec)
        self._last_group = sum(map(len, records))
        self._end = offset
        self._next_seq = todo[-1].result[1] + 1
        self._last_us = stamp

    def _note_index_entry(self, seq: int, offset: int) -> None:
        """Index a record we wrote: at once in memory, in groups in the file.

        Writing each entry as it comes would dirty the index file on every
        append, and its inode update would ride in the journal commit of the
        next fdatasync. Entries not yet written are only derived data: a crash
        loses them, and opening then scans a few more records.
        """
        self._idx.add(seq, offset)
        self._idx_unwritten.append(self._idx.entry_bytes(seq, offset))
        if len(self._idx_unwritten) >= _INDEX_WRITE_GROUP:
            self._write_index_entries()

    def _create_index_file(self) -> None:
        """Create the active segment's index file, holding every entry in memory (it had none on disk)."""
        self._idx_unwritten.clear()
        self._idx_lazy = False
        try:
            self._idx_fd = index.open_for_append(self._idx_path(self._idx.base_seq), self._idx)
        except OSError:
            pass  # derived data: a missing index only costs a longer scan (and is rebuilt)

    def _write_index_entries(self) -> None:
        if self._idx_unwritten and self._idx_lazy:
            self._create_index_file()  # the segment's first entries
            return
        if self._idx_unwritten and self._idx_fd is not None:
            try:
                fileio.append(self._idx_fd, b"".join(self._idx_unwritten))
            except OSError:
                pass  # derived data: a missing entry only costs a longer scan
        self._idx_unwritten.clear()

    def _poison(self) -> None:
        """After a failed write or sync, never trust this handle or its page cache again.

        The failed batch is cut away so that it can never later read as
        acknowledged; the state is dropped so the next call re-opens the log
        and verifies its tail.
        """
        self._settle()  # an extension's zeros land before the cut, never after it
        fd, end = self._fd, self._pending_end
        if fd is not None and end is not None:
            try:
                fileio.truncate(fd, end)
            except OSError:
                pass
        self._close_files()
