"""The read path: verified items of a seq range, wherever damage lies.

Reads find the segment holding a seq by the segment names (base seqs), the
record by the segment's sparse index, and walk records from there, verifying
each. Damage that holds a seq of the range raises Corrupted (with its file
and offset); seqs a repair recorded as lost raise ItemsLost; every other
range reads normally.
"""

from __future__ import annotations

import bisect
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from itertools import repeat
from typing import Any, NoReturn

import msgspec

from . import index
from .codec import BadBatchBody, batch_decoder, decode_batch, decode_items, split_batch
from .convstate import ReadOnlyFile, Tip
from .errors import Corrupted, ItemsLost, Loss, Timeout
from .frame import (
    KIND_BATCH,
    KIND_IDENTITY,
    KIND_KEYED,
    KIND_LOSS,
    KIND_SEAL,
    MAX_BODY,
    MAX_IDENTITY_BODY,
    MIN_IDENTITY_BODY,
    RECORD_HEADER,
    RECORD_HEADER_SIZE,
    SEGMENT_HEADER_SIZE,
    TRAILER_SIZE,
    RecordHeader,
    items_body,
    xxh3_64,
)
from .limits import MAX_BATCH_ITEMS
from .model import MemoryItem, RawMemoryItem
from .recovery import Recovery
from .sealedsegment import SealedSegment
from .segment import BadRecord, Gap, gap_at, iter_records
from .timefmt import format_us

#: ``(start, stop, seg_end, raw)``: collect seqs ``[start, stop)`` of a segment whose seqs end
#: before ``seg_end``, as RawMemoryItem when ``raw``, else as MemoryItem.
_Span = tuple[int, int, int, bool]


#: Bound of each of the two caches below (cleared whole when full; entries are tiny).
_CACHE_MAX = 4096
#: ``recorded_at`` text by microseconds: a record read again formats nothing.
_STAMPS: dict[int, str] = {}
#: Segment file paths by (conversation directory, base seq), named in errors only.
_SEG_PATHS: dict[tuple[str, int], str] = {}


#: Bytes after the committed end read with the tail to see whether another process appended
#: there (as Recovery._moved_on reads them: a record header is never all zero).
_END_CHECK = 16
#: The most a read asks for in its first pread (the walk reads on in chunks if it needs more).
_READ_MAX = 4 << 20

#: A raw read of at most this many bytes of records keeps and reuses their splits (see _SplitCache).
_RAW_REUSE_MAX = 256 * 1024

#: A batch body at least this large, read only in part, is kept split (see _SplitCache).
_SPLIT_MIN = 64 * 1024


