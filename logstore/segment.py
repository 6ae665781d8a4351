"""Reading and verifying the records of one segment file.

:func:`iter_records` walks records between two offsets and verifies each
(plausible header, whole record present, checksum). The first record that
fails raises :class:`BadRecord`; what that means (a torn tail to cut away, or
damage to acknowledged data) is decided by :func:`classify_failure`, which
encodes the recovery rule of FORMAT.md.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Literal

from . import frame
from .frame import RECORD_HEADER_SIZE, RecordHeader

#: Bytes read ahead in one pread while walking records.
CHUNK = 256 * 1024


class BadRecord(Exception):
    """The record at ``offset`` failed verification."""

    def __init__(self, offset: int, why: str) -> None:
        super().__init__(f"bad record at byte offset {offset}: {why}")
        self.offset = offset
        self.why = why


def iter_records(fd: int, start: int, end: int, salt: int) -> Iterator[tuple[int, RecordHeader, memoryview]]:
    """Yield ``(offset, header, body)`` for each valid record in ``[start, end)``.

    Raises :class:`BadRecord` at the first record that is not whole and valid.
    Bodies are views into a read buffer; copy or decode before the next step.
    """
    # The hot loop of every read: header fields, plausibility and checksum are
    # inlined (same checks and messages as frame.plausible / checksum_ok).
    unpack = frame.RECORD_HEADER.unpack_from
    make = RecordHeader._make
    xxh3 = frame.xxh3_64
    max_body = frame.MAX_BODY
    max_count = frame.MAX_BATCH_ITEMS
    pos = start
    buf: bytes = b""
    view = memoryview(buf)
    buf_off = start
    while pos < end:
        if pos + RECORD_HEADER_SIZE > end:
            raise BadRecord(pos, "incomplete record header")
        if pos + RECORD_HEADER_SIZE > buf_off + len(buf):
            buf = os.pread(fd, min(max(CHUNK, RECORD_HEADER_SIZE), end - pos), pos)
            view = memoryview(buf)
            buf_off = pos
            if len(buf) < RECORD_HEADER_SIZE:
                raise BadRecord(pos, "file ends inside the record header")
        fields = unpack(buf, pos - buf_off)
        checksum, body_len, count, kind = fields[0], fields[1], fields[2], fields[3]
        if kind == frame.KIND_BATCH:
            ok = 1 <= count <= max_count and 2 <= body_len <= max_body
        else:
            ok = kind == frame.KIND_SEAL and count == 0 and body_len == 0
        if not ok:
            raise BadRecord(pos, "record header fields are out of range")
        rend = pos + frame.RECORD_OVERHEAD + body_len
        if rend > end:
            raise BadRecord(pos, f"record length {body_len} runs past the end of the data")
        if rend > buf_off + len(buf):
            buf = os.pread(fd, max(CHUNK, rend - pos), pos)
            view = memoryview(buf)
            buf_off = pos
            if len(buf) < rend - pos:
                raise BadRecord(pos, "file ends inside the record")
        rel = pos - buf_off
        body_at = rel + RECORD_HEADER_SIZE
        if xxh3(view[rel + 8 : body_at + body_len], salt) != checksum:
            raise BadRecord(pos, "checksum mismatch")
        yield pos, make(fields), view[body_at : body_at + body_len]
        pos = rend


def _valid_record_at(data: bytes, pos: int, salt: int) -> bool:
    if pos < 0 or pos + frame.RECORD_OVERHEAD > len(data):
        return False
    h = frame.decode_record_header(data, pos)
    if not frame.plausible(h) or pos + h.size > len(data):
        return False
    return frame.checksum_ok(data, pos, h, salt)


Verdict = Literal["torn", "corrupt"]


def classify_failure(fd: int, bad_offset: int, file_size: int, salt: int) -> Verdict:
    """Decide whether a failed record at ``bad_offset`` of the last segment is a torn tail.

    It is damage to acknowledged data ("corrupt") when a valid record follows
    it anywhere in the file, or when the file ends with an intact record
    trailer that belongs to the failed record (it was written whole, then
    damaged) and holds no run of zero bytes (see ``_ZERO_RUN``). Otherwise it
    is a torn tail: a write that never completed, and so was never
    acknowledged.
    """
    data = os.pread(fd, file_size - bad_offset, bad_offset)
    # A valid record after the bad one: every record ends with the trailer magic.
    probe = 1
    while True:
        m = data.find(frame.TRAILER_MAGIC, probe)
        if m < 0:
            break
        found = frame.trailer_at_end(data, m + len(frame.TRAILER_MAGIC))
        if found is not None and found[0] > 0 and _valid_record_at(data, found[0], salt):
            return "corrupt"
        probe = m + 1
    tail = frame.trailer_at_end(data, len(data))
    if tail is not None and tail[0] == 0 and _ZERO_RUN not in data[: len(data) - frame.TRAILER_SIZE]:
        return "corrupt"
    return "torn"


#: A power cut can persist an unsynced record's sectors in any order (its trailer
#: but not its header, say); those that never reached the disk read as zeros. A
#: record written whole never holds this many zero bytes in a row (its body is
#: JSON text, with no NUL byte), and bit rot does not write them.
_ZERO_RUN = bytes(16)
