"""The conversation's writes into its active segment: one write and one ``fdatasync`` per group.

A group's records go in one write and one ``fdatasync``
(:meth:`ActiveWrites._write_records`), into space already allocated and
synced when they fit (the sync then flushes data only), else with the zeros
of an extension after them in the same write (:mod:`logstore.preallocation`).
``mutex`` is released meanwhile, with ``_inflight`` set. Only once that sync
returned are the records adopted (:meth:`ActiveWrites._written`): the
committed end, next seq and last ``recorded_at`` in memory never cover a
record that is not durable. After a failed write or sync the handle is never
trusted again (:meth:`ActiveWrites._poison`). The segment itself is
:class:`logstore.activesegment.ActiveSegment`.
"""

from __future__ import annotations

from . import frame
from .frame import KIND_BATCH, KIND_KEYED
from .groupcommit import Batch
from .preallocation import Preallocated


class ActiveWrites(Preallocated):
    """The conversation's writes into its :class:`ActiveSegment`: one write and one sync per group."""

    @staticmethod
    def _encode(todo: list[Batch], stamp: int, salt: int) -> list[bytes]:
        return [
            frame.encode_record(salt, KIND_BATCH if b.key is None else KIND_KEYED, b.result[0], b.count, stamp, b.body)
            for b in todo
        ]

    def _write_records(self, records: list[bytes], todo: list[Batch], stamp: int) -> None:
        """One write and one fdatasync for the group; ``mutex`` is released meanwhile (see the module doc)."""
        seg = self.active
        assert seg is not None
        offset = seg.end
        seg.pending_end = offset
        data = records[0] if len(records) == 1 else b"".join(records)
        rec_end = offset + len(data)
        self._inflight = True
        try:
            while rec_end > seg.alloc and self._growing:
                self._cond.wait()  # an extend-ahead job is writing the space we need: its next step
        except BaseException:
            self._inflight = False
            raise
        extend = rec_end > seg.alloc
        if extend:
            # Extend the file in the same write: the records, then zeros up to the new
            # size. The one fdatasync below makes both durable (size included).
            self._measure_pace(offset)
            new_size = self._extended_size(seg.alloc, rec_end)
            data += bytes(new_size - rec_end)
            self._growing = True
        # else: into space already allocated and synced, so the fdatasync flushes data only.
        self.mutex.release()
        try:
            seg.write(data, offset)
        finally:
            self.mutex.acquire()
            self._inflight = False
            if extend:
                self._growing = False
                self._cond.notify_all()
        if extend:
            seg.alloc = new_size
        self._written(records, todo, stamp, offset)

    def _written(self, records: list[bytes], todo: list[Batch], stamp: int, offset: int) -> None:
        """Adopt ``records`` (of ``todo``'s batches), durable from byte ``offset`` of the active segment."""
        seg = self.active
        assert seg is not None
        self._last_group = seg.adopt(records, todo, offset, self.options.index_interval)
        self._next_seq = todo[-1].result[1] + 1
        self._last_us = stamp

    def _poison(self) -> None:
        """After a failed write or sync, never trust this handle or its page cache again.

        The failed batch is cut away (:meth:`ActiveSegment.cut_back`); the
        state is dropped so the next call re-opens the log and verifies its tail.
        """
        self._settle()  # an extension's zeros land before the cut, never after it
        if self.active is not None:
            self.active.cut_back()
        self._close_files()
