"""One conversation's log: recovery on open, durable append, verified reads.

A conversation is a directory of segments named by their base seq. Only the
last segment (the active one) is ever written; earlier ones are sealed and
immutable. The state kept in memory (active segment, end offset, next seq,
last ``recorded_at``) is re-derived from the files whenever another process
may have changed them, so several processes can share a data directory.

Locking: ``mutex`` serializes threads of this process; the ``lock`` file in
the directory serializes processes (exclusive for writers, shared for a
reader that must re-read the tail). Lock order is always conversation, then
site manifest.
"""

from __future__ import annotations

import bisect
import contextlib
import errno
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from itertools import repeat
from typing import Any

from . import fileio, frame, index, layout
from .codec import decode_batch
from .errors import ConversationFull, Corrupted, Io, StoreError, Timeout
from .frame import KIND_BATCH, KIND_SEAL, SEGMENT_HEADER_SIZE
from .limits import MAX_CONVERSATION_ITEMS
from .model import MemoryItem
from .segment import BadRecord, classify_failure, iter_records
from .timefmt import format_us, now_us

#: Index entries of our own appends are written to the index file this many at a time.
_INDEX_WRITE_GROUP = 16


@dataclass(frozen=True)
class Options:
    """Tuning of the engine; the defaults suit production."""

    #: Seconds to wait for a conversation's lock before raising Timeout.
    lock_timeout: float = 5.0
    #: A segment is sealed and a new one started past this many bytes.
    segment_bytes: int = 16 * 1024 * 1024
    #: Roughly one index entry per this many bytes of segment.
    index_interval: int = 4096


@dataclass(frozen=True)
class Tip:
    """What a conversation holds, as seen by the listing."""

    created_us: int
    last_us: int
    next_seq: int


class ManifestHook:
    """Where a conversation reports its appends (implemented by the site manifest)."""

    def intent(self, conversation_id: str, tip: Tip, *, new: bool) -> None:
        raise NotImplementedError

    def commit(self, conversation_id: str, tip: Tip) -> None:
        raise NotImplementedError


def _lock_wait(acquire: Callable[[], bool], deadline: float, started: float) -> None:
    delay = 0.0005
    while not acquire():
        now = time.monotonic()
        if now >= deadline:
            raise Timeout(now - started)
        time.sleep(min(delay, max(deadline - now, 0.0)))
        delay = min(delay * 2, 0.02)


