"""The append path: one batch, one record, durable before it is acknowledged.

An append holds the conversation exclusively (thread mutex and file lock),
re-verifies the tail (:mod:`logstore.recovery`), logs its intent in the site
manifest, writes the record and syncs it, then logs the commit. A
conversation's first segment is created in place with its first batch
(:meth:`Writer._create_first_segment`); later segments are created whole
(header synced, then renamed into place) when the active one is rolled
(sealed) past ``Options.segment_bytes``.

Preallocated space: the active segment's file is kept larger than its
records, the rest zero-filled and synced, so that most appends write into
space the file already has and their fdatasync flushes data and no metadata.
An append whose record does not fit extends the file by a chunk (zeros
written after the record, in the same write and the same sync). A sealed
segment is cut to its records before the next one is created.
"""

from __future__ import annotations

import contextlib
import errno
import os
import time
from collections.abc import Iterator

from . import convpool, fileio, frame, index, layout
from .convstate import Tip
from .errors import ConversationFull, Io, StoreError, Timeout
from .frame import KIND_BATCH, KIND_SEAL, SEGMENT_HEADER_SIZE
from .limits import MAX_CONVERSATION_ITEMS
from .recovery import Recovery
from .timefmt import now_us

_INDEX_WRITE_GROUP = 16

#: Preallocated space (FORMAT.md, "Preallocated space"): a new segment is created
#: this big (header and zeros), and each extension adds at least this much ...
PREALLOC_FIRST = 4096
#: ... and at most this much: the file about doubles until chunks reach it.
PREALLOC_MAX = 1 << 20



class _Batch:
    """One caller's batch in the conversation's writer queue, and what became of it."""

    __slots__ = ("body", "count", "done", "error", "result", "taken")

    def __init__(self, body: bytes, count: int) -> None:
        self.body = body
        self.count = count
        self.taken = False  # part of a group being written: the caller must wait for its outcome
        self.done = False
        self.result: tuple[int, int, int] = (0, 0, 0)
        self.error: BaseException | None = None


#: A group commit takes at most this many batches ...
GROUP_MAX_BATCHES = 64
#: ... and at most this many bytes of records (more when the first batch alone is bigger).
GROUP_MAX_BYTES = 1 << 20


