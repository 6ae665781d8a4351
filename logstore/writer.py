"""The append path: one batch, one record, durable before it is acknowledged.

An append holds the conversation exclusively (thread mutex and file lock),
re-verifies the tail (:mod:`logstore.recovery`), logs its intent in the site
manifest, writes the record and syncs it, then logs the commit. A
conversation's first segment is created in place with its first batch
(:meth:`Writer._create_first_segment`); later segments are created whole
(header synced, then renamed into place) when the active one is rolled
(sealed) past ``Options.segment_bytes``.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterator

from . import fileio, frame, index, layout
from .convstate import Tip
from .errors import ConversationFull, Io, StoreError
from .frame import KIND_BATCH, KIND_SEAL, SEGMENT_HEADER_SIZE
from .limits import MAX_CONVERSATION_ITEMS
from .recovery import Recovery
from .timefmt import now_us

_INDEX_WRITE_GROUP = 16



class Writer(Recovery):
    """Appends batches to the conversation's active segment."""

    def append(self, body: bytes, count: int, deadline: float, started: float) -> tuple[int, int, int]:
        """Append one encoded batch; return ``(first_seq, last_seq, recorded_at_us)``.

        Caller holds ``mutex``. Durable on return. Gives up with Timeout at
        ``deadline`` (a ``time.monotonic()`` value) when another process holds
        the conversation.
        """
        with self._exclusive(deadline, started):
            if self._next_seq + count > MAX_CONVERSATION_ITEMS:
                raise ConversationFull(MAX_CONVERSATION_ITEMS, self._next_seq + count)
            # recorded_at never decreases within a conversation, whatever the wall clock does.
            stamp = max(now_us(), self._last_us)
            first = self._next_seq
            self._commit_batch(body, count, first, stamp)
            return first, first + count - 1, stamp

    @contextlib.contextmanager
    def _exclusive(self, deadline: float, started: float) -> Iterator[None]:
        """Hold the conversation for writing, its tail verified and undamaged. Caller holds ``mutex``."""
        if self._fd is None:
            # No segment open: the directory may not exist yet. Made here, unsynced (its lock
            # file lives in it); the first segment's creation makes it durable before any
            # batch in it is acknowledged (_create_first_segment).
            fileio.make_dirs(self.path)
        fileio.resync_failed_dirs(self.path)
        self._lock(True, deadline, started)
        try:
            try:
                self._refresh(True)
            except OSError as exc:
                self._close_files()
                raise Io(f"reading the conversation's tail failed: {exc}", exc.errno) from exc
            if self._damage is not None:
                raise self._damage
            yield
        finally:
            self._unlock()

    def _commit_batch(self, body: bytes, count: int, first: int, stamp: int) -> None:
        """Log the intent, write and sync the record, log the commit (inside :meth:`_exclusive`)."""
        self._pending_end = None
        created = self._created_us if self._created_us is not None else stamp
        tip = Tip(created, stamp, first + count)
        self.manifest.intent(self.conversation_id, tip, new=first == 0)
        fileio.crashpoint("manifest-intent")
        try:
            self._write_batch(body, count, first, stamp)
        except OSError as exc:
            self._poison()
            raise Io(f"appending to the log failed: {os.strerror(exc.errno or errno.EIO)}", exc.errno) from exc
        self._created_us = created
        try:
            self.manifest.commit(self.conversation_id, tip)
        except (OSError, StoreError):
            # The batch is durable: the append has happened and must not be reported as
            # failed (a Timeout or Io here would be a lie: "nothing was written"). The
            # listing learns of it when the intent is resolved by probing (FORMAT.md 5).
            pass
        fileio.crashpoint("manifest-commit")

    def _write_batch(self, body: bytes, count: int, first: int, stamp: int) -> None:
        if not self._segments:
            self._create_first_segment(body, count, first, stamp)
            return
        record = frame.encode_record(self._salt, KIND_BATCH, first, count, stamp, body)
        if self._sealed_active or (
            self._end > SEGMENT_HEADER_SIZE and self._end + len(record) > self.options.segment_bytes
        ):
            self._roll()
            record = frame.encode_record(self._salt, KIND_BATCH, first, count, stamp, body)
        fd = self._fd
        assert fd is not None
        offset = self._end
        self._pending_end = offset
        fileio.pwrite_all(fd, record, offset)
        fileio.crashpoint("before-data-sync")
        fileio.fdatasync(fd)
        fileio.crashpoint("after-data-sync")
        self._end = offset + len(record)
        self._next_seq = first + count
        self._last_us = stamp
        if offset - self._idx.last_offset() >= self.options.index_interval and offset > SEGMENT_HEADER_SIZE:
            self._note_index_entry(first, offset)

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

    def _create_first_segment(self, body: bytes, count: int, first: int, stamp: int) -> None:
        """Create the conversation's first segment holding its first batch, durably, with the fewest syncs.

        The segment is created in place (FORMAT.md 6, "Creating a conversation"):
        its header and the batch's record go in one write from offset 0, so the
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
        data = frame.encode_segment_header(0, salt) + frame.encode_record(salt, KIND_BATCH, first, count, stamp, body)
        # O_TRUNC: a torn creation's file may be there (only then: there is no segment otherwise).
        fd = fileio.open_create(self._seg_path(0), os.O_RDWR | os.O_TRUNC)
        self._close_active()
        self._fd = fd
        self._pending_end = 0  # on failure the file is emptied: an empty file is a torn creation
        fileio.pwrite_all(fd, data, 0)
        fileio.crashpoint("after-file-create")
        fileio.crashpoint("before-data-sync")
        # The data sync and the directory syncs at the same time (measured faster than one after
        # the other on the benchmark machine's filesystem; see fileio.fsync_dirs).
        fileio.sync_dir_chain(self.path, layout.sites_dir_of_conversation(self.path), data_fd=fd)
        fileio.crashpoint("after-data-sync")
        self._salt = salt
        self._end = len(data)
        self._sealed_active = False
        self._segments = [0]
        self._idx = index.SparseIndex(0, salt)
        self._idx_fd = None
        self._idx_lazy = True
        self._next_seq = first + count
        self._last_us = stamp

    def _create_segment(self, base: int) -> None:
        """Create, sync and publish an empty segment starting at seq ``base``."""
        salt = frame.new_salt()
        final = self._seg_path(base)
        tmp = final + ".tmp"
        fd = fileio.open_create(tmp, os.O_RDWR | os.O_TRUNC)
        try:
            fileio.pwrite_all(fd, frame.encode_segment_header(base, salt), 0)
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
        self._sealed_active = False
        self._segments.append(base)
        self._idx = index.SparseIndex(base, salt)
        self._idx_fd = index.open_for_append(self._idx_path(base), self._idx)
        self._idx_lazy = False

    def _roll(self) -> None:
        """Seal the active segment and start the next one."""
        fd = self._fd
        assert fd is not None
        if not self._sealed_active:
            seal = frame.encode_record(self._salt, KIND_SEAL, self._next_seq, 0, self._last_us, b"")
            fileio.pwrite_all(fd, seal, self._end)
            fileio.fdatasync(fd)
            self._end += len(seal)
            self._sealed_active = True
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