class _SplitCache:
    """Verified batch records split into their items, so that a later read need not parse them again.

    Two kinds of read use it:

    * A read that returns part of a large batch (a body of :data:`_SPLIT_MIN`
      or more). Decoding a 250-item batch to return its last 50 items costs
      the whole body: msgspec cannot split an array faster than it decodes
      it (measured: ~110 us both for 250 items of 1 KiB), and the split is
      what checks the body's shape. Such a record is kept here once its
      checksum and shape were verified; a later read that starts in it
      re-reads only its header (:meth:`Reader._cached_split`), which must be
      the one verified (same checksum, length, seqs, time), and decodes only
      the items it returns. What that does not notice: a body that rots on
      disk after it was cached (the header still matches) is served as the
      verified bytes it was; fsck reads every record from disk.
    * A raw read (:meth:`Reader.read_raw`, what the MCP server returns) of
      at most :data:`_RAW_REUSE_MAX` bytes of records (a recall; a replay
      page splits its records in place, keeping one copy of them in memory).
      Each record is read from disk and its checksum verified as always;
      when its header and its body's bytes equal those of an entry here, the
      entry's split of those very bytes is used instead of parsing them
      again. That reuse notices everything: it is a pure function of bytes
      just read and compared whole.

    Entries are keyed by (segment path, record offset): a file replaced or
    rewritten by a repair, or a record written again at the same offset, no
    longer matches and is parsed afresh. Bounded by the bodies' bytes, least
    recently used first out; shared by the conversations of the process.
    """

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self._entries: OrderedDict[tuple[str, int], tuple[RecordHeader, bytes, list[msgspec.Raw]]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def __bool__(self) -> bool:
        return bool(self._entries)

    def get(self, path: str, offset: int) -> tuple[RecordHeader, bytes, list[msgspec.Raw]] | None:
        key = (path, offset)
        with self._lock:
            found = self._entries.get(key)
            if found is not None:
                self._entries.move_to_end(key)
            return found

    def put(self, path: str, offset: int, header: RecordHeader, body: bytes, items: list[msgspec.Raw]) -> None:
        """Keep ``items``, the verified split of ``body``, the body of the record ``header`` at ``offset``."""
        key = (path, offset)
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._bytes -= old[0].body_len
            self._entries[key] = (header, body, items)
            self._bytes += header.body_len
            while self._bytes > self.budget and self._entries:
                _, (h, _body, _items) = self._entries.popitem(last=False)
                self._bytes -= h.body_len


_SPLITS = _SplitCache(16 * 1024 * 1024)


class Reader(Recovery):
    """Reads items and the conversation's extent."""

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

    def _refresh_for_read(self, deadline: float | None = None, *, fold: bool = False) -> bool:
        """Bring the cached state up to date with the files, taking the shared file lock only when needed.

        The common case costs one ``fstat``: the active segment is still
        linked (its directory was not removed, no repair replaced it), its
        size is what we last saw, and the bytes at the committed end are
        still zero (nobody appended into the preallocated space). That last
        check reads 16 bytes; with ``fold`` it is left to the caller, who
        folds it into its read of the tail (see :meth:`_collect`), and True is
        returned: the state is current unless those bytes are not all zero
        (then the caller raises :class:`_MovedOn` and refreshes).
        """
        seg = self.active
        unlinked = False
        if seg is not None:
            st = os.fstat(seg.fd)
            if not st.st_nlink:
                unlinked = True
            elif self._inflight:
                # Our own writer holds the exclusive lock with a group in flight: nobody else
                # can write, and the state describes what is acknowledged.
                return False
            elif self._loaded and self._damage is None and not seg.sealed and st.st_size == seg.alloc:
                if st.st_size <= seg.end:
                    return False
                if fold:
                    return True
                if not self._moved_on():
                    return False
        if not os.path.isdir(self.path):
            self._close_files()
            self._loaded = True
            return False
        self._refresh_locked(deadline, reload=unlinked)
        return False

    def _refresh_locked(self, deadline: float | None, reload: bool = False) -> None:
        """Refresh the state under the shared file lock; ``reload`` opens the active segment afresh."""
        started = time.monotonic()
        self._lock(False, started + self.options.lock_timeout if deadline is None else deadline, started)
        try:
            if reload:
                self._load(False)  # the file we hold was unlinked or replaced: read what is named now
            else:
                self._refresh(False)
        finally:
            self._unlock()

    def read(self, start: int | None, limit: int) -> list[MemoryItem]:
        """Up to ``limit`` items from seq ``start`` (None: the last ``limit``). Caller holds ``mutex``.

        Raises Corrupted when the range covers a damaged record, and ItemsLost
        when it covers seqs a repair recorded as lost; every other range reads
        normally, wherever the damage lies. Every batch the items come from
        has its checksum and its whole body's shape checked.
        """
        out: list[MemoryItem] = []
        self._read_current(start, limit, False, out)
        return out

    def read_raw(self, start: int | None, limit: int) -> list[RawMemoryItem]:
        """As :meth:`read`, with the same checks, but the payloads left as their stored JSON bytes."""
        out: list[RawMemoryItem] = []
        self._read_current(start, limit, True, out)
        return out

    def try_read_raw(self, start: int | None, limit: int, max_bytes: int) -> list[RawMemoryItem] | None:
        """:meth:`read_raw` if it needs no waiting and little reading, else None. Caller holds ``mutex``.

        None when the file lock is taken by another process (the cached tail
        could not be refreshed without waiting), when known damage must be
        re-checked, when the range starts before the active segment, or when
        the records from the range's index entry to the end of the segment
        exceed ``max_bytes``. For callers that must not block (an event loop)
        and fall back to a thread on None.
        """
        deadline = time.monotonic()  # the lock is tried once, never waited for
        try:
            check = self._refresh_for_read(deadline, fold=True)
            while True:
                seg = self.active
                if seg is None or self._damage is not None or not self._segments:
                    return None
                first = max(0, self._next_seq - limit) if start is None else start
                if first < self._next_seq:
                    if first < self._segments[-1]:
                        return None
                    entry = seg.idx.floor(first)
                    if seg.end - (entry[1] if entry else SEGMENT_HEADER_SIZE) > max_bytes:
                        return None
                out: list[RawMemoryItem] = []
                try:
                    self._read(start, limit, True, out, check)
                    return out
                except _MovedOn:
                    self._refresh_locked(deadline)
                    check = False
        except Timeout:
            return None

    def _read_current(self, start: int | None, limit: int, raw: bool, out: list[Any]) -> None:
        """:meth:`_read` after bringing the state up to date (the last check folded into the read of the tail)."""
        check = self._refresh_for_read(fold=True)
        try:
            self._read(start, limit, raw, out, check)
        except _MovedOn:
            del out[:]
            self._refresh_locked(None)
            self._read(start, limit, raw, out, False)

    def _read(self, start: int | None, limit: int, raw: bool, out: list[Any], check_end: bool) -> None:
        """Collect the items of a range into ``out``, from the cached state.

        ``check_end``: the state is current only if the 16 bytes at the
        committed end are zero (:meth:`_refresh_for_read` with ``fold``). A
        read of the tail checks them in its read of the last records, any
        other read first; both raise :class:`_MovedOn`, before anything is
        collected, when they are not.
        """
        if limit == 0:
            return
        if self._damage is not None:
            if start is None or start + limit > self._next_seq:
                raise self._damage
        end_seq = self._next_seq
        if start is None:
            start = max(0, end_seq - limit)
        stop = min(end_seq, start + limit)
        segments = self._segments
        # The check is folded into the read only when the read reaches the active segment's
        # records; any other read (one that ends before the tail, or starts past it, or an
        # active segment that holds no record yet) makes it first.
        if check_end and (start >= stop or stop < end_seq or segments[-1] >= end_seq):
            if self._moved_on():
                raise _MovedOn()
            check_end = False
        if start >= end_seq:
            return
        lost: list[Loss] = []
        seg_i = max(bisect.bisect_right(segments, start) - 1, 0)
        while start < stop and seg_i < len(segments):
            base = segments[seg_i]
            seg_end = segments[seg_i + 1] if seg_i + 1 < len(segments) else end_seq
            if seg_end > start:
                self._read_segment(base, (start, min(stop, seg_end), seg_end, raw), out, lost, check_end)
                start = seg_end
            seg_i += 1
        if lost:
            raise ItemsLost(lost)

    def _read_segment(self, base: int, span: _Span, out: list[Any], lost: list[Loss], check_end: bool) -> None:
        path = _SEG_PATHS.get((self.path, base))
        if path is None:
            if len(_SEG_PATHS) >= _CACHE_MAX:
                _SEG_PATHS.clear()
            path = _SEG_PATHS[(self.path, base)] = self._seg_path(base)
        if base == self._segments[-1]:
            seg = self.active
            assert seg is not None
            self._read_records(seg.fd, path, seg.salt, seg.end, seg.idx, base, span, out, lost, check_end)
        else:
            with ReadOnlyFile(path) as fd:
                try:
                    sealed = self._sealed(base, fd)
                except Corrupted as exc:
                    raise Corrupted(path, 0, exc.why, base, span[2] - 1) from None
                self._read_records(fd, path, sealed.salt, sealed.end, sealed.idx, base, span, out, lost, False)

    def _read_records(
        self,
        fd: int,
        path: str,
        salt: int,
        end: int,
        idx: index.SparseIndex,
        base: int,
        span: _Span,
        out: list[Any],
        lost: list[Loss],
        check_end: bool,
    ) -> None:
        active = base == self._segments[-1]
        n_out, n_lost = len(out), len(lost)
        try:
            # A read of the tail (check_end) reads to the committed end: it needs no bound from the index.
            upto = end if check_end else _upto(idx, span[1], end)
            self._collect(fd, path, idx.floor(span[0]), upto, base, end, salt, span, out, lost, check_end)
            return
        except _StaleEntry:
            del out[n_out:]
            del lost[n_lost:]
        # An index entry did not verify: the index is what is wrong. Rebuild it from the
        # segment (past any damage) and read again. The active segment's index file is
        # left to its writer; a sealed one's is rewritten (derived data, nobody appends).
        fresh = self._build_index(fd, base, salt, end, save=not active)
        if active:
            assert self.active is not None
            self.active.idx = fresh
            self.active.idx_unwritten.clear()
        else:
            st = os.fstat(fd)
            self.sealed_cache.replace(SealedSegment(base, salt, end, fresh, (st.st_ino, st.st_size)))
        try:
            self._collect(fd, path, fresh.floor(span[0]), _upto(fresh, span[1], end), base, end, salt, span, out,
                          lost, check_end)
        except _StaleEntry as stale:
            raise Corrupted(path, stale.offset, "the record an index entry points at changed under the read") from None

    def _collect(
        self,
        fd: int,
        path: str,
        entry: tuple[int, int] | None,
        upto: int,
        base: int,
        end: int,
        salt: int,
        span: _Span,
        out: list[Any],
        lost: list[Loss],
        check_end: bool,
    ) -> None:
        """Walk records from ``entry`` (or the segment's start), collecting seqs ``[start, stop)``.

        Damage whose seqs all lie before ``start`` is walked over (the next
        valid record says where the log goes on); damage that holds any seq
        of the range raises Corrupted. Raises _StaleEntry when ``entry`` does
        not point at a valid record carrying its seq. Items go to ``out`` as
        RawMemoryItem when ``raw`` (the span's last field), else MemoryItem.

        The records are read with one ``pread`` up to ``upto`` (where, by the
        index, the range's records end; the walk reads on if they do not).
        With ``check_end`` (a read of the active segment's tail) that read
        takes the 16 bytes after the committed end too, and raises
        :class:`_MovedOn` when they are not zero, or when the file no longer
        reaches the end: another process wrote or cut the segment, and the
        cached state must be refreshed before anything is collected.
        """
        start, stop, seg_end, raw = span
        make: Callable[..., Any] = RawMemoryItem if raw else MemoryItem
        decode = batch_decoder.decode
        items: list[Any]
        pos, seq = (entry[1], entry[0]) if entry else (SEGMENT_HEADER_SIZE, base)
        check_entry = entry is not None
        # A kept split is of a record larger than _SPLIT_MIN: none can start at ``pos`` when less follows it.
        cached = self._cached_split(fd, path, pos, end, seq) if check_entry and end - pos > _SPLIT_MIN else None
        if cached is not None:
            if check_end:
                if self._moved_on():
                    raise _MovedOn()
                check_end = False
            h, parts = cached
            first, count = h.first_seq, h.count
            check_entry = False
            pos += h.size
            seq = first + count
            if seq > start:
                lo, hi = max(start - first, 0), min(stop - first, count)
                try:
                    items = parts[lo:hi] if raw else decode_items(parts[lo:hi])
                except Exception as exc:
                    why = f"batch body is not a JSON array of objects: {exc}"
                    raise Corrupted(path, pos - h.size, why, first, seq - 1) from None
                out.extend(map(make, range(first + lo, first + hi), repeat(_stamp(h)), items))
                if seq >= stop:
                    return
        # A raw read of little (a recall) keeps and reuses splits; a larger one (a page of a
        # replay) splits its records where they lie, so that it holds one copy of them.
        reuse = raw and (end if check_end else upto) - pos <= _RAW_REUSE_MAX
        buf: bytes | memoryview
        if check_end:
            buf = os.pread(fd, end + _END_CHECK - pos, pos)
            if len(buf) < end - pos or any(buf[end - pos :]):
                raise _MovedOn()
        else:
            buf = os.pread(fd, min(max(upto - pos, RECORD_HEADER_SIZE), _READ_MAX), pos) if upto > pos else b""
        # The fast walk, the common case of every read: whole, valid batch records in ``buf``,
        # in seq order, checked as iter_records checks them. Anything else (a seal, a loss
        # record, a record not wholly read, one that fails a check, seqs out of order) stops
        # it; the general walk below goes on from that record and says what it is.
        view = memoryview(buf)
        limit = min(len(buf), end - pos)
        rel = 0
        unpack = RECORD_HEADER.unpack_from
        xxh3 = xxh3_64
        stamps = _STAMPS
        while rel + RECORD_HEADER_SIZE <= limit:
            checksum, body_len, count, kind, first, us = unpack(buf, rel)
            if kind != KIND_BATCH or not 0 < count <= MAX_BATCH_ITEMS or not 2 <= body_len <= MAX_BODY:
                if kind != KIND_IDENTITY or pos + rel != SEGMENT_HEADER_SIZE or count or first != seq:
                    break
                # A claimed conversation's identity, its first segment's first record: no items.
                rend = rel + RECORD_HEADER_SIZE + body_len + TRAILER_SIZE
                if not MIN_IDENTITY_BODY <= body_len <= MAX_IDENTITY_BODY or rend > limit:
                    break
                if xxh3(view[rel + 8 : rel + RECORD_HEADER_SIZE + body_len], salt) != checksum:
                    break
                rel = rend
                continue
            body_at = rel + RECORD_HEADER_SIZE
            rend = body_at + body_len + TRAILER_SIZE
            if rend > limit or xxh3(view[rel + 8 : body_at + body_len], salt) != checksum:
                break
            if first != seq:
                if check_entry:
                    raise _StaleEntry(pos + rel)
                break
            check_entry = False
            seq = first + count
            if seq > start:
                lo = start - first if start > first else 0
                hi = stop - first if stop < seq else count
                body = view[body_at : body_at + body_len]
                stamp = stamps.get(us) or _stamp_us(us)
                if raw or lo or hi < count:
                    h = RecordHeader(checksum, body_len, count, kind, first, us)
                    items = self._part(path, pos + rel, h, body, lo, hi, raw, reuse)
                    out.extend(map(make, range(first + lo, first + hi), repeat(stamp), items))
                else:
                    # A whole record decoded, inline (the common case of a recall and of every
                    # replay page): decoding the body is what checks it, as in _decode_whole,
                    # which says what is wrong when it is not a JSON array of ``count`` objects.
                    try:
                        items = decode(body)
                    except Exception:
                        items = []
                    if len(items) != count:  # decoded again, to say what is wrong (or to use it)
                        items = _decode_whole(decode, body, count, path, pos + rel, first, seq - 1)
                    out.extend(map(make, range(first, seq), repeat(stamp), items))
                if seq >= stop:
                    return
            rel = rend
        pos += rel
        buf = view[rel:]
        while True:
            try:
                # The hot loop of every read: plain iter_records, damage handled below.
                for roff, h, body in iter_records(fd, pos, end, salt, buf):
                    _, _, count, kind, first, us = h
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
                    if kind == KIND_SEAL:
                        return
                    seq = first + count
                    if seq <= start:
                        continue
                    if kind == KIND_LOSS:
                        lost.append(_loss(path, roff, first, count, body))
                    else:
                        if kind == KIND_KEYED:
                            # The items without the key; the header keeps the record's own length.
                            body = items_body(kind, body)  # type: ignore[assignment]
                        lo = start - first if start > first else 0
                        hi = stop - first if stop < seq else count
                        if raw or lo or hi < count:
                            items = self._part(path, roff, h, body, lo, hi, raw, reuse)
                        else:
                            items = _decode_whole(decode, body, count, path, roff, first, seq - 1)
                        _emit(out, make, us, first + lo, first + hi, items)
                    if seq >= stop:
                        return
                return
            except BadRecord as bad:
                gap = gap_at(fd, bad, end, salt)
            buf = b""  # it holds the bytes from the walk's first position only
            if check_entry:
                raise _StaleEntry(gap.offset)
            resume = gap.resume
            if resume is None or resume[1].first_seq <= seq:
                self._damage_without_resume(path, gap, seq, seg_end, base)
            if resume[1].first_seq > start:
                raise Corrupted(path, gap.offset, gap.why, seq, resume[1].first_seq - 1)
            pos, seq = resume[0], resume[1].first_seq  # the damage lies wholly before the range

    def _part(
        self, path: str, offset: int, h: RecordHeader, body: memoryview, lo: int, hi: int, raw: bool, reuse: bool
    ) -> list[Any]:
        """Items ``[lo, hi)`` of a verified batch record, raw or decoded, after checking the whole body's shape.

        A large batch read in part, and a raw read when ``reuse``, keep the split for the
        next read (:class:`_SplitCache`); the latter reuses a kept split of the same bytes.
        Decoding a whole body is what checks it, and msgspec decodes as fast as it can
        merely split one (measured), so a small batch read decoded is decoded whole and sliced.
        """
        first, count = h.first_seq, h.count
        try:
            if raw and not reuse:
                parts = split_batch(body, count)  # the items keep the read buffer alive, nothing is copied
                return parts[lo:hi]
            if raw or (h.body_len >= _SPLIT_MIN and (lo or hi < count)):
                # The kept split gets its own copy of the body: the read buffer may hold more records.
                data = bytes(body)
                cached = _SPLITS.get(path, offset) if _SPLITS else None
                if cached is not None and cached[0] == h and cached[1] == data:
                    parts = cached[2]  # the split of these very bytes, checked when it was made
                else:
                    parts = split_batch(data, count)
                    _SPLITS.put(path, offset, h, data, parts)
                return parts[lo:hi] if raw else decode_items(parts[lo:hi])
            items = decode_batch(body)
            if len(items) != count:
                raise BadBatchBody(f"batch holds {len(items)} items, header says {count}")
            return items[lo:hi]
        except BadBatchBody as exc:
            raise Corrupted(path, offset, str(exc), first, first + count - 1) from None
        except Exception as exc:
            why = f"batch body is not a JSON array of objects: {exc}"
            raise Corrupted(path, offset, why, first, first + count - 1) from None

    def _cached_split(
        self, fd: int, path: str, pos: int, end: int, seq: int
    ) -> tuple[RecordHeader, list[msgspec.Raw]] | None:
        """The verified split of the batch record at ``pos`` carrying ``seq``, if cached and still on disk."""
        cached = _SPLITS.get(path, pos) if _SPLITS else None
        if cached is None:
            return None
        h = cached[0]
        if h.body_len < _SPLIT_MIN or h.first_seq != seq or pos + h.size > end:
            return None  # a small record is read again: reading it costs less than this check
        # The header on disk must still be the one verified: same checksum, length, seqs and time.
        data = os.pread(fd, RECORD_HEADER_SIZE, pos)
        if len(data) != RECORD_HEADER_SIZE or RECORD_HEADER.unpack(data) != tuple(h):
            return None
        return h, cached[2]

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


def _emit(out: list[Any], make: Callable[..., Any], us: int, first: int, stop: int, items: list[Any]) -> None:
    """Append the items of seqs ``first``..``stop - 1`` stamped ``us`` to ``out``.

    ``map()`` builds the items in C: per item this is most of a replay's overhead.
    """
    stamp = _STAMPS.get(us)
    if stamp is None:
        stamp = _stamp_us(us)
    out.extend(map(make, range(first, stop), repeat(stamp), items))


def _decode_whole(
    decode: Callable[[Any], list[Any]], body: Any, count: int, path: str, offset: int, first: int, last: int
) -> list[Any]:
    """A whole batch's items: decoding the body is what checks it, in one pass.

    Corrupted (at the record's ``offset``, items ``first``..``last``) when the
    body is not a JSON array of objects or holds other than ``count`` items.
    """
    try:
        items = decode(body)
    except Exception as exc:
        raise Corrupted(path, offset, f"batch body is not a JSON array of objects: {exc}", first, last) from None
    if len(items) != count:
        raise Corrupted(path, offset, f"batch holds {len(items)} items, header says {count}", first, last)
    return items


def _stamp(h: RecordHeader) -> str:
    """The record's ``recorded_at`` as text (formatted once per distinct time)."""
    return _stamp_us(h.recorded_at_us)


def _stamp_us(us: int) -> str:
    """``recorded_at`` text of ``us`` microseconds (formatted once per distinct time)."""
    stamp = _STAMPS.get(us)
    if stamp is None:
        if len(_STAMPS) >= _CACHE_MAX:
            _STAMPS.clear()
        stamp = _STAMPS[us] = format_us(us)
    return stamp


def _upto(idx: index.SparseIndex, stop: int, end: int) -> int:
    """Where the records holding seqs before ``stop`` end at the latest, by the index: its first entry at or
    past ``stop`` (a record starting there holds none of them), else ``end``. A hint for the read size only."""
    i = bisect.bisect_left(idx.seqs, stop)
    return idx.offsets[i] if i < len(idx.seqs) else end


class _MovedOn(Exception):
    """The bytes at the active segment's committed end are no longer zero: another process appended."""


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