class Writer(Recovery):
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

    def append(self, body: bytes, count: int, deadline: float, started: float) -> tuple[int, int, int]:
        """Append one encoded batch; return ``(first_seq, last_seq, recorded_at_us)``.

        Caller holds ``mutex``. Durable on return. Gives up with Timeout at
        ``deadline`` (a ``time.monotonic()`` value) when another process holds
        the conversation, or when the batch is still queued then.
        """
        me = _Batch(body, count)
        queue = self._queue
        queue.append(me)
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
        """Write the batches at the head of the queue as one group (this thread's batch first)."""
        queue = self._queue
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
        self._cond.notify_all()

    def _append_group(self, group: list[_Batch], deadline: float, started: float) -> int:
        """Append a prefix of ``group`` (at least one batch), each its own record, in one sync; how many.

        A batch that would take the conversation past its item limit fails
        alone (ConversationFull); batches left out (the group did not fit the
        segment) stay queued for the next leader.
        """
        with self._exclusive(deadline, started):
            # recorded_at never decreases within a conversation, whatever the wall clock does.
            stamp = max(now_us(), self._last_us)
            todo: list[_Batch] = []
            nxt = self._next_seq
            for b in group:
                if nxt + b.count > MAX_CONVERSATION_ITEMS:
                    b.error = ConversationFull(MAX_CONVERSATION_ITEMS, nxt + b.count)
                    continue
                b.result = (nxt, nxt + b.count - 1, stamp)
                nxt += b.count
                todo.append(b)
            if todo:
                taken = self._commit_group(todo, stamp)
                if taken < len(todo):
                    # Left for the next leader: every batch behind the last one written.
                    return group.index(todo[taken])
            return len(group)

    @contextlib.contextmanager
    def _exclusive(self, deadline: float, started: float) -> Iterator[None]:
        """Hold the conversation for writing, its tail verified and undamaged. Caller holds ``mutex``."""
        if self._fd is None and not self._claim_from_pool():
            # No segment open: the directory may not exist yet. Made here, unsynced (its lock
            # file lives in it); the first segment's creation makes it durable before any
            # batch in it is acknowledged (_create_first_segment).
            fileio.make_dirs(self.path)
        fileio.resync_failed_dirs(self.path)
        self._lock(True, deadline, started)
        try:
            try:
                if self._claim is None:
                    self._refresh(True)
                # else: a claimed pool entry, its state set at the claim (nobody else can write it)
            except OSError as exc:
                self._close_files()
                raise Io(f"reading the conversation's tail failed: {exc}", exc.errno) from exc
            if self._damage is not None:
                raise self._damage
            yield
        finally:
            self._unlock()

    def _claim_from_pool(self) -> bool:
        """For a conversation with no directory yet: claim a pre-created one (:mod:`logstore.convpool`).

        True when this conversation's directory is a claimed pool entry whose
        first segment is not written yet; its lock file's flock, held, is then
        the conversation's writer lock. Caller holds ``mutex``.
        """
        if self._claim is not None:
            return True
        pool = self.pool
        if pool is None or self._first_chunk() != pool.entry_bytes or os.path.isdir(self.path):
            return False
        claim = pool.claim(self.path)
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
        try:
            self.manifest.commit(self.conversation_id, tip)
        except (OSError, StoreError):
            # The batches are durable: the append has happened and must not be reported as
            # failed (a Timeout or Io here would be a lie: "nothing was written"). The
            # listing learns of it when the intent is resolved by probing (FORMAT.md 5).
            pass
        fileio.crashpoint("manifest-commit")
        return n

    def _commit_batch(self, body: bytes, count: int, first: int, stamp: int) -> None:
        """Append one batch at seq ``first`` stamped ``stamp`` (a restore; in :meth:`_exclusive`, ``mutex`` held)."""
        b = _Batch(body, count)
        b.result = (first, first + count - 1, stamp)
        self._commit_group([b], stamp)

    @staticmethod
    def _encode(todo: list[_Batch], stamp: int, salt: int) -> list[bytes]:
        return [frame.encode_record(salt, KIND_BATCH, b.result[0], b.count, stamp, b.body) for b in todo]

    def _write_records(self, records: list[bytes], todo: list[_Batch], stamp: int) -> None:
        """One write and one fdatasync for the group; ``mutex`` is released meanwhile (see the class doc)."""
        fd = self._fd
        assert fd is not None
        offset = self._end
        self._pending_end = offset
        data = records[0] if len(records) == 1 else b"".join(records)
        rec_end = offset + len(data)
        new_size = self._alloc
        if rec_end > new_size:
            # Extend the file in the same write: the records, then zeros up to the new
            # size. The one fdatasync below makes both durable (size included).
            new_size = self._extended_size(rec_end)
            data += bytes(new_size - rec_end)
        # else: into space already allocated and synced, so the fdatasync flushes data only.
        self._inflight = True
        self.mutex.release()
        try:
            fileio.pwrite_all(fd, data, offset)
            fileio.crashpoint("before-data-sync")
            fileio.fdatasync(fd)
            fileio.crashpoint("after-data-sync")
        finally:
            self.mutex.acquire()
            self._inflight = False
        self._alloc = new_size
        self._written(records, todo, stamp, offset)

    def _written(self, records: list[bytes], todo: list[_Batch], stamp: int, offset: int) -> None:
        """Adopt ``records`` (of ``todo``'s batches), durable from byte ``offset`` of the active segment."""
        interval = self.options.index_interval
        for rec, b in zip(records, todo, strict=True):
            if offset - self._idx.last_offset() >= interval and offset > SEGMENT_HEADER_SIZE:
                self._note_index_entry(b.result[0], offset)
            offset += len(rec)
        self._end = offset
        self._next_seq = todo[-1].result[1] + 1
        self._last_us = stamp

    def _first_chunk(self) -> int:
        """Bytes of a new segment file (header and zeros): one block, less for tiny test segments."""
        return max(SEGMENT_HEADER_SIZE, min(PREALLOC_FIRST, self.options.segment_bytes // 4))

    def _extended_size(self, rec_end: int) -> int:
        """The new file size when a record ending at ``rec_end`` does not fit the space allocated.

        The file about doubles (chunks of :data:`PREALLOC_MAX` at most), never
        past the segment size unless the record itself does, rounded to whole
        4 KiB blocks.
        """
        first = self._first_chunk()
        grown = self._alloc + min(max(self._alloc, first), PREALLOC_MAX)
        block = min(4096, first)
        size = -(-max(grown, rec_end) // block) * block
        return max(rec_end, min(size, self.options.segment_bytes))

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
            # The directory syncs (the rename into place) run while the data is written and synced.
            syncs = fileio.start_dir_syncs(claim.dirs)
            try:
                fileio.pwrite_all(fd, data if size == claim.size else data + bytes(size - len(data)), 0)
            except BaseException:
                with contextlib.suppress(OSError):
                    syncs.finish()  # (their descriptors closed; the claim's directories stay owed a sync)
                raise
            fileio.crashpoint("after-file-create")
            fileio.crashpoint("before-data-sync")
            syncs.finish(data_fd=fd)
            fileio.mark_durable(claim.linked)
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
        fileio.crashpoint("after-data-sync")
        if claim is None and self.pool is not None and self._first_chunk() == self.pool.entry_bytes:
            self.pool.request_fill()  # a site's first conversation: its pool can be made now
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
        fd, end = self._fd, self._pending_end
        if fd is not None and end is not None:
            try:
                fileio.truncate(fd, end)
            except OSError:
                pass
        self._close_files()

