"""Reading and verifying the records of one segment file: the one record walker.

:func:`iter_records` walks records between two offsets and verifies each
(plausible header, whole record present, checksum). The first record that
fails raises :class:`BadRecord`, whose :class:`Fault` says what failed; what
that means (a torn tail to cut away, or damage to acknowledged data) is
decided by :func:`classify_failure`, which encodes the recovery rule of
FORMAT.md. :func:`walk` goes on past damage, resynchronising as FORMAT.md
section 3 says: at the next offset whose header is plausible and whose
checksum matches (:func:`find_next_record`), never by a trailer. The engine's
reader and recovery, the maintenance tools (dump, fsck's scan, export, stats,
salvage) and the memory event log all walk records through this module.
"""

from __future__ import annotations

import enum
import os
import re
from collections.abc import Iterator
from typing import Literal, NamedTuple

from . import frame
from .frame import RECORD_HEADER_SIZE, RecordHeader
from .limits import MAX_BATCH_ITEMS

#: Bytes read ahead in one pread while walking records ...
CHUNK = 256 * 1024
#: ... after a first, smaller read.
FIRST_READ = 16 * 1024


class Fault(enum.Enum):
    """What made a record fail: decided by code, never read back from a message."""

    #: The header is cut short, or its fields are out of range (FORMAT.md section 3).
    HEADER = "header"
    #: The header is plausible but the record runs past the end of the data.
    LENGTH = "length"
    #: The whole record is there and its checksum does not match.
    CHECKSUM = "checksum"
    #: A valid record whose first seq is not the one the log expects.
    SEQ = "seq"
    #: A valid record after the segment's seal.
    AFTER_SEAL = "after-seal"
    #: A valid record whose content the log it is in does not allow (the memory
    #: event log: exactly one event per batch, a decodable event).
    CONTENT = "content"

    @property
    def framing(self) -> bool:
        """True when the bytes themselves fail (they may be a torn write); False for a valid record out of place."""
        return self in (Fault.HEADER, Fault.LENGTH, Fault.CHECKSUM)


class BadRecord(Exception):
    """The record at ``offset`` failed verification; ``fault`` says how, ``why`` says it in words."""

    def __init__(self, offset: int, why: str, fault: Fault) -> None:
        super().__init__(f"bad record at byte offset {offset}: {why}")
        self.offset = offset
        self.why = why
        self.fault = fault


def iter_records(
    fd: int, start: int, end: int, salt: int, buf: bytes | memoryview = b""
) -> Iterator[tuple[int, RecordHeader, memoryview]]:
    """Yield ``(offset, header, body)`` for each valid record in ``[start, end)``.

    Raises :class:`BadRecord` at the first record that is not whole and valid.
    Bodies are views into a read buffer; copy or decode before the next step.
    ``buf``, when given, holds the file's bytes from ``start`` on (as many as
    the caller read, possibly past ``end``): the walk reads only what lies
    beyond it. No read extends past ``end``.
    """
    # The hot loop of every read: header fields, plausibility and checksum are
    # inlined (same checks and messages as frame.plausible / checksum_ok).
    unpack = frame.RECORD_HEADER.unpack_from
    make = RecordHeader._make
    xxh3 = frame.xxh3_64
    max_body = frame.MAX_BODY
    max_count = MAX_BATCH_ITEMS
    min_ident, max_ident = frame.MIN_IDENTITY_BODY, frame.MAX_IDENTITY_BODY
    pos = start
    view = memoryview(buf)
    buf_off = start
    # The first read is small: the walk often ends soon (a few new records, then the
    # preallocated zeros of the active segment); later reads take CHUNK at a time.
    ahead = FIRST_READ
    while pos < end:
        if pos + RECORD_HEADER_SIZE > end:
            raise BadRecord(pos, "incomplete record header", Fault.HEADER)
        if pos + RECORD_HEADER_SIZE > buf_off + len(buf):
            buf = os.pread(fd, min(max(ahead, RECORD_HEADER_SIZE), end - pos), pos)
            ahead = CHUNK
            view = memoryview(buf)
            buf_off = pos
            if len(buf) < RECORD_HEADER_SIZE:
                raise BadRecord(pos, "file ends inside the record header", Fault.HEADER)
        fields = unpack(buf, pos - buf_off)
        checksum, body_len, count, kind = fields[0], fields[1], fields[2], fields[3]
        if kind == frame.KIND_BATCH:
            ok = 1 <= count <= max_count and 2 <= body_len <= max_body
        elif kind == frame.KIND_SEAL:
            ok = count == 0 and body_len == 0
        elif kind == frame.KIND_KEYED:
            ok = 1 <= count <= max_count and frame.MIN_KEYED_BODY <= body_len <= frame.MAX_KEYED_BODY
        elif kind == frame.KIND_LOSS:
            ok = count >= 1 and 2 <= body_len <= frame.MAX_LOSS_BODY
        else:
            ok = kind == frame.KIND_IDENTITY and count == 0 and min_ident <= body_len <= max_ident
        if not ok:
            raise BadRecord(pos, "record header fields are out of range", Fault.HEADER)
        rend = pos + frame.RECORD_OVERHEAD + body_len
        if rend > end:
            raise BadRecord(pos, f"record length {body_len} runs past the end of the data", Fault.LENGTH)
        if rend > buf_off + len(buf):
            buf = os.pread(fd, min(max(ahead, rend - pos), end - pos), pos)
            ahead = CHUNK
            view = memoryview(buf)
            buf_off = pos
            if len(buf) < rend - pos:
                raise BadRecord(pos, "file ends inside the record", Fault.LENGTH)
        rel = pos - buf_off
        body_at = rel + RECORD_HEADER_SIZE
        if xxh3(view[rel + 8 : body_at + body_len], salt) != checksum:
            raise BadRecord(pos, "checksum mismatch", Fault.CHECKSUM)
        yield pos, make(fields), view[body_at : body_at + body_len]
        pos = rend


