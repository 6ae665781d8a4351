"""Preallocated space and extend-ahead: the active segment's file kept larger than its records.

Preallocated space: the active segment's file is kept larger than its
records, the rest zero-filled and synced, so that most appends write into
space the file already has and their fdatasync flushes data and no metadata.
How much is :mod:`logstore.zerofill`'s choice (sized to the conversation's
write rate, bounded per site, trimmed at close). Extend-ahead: once an
append leaves little free space and the next chunk is big, a background job
(:meth:`Preallocated._extend_ahead`) extends the file by a chunk of zeros, written
out in steps and synced once, holding the conversation's file lock, while
this process's appends go on writing into the space already there. An
append whose records do not fit waits for the job, or, with no job running,
extends the file itself (zeros written after the records, in the same write
and the same sync: :meth:`logstore.activewrites.ActiveWrites._write_records`).
A sealed segment is cut to its records before the next one is created
(:mod:`logstore.segmentroll`).
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from . import background, fileio, layout, zerofill
from .convstate import Options
from .frame import SEGMENT_HEADER_SIZE
from .recovery import Recovery

if TYPE_CHECKING:
    from .activesegment import ActiveSegment

#: Preallocated space (FORMAT.md, "Preallocated space"): a new segment is created
#: this big (header and zeros), and each extension adds at least this much (the
#: chunks after it: :mod:`logstore.zerofill`).
PREALLOC_FIRST = 4096

#: An extend-ahead job writes its chunk out in steps of at most this many bytes (at this
#: alignment), then syncs it once: an append whose sync runs meanwhile finds one step's
#: zeros to write at most, never a whole chunk's.
EXTEND_STEP = 64 * 1024

_ZERO_STEP = bytes(EXTEND_STEP)


def first_chunk(options: Options) -> int:
    """Bytes of a new segment file (header and zeros): one block, less for tiny test segments."""
    return max(SEGMENT_HEADER_SIZE, min(PREALLOC_FIRST, options.segment_bytes // 4))


def _run_extension_job(job: Callable[[], None]) -> None:
    background.run(job, "extend-ahead")


def wait_for_extensions(timeout: float | None = None) -> bool:
    """Wait until no background job of this process (extend-ahead, zeros cut, pool refill) is queued or running.

    False on timeout. For benchmarks and tests that must not let a job's I/O
    fall into something else they time or compare; appends never need it.
    Call it holding no conversation's ``mutex`` (a job needs it to finish).
    See :mod:`logstore.background`.
    """
    return background.wait(timeout)


#: Runs extend-ahead jobs (:meth:`Preallocated._extend_ahead`) and the cuts of zeros at close
#: (:meth:`Preallocated._give_back_zeros`): on a pool thread. Tests that need
#: the file operations in a reproducible order replace it (with a list's ``append``, say,
#: and run the jobs themselves); a job that never runs only leaves appends to extend the
#: file themselves.
run_extension: Callable[[Callable[[], None]], None] = _run_extension_job


class Preallocated(Recovery):
    """Sizes the active segment's zero-filled space ahead of its records, and extends it ahead of need."""

    #: The write rate and chunk of the zero-filled space ahead (:mod:`logstore.zerofill`), from the first extension.
    _pace: zerofill.Pace | None = None

    def _first_chunk(self) -> int:
        return first_chunk(self.options)

    def _chunk(self) -> int:
        """The current chunk of zero-filled space (:class:`logstore.zerofill.Pace`): what an extension adds."""
        return self._pace.chunk if self._pace is not None else self._first_chunk()

    def _measure_pace(self, end: int) -> int:
        """At an extension, records ending at ``end``: measure the write rate and set the chunk (``mutex`` held)."""
        now = time.monotonic()
        pace = self._pace
        first = self._first_chunk()
        if pace is None:
            pace = self._pace = zerofill.Pace(self.path, first, SEGMENT_HEADER_SIZE, now - 1.0,
                                              zerofill.site_budget(self.path), self._reclaim_zeros)
        return pace.measure(end, now, first)

    def _extended_size(self, alloc: int, rec_end: int) -> int:
        """The new file size when a record ending at ``rec_end`` does not fit the ``alloc`` bytes allocated.

        One chunk (:meth:`_chunk`) past the space allocated, or past the
        record when it is bigger; never past the segment size unless the
        record itself does; whole 4 KiB blocks (smaller for tiny test segments).
        """
        first = self._first_chunk()
        size = zerofill.blocks(max(alloc + self._chunk(), rec_end), min(zerofill.BLOCK, first))
        return max(rec_end, min(size, self.options.segment_bytes))

    def growth_bound(self, record_bytes: int) -> int:
        """At most what an append of ``record_bytes`` may add to the active segment's allocation (quota).

        The extension the record itself needs plus the extend-ahead chunk it
        would then start, each at most twice the current chunk (a chunk grows
        at most twofold per extension). 0 while the segment is not open in
        this process (nothing known: the append's own estimate stands).
        ``mutex`` held.
        """
        seg = self.active
        if seg is None or seg.sealed:
            return 0
        rec_end = seg.end + record_bytes
        grown = min(2 * self._chunk(), zerofill.CHUNK_MAX)
        need = zerofill.blocks(rec_end + grown) - seg.alloc if rec_end > seg.alloc else 0
        return max(need, 0) + (grown if grown >= self._ahead_min() else 0)

    def _ahead_min(self) -> int:
        """The smallest chunk a background job writes (an eighth of the segment size, if smaller)."""
        return min(zerofill.AHEAD_MIN_CHUNK, self.options.segment_bytes // 8)

    def _space_low(self, seg: ActiveSegment) -> bool:
        """Free space runs low: below half the chunk, or below room for two more groups like the last."""
        return seg.alloc - seg.end < max(self._chunk() // 2, 2 * self._last_group)

    def _ahead_target(self) -> int | None:
        """The size to extend the active segment to ahead of need, or None while its free space suffices.

        One chunk past the space allocated (at least room for two more
        groups like the last), when free space runs low
        (:meth:`_space_low`). Never past the segment size: a record that
        would go past it starts the next segment. Only chunks of
        :data:`logstore.zerofill.AHEAD_MIN_CHUNK` or more are extended ahead:
        a smaller one adds little to the append that writes it with its
        record, while a job costs a sync of its own (short and slow
        conversations, the common case, never start one). ``mutex`` held;
        the chunk is the one set at the last extension (see
        :meth:`_measure_pace`).
        """
        limit = self.options.segment_bytes
        seg = self.active
        if seg is None or seg.sealed or self._damage is not None or seg.alloc >= limit:
            return None
        if not self._space_low(seg):
            return None
        chunk = self._chunk()
        if chunk < self._ahead_min():
            return None  # a small chunk costs an append little; a job would cost a sync of its own
        block = min(zerofill.BLOCK, self._first_chunk())
        target = min(zerofill.blocks(max(seg.alloc + chunk, seg.end + 2 * self._last_group), block), limit)
        return target if target > seg.alloc else None

    def _schedule_extension(self) -> None:
        """After a group was written (``mutex`` held): hand over an extend-ahead job when free space runs low.

        The chunk is measured (the write rate since the last extension) only
        here, once free space runs low and no job is under way, and at an
        append's own extension: once per extension.
        """
        seg = self.active
        if self._extend_queued or self._growing or seg is None or not self._space_low(seg):
            return
        if seg.alloc >= self.options.segment_bytes:
            return
        if 2 * self._chunk() < self._ahead_min():
            return  # even doubled, the next chunk is the append's to write (saves measuring every group)
        self._measure_pace(seg.end)
        if self._ahead_target() is None:
            return
        self._extend_queued = True
        try:
            run_extension(self._extend_ahead)
        except RuntimeError:
            self._extend_queued = False  # the interpreter is shutting down: appends extend for themselves

    def _extend_ahead(self) -> None:
        """Extend the active segment by a chunk of zeros, written and synced, before an append needs them.

        A job run on a background thread (:data:`run_extension`). It holds the
        conversation's file lock, exclusive, from start to end (other processes
        wait; this process's appends share it and go on writing into the space
        already there), and ``_growing``: nothing else writes past ``_alloc``,
        and the segment is neither closed, cut nor sealed until it is over.
        The chunk is written in steps of :data:`EXTEND_STEP`, each written out
        (:func:`logstore.fileio.write_out`: no device flush) before the next,
        then synced once; only then does ``_alloc`` cover it, so an append
        into it flushes data only, and the chunk costs the device one flush.
        The zeros go through a descriptor of
        the job's own: a writeback error its sync meets is reported to the
        appends' descriptor too (each open file description learns of it),
        never consumed here. A failure is harmless: what it wrote is zeros past
        every record, and an append that needs that space syncs it itself.
        """
        with self.mutex:
            self._extend_queued = False
            plan = self._begin_extension()
        if plan is None:
            return
        fd, pos, target = plan
        try:
            while pos < target:
                stop = min(target, (pos // EXTEND_STEP + 1) * EXTEND_STEP)
                fileio.pwrite_all(fd, _ZERO_STEP if stop - pos == EXTEND_STEP else bytes(stop - pos), pos)
                if stop < target:
                    fileio.write_out(fd, pos, stop - pos)
                pos = stop
            fileio.crashpoint("extend-ahead-written")
            fileio.fdatasync(fd)
            with self.mutex:
                seg = self.active
                assert seg is not None  # (``_growing``: the segment is neither closed nor replaced meanwhile)
                seg.alloc = target
                self._cond.notify_all()
        except OSError:
            pass  # see the docstring: the space past _alloc is left to the appends
        finally:
            os.close(fd)
            with self.mutex:
                self._growing = False
                self._unlock()
                self._cond.notify_all()

    def _give_back_zeros(self) -> None:
        """At close (``mutex`` held, nothing in flight): hand the zeros past the data end back, in the background.

        The active segment is cut to its data end rounded up to a block by a
        job (:func:`logstore.zerofill.trim`, through :data:`run_extension`),
        which checks again, under the conversation's lock, that nothing was
        written since; and the chunk goes back to the site's budget.
        """
        if self._pace is not None:
            self._pace.release()
        seg = self.active
        if seg is None or seg.sealed or self._damage is not None or not self._segments:
            return
        keep = zerofill.blocks(seg.end, min(zerofill.BLOCK, self._first_chunk()))
        if seg.alloc <= keep:
            return
        job = functools.partial(zerofill.trim, self._seg_path(self._segments[-1]),
                                os.path.join(self.path, layout.LOCK_FILE), seg.alloc, seg.end, keep)
        try:
            run_extension(job)
        except RuntimeError:
            pass  # shutting down: the zeros stay (harmless)

    def _reclaim_zeros(self) -> bool:
        """The site's budget asks (another conversation needs room): give this idle one's zeros back now.

        Only when its ``mutex`` is free and nothing is in flight, queued or
        growing; True when it did. The cut runs in the background as at
        close (the state in memory is brought up to date with the file at the
        next append, as after another process's write); the chunk starts
        again from the first.
        """
        if not self.mutex.acquire(blocking=False):
            return False
        try:
            if self.closed or self._inflight or self._queue or self._growing or self._extend_queued or self._leased:
                return False
            self._give_back_zeros()
            if self._pace is not None:
                self._pace.chunk = self._first_chunk()
            return True
        finally:
            self.mutex.release()

    def _begin_extension(self) -> tuple[int, int, int] | None:
        """Take the file lock and ``_growing`` for an extension the active segment needs (``mutex`` held).

        ``(descriptor, from, to)``, or None when there is nothing to do: the
        conversation is closed or already growing, another process holds its
        lock (its appends extend the file as they need), or, its tail
        re-verified, the free space suffices.
        """
        if self.closed or self._growing or self.active is None or self._lock_fd is None:
            return None
        fresh = self._lock_holds == 0 and not self._leased
        if fresh:
            if not fileio.try_lock(self._lock_fd, True):
                return None
            self._lock_excl = True
            self._lease_since = time.monotonic()
            self._busy = False  # an extension of its own never makes a lease
        self._leased = False  # (a lease is an exclusive hold: now the job's)
        self._lock_holds += 1
        fd = -1
        try:
            if fresh:
                # Another process may have written since our last append: look again.
                self._refresh(True)
            target = self._ahead_target()
            if target is not None:
                fd = os.open(self._seg_path(self._segments[-1]), os.O_WRONLY)
                seg = self.active
                assert seg is not None
                if os.fstat(fd).st_ino == os.fstat(seg.fd).st_ino:
                    self._growing = True
                    return fd, seg.alloc, target
        except OSError:
            if fresh:
                self._close_files()  # a half-done refresh: the next call loads again
        except Exception:  # known damage and the like: the next append reports it
            pass
        if fd >= 0:
            os.close(fd)
        self._unlock()
        return None
