"""Byte layout of segment files: the file header and the framed records.

See FORMAT.md for the prose version. All integers are little-endian.

Segment header (40 bytes)::

    0   8  magic  b"CVMSEG\\x00\\x01"
    8   4  u32    format version (1)
    12  4  u32    header length (40)
    16  8  u64    base seq (seq of the first item the segment holds)
    24  8  u64    salt (random per segment; seeds every record checksum)
    32  8  u64    xxh3_64 of bytes 0..32, seed 0

Record (32-byte header, body, 16-byte trailer)::

    0   8  u64    checksum: xxh3_64 of bytes 8..32+body_len, seed = salt
    8   4  u32    body_len
    12  2  u16    count (items in the batch, seqs a loss record stands for; 0 for a seal)
    14  2  u16    kind (1 batch, 2 seal, 3 loss, 4 keyed batch, 5 identity)
    16  8  u64    first_seq
    24  8  i64    recorded_at, microseconds since the Unix epoch, UTC
    32  n  body   a batch: the items as one compact JSON array; a seal: empty;
                  a keyed batch: u8 key length k, k bytes of idempotency key, the JSON array;
                  an identity: the conversation id (ASCII), count 0, no seqs
    32+n 8 u64    checksum again
    40+n 4 u32    body_len again
    44+n 4 bytes  b"CVMT"

The checksum covers the length and header fields, and is seeded with the
segment's salt, so zeros, stale bytes and records copied from another segment
never validate. The trailer lets recovery tell a record that was written whole
and later damaged (trailer intact at the end of the file) from a torn write.
"""

from __future__ import annotations

import os
import re
import struct
from typing import NamedTuple

import xxhash

from .limits import MAX_BATCH_BYTES, MAX_BATCH_ITEMS, MAX_ID_LENGTH, MIN_ID_LENGTH

SEGMENT_MAGIC = b"CVMSEG\x00\x01"
FORMAT_VERSION = 1
SEGMENT_HEADER = struct.Struct("<8sIIQQQ")
SEGMENT_HEADER_SIZE = SEGMENT_HEADER.size  # 40

RECORD_HEADER = struct.Struct("<QIHHQq")
RECORD_HEADER_SIZE = RECORD_HEADER.size  # 32
TRAILER = struct.Struct("<QI4s")
TRAILER_SIZE = TRAILER.size  # 16
TRAILER_MAGIC = b"CVMT"
RECORD_OVERHEAD = RECORD_HEADER_SIZE + TRAILER_SIZE

KIND_BATCH = 1
KIND_SEAL = 2
#: A record written by an operator repair in place of a damaged record: it
#: keeps the damaged record's seq range and says those items were lost.
KIND_LOSS = 3

#: A batch record carrying its append's idempotency key (FORMAT.md 3, "Keyed batch"):
#: its body is ``u8 k | k bytes of key | the items' JSON array``.
KIND_KEYED = 4
#: The kinds whose records hold items (a batch, with or without its key).
ITEM_KINDS = (KIND_BATCH, KIND_KEYED)
#: The conversation's identity (FORMAT.md 3, "Identity"): written by a first append that claimed
#: a pool entry, at offset 40 of the first segment, in the write (and sync) of its first batch.
#: It holds no seqs (count 0, first seq the segment's base) and no items; readers skip it.
KIND_IDENTITY = 5
#: The kinds whose records stand for seqs (items, or items lost).
SEQ_KINDS = (KIND_BATCH, KIND_KEYED, KIND_LOSS)
#: The longest idempotency key (bytes of ``[A-Za-z0-9_-]``).
MAX_KEY_LEN = 128

#: A loss record stands for at most this many seqs (the u16 count field).
MAX_LOSS_COUNT = 65535
#: Largest body of a loss record (a small JSON object describing the loss).
MAX_LOSS_BODY = 4096

#: Largest body a valid record can have: a full batch as one JSON array, its items
#: (at most MAX_BATCH_BYTES in all) joined by MAX_BATCH_ITEMS - 1 commas inside two
#: brackets (FORMAT.md, section 3: 1,048,827).
MAX_BODY = MAX_BATCH_BYTES + (MAX_BATCH_ITEMS - 1) + 2
#: Largest body of a keyed batch record: its key's length byte and key, then a batch body.
MAX_KEYED_BODY = MAX_BODY + 1 + MAX_KEY_LEN
#: Smallest body of a keyed batch record: a one-byte key and ``[]``'s two bytes.
MIN_KEYED_BODY = 1 + 1 + 2

_xxh3 = xxhash.xxh3_64_intdigest
_KEY_BYTES = re.compile(rb"[A-Za-z0-9_-]+")
_ID_BYTES = re.compile(rb"[A-Za-z0-9_-]{%d,%d}" % (MIN_ID_LENGTH, MAX_ID_LENGTH))
#: The record checksum function (public for the scan loop in segment.py).
xxh3_64 = _xxh3


class SegmentHeader(NamedTuple):
    base_seq: int
    salt: int


class RecordHeader(NamedTuple):
    checksum: int
    body_len: int
    # The on-disk field's name (FORMAT.md); it shadows tuple.count, which no caller uses.
    count: int  # type: ignore[assignment]
    kind: int
    first_seq: int
    recorded_at_us: int

    @property
    def size(self) -> int:
        """Total bytes the record occupies on disk."""
        return RECORD_OVERHEAD + self.body_len

    @property
    def end_seq(self) -> int:
        """One past the last seq in the record."""
        return self.first_seq + self.count


#: Bounds of an identity record's body: a conversation id.
MIN_IDENTITY_BODY, MAX_IDENTITY_BODY = MIN_ID_LENGTH, MAX_ID_LENGTH