# Where a record header may start: the u16 count and u16 kind fields (bytes
# 12..16 of a record) of a batch or keyed batch (count 1..250), a seal or an
# identity (count 0) or a loss record (any count). Matched with a lookahead so
# candidates may overlap.
_CANDIDATE = re.compile(
    rb"(?=[\x01-\xfa]\x00[\x01\x04]\x00|\x00\x00[\x02\x05]\x00|[^\x00]\x00\x03\x00|[\x00-\xff][^\x00]\x03\x00)",
    re.DOTALL,
)


def find_next_record(fd: int, after: int, end: int, salt: int, min_seq: int = 0) -> tuple[int, RecordHeader] | None:
    """The first valid record after byte ``after`` (and before ``end``) whose first seq is ``min_seq`` or more.

    Used to find where intact data resumes after a damaged record. A
    candidate is any position whose count and kind fields are plausible; it is
    accepted only when the whole record lies before ``end`` and its checksum,
    seeded with the segment's salt, matches. The trailer is not needed, so a
    record whose trailer was damaged is still found.
    """
    first = after + 1
    if first + frame.RECORD_OVERHEAD > end:
        return None
    data = os.pread(fd, end - first, first)
    limit = len(data)
    for m in _CANDIDATE.finditer(data, 12):
        pos = m.start() - 12
        if pos + frame.RECORD_OVERHEAD > limit:
            return None
        h = frame.decode_record_header(data, pos)
        if not frame.plausible(h) or pos + h.size > limit or h.first_seq < min_seq:
            continue
        if frame.checksum_ok(data, pos, h, salt):
            return first + pos, h
    return None


class Gap(NamedTuple):
    """A damaged stretch met by :func:`walk`.

    ``offset`` is where the first record that failed starts, ``why`` what
    failed (``fault`` the same as a value), ``header`` its header fields when
    they were plausible (not verified: a hint only), and ``resume`` the offset
    and header of the next valid record, or None when none follows before the end.
    """

    offset: int
    why: str
    header: RecordHeader | None
    resume: tuple[int, RecordHeader] | None
    fault: Fault = Fault.HEADER


def gap_at(fd: int, bad: BadRecord, end: int, salt: int) -> Gap:
    """The :class:`Gap` that starts at a record that failed verification, and where valid data resumes."""
    hint: RecordHeader | None = None
    raw = os.pread(fd, RECORD_HEADER_SIZE, bad.offset)
    if len(raw) == RECORD_HEADER_SIZE:
        h0 = frame.decode_record_header(raw)
        hint = h0 if frame.plausible(h0) else None
    return Gap(bad.offset, bad.why, hint, find_next_record(fd, bad.offset, end, salt), bad.fault)


def walk(fd: int, start: int, end: int, salt: int) -> Iterator[tuple[int, RecordHeader, memoryview] | Gap]:
    """Like :func:`iter_records`, but a damaged record yields a :class:`Gap` and the walk resumes after it."""
    pos = start
    while pos < end:
        try:
            yield from iter_records(fd, pos, end, salt)
            return
        except BadRecord as bad:
            gap = gap_at(fd, bad, end, salt)
        yield gap
        if gap.resume is None:
            return
        pos = gap.resume[0]


Verdict = Literal["torn", "corrupt"]

#: Zero bytes compared against while checking preallocated space.
_ZEROS = bytes(64 * 1024)


def data_end(fd: int, start: int, size: int) -> int:
    """Just after the last non-zero byte of ``[start, size)`` of the file, or ``start`` when all of it is zero.

    The active segment is extended in zero-filled chunks ahead of its records
    (FORMAT.md, "Preallocated space"): its data ends here, and the bytes after
    are unused space. Reads backwards from ``size``, so it reads the trailing
    zeros and a little more.
    """
    pos, step = size, 4096
    while pos > start:
        n = min(step, pos - start)
        buf = os.pread(fd, n, pos - n)
        if len(buf) < n:
            # The file is shorter than ``size`` (cut meanwhile): look at what is there.
            pos = pos - n + len(buf)
            if not buf:
                continue
        kept = len(buf.rstrip(b"\x00"))
        if kept:
            return pos - len(buf) + kept
        pos -= len(buf)
        step = min(step * 4, 1 << 20)
    return start