class Conversation:
    """The log of one conversation of one site."""

    def __init__(self, path: str, conversation_id: str, options: Options, manifest: ManifestHook) -> None:
        self.path = path
        self.conversation_id = conversation_id
        self.options = options
        self.manifest = manifest
        self.mutex = threading.Lock()
        self.closed = False
        self._lock_fd: int | None = None
        self._loaded = False
        self._fd: int | None = None  # active segment, read-write
        self._idx_fd: int | None = None
        self._reset_state()

    # ----------------------------------------------------------------- state

    def _reset_state(self) -> None:
        self._loaded = False
        self._segments: list[int] = []  # base seqs, ascending
        self._salt = 0
        self._end = 0  # committed end of the active segment
        self._sealed_active = False  # the active segment ends with a seal record
        self._next_seq = 0
        self._last_us = 0
        self._created_us: int | None = None
        self._idx = index.SparseIndex(0, 0)
        # Entries of our own appends not yet in the index file (see _note_index_entry).
        self._idx_unwritten: list[bytes] = []
        self._damage: Corrupted | None = None
        self._pending_end: int | None = None
        self._sealed_cache: dict[int, tuple[int, int, index.SparseIndex]] = {}

    def _close_files(self) -> None:
        for fd in (self._fd, self._idx_fd):
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self._fd = self._idx_fd = None
        self._reset_state()

    def close(self) -> None:
        """Release every descriptor, writing our pending index entries if still in order. Caller holds ``mutex``."""
        if self._idx_unwritten and self._fd is not None and self._lock_fd is not None:
            try:
                if fileio.try_lock(self._lock_fd, True):
                    try:
                        if os.fstat(self._fd).st_size == self._end:  # nobody appended after us
                            self._write_index_entries()
                    finally:
                        fileio.unlock(self._lock_fd)
            except OSError:
                pass  # derived data
        self._close_files()
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None
        self.closed = True

    def _seg_path(self, base: int) -> str:
        return os.path.join(self.path, layout.segment_name(base))

    def _idx_path(self, base: int) -> str:
        return os.path.join(self.path, layout.index_name(base))

    # ----------------------------------------------------------------- locks

    def _lock(self, exclusive: bool, deadline: float, started: float) -> None:
        if self._lock_fd is None:
            self._lock_fd = os.open(os.path.join(self.path, layout.LOCK_FILE), os.O_RDWR | os.O_CREAT, fileio.FILE_MODE)
        fd = self._lock_fd
        _lock_wait(lambda: fileio.try_lock(fd, exclusive), deadline, started)

    def _unlock(self) -> None:
        if self._lock_fd is not None:
            fileio.unlock(self._lock_fd)

    # -------------------------------------------------------------- recovery

    def _list_segments(self) -> list[int]:
        try:
            names = os.listdir(self.path)
        except FileNotFoundError:
            return []
        return sorted(b for b in map(layout.parse_segment_name, names) if b is not None)

    def _load(self, writable: bool) -> None:
        """Open the active segment and verify its tail (under the file lock)."""
        self._close_files()
        self._segments = self._list_segments()
        self._loaded = True
        if not self._segments:
            return
        try:
            self._open_active(self._segments[-1], writable)
            if self._next_seq > 0:
                self._created_us = self._first_record_time(self._segments[0])
        except BaseException:
            # Never keep a half-loaded state (e.g. a damaged segment header): the
            # next call must load again and report the damage again.
            self._close_files()
            raise

    def _first_record_time(self, base: int) -> int | None:
        """recorded_at of the conversation's first batch (verified), or None."""
        path = self._seg_path(base)
        try:
            with _Open(path) as fd:
                header = frame.decode_segment_header(os.pread(fd, SEGMENT_HEADER_SIZE, 0))
                if header is None:
                    raise Corrupted(path, 0, "segment header is missing or invalid")
                for _off, h, _ in iter_records(fd, SEGMENT_HEADER_SIZE, os.fstat(fd).st_size, header.salt):
                    return h.recorded_at_us if h.kind == KIND_BATCH else None
        except FileNotFoundError:
            return None
        except BadRecord as bad:
            if base != self._segments[-1]:
                raise Corrupted(path, bad.offset, bad.why) from None
        return None

    def _open_active(self, base: int, writable: bool) -> None:
        path = self._seg_path(base)
        fd = os.open(path, os.O_RDWR if writable else os.O_RDONLY)
        self._fd = fd
        header = frame.decode_segment_header(os.pread(fd, SEGMENT_HEADER_SIZE, 0))
        if header is None or header.base_seq != base:
            raise Corrupted(path, 0, "segment header is missing or invalid")
        self._salt = header.salt
        size = os.fstat(fd).st_size
        idx = index.load(self._idx_path(base), base, header.salt, size)
        start, seq = SEGMENT_HEADER_SIZE, base
        index_ok = idx is not None and idx.complete
        if idx is None:
            idx = index.SparseIndex(base, header.salt)
        # Trust the newest index entry that points at a valid record of the right seq.
        while idx.seqs:
            s, off = idx.seqs[-1], idx.offsets[-1]
            try:
                _, h, _ = next(iter_records(fd, off, size, header.salt))
                if h.first_seq == s:
                    start, seq = off, s
                    break
            except (BadRecord, StopIteration):
                pass
            idx.drop_from(len(idx.seqs) - 1)
            index_ok = False
        self._idx = idx
        self._end = start
        self._next_seq = seq
        self._sealed_active = False
        entries = len(idx.seqs)
        self._scan_forward(writable, size)
        if writable:
            if index_ok and len(self._idx.seqs) == entries:
                # The file already says exactly this: keep it, so other writers' descriptors stay valid.
                self._idx_fd = os.open(self._idx_path(base), os.O_WRONLY | os.O_APPEND)
            else:
                self._idx_fd = index.open_for_append(self._idx_path(base), self._idx)

    def _scan_forward(self, writable: bool, size: int | None = None) -> None:
        """Walk records from the committed end to EOF, adopting whole ones.

        A torn tail is cut away when ``writable`` (we hold the exclusive lock);
        damage to acknowledged data is recorded and raised as Corrupted.
        """
        fd = self._fd
        assert fd is not None
        if size is None:
            size = os.fstat(fd).st_size
        path = self._seg_path(self._idx.base_seq)
        last_indexed = self._idx.last_offset()
        # Records we did not write may follow ours: our unwritten entries would now land
        # after theirs, out of order, so they stay in memory only.
        self._idx_unwritten.clear()
        try:
            for off, h, _body in iter_records(fd, self._end, size, self._salt):
                if self._sealed_active:
                    raise BadRecord(off, "record after the segment's seal")
                if h.first_seq != self._next_seq:
                    raise BadRecord(off, f"expected seq {self._next_seq}, record starts at {h.first_seq}")
                if h.kind == KIND_SEAL:
                    self._sealed_active = True
                else:
                    if off - last_indexed >= self.options.index_interval and off > SEGMENT_HEADER_SIZE:
                        # In memory only: the process that wrote the record wrote its entry.
                        self._idx.add(h.first_seq, off)
                        last_indexed = off
                    self._last_us = h.recorded_at_us
                    self._next_seq = h.end_seq
                self._end = off + h.size
        except BadRecord as bad:
            verdict = classify_failure(fd, bad.offset, size, self._salt)
            if verdict == "corrupt" or bad.why.startswith("expected seq") or "after the segment's seal" in bad.why:
                self._damage = Corrupted(path, bad.offset, bad.why)
            elif writable:
                # Never acknowledged: cut it away, and the stale index entries with it.
                fileio.truncate(fd, bad.offset)
                self._idx.truncate_before_offset(bad.offset)
                if self._idx_fd is not None:
                    os.close(self._idx_fd)
                    self._idx_fd = index.open_for_append(self._idx_path(self._idx.base_seq), self._idx)
        if self._last_us == 0 and self._next_seq > 0:
            self._last_us = self._last_record_time()

    def _last_record_time(self) -> int:
        """recorded_at of the last batch, read from the record the index points at or before the end."""
        assert self._fd is not None
        last = 0
        start = self._idx.last_offset() or SEGMENT_HEADER_SIZE
        try:
            for _off, h, _ in iter_records(self._fd, start, self._end, self._salt):
                if h.kind == KIND_BATCH:
                    last = h.recorded_at_us
        except BadRecord:
            pass
        if last == 0 and len(self._segments) > 1:
            # The active segment holds only its header (or a seal): ask the previous one.
            prev = self._segments[-2]
            salt, end, idx = self._sealed(prev)
            with _Open(self._seg_path(prev)) as fd:
                for _off, h, _ in iter_records(fd, idx.last_offset() or SEGMENT_HEADER_SIZE, end, salt):
                    if h.kind == KIND_BATCH:
                        last = h.recorded_at_us
        return last

    def _refresh(self, writable: bool) -> None:
        """Bring the in-memory state up to date with the files (file lock held)."""
        if not self._loaded or self._fd is None:
            self._load(writable)
            return
        if (writable and self._idx_fd is None) or self._damage is not None:
            self._load(writable)
            return
        size = os.fstat(self._fd).st_size
        if size < self._end:
            self._load(writable)
            return
        if size > self._end:
            self._scan_forward(writable, size)
        if self._sealed_active:
            nxt = self._list_segments()
            if nxt and nxt[-1] > self._idx.base_seq:
                self._segments = nxt
                self._sealed_cache.clear()
                self._close_active()
                try:
                    self._open_active(nxt[-1], writable)
                except BaseException:
                    self._close_files()
                    raise

    def _close_active(self) -> None:
        for fd in (self._fd, self._idx_fd):
            if fd is not None:
                os.close(fd)
        self._fd = self._idx_fd = None

    def _stale(self) -> bool:
        """True when another process may have changed the files since we looked."""
        if not self._loaded or self._fd is None or self._damage is not None:
            return True  # known damage is re-checked each time: an operator may have repaired it
        return os.fstat(self._fd).st_size != self._end or self._sealed_active

    # ---------------------------------------------------------------- append

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
        fileio.makedirs_durable(self.path)
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
            self._create_segment(0)
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

    def _write_index_entries(self) -> None:
        if self._idx_unwritten and self._idx_fd is not None:
            try:
                os.write(self._idx_fd, b"".join(self._idx_unwritten))
            except OSError:
                pass  # derived data: a missing entry only costs a longer scan
        self._idx_unwritten.clear()

    def _create_segment(self, base: int) -> None:
        """Create, sync and publish an empty segment starting at seq ``base``."""
        salt = frame.new_salt()
        final = self._seg_path(base)
        tmp = final + ".tmp"
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, fileio.FILE_MODE)
        try:
            fileio.pwrite_all(fd, frame.encode_segment_header(base, salt), 0)
            fileio.fdatasync(fd)
            os.rename(tmp, final)
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

    # ------------------------------------------------------------------ read

    def tip(self, deadline: float | None = None) -> Tip | None:
        """The conversation's current extent (refreshing from disk), or None when empty.

        Raises Timeout if another process holds the conversation past ``deadline``.
        """
        self._refresh_for_read(deadline)
        if self._damage is not None:
            raise self._damage
        if self._next_seq == 0 or self._created_us is None:
            return None
        return Tip(self._created_us, self._last_us, self._next_seq)

    def _refresh_for_read(self, deadline: float | None = None) -> None:
        if not os.path.isdir(self.path):
            self._close_files()
            self._loaded = True
            return
        if not self._stale():
            return
        started = time.monotonic()
        self._lock(False, started + self.options.lock_timeout if deadline is None else deadline, started)
        try:
            self._refresh(False)
        finally:
            self._unlock()

    def read(self, start: int | None, limit: int) -> list[MemoryItem]:
        """Up to ``limit`` items from seq ``start`` (None: the last ``limit``). Caller holds ``mutex``."""
        self._refresh_for_read()
        if limit == 0:
            return []
        if self._damage is not None:
            if start is None or start + limit > self._next_seq:
                raise self._damage
        end_seq = self._next_seq
        if start is None:
            start = max(0, end_seq - limit)
        if start >= end_seq:
            return []
        stop = min(end_seq, start + limit)
        out: list[MemoryItem] = []
        seg_i = max(bisect.bisect_right(self._segments, start) - 1, 0)
        while start < stop and seg_i < len(self._segments):
            base = self._segments[seg_i]
            self._read_segment(base, start, stop, out)
            start = out[-1].seq + 1 if out else start
            seg_i += 1
        return out

    def _sealed(self, base: int) -> tuple[int, int, index.SparseIndex]:
        """``(salt, end, index)`` of a sealed segment, building its index if needed."""
        cached = self._sealed_cache.get(base)
        if cached is not None:
            return cached
        path = self._seg_path(base)
        with _Open(path) as fd:
            header = frame.decode_segment_header(os.pread(fd, SEGMENT_HEADER_SIZE, 0))
            if header is None or header.base_seq != base:
                raise Corrupted(path, 0, "segment header is missing or invalid")
            size = os.fstat(fd).st_size
            idx = index.load(self._idx_path(base), base, header.salt, size)
            if idx is None:
                idx = self._build_index(fd, path, base, header.salt, size)
        if len(self._sealed_cache) >= 8:
            self._sealed_cache.pop(next(iter(self._sealed_cache)))
        result = (header.salt, size, idx)
        self._sealed_cache[base] = result
        return result

    def _build_index(self, fd: int, path: str, base: int, salt: int, size: int) -> index.SparseIndex:
        """Rebuild a segment's index from its records and save it (best effort)."""
        idx = index.SparseIndex(base, salt)
        last = 0
        try:
            for off, h, _ in iter_records(fd, SEGMENT_HEADER_SIZE, size, salt):
                if h.kind == KIND_BATCH and off - last >= self.options.index_interval and off > SEGMENT_HEADER_SIZE:
                    idx.add(h.first_seq, off)
                    last = off
        except BadRecord:
            pass  # the read that reaches the bad record reports it
        try:
            index.write(self._idx_path(base), idx)
        except OSError:
            pass
        return idx

    def _read_segment(self, base: int, start: int, stop: int, out: list[MemoryItem]) -> None:
        active = base == self._segments[-1]
        if active:
            assert self._fd is not None
            salt, end, idx = self._salt, self._end, self._idx
            self._read_records(self._fd, self._seg_path(base), salt, end, idx, start, stop, out, base)
        else:
            salt, end, idx = self._sealed(base)
            with _Open(self._seg_path(base)) as fd:
                self._read_records(fd, self._seg_path(base), salt, end, idx, start, stop, out, base)

    def _read_records(
        self,
        fd: int,
        path: str,
        salt: int,
        end: int,
        idx: index.SparseIndex,
        start: int,
        stop: int,
        out: list[MemoryItem],
        base: int,
    ) -> None:
        entry = idx.floor(start)
        off, seq = (entry[1], entry[0]) if entry else (SEGMENT_HEADER_SIZE, base)
        n_before = len(out)
        try:
            self._collect(fd, off, seq, end, salt, start, stop, out)
        except BadRecord as bad:
            del out[n_before:]
            if entry is None:
                raise Corrupted(path, bad.offset, bad.why) from None
            # The index may be what is wrong: rebuild it from the segment and retry once.
            fresh = self._build_index(fd, path, base, salt, end)
            if base == self._segments[-1]:
                self._idx = fresh
                self._idx_unwritten.clear()
                if self._idx_fd is not None:
                    os.close(self._idx_fd)
                    self._idx_fd = index.open_for_append(self._idx_path(base), fresh)
            else:
                self._sealed_cache[base] = (salt, end, fresh)
            entry = fresh.floor(start)
            off, seq = (entry[1], entry[0]) if entry else (SEGMENT_HEADER_SIZE, base)
            try:
                self._collect(fd, off, seq, end, salt, start, stop, out)
            except BadRecord as bad2:
                del out[n_before:]
                raise Corrupted(path, bad2.offset, bad2.why) from None

    @staticmethod
    def _collect(
        fd: int, off: int, seq: int, end: int, salt: int, start: int, stop: int, out: list[MemoryItem]
    ) -> None:
        for roff, h, body in iter_records(fd, off, end, salt):
            first, count = h.first_seq, h.count
            if first != seq:
                raise BadRecord(roff, f"expected seq {seq}, record starts at {first}")
            if h.kind != KIND_BATCH:
                return
            seq = first + count
            if seq <= start:
                continue
            try:
                items: list[dict[str, Any]] = decode_batch(body)
            except Exception as exc:
                raise BadRecord(roff, f"batch body is not a JSON array of objects: {exc}") from None
            if len(items) != count:
                raise BadRecord(roff, f"batch holds {len(items)} items, header says {count}")
            lo = max(start - first, 0)
            hi = min(stop - first, count)
            if lo or hi < count:
                items = items[lo:hi]
            # map() builds the items in C: per item this is most of a replay's overhead.
            out.extend(map(MemoryItem, range(first + lo, first + hi), repeat(format_us(h.recorded_at_us)), items))
            if seq >= stop:
                return


class _Open:
    """A read-only descriptor as a context manager."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.fd = -1

    def __enter__(self) -> int:
        self.fd = os.open(self.path, os.O_RDONLY)
        return self.fd

    def __exit__(self, *exc: object) -> None:
        os.close(self.fd)
