"""The append path: one batch, one record, durable before it is acknowledged.

An append holds the conversation exclusively (thread mutex and file lock),
re-verifies the tail (:mod:`logstore.recovery`), logs its intent in the site
manifest, writes the record and syncs it, then owes the manifest its commit
(kept in memory and carried by the conversation's next intent, or logged at
close; FORMAT.md section 5: no manifest write after the sync). A
conversation's first segment is created in place with its first batch
(:meth:`Writer._create_first_segment`); later segments are created whole
(header synced, then renamed into place) when the active one is rolled
(sealed) past ``Options.segment_bytes``.

Preallocated space: the active segment's file is kept larger than its
records, the rest zero-filled and synced, so that most appends write into
space the file already has and their fdatasync flushes data and no metadata.
How much is :mod:`logstore.zerofill`'s choice (sized to the conversation's
write rate, bounded per site, trimmed at close). Extend-ahead: once an
append leaves little free space and the next chunk is big, a background job
(:meth:`Writer._extend_ahead`) extends the file by a chunk of zeros, written
out in steps and synced once, holding the conversation's file lock, while
this process's appends go on writing into the space already there. An
append whose records do not fit waits for the job, or, with no job running,
extends the file itself (zeros written after the records, in the same write
and the same sync). A sealed segment is cut to its records before the next
one is created.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import time
from collections.abc import Callable, Iterator

from . import background, convpool, fileio, follow, frame, idempotency, index, layout, poolclaims, zerofill
from .convstate import Options, Tip
from .errors import ConversationFull, IdempotencyConflict, IdempotencyRedacted, Io, SeqConflict, Timeout
from .frame import KIND_BATCH, KIND_KEYED, KIND_SEAL, SEGMENT_HEADER_SIZE
from .limits import MAX_CONVERSATION_ITEMS
from .recovery import Recovery
from .redaction import redacted_in_retry
from .timefmt import now_us

_INDEX_WRITE_GROUP = 16

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


#: Runs extend-ahead jobs (:meth:`Writer._extend_ahead`) and the cuts of zeros at close
#: (:meth:`Writer._give_back_zeros`): on a pool thread. Tests that need
#: the file operations in a reproducible order replace it (with a list's ``append``, say,
#: and run the jobs themselves); a job that never runs only leaves appends to extend the
#: file themselves.
run_extension: Callable[[Callable[[], None]], None] = _run_extension_job


class _Batch:
    """One caller's batch in the conversation's writer queue, and what became of it.

    ``body`` is the record's body: for a keyed batch (``key`` set) the key and
    then the items, whose digest is ``digest``. ``expect`` is the caller's
    ``expected_next_seq``. A batch answered from its key without being written
    gets a result whose ``recorded_at_us`` is 0.
    """

    __slots__ = ("body", "count", "digest", "done", "error", "expect", "key", "result", "taken")

    def __init__(self, body: bytes, count: int, key: str | None = None, expect: int | None = None) -> None:
        self.key = key
        self.expect = expect
        self.digest = idempotency.digest(body) if key is not None else b""
        self.body = frame.keyed_body(key.encode("ascii"), body) if key is not None else body
        self.count = count
        self.taken = False  # part of a group being written: the caller must wait for its outcome
        self.done = False
        self.result: tuple[int, int, int] = (0, 0, 0)
        self.error: BaseException | None = None


#: Seconds a leader waits for the writers of the last group to queue their next batches.
GATHER_WAIT = 0.0002

#: A group commit takes at most this many batches ...
GROUP_MAX_BATCHES = 64
#: ... and at most this many bytes of records (more when the first batch alone is bigger).
GROUP_MAX_BYTES = 1 << 20


class Writer(Recovery):
    #: The idempotency keys of recent batches (:mod:`logstore.idempotency`), built on the first keyed append.
    _keys: idempotency.KeyTable | None = None
    #: The write rate and chunk of the zero-filled space ahead (:mod:`logstore.zerofill`), from the first extension.
    _pace: zerofill.Pace | None = None

    """Appends batches to the conversation's active segment, several threads' batches in one sync.

    Group commit (LevelDB's writer queue): every caller queues its batch and
    waits; the caller at the head of the queue is the leader. It takes the
    batches queued behind it (up to :data:`GROUP_MAX_BATCHES` and
    :data:`GROUP_MAX_BYTES`), writes them as separate records (each with its
    own seqs and ``recorded_at``) in one write and one ``fdatasync``, and
    acknowledges each; when the write or the sync fails, every batch of the
    group fails and none is acknowledged. While the leader writes and syncs it
    releases ``mutex`` (so that batches can queue behind it), with
    ``_inflight`` set: reads then use the state as it was (the group is not
    acknowledged yet), and :meth:`Conversation.close` waits.
    """

    def append(
        self,
        body: bytes,
        count: int,
        deadline: float,
        started: float,
        key: str | None = None,
        expect: int | None = None,
    ) -> tuple[int, int, int]:
        """Append one encoded batch; return ``(first_seq, last_seq, recorded_at_us)``.

        Caller holds ``mutex``. Durable on return. Gives up with Timeout at
        ``deadline`` (a ``time.monotonic()`` value) when another process holds
        the conversation, or when the batch is still queued then.

        ``key`` (a validated idempotency key): when a retained batch carries
        it, nothing is written and its range is returned with
        ``recorded_at_us`` 0, or IdempotencyConflict is raised when its items
        differ. ``expect``: SeqConflict, nothing written, unless the batch
        would start at that seq (a keyed retry is answered before this check).
        """
        me = _Batch(body, count, key, expect)
        queue = self._queue
        queue.append(me)
        if self._gathering:
            self._cond.notify_all()  # a leader waits for the writers of the last group
        while not me.done and queue[0] is not me:
            left = deadline - time.monotonic()
            if left <= 0 and not me.taken:
                queue.remove(me)
                self._cond.notify_all()
                raise Timeout(time.monotonic() - started)
            self._cond.wait(max(left, 0.001))
        if not me.done:
            self._lead(deadline, started)
        if me.error is not None:
            raise me.error
        return me.result

    def _lead(self, deadline: float, started: float) -> None:
        """Write the batches at the head of the queue as one group (this thread's batch first).

        When the last group held several batches and fewer are queued now, the
        leader first waits a little (at most :data:`GATHER_WAIT`) for their
        writers to come back with their next batch, as PostgreSQL's
        ``commit_delay`` does when other transactions are active: otherwise the
        first writer back from a group finds the queue empty and syncs alone,
        and the groups alternate between one batch and the rest.
        """
        queue = self._queue
        want = min(self._last_batches, GROUP_MAX_BATCHES)
        if 1 < want and len(queue) < want:
            self._gathering = True
            until = time.monotonic() + GATHER_WAIT
            try:
                while len(queue) < want:
                    left = until - time.monotonic()
                    if left <= 0:
                        break
                    self._cond.wait(left)
            finally:
                self._gathering = False
        group: list[_Batch] = []
        size = 0
        for b in queue:
            if group and (len(group) >= GROUP_MAX_BATCHES or size + len(b.body) > GROUP_MAX_BYTES):
                break
            b.taken = True
            group.append(b)
            size += len(b.body) + frame.RECORD_OVERHEAD
        try:
            written = self._append_group(group, deadline, started)
        except BaseException as exc:
            written = len(group)
            for b in group:
                b.error = exc
        finally:
            for b in group:
                b.taken = False
        for b in group[:written]:
            b.done = True
            queue.popleft()
        self._last_batches = written
        self._cond.notify_all()
        follow.changed(self.path)  # this process's followers (others learn of the write by inotify)

    def _append_group(self, group: list[_Batch], deadline: float, started: float) -> int:
        """Append a prefix of ``group`` (at least one batch), each its own record, in one sync; how many.

        A batch that would take the conversation past its item limit fails
        alone (ConversationFull); batches left out (the group did not fit the
        segment) stay queued for the next leader.
        """
        # What _exclusive does, without a generator's cost on every append.
        self._take_exclusive(deadline, started)
        try:
            # recorded_at never decreases within a conversation, whatever the wall clock does.
            stamp = max(now_us(), self._last_us)
            nxt = self._next_seq
            if len(group) == 1 and group[0].key is None and group[0].expect is None:
                b = group[0]
                if nxt + b.count > MAX_CONVERSATION_ITEMS:
                    b.error = ConversationFull(MAX_CONVERSATION_ITEMS, nxt + b.count)
                    return 1
                b.result = (nxt, nxt + b.count - 1, stamp)
                self._commit_group(group, stamp)  # one batch always fits (a segment takes at least one)
                self._note_keys(group)
                return 1
            keys = self._key_table() if any(b.key is not None for b in group) else None
            pending: dict[str, _Batch] = {}  # keys of this group's batches to be written
            todo: list[_Batch] = []
            for b in group:
                b.error = None  # a batch left over from the last group is judged afresh
                if b.key is not None and self._answer_from_key(b, keys, pending):
                    continue
                if b.expect is not None and b.expect != nxt:
                    b.error = SeqConflict(b.expect, nxt)
                    continue
                if nxt + b.count > MAX_CONVERSATION_ITEMS:
                    b.error = ConversationFull(MAX_CONVERSATION_ITEMS, nxt + b.count)
                    continue
                b.result = (nxt, nxt + b.count - 1, stamp)
                nxt += b.count
                todo.append(b)
                if b.key is not None:
                    pending[b.key] = b
            if todo:
                taken = self._commit_group(todo, stamp)
                self._note_keys(todo[:taken])
                if taken < len(todo):
                    # Left for the next leader: every batch behind the last one written.
                    return group.index(todo[taken])
            return len(group)
        finally:
            self._unlock()

    def _load(self, writable: bool) -> None:
        """Load the log afresh (as :class:`Recovery`); a log that lost seqs was forgotten since.

        The listing's commits this process still owes for those seqs are then
        stale, and are dropped.
        """
        known = self._next_seq if self._loaded else 0
        super()._load(writable)
        if self._next_seq < known:
            self.manifest.shrank(self.conversation_id, self._next_seq)

    def _key_table(self) -> idempotency.KeyTable:
        """The conversation's key table, current with the log (exclusive lock held, tail verified)."""
        table = self._keys
        if table is None or table.covered > self._next_seq:
            table = self._keys = idempotency.build(self)
        elif table.covered < self._next_seq:
            idempotency.catch_up(self, table)  # another process appended since
        return table

    def _answer_from_key(self, b: _Batch, keys: idempotency.KeyTable | None, pending: dict[str, _Batch]) -> bool:
        """Answer a keyed batch from a retained batch with its key, if any (True: nothing to write)."""
        assert b.key is not None and keys is not None
        found = keys.get(b.key)
        stored: tuple[bytes, list[bytes]] | None = None
        if found is not None:
            first, last, dig = found.first, found.last, found.digest
            # The batch as stored now decides: a redaction since may have rewritten it (the table's
            # digest is of the items as appended). A retry is rare; this reads one record.
            stored = idempotency.stored_batch(self, first)
            if stored is not None:
                dig = stored[0]
        elif (twin := pending.get(b.key)) is not None:
            first, last, dig = twin.result[0], twin.result[1], twin.digest  # the same key twice in one group
        else:
            return False
        if dig != b.digest:
            b.error = self._key_conflict(b, first, last, stored[1] if stored is not None else None)
        else:
            b.result = (first, last, 0)
        return True

    @staticmethod
    def _key_conflict(b: _Batch, first: int, last: int, stored: list[bytes] | None) -> IdempotencyConflict:
        """The error of a keyed retry whose items differ from its batch's ``stored`` items (None: unknown):
        IdempotencyRedacted when a redaction of the batch may be why, else IdempotencyConflict."""
        assert b.key is not None
        if stored is not None:
            retried = [bytes(r) for r in idempotency.RAW_ITEMS.decode(frame.items_body(frame.KIND_KEYED, b.body))]
            hidden = redacted_in_retry(stored, retried)
            if hidden is not None:
                return IdempotencyRedacted(b.key, first, last, [first + i for i in hidden])
        return IdempotencyConflict(b.key, first, last)

    def _note_keys(self, written: list[_Batch]) -> None:
        """Keep the key table (if built) current with batches just written (``mutex`` held)."""
        table = self._keys
        if table is None or not written or table.covered != written[0].result[0]:
            return  # not built, or behind the log: the next keyed append catches it up
        for b in written:
            table.note(b.key, b.result[0], b.result[1], b.digest, b.result[2])
        table.prune(written[-1].result[2])

    @contextlib.contextmanager
    def _exclusive(self, deadline: float, started: float) -> Iterator[None]:
        """Hold the conversation for writing, its tail verified and undamaged. Caller holds ``mutex``."""
        self._take_exclusive(deadline, started)
        try:
            yield
        finally:
            self._unlock()

    def _take_exclusive(self, deadline: float, started: float) -> None:
        """Take the file lock (exclusive) and verify the tail, as :meth:`_exclusive`; the caller unlocks."""
        if self._fd is None and not self._claim_from_pool():
            # No segment open: the directory may not exist yet. Made here, unsynced (its lock
            # file lives in it); the first segment's creation makes it durable before any
            # batch in it is acknowledged (_create_first_segment).
            fileio.make_dirs(self.path)
        fileio.resync_failed_dirs(self.path)
        # Held by an extend-ahead job of ours (see ConversationState._lock): the state is current.
        shared = self._lock_holds > 0
        self._lock(True, deadline, started)
        try:
            try:
                if not shared and self._claim is None:
                    # shared: an extend-ahead job of ours holds the lock, the state is current;
                    # a claimed pool entry: its state was set at the claim (nobody else can write it).
                    self._refresh(True)
            except OSError as exc:
                self._close_files()
                raise Io(f"reading the conversation's tail failed: {exc}", exc.errno) from exc
            if self._damage is not None:
                raise self._damage
        except BaseException:
            self._unlock()
            raise

    def _claim_from_pool(self) -> bool:
        """For a conversation with no directory yet: claim a pre-created one (:mod:`logstore.convpool`).

        True when this conversation's directory is a claimed pool entry whose
        first segment is not written yet; its lock file's flock, held, is then
        the conversation's writer lock. Caller holds ``mutex``.
        """
        if self._claim is not None:
            return True
        missing, self._missing = self._missing, None  # (a hint for this first attempt only)
        pool = self.pool
        if pool is None or self._first_chunk() != pool.entry_bytes or (missing is None and os.path.isdir(self.path)):
            return False
        claim = pool.claim(self.path, missing)
        if claim is None:
            return False
        if self._lock_fd is not None:
            os.close(self._lock_fd)
        self._lock_fd = claim.lock_fd
        self._claim = claim
        # What loading it would find: one segment of zeros, a torn creation, so nothing.
        self._close_files()
        self._loaded = True
        return True

    def _commit_group(self, todo: list[_Batch], stamp: int) -> int:
        """Log the intent, write and sync the records, log the commit (inside :meth:`_exclusive`); batches written."""
        self._pending_end = None
        limit = self.options.segment_bytes
        first_size = len(todo[0].body) + frame.RECORD_OVERHEAD
        roll = bool(self._segments) and (
            self._sealed_active or (self._end > SEGMENT_HEADER_SIZE and self._end + first_size > limit)
        )
        # Only the records that fit the segment (at least one): the rest wait for the next group.
        n, end = 0, self._end if self._segments and not roll else SEGMENT_HEADER_SIZE
        for b in todo:
            size = len(b.body) + frame.RECORD_OVERHEAD
            if n and end + size > limit:
                break
            end += size
            n += 1
        todo = todo[:n]
        first = todo[0].result[0]
        last = todo[-1].result[1] + 1
        created = self._created_us if self._created_us is not None else stamp
        tip = Tip(created, stamp, last)
        self.manifest.intent(self.conversation_id, tip, new=first == 0)
        fileio.crashpoint("manifest-intent")
        try:
            if not self._segments:
                self._create_first_segment(todo, stamp)
            else:
                if roll:
                    self._roll()
                self._write_records(self._encode(todo, stamp, self._salt), todo, stamp)
        except OSError as exc:
            self._poison()
            raise Io(f"appending to the log failed: {os.strerror(exc.errno or errno.EIO)}", exc.errno) from exc
        self._created_us = created
        # In memory only (no I/O, nothing to fail): the batches are durable and acknowledged
        # whatever becomes of the owed commit; a listing elsewhere probes the pending intent.
        self.manifest.commit(self.conversation_id, tip)
        fileio.crashpoint("manifest-commit")
        self._schedule_extension()
        if self._refill_pool:
            self._refill_pool = False
            assert self.pool is not None
            self.pool.refill_if_due(self.mutex)
        return n

    def _commit_batch(self, body: bytes, count: int, first: int, stamp: int) -> None:
        """Append one batch at seq ``first`` stamped ``stamp`` (a restore; in :meth:`_exclusive`, ``mutex`` held)."""
        b = _Batch(body, count)
        b.result = (first, first + count - 1, stamp)
        self._commit_group([b], stamp)

    @staticmethod
    def _encode(todo: list[_Batch], stamp: int, salt: int) -> list[bytes]:
        return [
            frame.encode_record(salt, KIND_BATCH if b.key is None else KIND_KEYED, b.result[0], b.count, stamp, b.body)
            for b in todo
        ]

    def _write_records(self, records: list[bytes], todo: list[_Batch], stamp: int) -> None:
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

    def _written(self, records: list[bytes], todo: list[_Batch], stamp: int, offset: int) -> None:
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

    def _extended_size(self, rec_end: int) -> int:
        """The new file size when a record ending at ``rec_end`` does not fit the space allocated.

        One chunk (:meth:`_chunk`) past the space allocated, or past the
        record when it is bigger; never past the segment size unless the
        record itself does; whole 4 KiB blocks (smaller for tiny test segments).
        """
        first = self._first_chunk()
        size = zerofill.blocks(max(self._alloc + self._chunk(), rec_end), min(zerofill.BLOCK, first))
        return max(rec_end, min(size, self.options.segment_bytes))

    def growth_bound(self, record_bytes: int) -> int:
        """At most what an append of ``record_bytes`` may add to the active segment's allocation (quota).

        The extension the record itself needs plus the extend-ahead chunk it
        would then start, each at most twice the current chunk (a chunk grows
        at most twofold per extension). 0 while the segment is not open in
        this process (nothing known: the append's own estimate stands).
        ``mutex`` held.
        """
        if self._fd is None or self._sealed_active:
            return 0
        rec_end = self._end + record_bytes
        grown = min(2 * self._chunk(), zerofill.CHUNK_MAX)
        need = zerofill.blocks(rec_end + grown) - self._alloc if rec_end > self._alloc else 0
        return max(need, 0) + (grown if grown >= self._ahead_min() else 0)

    def _ahead_min(self) -> int:
        """The smallest chunk a background job writes (an eighth of the segment size, if smaller)."""
        return min(zerofill.AHEAD_MIN_CHUNK, self.options.segment_bytes // 8)

    def _space_low(self) -> bool:
        """Free space runs low: below half the chunk, or below room for two more groups like the last."""
        return self._alloc - self._end < max(self._chunk() // 2, 2 * self._last_group)

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
        if self._fd is None or self._sealed_active or self._damage is not None or self._alloc >= limit:
            return None
        if not self._space_low():
            return None
        chunk = self._chunk()
        if chunk < self._ahead_min():
            return None  # a small chunk costs an append little; a job would cost a sync of its own
        block = min(zerofill.BLOCK, self._first_chunk())
        target = min(zerofill.blocks(max(self._alloc + chunk, self._end + 2 * self._last_group), block), limit)
        return target if target > self._alloc else None

    def _schedule_extension(self) -> None:
        """After a group was written (``mutex`` held): hand over an extend-ahead job when free space runs low.

        The chunk is measured (the write rate since the last extension) only
        here, once free space runs low and no job is under way, and at an
        append's own extension: once per extension.
        """
        if self._extend_queued or self._growing or self._fd is None or not self._space_low():
            return
        if self._alloc >= self.options.segment_bytes:
            return
        if 2 * self._chunk() < self._ahead_min():
            return  # even doubled, the next chunk is the append's to write (saves measuring every group)
        self._measure_pace(self._end)
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
                self._alloc = target
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
        if self._fd is None or self._sealed_active or self._damage is not None or not self._segments:
            return
        keep = zerofill.blocks(self._end, min(zerofill.BLOCK, self._first_chunk()))
        if self._alloc <= keep:
            return
        job = functools.partial(zerofill.trim, self._seg_path(self._segments[-1]),
                                os.path.join(self.path, layout.LOCK_FILE), self._alloc, self._end, keep)
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
            if self.closed or self._inflight or self._queue or self._growing or self._extend_queued:
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
        if self.closed or self._growing or self._fd is None or self._lock_fd is None:
            return None
        fresh = self._lock_holds == 0
        if fresh and not fileio.try_lock(self._lock_fd, True):
            return None
        self._lock_holds += 1
        fd = -1
        try:
            if fresh:
                # Another process may have written since our last append: look again.
                self._refresh(True)
            target = self._ahead_target()
            if target is not None:
                fd = os.open(self._seg_path(self._segments[-1]), os.O_WRONLY)
                assert self._fd is not None
                if os.fstat(fd).st_ino == os.fstat(self._fd).st_ino:
                    self._growing = True
                    return fd, self._alloc, target
        except OSError:
            if fresh:
                self._close_files()  # a half-done refresh: the next call loads again
        except Exception:  # known damage and the like: the next append reports it
            pass
        if fd >= 0:
            os.close(fd)
        self._unlock()
        return None

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

    def _create_first_segment(self, todo: list[_Batch], stamp: int) -> None:
        """Create the conversation's first segment holding its first batches, durably, with the fewest syncs.

        The segment is created in place (FORMAT.md 6, "Creating a conversation"):
        its header, the batches' records and the first chunk of preallocated
        zeros go in one write from offset 0, so the
        header lies whole in the file's first sector; then, at the same time, its
        ``fdatasync``, the sync of the conversation directory and of each
        directory above it this process has not yet seen made durable
        (:func:`logstore.fileio.sync_dir_chain`). A power cut before all that
        leaves no segment, or one whose first sector is all zeros (a torn
        creation, which recovery treats as empty and the next append rewrites),
        or a whole header with a torn record (a torn tail): never an
        acknowledged batch. The index file is created with the first index entry.

        In a claimed pool entry (FORMAT.md 6, "A first append in one sync") the
        same write goes into the entry's synced zeros, the conversation's
        identity into its lock file, and only those two files are synced: the
        rename into place is synced after the acknowledgement
        (:meth:`logstore.convpool.SitePool.settle_later`), and a power cut that
        undoes it leaves the entry for :mod:`logstore.poolclaims` to move back.
        """
        salt = frame.new_salt()
        records = self._encode(todo, stamp, salt)
        data = frame.encode_segment_header(0, salt) + b"".join(records)
        claim, self._claim = self._claim, None
        if claim is not None:
            # A claimed pool entry: its file is the pool's entry_bytes of synced zeros, so the write
            # goes into allocated space (extending it only when the batch is bigger).
            self._alloc = claim.size
            size = claim.size if len(data) <= claim.size else self._extended_size(len(data))
            fd = claim.seg_fd
            self._close_active()
            self._fd = fd
            self._pending_end = 0  # on failure the file is emptied: an empty file is a torn creation
            fileio.pwrite_all(fd, data if size == claim.size else data + bytes(size - len(data)), 0)
            fileio.crashpoint("after-file-create")
            # The conversation's identity, in the entry's lock file (a synced sector of zeros): a power
            # cut that undoes the rename leaves it beside the data, for poolclaims to move it back into
            # place. The two files' syncs are the only ones: the rename is synced after the acknowledgement.
            fileio.pwrite_all(claim.lock_fd, poolclaims.encode(self.conversation_id), 0)
            fileio.crashpoint("before-data-sync")
            fileio.sync_all([fd, claim.lock_fd], [])
            fileio.crashpoint("pool-claim-synced")
        else:
            self._alloc = 0
            size = self._extended_size(len(data))
            # O_TRUNC: a torn creation's file may be there (only then: there is no segment otherwise).
            fd = fileio.open_create(self._seg_path(0), os.O_RDWR | os.O_TRUNC)
            self._close_active()
            self._fd = fd
            self._pending_end = 0  # on failure the file is emptied: an empty file is a torn creation
            fileio.pwrite_all(fd, data + bytes(size - len(data)), 0)
            fileio.crashpoint("after-file-create")
            fileio.crashpoint("before-data-sync")
            # The data sync and the directory syncs at the same time (measured faster than one after
            # the other on the benchmark machine's filesystem; see fileio.fsync_dirs). A claim that
            # failed before its first segment was durable left its directories to sync here.
            fileio.sync_dir_chain(self.path, layout.sites_dir_of_conversation(self.path), data_fd=fd,
                                  also=convpool.unsettled(self.path))
        convpool.settled(self.path)
        if claim is not None and self.pool is not None:
            self.pool.settle_later(claim)
        fileio.crashpoint("after-data-sync")
        # The pool is refilled once the append is done (_commit_group): the fill's syncs and
        # interpreter time would otherwise compete with this append's.
        self._refill_pool = self.pool is not None and self._first_chunk() == self.pool.entry_bytes
        self._salt = salt
        self._alloc = size
        self._sealed_active = False
        self._segments = [0]
        self._idx = index.SparseIndex(0, salt)
        self._idx_fd = None
        self._idx_lazy = True
        self._written(records, todo, stamp, SEGMENT_HEADER_SIZE)

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
        self._fd = fd
        self._salt = salt
        self._end = SEGMENT_HEADER_SIZE
        self._alloc = size
        self._sealed_active = False
        self._segments.append(base)
        self._idx = index.SparseIndex(base, salt)
        self._idx_fd = index.open_for_append(self._idx_path(base), self._idx)
        self._idx_lazy = False

    def _roll(self) -> None:
        """Seal the active segment and start the next one."""
        self._settle()  # no extension may write zeros into a sealed segment
        fd = self._fd
        assert fd is not None
        synced = True
        if not self._sealed_active:
            seal = frame.encode_record(self._salt, KIND_SEAL, self._next_seq, 0, self._last_us, b"")
            fileio.pwrite_all(fd, seal, self._end)
            self._end += len(seal)
            self._sealed_active = True
            synced = False
        if self._alloc > self._end:
            # A sealed segment keeps no preallocated space: cut it, durably (this sync
            # covers the seal too), before the next segment exists.
            fileio.truncate(fd, self._end)
            self._alloc = self._end
        elif not synced:
            fileio.fdatasync(fd)
        fileio.crashpoint("segment-roll-sealed")
        if self._idx_lazy:
            self._create_index_file()  # a sealed segment has its index file, even without entries
        self._write_index_entries()  # the sealed segment's index is complete, and nobody else writes it
        self._sealed_cache.clear()
        self._create_segment(self._next_seq)
        fileio.crashpoint("segment-roll-created")

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

