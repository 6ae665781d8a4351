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
from typing import Any, NoReturn

import msgspec

from . import fileio, frame, index, layout, observe
from .codec import decode_batch
from .errors import ConversationFull, Corrupted, Io, ItemsLost, Loss, StoreError, Timeout
from .frame import KIND_BATCH, KIND_LOSS, KIND_SEAL, SEGMENT_HEADER_SIZE
from .limits import MAX_CONVERSATION_ITEMS
from .model import MemoryItem
from .segment import BadRecord, Gap, classify_failure, find_next_record, gap_at, iter_records, walk
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
    if acquire():
        return
    with observe.timed("lock_wait"):
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
        # base seq -> ((inode, size), (salt, end, index)) of sealed segments read lately.
        self._sealed_cache: dict[int, tuple[tuple[int, int], tuple[int, int, index.SparseIndex]]] = {}

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
            self._lock_fd = fileio.open_create(os.path.join(self.path, layout.LOCK_FILE))
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
        """recorded_at of the conversation's first batch, or None.

        When the first record is damaged its time cannot be verified: the
        first intact record's is used instead (the closest later bound), so
        damage there never stops the conversation from loading.
        """
        path = self._seg_path(base)
        try:
            with _Open(path) as fd:
                header = frame.decode_segment_header(os.pread(fd, SEGMENT_HEADER_SIZE, 0))
                if header is None:
                    return None
                for rec in walk(fd, SEGMENT_HEADER_SIZE, os.fstat(fd).st_size, header.salt):
                    if not isinstance(rec, Gap) and rec[1].kind != KIND_SEAL:
                        return rec[1].recorded_at_us
        except FileNotFoundError:
            return None
        return None

    def _open_active(self, base: int, writable: bool) -> None:
        path = self._seg_path(base)
        fd = os.open(path, os.O_RDWR if writable else os.O_RDONLY)
        self._fd = fd
        header = frame.decode_segment_header(os.pread(fd, SEGMENT_HEADER_SIZE, 0))
        if header is None or header.base_seq != base:
            # Without its salt no record of the segment can be verified: the log is
            # readable up to the segment's base seq (its name), and appends refuse.
            self._damage = Corrupted(path, 0, "segment header is missing or invalid", base)
            self._next_seq = base
            self._end = 0
            return
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

        A torn tail is cut away when ``writable`` (we hold the exclusive lock).
        Damage with a valid record after it is walked over: the log goes on at
        that record, and only reads that cover the damage report it. Damage to
        the last record (nothing valid follows) is recorded and raised as
        Corrupted by appends and by reads that reach it.
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
        pos = self._end
        while True:
            try:
                for off, h, _body in iter_records(fd, pos, size, self._salt):
                    if self._sealed_active:
                        raise BadRecord(off, "record after the segment's seal")
                    if h.first_seq != self._next_seq:
                        raise BadRecord(off, f"expected seq {self._next_seq}, record starts at {h.first_seq}")
                    if h.kind == KIND_SEAL:
                        self._sealed_active = True
                    else:
                        if (
                            h.kind == KIND_BATCH
                            and off - last_indexed >= self.options.index_interval
                            and off > SEGMENT_HEADER_SIZE
                        ):
                            # In memory only: the process that wrote the record wrote its entry.
                            self._idx.add(h.first_seq, off)
                            last_indexed = off
                        self._last_us = h.recorded_at_us
                        self._next_seq = h.end_seq
                    self._end = off + h.size
                break
            except BadRecord as bad:
                after_seal = "after the segment's seal" in bad.why
                seq_problem = after_seal or bad.why.startswith("expected seq")
                if not seq_problem and classify_failure(fd, bad.offset, size, self._salt) == "torn":
                    if writable:
                        # Never acknowledged: cut it away, and the stale index entries with it.
                        fileio.truncate(fd, bad.offset)
                        self._idx.truncate_before_offset(bad.offset)
                        if self._idx_fd is not None:
                            os.close(self._idx_fd)
                            self._idx_fd = index.open_for_append(self._idx_path(self._idx.base_seq), self._idx)
                    break
                nxt = None if after_seal else find_next_record(fd, bad.offset, size, self._salt, self._next_seq + 1)
                if nxt is None:
                    self._damage = self._tail_damage(fd, path, bad)
                    break
                # Damage in the middle: the log goes on at the next valid record.
                pos, self._next_seq = nxt[0], nxt[1].first_seq
                self._end = pos
        if self._last_us == 0 and self._next_seq > 0:
            self._last_us = self._last_record_time()

    def _tail_damage(self, fd: int, path: str, bad: BadRecord) -> Corrupted:
        """Corrupted for damage at the end of the active segment: every seq from it on is unreadable."""
        why = bad.why
        raw = os.pread(fd, frame.RECORD_HEADER_SIZE, bad.offset)
        if len(raw) == frame.RECORD_HEADER_SIZE and not why.startswith("expected seq"):
            h = frame.decode_record_header(raw)
            if frame.plausible(h) and h.first_seq == self._next_seq and h.count > 0:
                # Only a hint: nothing after the record can confirm its count.
                why += f"; its header, unverified, says it holds seqs {h.first_seq}..{h.end_seq - 1}"
        return Corrupted(path, bad.offset, why, self._next_seq)

    def _last_record_time(self) -> int:
        """recorded_at of the last intact record at or before the end (0 when none can be read).

        Read from the active segment (from its last index entry), else from the
        previous segment's seal, which carries its last batch's time, else from
        that segment's last intact record.
        """
        assert self._fd is not None
        last = 0
        start = self._idx.last_offset() or SEGMENT_HEADER_SIZE
        for rec in walk(self._fd, start, self._end, self._salt):
            if not isinstance(rec, Gap) and rec[1].kind != KIND_SEAL:
                last = rec[1].recorded_at_us
        if last == 0 and len(self._segments) > 1:
            # The active segment holds only its header (or a seal): ask the previous one.
            prev = self._segments[-2]
            try:
                with _Open(self._seg_path(prev)) as fd:
                    salt, end, idx = self._sealed(prev, fd)
                    seal = _record_ending_at(fd, end, salt)
                    if seal is not None:
                        return seal.recorded_at_us
                    for rec in walk(fd, idx.last_offset() or SEGMENT_HEADER_SIZE, end, salt):
                        if not isinstance(rec, Gap):
                            last = rec[1].recorded_at_us
            except (Corrupted, FileNotFoundError):
                pass  # nothing readable there: the clock alone stamps the next batch
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
                fileio.append(self._idx_fd, b"".join(self._idx_unwritten))
            except OSError:
                pass  # derived data: a missing entry only costs a longer scan
        self._idx_unwritten.clear()

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
        """Up to ``limit`` items from seq ``start`` (None: the last ``limit``). Caller holds ``mutex``.

        Raises Corrupted when the range covers a damaged record, and ItemsLost
        when it covers seqs a repair recorded as lost; every other range reads
        normally, wherever the damage lies.
        """
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
        lost: list[Loss] = []
        segments = self._segments
        seg_i = max(bisect.bisect_right(segments, start) - 1, 0)
        while start < stop and seg_i < len(segments):
            base = segments[seg_i]
            seg_end = segments[seg_i + 1] if seg_i + 1 < len(segments) else end_seq
            if seg_end > start:
                self._read_segment(base, start, min(stop, seg_end), seg_end, out, lost)
                start = seg_end
            seg_i += 1
        if lost:
            raise ItemsLost(lost)
        return out

    def _sealed(self, base: int, fd: int) -> tuple[int, int, index.SparseIndex]:
        """``(salt, end, index)`` of the sealed segment open as ``fd``, building its index if needed.

        The cache is keyed by the file's identity and size, so a segment that a
        repair replaced is read afresh.
        """
        st = os.fstat(fd)
        cached = self._sealed_cache.get(base)
        if cached is not None and cached[0] == (st.st_ino, st.st_size):
            return cached[1]
        path = self._seg_path(base)
        header = frame.decode_segment_header(os.pread(fd, SEGMENT_HEADER_SIZE, 0))
        if header is None or header.base_seq != base:
            raise Corrupted(path, 0, "segment header is missing or invalid", base)
        idx = index.load(self._idx_path(base), base, header.salt, st.st_size)
        if idx is None or not idx.complete:
            # Missing, not this segment's, or malformed entries (a power cut can zero them):
            # rebuild it from the segment and save it, so the file is whole again.
            idx = self._build_index(fd, base, header.salt, st.st_size, save=True)
        if len(self._sealed_cache) >= 8:
            self._sealed_cache.pop(next(iter(self._sealed_cache)))
        result = (header.salt, st.st_size, idx)
        self._sealed_cache[base] = ((st.st_ino, st.st_size), result)
        return result

    def _build_index(self, fd: int, base: int, salt: int, size: int, *, save: bool) -> index.SparseIndex:
        """A segment's index from its records, past any damage; saved (best effort) when ``save``.

        Damage is walked over to the next valid record, so the index never
        stops short of it. A segment with damage keeps its index file as it
        is (it is only ever used after verification): derived data is never
        rewritten around damage.
        """
        idx = index.SparseIndex(base, salt)
        last = 0
        interval = self.options.index_interval
        damaged = False
        for rec in walk(fd, SEGMENT_HEADER_SIZE, size, salt):
            if isinstance(rec, Gap):
                damaged = True
                continue
            off, h, _ = rec
            if h.kind == KIND_BATCH and off - last >= interval and off > SEGMENT_HEADER_SIZE:
                if idx.seqs and h.first_seq <= idx.seqs[-1]:
                    damaged = True  # out of order: only damaged data can say so; never index it
                    continue
                idx.add(h.first_seq, off)
                last = off
        if save and not damaged:
            try:
                index.write(self._idx_path(base), idx)
            except OSError:
                pass
        return idx

    def _read_segment(
        self, base: int, start: int, stop: int, seg_end: int, out: list[MemoryItem], lost: list[Loss]
    ) -> None:
        path = self._seg_path(base)
        if base == self._segments[-1]:
            assert self._fd is not None
            self._read_records(
                self._fd, path, self._salt, self._end, self._idx, base, (start, stop, seg_end), out, lost
            )
        else:
            with _Open(path) as fd:
                try:
                    salt, end, idx = self._sealed(base, fd)
                except Corrupted as exc:
                    raise Corrupted(path, 0, exc.why, base, seg_end - 1) from None
                self._read_records(fd, path, salt, end, idx, base, (start, stop, seg_end), out, lost)

    def _read_records(
        self,
        fd: int,
        path: str,
        salt: int,
        end: int,
        idx: index.SparseIndex,
        base: int,
        span: tuple[int, int, int],
        out: list[MemoryItem],
        lost: list[Loss],
    ) -> None:
        active = base == self._segments[-1]
        n_out, n_lost = len(out), len(lost)
        try:
            self._collect(fd, path, idx.floor(span[0]), base, end, salt, span, out, lost)
            return
        except _StaleEntry:
            del out[n_out:]
            del lost[n_lost:]
        # An index entry did not verify: the index is what is wrong. Rebuild it from the
        # segment (past any damage) and read again. The active segment's index file is
        # left to its writer; a sealed one's is rewritten (derived data, nobody appends).
        fresh = self._build_index(fd, base, salt, end, save=not active)
        if active:
            self._idx = fresh
            self._idx_unwritten.clear()
        else:
            st = os.fstat(fd)
            self._sealed_cache[base] = ((st.st_ino, st.st_size), (salt, end, fresh))
        try:
            self._collect(fd, path, fresh.floor(span[0]), base, end, salt, span, out, lost)
        except _StaleEntry as stale:
            raise Corrupted(path, stale.offset, "the record an index entry points at changed under the read") from None

    def _collect(
        self,
        fd: int,
        path: str,
        entry: tuple[int, int] | None,
        base: int,
        end: int,
        salt: int,
        span: tuple[int, int, int],
        out: list[MemoryItem],
        lost: list[Loss],
    ) -> None:
        """Walk records from ``entry`` (or the segment's start), collecting seqs ``[start, stop)``.

        Damage whose seqs all lie before ``start`` is walked over (the next
        valid record says where the log goes on); damage that holds any seq
        of the range raises Corrupted. Raises _StaleEntry when ``entry`` does
        not point at a valid record carrying its seq.
        """
        start, stop, seg_end = span
        pos, seq = (entry[1], entry[0]) if entry else (SEGMENT_HEADER_SIZE, base)
        check_entry = entry is not None
        while True:
            try:
                # The hot loop of every read: plain iter_records, damage handled below.
                for roff, h, body in iter_records(fd, pos, end, salt):
                    first, count = h.first_seq, h.count
                    if check_entry:
                        if first != seq:
                            raise _StaleEntry(roff)
                        check_entry = False
                    if first != seq:
                        if seq < first <= start:
                            seq = first  # a gap in seqs, wholly before the range
                        else:
                            raise Corrupted(
                                path,
                                roff,
                                f"expected seq {seq}, record starts at {first}",
                                seq,
                                first - 1 if first > seq else None,
                            )
                    kind = h.kind
                    if kind == KIND_SEAL:
                        return
                    seq = first + count
                    if seq <= start:
                        continue
                    if kind == KIND_LOSS:
                        lost.append(_loss(path, roff, first, count, body))
                    else:
                        try:
                            items: list[dict[str, Any]] = decode_batch(body)
                        except Exception as exc:
                            why = f"batch body is not a JSON array of objects: {exc}"
                            raise Corrupted(path, roff, why, first, seq - 1) from None
                        if len(items) != count:
                            why = f"batch holds {len(items)} items, header says {count}"
                            raise Corrupted(path, roff, why, first, seq - 1)
                        lo = max(start - first, 0)
                        hi = min(stop - first, count)
                        if lo or hi < count:
                            items = items[lo:hi]
                        # map() builds the items in C: per item this is most of a replay's overhead.
                        stamp = format_us(h.recorded_at_us)
                        out.extend(map(MemoryItem, range(first + lo, first + hi), repeat(stamp), items))
                    if seq >= stop:
                        return
                return
            except BadRecord as bad:
                gap = gap_at(fd, bad, end, salt)
            if check_entry:
                raise _StaleEntry(gap.offset)
            resume = gap.resume
            if resume is None or resume[1].first_seq <= seq:
                self._damage_without_resume(path, gap, seq, seg_end, base)
            if resume[1].first_seq > start:
                raise Corrupted(path, gap.offset, gap.why, seq, resume[1].first_seq - 1)
            pos, seq = resume[0], resume[1].first_seq  # the damage lies wholly before the range

    def _damage_without_resume(self, path: str, gap: Gap, seq: int, seg_end: int, base: int) -> NoReturn:
        """Raise Corrupted for damage that no valid record follows in its segment.

        The damaged stretch ends with the segment, at ``seg_end``. In the
        active segment that makes it the record the next append would follow:
        it is remembered, so that appends refuse it (as they would after a
        restart) and the tail is verified again on the next call.
        """
        last: int | None = seg_end - 1 if seg_end > seq else None
        exc = Corrupted(path, gap.offset, gap.why, seq, last)
        if base == self._segments[-1]:
            self._damage = exc
        raise exc


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


