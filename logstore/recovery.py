"""Recovery on open: find where a conversation's log ends, and what of it can be trusted.

The active segment's committed end is found from its sparse index (the
newest entry that points at a valid record of the right seq) and a forward
walk over the records after it. A record that fails verification at the end
is the clean end when only zeros follow (preallocated space), else a torn
tail (cut away by a writer) or damage (remembered and reported as Corrupted),
as :func:`logstore.segment.classify_tail` decides; damage followed by a valid
record is walked over. Sealed segments' indexes are
loaded, or rebuilt from their records, here too.
"""

from __future__ import annotations

import os

from . import fileio, frame, index
from .activesegment import ActiveSegment
from .convstate import ConversationState, ReadOnlyFile
from .errors import Corrupted
from .frame import ITEM_KINDS, KIND_IDENTITY, KIND_SEAL, SEGMENT_HEADER_SIZE, SEQ_KINDS
from .sealedsegment import SealedSegment
from .segment import BadRecord, Fault, Gap, classify_tail, data_end, find_next_record, iter_records, walk


class Recovery(ConversationState):
    """Brings the cached state of :class:`ConversationState` in line with the files."""

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
            with ReadOnlyFile(path) as fd:
                header = frame.decode_segment_header(os.pread(fd, SEGMENT_HEADER_SIZE, 0))
                if header is None:
                    return None
                end = data_end(fd, SEGMENT_HEADER_SIZE, os.fstat(fd).st_size)
                for rec in walk(fd, SEGMENT_HEADER_SIZE, end, header.salt):
                    if not isinstance(rec, Gap) and rec[1].kind in SEQ_KINDS:
                        return rec[1].recorded_at_us
        except FileNotFoundError:
            return None
        return None

    def _open_active(self, base: int, writable: bool, prev: ActiveSegment | None = None) -> None:
        """Open segment ``base`` as the active one and verify its tail.

        ``prev``: the active segment it follows (a refresh found that one
        sealed); a damaged header keeps its salt, allocation, seal flag and
        index in memory, as the state was before segments were objects.
        """
        path = self._seg_path(base)
        # Invariant: ``_last_us`` is the time of the last batch at or before the end found
        # here, never one kept from an older active segment. A refresh that finds its
        # segment sealed opens the newest one directly, past any segment between them:
        # kept, the old time would be stale (and a probe would log it to the listing with
        # the new extent); zero makes the walk below, or _last_record_time, find it.
        self._last_us = 0
        fd = os.open(path, os.O_RDWR if writable else os.O_RDONLY)
        seg = self.active = ActiveSegment(self.path, base, fd)
        head = os.pread(fd, _SECTOR, 0)
        header = frame.decode_segment_header(head)
        if header is None and base == 0 and len(self._segments) == 1 and not any(head):
            # A torn creation (see is_torn_creation): nothing in it was ever acknowledged.
            # The conversation holds nothing; the next append rewrites the file.
            os.close(fd)
            self.active = None
            self._segments = []
            return
        if header is None or header.base_seq != base:
            # Without its salt no record of the segment can be verified: the log is
            # readable up to the segment's base seq (its name), and appends refuse.
            self._damage = Corrupted(path, 0, "segment header is missing or invalid", base)
            self._next_seq = base
            if prev is not None:
                seg.salt, seg.alloc, seg.sealed, seg.idx = prev.salt, prev.alloc, prev.sealed, prev.idx
                seg.idx_lazy, seg.idx_unwritten = prev.idx_lazy, prev.idx_unwritten
            return
        seg.salt = header.salt
        size = os.fstat(fd).st_size
        idx = index.load(self._idx_path(base), base, header.salt, size)
        start, seq = SEGMENT_HEADER_SIZE, base
        index_ok = idx is not None and idx.complete
        idx_missing = idx is None
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
        seg.idx = idx
        seg.end = start
        self._next_seq = seq
        seg.alloc = size
        entries = len(idx.seqs)
        self._scan_forward(writable, size)
        if writable:
            if index_ok and len(seg.idx.seqs) == entries:
                # The file already says exactly this: keep it, so other writers' descriptors stay valid.
                seg.idx_fd = os.open(self._idx_path(base), os.O_WRONLY | os.O_APPEND)
            elif idx_missing and not seg.idx.seqs:
                seg.idx_lazy = True  # nothing to write yet: created with the first entry
            else:
                seg.idx_fd = index.open_for_append(self._idx_path(base), seg.idx)

    def _scan_forward(self, writable: bool, size: int | None = None) -> None:
        """Walk records from the committed end to EOF, adopting whole ones.

        A torn tail is cut away when ``writable`` (we hold the exclusive lock).
        Damage with a valid record after it is walked over: the log goes on at
        that record, and only reads that cover the damage report it. Damage to
        the last record (nothing valid follows) is recorded and raised as
        Corrupted by appends and by reads that reach it.
        """
        seg = self.active
        assert seg is not None
        fd = seg.fd
        if size is None:
            size = os.fstat(fd).st_size
        seg.alloc = size
        path = self._seg_path(seg.idx.base_seq)
        last_indexed = seg.idx.last_offset()
        # Records we did not write may follow ours: our unwritten entries would now land
        # after theirs, out of order, so they stay in memory only.
        seg.idx_unwritten.clear()
        pos = seg.end
        while True:
            try:
                for off, h, _body in iter_records(fd, pos, size, seg.salt):
                    if seg.sealed:
                        raise BadRecord(off, "record after the segment's seal", Fault.AFTER_SEAL)
                    if h.first_seq != self._next_seq:
                        raise BadRecord(
                            off, f"expected seq {self._next_seq}, record starts at {h.first_seq}", Fault.SEQ
                        )
                    if h.kind == KIND_SEAL:
                        seg.sealed = True
                    elif h.kind != KIND_IDENTITY:  # (the conversation's identity: no seqs, no time of a batch)
                        if (
                            h.kind in ITEM_KINDS
                            and off - last_indexed >= self.options.index_interval
                            and off > SEGMENT_HEADER_SIZE
                        ):
                            # In memory only: the process that wrote the record wrote its entry.
                            seg.idx.add(h.first_seq, off)
                            last_indexed = off
                        self._last_us = h.recorded_at_us
                        self._next_seq = h.end_seq
                    seg.end = off + h.size
                break
            except BadRecord as bad:
                # A valid record out of place is damage, never a torn write or the end.
                after_seal = bad.fault is Fault.AFTER_SEAL
                verdict = classify_tail(fd, bad.offset, size, seg.salt, self._next_seq) if bad.fault.framing else None
                if verdict == "end":
                    # Only zeros follow: preallocated space, the clean end of the log.
                    break
                if verdict == "torn":
                    if writable:
                        # Never acknowledged: cut it away (with the space after it), and the
                        # stale index entries with it. The next append extends the file again.
                        fileio.truncate(fd, bad.offset)
                        seg.alloc = bad.offset
                        seg.idx.truncate_before_offset(bad.offset)
                        if seg.idx_fd is not None:
                            os.close(seg.idx_fd)
                            seg.idx_fd = index.open_for_append(seg.index_path(), seg.idx)
                    break
                nxt = None if after_seal else find_next_record(fd, bad.offset, size, seg.salt, self._next_seq + 1)
                if nxt is None:
                    self._damage = self._tail_damage(fd, path, bad)
                    break
                # Damage in the middle: the log goes on at the next valid record.
                pos, self._next_seq = nxt[0], nxt[1].first_seq
                seg.end = pos
        if self._last_us == 0 and self._next_seq > 0:
            self._last_us = self._last_record_time()

    def _tail_damage(self, fd: int, path: str, bad: BadRecord) -> Corrupted:
        """Corrupted for damage at the end of the active segment: every seq from it on is unreadable."""
        why = bad.why
        raw = os.pread(fd, frame.RECORD_HEADER_SIZE, bad.offset)
        if len(raw) == frame.RECORD_HEADER_SIZE and bad.fault is not Fault.SEQ:
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
        seg = self.active
        assert seg is not None
        last = 0
        start = seg.idx.last_offset() or SEGMENT_HEADER_SIZE
        for rec in walk(seg.fd, start, seg.end, seg.salt):
            if not isinstance(rec, Gap) and rec[1].kind in SEQ_KINDS:
                last = rec[1].recorded_at_us
        if last == 0 and len(self._segments) > 1:
            # The active segment holds only its header (or a seal): ask the previous one.
            prev = self._segments[-2]
            try:
                with ReadOnlyFile(self._seg_path(prev)) as fd:
                    sealed = self._sealed(prev, fd)
                    seal = _record_ending_at(fd, sealed.end, sealed.salt)
                    if seal is not None:
                        return seal.recorded_at_us
                    for rec in walk(fd, sealed.idx.last_offset() or SEGMENT_HEADER_SIZE, sealed.end, sealed.salt):
                        if not isinstance(rec, Gap):
                            last = rec[1].recorded_at_us
            except (Corrupted, FileNotFoundError):
                pass  # nothing readable there: the clock alone stamps the next batch
        return last

    def _refresh(self, writable: bool) -> None:
        """Bring the in-memory state up to date with the files (file lock held)."""
        seg = self.active
        if not self._loaded or seg is None:
            self._load(writable)
            return
        if (writable and seg.idx_fd is None and not seg.idx_lazy) or self._damage is not None:
            self._load(writable)
            return
        size = os.fstat(seg.fd).st_size
        if size < seg.end:
            self._load(writable)
            return
        if size != seg.alloc or (size > seg.end and self._moved_on()):
            self._scan_forward(writable, size)
        if seg.sealed:
            nxt = self._list_segments()
            if nxt and nxt[-1] > seg.idx.base_seq:
                self._segments = nxt
                self.sealed_cache.clear()
                self._close_active()
                try:
                    self._open_active(nxt[-1], writable, seg)
                except BaseException:
                    self._close_files()
                    raise

    def _stale(self) -> bool:
        """True when another process may have changed the files since we looked.

        False while this object's writer has a group in flight or extends the
        active segment (``mutex`` released, the exclusive file lock held):
        nobody else can write, and the state describes what is acknowledged.
        """
        if self._inflight or self._growing:
            return False
        seg = self.active
        if not self._loaded or seg is None or self._damage is not None:
            return True  # known damage is re-checked each time: an operator may have repaired it
        if seg.sealed:
            return True
        size = os.fstat(seg.fd).st_size
        return size != seg.alloc or (size > seg.end and self._moved_on())

    def _moved_on(self) -> bool:
        """True when the bytes at the committed end are no longer zero: another process wrote there.

        Appends into preallocated space change no file size. A record header is
        never all zero (its kind field is not), so its first 16 bytes tell.
        """
        seg = self.active
        assert seg is not None
        # any(): near the end of the file fewer than 16 bytes remain, and those are zeros too.
        return any(os.pread(seg.fd, 16, seg.end))

    def _sealed(self, base: int, fd: int) -> SealedSegment:
        """The sealed segment ``base`` open as ``fd``, building its index if needed.

        The cache (:class:`logstore.sealedsegment.SealedCache`) is keyed by the
        file's identity and size, so a segment that a repair replaced is read afresh.
        """
        st = os.fstat(fd)
        cached = self.sealed_cache.get(base, st)
        if cached is not None:
            return cached
        path = self._seg_path(base)
        header = frame.decode_segment_header(os.pread(fd, SEGMENT_HEADER_SIZE, 0))
        if header is None or header.base_seq != base:
            raise Corrupted(path, 0, "segment header is missing or invalid", base)
        idx = index.load(self._idx_path(base), base, header.salt, st.st_size)
        if idx is None or not idx.complete:
            # Missing, not this segment's, or malformed entries (a power cut can zero them):
            # rebuild it from the segment and save it, so the file is whole again.
            idx = self._build_index(fd, base, header.salt, st.st_size, save=True)
        result = SealedSegment(base, header.salt, st.st_size, idx, (st.st_ino, st.st_size))
        self.sealed_cache.add(result)
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
            if h.kind in ITEM_KINDS and off - last >= interval and off > SEGMENT_HEADER_SIZE:
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


#: The unit a disk writes atomically (as in :mod:`logstore.segment`): a segment's header lies in its first one.
_SECTOR = 512


def is_torn_creation(fd: int, base: int, last: bool, only: bool) -> bool:
    """True when the segment open as ``fd`` is a conversation's first segment whose creation never completed.

    A first segment is created in place, its header and first record written
    in one write from offset 0 and synced before anything is acknowledged
    (FORMAT.md 6). Its first sector (the header and the record's start) is
    written whole or not at all, so a power cut before the sync can leave the
    file empty or its first sector all zeros; nothing in it was acknowledged.
    Only the conversation's one and only segment (base seq 0, the last) can
    be in that state: any other segment was synced before it was named, so
    there an invalid header is damage.
    """
    if base != 0 or not last or not only:
        return False
    return not any(os.pread(fd, _SECTOR, 0))


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
