"""The site manifest's bytes: file names, the snapshot, the activity log's header and records.

Pure encoding and decoding, no I/O but reading a whole snapshot file; the
format's reference is FORMAT.md (the site manifest). A log record is
checksummed with the log's salt (:func:`encode_log_record`); a reader
resynchronises past damage on the next record magic and stops at a record
that runs past the end of what it read, which may still be being written
(:func:`iter_log_records`). An intent carries the commit owed for its
conversation's previous batch (:func:`carried_records`), so an append to the
conversation written last is one record.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from typing import Any

import msgspec
import xxhash

LOG_MAGIC = b"CVMMLOG\x01"
SNAP_MAGIC = b"CVMMSNP\x01"
LOG_HEADER = struct.Struct("<8sQQQ")  # magic, epoch, salt, xxh3(first 24 bytes)
SNAP_HEADER = struct.Struct("<8sQQQQQ")  # magic, epoch, complete, body_len, xxh3(body), xxh3(first 40)
REC_MAGIC = b"\xc7\x4d"
REC_HEADER = struct.Struct("<2sHIQ")  # magic, reserved, body_len, xxh3(body_len bytes + body, seed=salt)

INTENT, COMMIT, RESOLVE, BOOT, WALKED = 1, 2, 3, 4, 5

encoder = msgspec.msgpack.Encoder()
decoder = msgspec.msgpack.Decoder()


def epoch_files(site_dir: str) -> dict[int, set[str]]:
    out: dict[int, set[str]] = {}
    try:
        names = os.listdir(site_dir)
    except FileNotFoundError:
        return out
    for name in names:
        if name.startswith("manifest-") and name.endswith((".snap", ".log")):
            stem, _, kind = name.partition(".")
            digits = stem[len("manifest-") :]
            if digits.isdigit():
                out.setdefault(int(digits), set()).add(kind)
    return out


def snap_path(site_dir: str, epoch: int) -> str:
    return os.path.join(site_dir, f"manifest-{epoch:010d}.snap")


def log_path(site_dir: str, epoch: int) -> str:
    return os.path.join(site_dir, f"manifest-{epoch:010d}.log")


def encode_log_header(epoch: int, salt: int) -> bytes:
    head = struct.pack("<8sQQ", LOG_MAGIC, epoch, salt)
    return head + struct.pack("<Q", xxhash.xxh3_64_intdigest(head))


_U32 = struct.Struct("<I")
_xxh3 = xxhash.xxh3_64_intdigest


def encode_log_record(salt: int, body: bytes) -> bytes:
    n = len(body)
    return REC_HEADER.pack(REC_MAGIC, 0, n, _xxh3(_U32.pack(n) + body, salt)) + body


def iter_log_records(data: bytes, salt: int, start: int) -> Iterator[tuple[int, int, list[Any] | None]]:
    """Yield ``(offset, end, record)`` from ``start``; record None marks skipped damage.

    Stops (without yielding) at a record that runs past the end of ``data``:
    it may still be being written.
    """
    pos = start
    n = len(data)
    while pos < n:
        if pos + REC_HEADER.size > n:
            return
        magic, _, blen, check = REC_HEADER.unpack_from(data, pos)
        end = pos + REC_HEADER.size + blen
        if magic == REC_MAGIC and end > n and blen < 4096:
            return
        ok = magic == REC_MAGIC and end <= n and blen < 4096
        if ok:
            body = data[pos + REC_HEADER.size : end]
            ok = xxhash.xxh3_64_intdigest(data[pos + 4 : pos + 8] + body, salt) == check
        if ok:
            try:
                yield pos, end, decoder.decode(body)
            except msgspec.DecodeError:
                yield pos, end, None
            pos = end
            continue
        # Damage: resynchronise on the next record magic.
        nxt = data.find(REC_MAGIC, pos + 1)
        if nxt < 0:
            # Trailing garbage with no record after it: a torn write, or a write in flight.
            return
        yield pos, nxt, None
        pos = nxt


class Entry(msgspec.Struct, array_like=True):
    conversation_id: str
    created_us: int
    last_us: int
    next_seq: int
    pending: tuple[int, int, int] | None = None


def carried_records(owed: dict[str, list[Any]], record: list[Any] | None) -> list[list[Any]]:
    """The log records for the commits ``owed`` and then ``record``.

    An intent whose conversation has a commit owed carries it (FORMAT.md 5:
    ``[1, conversation_id, created_us, last_us, next_seq, committed created_us,
    last_us, next_seq]``), so an append to the conversation it wrote last is
    one record.
    """
    carried = record[1] if record is not None and record[0] == INTENT and record[1] in owed else None
    out = [rec for conv, rec in owed.items() if conv != carried]
    if record is not None:
        out.append(record if carried is None else [*record, *owed[carried][2:5]])
    return out


class Damaged(Exception):
    pass


def new_salt() -> int:
    return int.from_bytes(os.urandom(8), "little") | 1


def read_or_damaged(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        raise Damaged() from None


def decode_snapshot(data: bytes, epoch: int) -> tuple[list[Entry], bool]:
    if len(data) < SNAP_HEADER.size:
        raise Damaged()
    magic, e, complete, blen, bcheck, hcheck = SNAP_HEADER.unpack_from(data)
    if magic != SNAP_MAGIC or e != epoch or xxhash.xxh3_64_intdigest(data[:40]) != hcheck:
        raise Damaged()
    body = data[SNAP_HEADER.size : SNAP_HEADER.size + blen]
    if len(body) != blen or xxhash.xxh3_64_intdigest(body) != bcheck:
        raise Damaged()
    try:
        entries = msgspec.msgpack.decode(body, type=list[Entry])
    except msgspec.DecodeError:
        raise Damaged() from None
    return entries, bool(complete)