class _StaleEntry(Exception):
    """An index entry did not point at a valid record carrying its seq."""

    def __init__(self, offset: int) -> None:
        super().__init__(offset)
        self.offset = offset


def _loss(path: str, offset: int, first: int, count: int, body: memoryview | bytes) -> Loss:
    """The :class:`Loss` a loss record stands for (its body names where the damaged bytes went)."""
    quarantine: str | None = None
    try:
        info = _LOSS_BODY.decode(body)
        q = info.get("quarantine")
        quarantine = q if isinstance(q, str) else None
    except msgspec.DecodeError:
        pass
    return Loss(first, first + count - 1, path, offset, quarantine)


_LOSS_BODY = msgspec.json.Decoder(type=dict[str, Any])


def _record_ending_at(fd: int, end: int, salt: int) -> frame.RecordHeader | None:
    """The valid record whose trailer ends at byte ``end``, if there is one."""
    if end < SEGMENT_HEADER_SIZE + frame.RECORD_OVERHEAD:
        return None
    found = frame.trailer_at_end(os.pread(fd, frame.TRAILER_SIZE, end - frame.TRAILER_SIZE), frame.TRAILER_SIZE)
    if found is None:
        return None
    start = end - frame.RECORD_OVERHEAD - found[1]
    if start < SEGMENT_HEADER_SIZE:
        return None
    data = os.pread(fd, end - start, start)
    h = frame.decode_record_header(data)
    if not frame.plausible(h) or h.size != len(data) or not frame.checksum_ok(data, 0, h, salt):
        return None
    return h