def zero_from(fd: int, offset: int, size: int) -> bool:
    """True when every byte of ``[offset, size)`` is zero; reads a little first, then more."""
    pos, n = offset, 4096
    while pos < size:
        want = min(n, size - pos, len(_ZEROS))
        buf = os.pread(fd, want, pos)
        if not buf:
            return True
        if buf != _ZEROS[: len(buf)]:
            return False
        pos += len(buf)
        n *= 4
    return True


TailVerdict = Literal["end", "torn", "corrupt"]


def classify_tail(fd: int, bad_offset: int, file_size: int, salt: int, expected_seq: int | None = None) -> TailVerdict:
    """What a failed record at ``bad_offset`` of the last segment of a conversation is.

    ``"end"`` when every byte from it to the end of the file is zero: the
    clean end of the log, in preallocated space. Otherwise
    :func:`classify_failure` decides, with the data end (just after the last
    non-zero byte, see :func:`data_end`) in place of the file size.
    """
    end = data_end(fd, bad_offset, file_size)
    if end == bad_offset:
        return "end"
    return classify_failure(fd, bad_offset, end, salt, expected_seq)


def classify_failure(fd: int, bad_offset: int, file_size: int, salt: int, expected_seq: int | None = None) -> Verdict:
    """Decide whether a failed record at ``bad_offset`` of the last segment is a torn tail.

    It is damage to acknowledged data ("corrupt") when a valid record follows
    it in the file (unless the two were one unsynced write, see
    :func:`_torn_group_write`; that needs ``expected_seq``, the seq the failed
    record should start at), or when the file ends with an intact record
    trailer that belongs to the failed record (it was written whole, then
    damaged) and holds no run of zero bytes (see ``_ZERO_RUN``) and no zeroed
    first sector piece (see ``_SECTOR``). Otherwise it
    is a torn tail: a write that never completed, and so was never
    acknowledged.
    """
    nxt = find_next_record(fd, bad_offset, file_size, salt)
    if nxt is not None:
        group = expected_seq is not None and nxt[1].first_seq > expected_seq
        return "torn" if group and _torn_group_write(fd, bad_offset, nxt[0], file_size, salt) else "corrupt"
    if file_size - bad_offset >= frame.RECORD_OVERHEAD:
        _check, body_len, magic = frame.TRAILER.unpack(os.pread(fd, frame.TRAILER_SIZE, file_size - frame.TRAILER_SIZE))
        if magic == frame.TRAILER_MAGIC and file_size - frame.RECORD_OVERHEAD - body_len == bad_offset:
            written = os.pread(fd, file_size - frame.TRAILER_SIZE - bad_offset, bad_offset)
            if _ZERO_RUN not in written and any(written[: _SECTOR - bad_offset % _SECTOR]):
                return "corrupt"
    return "torn"


def _torn_group_write(fd: int, bad_offset: int, next_offset: int, end: int, salt: int) -> bool:
    """True when a failed record and the valid records after it can only be one write that was never synced.

    A group commit writes several batches' records with one ``write`` and
    acknowledges them after one sync. A power cut before that sync can keep
    the later sectors of the write and lose an earlier one (they reach the
    disk in any order); the lost sector reads as zeros. Valid records then
    follow a failed one, yet none of them was acknowledged: any sync after
    their write would have made the failed record's sectors durable too.

    So the failure counts as torn when the next valid record starts past the
    seq the failed one should hold (the caller checks), the failed bytes (up
    to it) carry the mark of a sector that never reached the disk (a run of
    zero bytes no record holds, or a zeroed first sector piece, see
    ``_ZERO_RUN`` and ``_SECTOR``), and every byte after them, up to ``end``,
    is whole valid records followed only by zeros: a clean tail, which is what
    the write left. Anything else after them is damage.
    """
    failed = os.pread(fd, next_offset - bad_offset, bad_offset)
    if _ZERO_RUN not in failed and any(failed[: _SECTOR - bad_offset % _SECTOR]):
        return False
    pos = next_offset
    try:
        for off, h, _body in iter_records(fd, next_offset, end, salt):
            pos = off + h.size
    except BadRecord as bad:
        pos = bad.offset
    return pos >= end or zero_from(fd, pos, end)


#: The unit a disk writes atomically. A record rarely starts on a sector boundary: its
#: first piece (up to the next boundary) may be a few bytes, too short for ``_ZERO_RUN``,
#: and when that sector never reached the disk those bytes read as zeros. They hold the
#: start of the record's checksum, so a record written whole has them all zero with
#: odds of 2**-8 per byte; such a record is taken for a torn tail.
_SECTOR = 512


#: A power cut can persist an unsynced record's sectors in any order (its trailer
#: but not its header, say); those that never reached the disk read as zeros. A
#: record written whole never holds this many zero bytes in a row (its body is
#: JSON text, with no NUL byte), and bit rot does not write them.
_ZERO_RUN = bytes(16)