def new_salt() -> int:
    """A random, non-zero 64-bit salt."""
    while True:
        salt = int.from_bytes(os.urandom(8), "little")
        if salt:
            return salt


def encode_segment_header(base_seq: int, salt: int) -> bytes:
    head = SEGMENT_HEADER.pack(SEGMENT_MAGIC, FORMAT_VERSION, SEGMENT_HEADER_SIZE, base_seq, salt, 0)[:32]
    return head + _xxh3(head).to_bytes(8, "little")


def decode_segment_header(data: bytes) -> SegmentHeader | None:
    """The header's fields, or None when the bytes are not a valid header."""
    if len(data) < SEGMENT_HEADER_SIZE:
        return None
    magic, version, hlen, base, salt, check = SEGMENT_HEADER.unpack_from(data)
    if magic != SEGMENT_MAGIC or version != FORMAT_VERSION or hlen != SEGMENT_HEADER_SIZE:
        return None
    if _xxh3(bytes(data[:32])) != check:
        return None
    return SegmentHeader(base, salt)


def encode_record(salt: int, kind: int, first_seq: int, count: int, recorded_at_us: int, body: bytes) -> bytes:
    """Frame one record (header, body, trailer) ready to be written."""
    n = len(body)
    buf = bytearray(RECORD_OVERHEAD + n)
    RECORD_HEADER.pack_into(buf, 0, 0, n, count, kind, first_seq, recorded_at_us)
    buf[RECORD_HEADER_SIZE : RECORD_HEADER_SIZE + n] = body
    checksum = _xxh3(memoryview(buf)[8 : RECORD_HEADER_SIZE + n], salt)
    struct.pack_into("<Q", buf, 0, checksum)
    TRAILER.pack_into(buf, RECORD_HEADER_SIZE + n, checksum, n, TRAILER_MAGIC)
    return bytes(buf)


def decode_record_header(data: bytes | memoryview, pos: int = 0) -> RecordHeader:
    """Unpack a record header (no validation; see :func:`plausible`)."""
    return RecordHeader(*RECORD_HEADER.unpack_from(data, pos))


def plausible(h: RecordHeader) -> bool:
    """Cheap sanity check of header fields before trusting body_len."""
    if h.kind == KIND_BATCH:
        return 1 <= h.count <= MAX_BATCH_ITEMS and 2 <= h.body_len <= MAX_BODY
    if h.kind == KIND_SEAL:
        return h.count == 0 and h.body_len == 0
    if h.kind == KIND_LOSS:
        return 1 <= h.count <= MAX_LOSS_COUNT and 2 <= h.body_len <= MAX_LOSS_BODY
    if h.kind == KIND_KEYED:
        return 1 <= h.count <= MAX_BATCH_ITEMS and MIN_KEYED_BODY <= h.body_len <= MAX_KEYED_BODY
    if h.kind == KIND_IDENTITY:
        return h.count == 0 and MIN_IDENTITY_BODY <= h.body_len <= MAX_IDENTITY_BODY
    return False


def encode_identity(salt: int, recorded_at_us: int, conversation_id: str) -> bytes:
    """The identity record of a claimed pool entry's first segment (base seq 0), stamped like its first batch."""
    return encode_record(salt, KIND_IDENTITY, 0, 0, recorded_at_us, conversation_id.encode("ascii"))


def identity_of(body: bytes | memoryview) -> str | None:
    """The conversation id an identity record's body names, or None when it is not a valid id."""
    raw = bytes(body)
    return raw.decode("ascii") if _ID_BYTES.fullmatch(raw) else None


def keyed_body(key: bytes, items: bytes) -> bytes:
    """The body of a keyed batch record: the key's length, the key, the items' JSON array."""
    return bytes((len(key),)) + key + items


def items_body(kind: int, body: bytes | memoryview) -> bytes | memoryview:
    """The items' JSON array of a batch record's body (a keyed batch's without its key).

    A keyed body whose length byte points past its end yields an empty
    slice, which every batch check then reports as a bad body.
    """
    if kind != KIND_KEYED:
        return body
    k = body[0] if len(body) else 0
    return body[1 + k :] if 1 <= k <= MAX_KEY_LEN and 1 + k < len(body) else body[:0]


def record_key(kind: int, body: bytes | memoryview) -> str | None:
    """The idempotency key a batch record carries, or None (a plain batch, or a malformed key)."""
    if kind != KIND_KEYED or not len(body):
        return None
    k = body[0]
    if not 1 <= k <= MAX_KEY_LEN or 1 + k >= len(body):
        return None
    raw = bytes(body[1 : 1 + k])
    return raw.decode("ascii") if _KEY_BYTES.fullmatch(raw) else None


def checksum_ok(data: bytes | memoryview, pos: int, h: RecordHeader, salt: int) -> bool:
    """True when the record at ``pos`` of ``data`` (whole record present) validates."""
    end = pos + RECORD_HEADER_SIZE + h.body_len
    return _xxh3(memoryview(data)[pos + 8 : end], salt) == h.checksum


def trailer_at_end(data: bytes | memoryview, end: int) -> tuple[int, int] | None:
    """If bytes ``end-16 .. end`` are a record trailer, return (record_start, body_len)."""
    if end < TRAILER_SIZE:
        return None
    _check, body_len, magic = TRAILER.unpack_from(data, end - TRAILER_SIZE)
    if magic != TRAILER_MAGIC:
        return None
    start = end - RECORD_OVERHEAD - body_len
    return (start, body_len) if start >= 0 else None
