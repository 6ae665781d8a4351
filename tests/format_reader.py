"""A reader of segment files written from logstore/FORMAT.md alone (sections 2 and 3).

It imports nothing from convmem: its bounds are read from FORMAT.md's own
validity rule, so a test that runs it on the engine's files checks that the
document describes what the engine writes. It walks records forward and, at
a record that is not valid, resynchronises on the first later offset whose
header is plausible and whose checksum (seeded with the segment's salt)
matches, as section 3 says; the trailer is never needed.
"""

from __future__ import annotations

import json
import re
import struct
from dataclasses import dataclass
from pathlib import Path

import xxhash

FORMAT_MD = Path(__file__).resolve().parent.parent / "logstore" / "FORMAT.md"

_HEADER = struct.Struct("<8sIIQQQ")
_RECORD = struct.Struct("<QIHHQq")
_OVERHEAD = 48


@dataclass(frozen=True)
class Bounds:
    """The record-validity rule of FORMAT.md section 3, as numbers."""

    max_batch_count: int
    max_batch_body: int
    max_loss_body: int
    identity_body: tuple[int, int] = (8, 64)


def doc_bounds(text: str | None = None) -> Bounds:
    """Parse the validity rule ("A record is **valid** when: ...") out of FORMAT.md."""
    text = FORMAT_MD.read_text() if text is None else text
    rule = text.split("A record is **valid** when:", 1)[1].split("\n\n", 1)[0]
    rule = " ".join(rule.split())

    def number(pattern: str) -> int:
        found = re.search(pattern, rule)
        assert found is not None, f"FORMAT.md's validity rule no longer says {pattern!r}: {rule}"
        return int(found.group(1).replace(",", ""))

    return Bounds(
        max_batch_count=number(r"kind is 1 with 1 <= count <= ([\d,]+)"),
        max_batch_body=number(r"kind is 1 with 1 <= count <= [\d,]+ and 2 <= n <= ([\d,]+)"),
        max_loss_body=number(r"kind is 3 with count >= 1 and 2 <= n <= ([\d,]+)"),
        identity_body=(
            number(r"kind is 5 with count = 0 and (\d+) <= n"),
            number(r"kind is 5 with count = 0 and \d+ <= n <= (\d+)"),
        ),
    )


@dataclass(frozen=True)
class Record:
    """One valid record: where it starts and what it holds."""

    offset: int
    kind: int
    first_seq: int
    count: int
    body: bytes


@dataclass(frozen=True)
class Damage:
    """A stretch of bytes that holds no valid record, and where valid data resumes (None: nowhere)."""

    offset: int
    resume: int | None


def _plausible(bounds: Bounds, count: int, kind: int, n: int) -> bool:
    if kind == 1:
        return 1 <= count <= bounds.max_batch_count and 2 <= n <= bounds.max_batch_body
    if kind == 2:
        return count == 0 and n == 0
    if kind == 3:
        return count >= 1 and 2 <= n <= bounds.max_loss_body
    if kind == 5:
        return count == 0 and bounds.identity_body[0] <= n <= bounds.identity_body[1]
    return False


def _valid_at(data: bytes, pos: int, salt: int, bounds: Bounds) -> tuple[int, int, int, int] | None:
    """``(n, count, kind, first_seq)`` when a record starting at ``pos`` is whole and its checksum matches."""
    if pos + 32 > len(data):
        return None
    checksum, n, count, kind, first, _at = _RECORD.unpack_from(data, pos)
    if not _plausible(bounds, count, kind, n) or pos + _OVERHEAD + n > len(data):
        return None
    if xxhash.xxh3_64_intdigest(data[pos + 8 : pos + 32 + n], salt) != checksum:
        return None
    return n, count, kind, first


def read_segment(path: str | Path, bounds: Bounds | None = None) -> tuple[int, list[Record | Damage]]:
    """``(base_seq, records and damaged stretches in file order)`` of one segment file.

    Trailing zeros (preallocated space, section 2) end the walk. Raises
    ValueError when the 40-byte header is not valid.
    """
    bounds = doc_bounds() if bounds is None else bounds
    data = Path(path).read_bytes()
    magic, version, hlen, base, salt, check = _HEADER.unpack_from(data)
    if magic != b"CVMSEG\x00\x01" or version != 1 or hlen != 40 or xxhash.xxh3_64_intdigest(data[:32]) != check:
        raise ValueError(f"{path}: not a valid segment header")
    end = max(len(data.rstrip(b"\x00")), 40)
    data = data[:end]
    out: list[Record | Damage] = []
    pos = 40
    while pos < end:
        found = _valid_at(data, pos, salt, bounds)
        if found is not None:
            n, count, kind, first = found
            out.append(Record(pos, kind, first, count, data[pos + 32 : pos + 32 + n]))
            pos += _OVERHEAD + n
            continue
        resume = next((q for q in range(pos + 1, end - _OVERHEAD + 1) if _valid_at(data, q, salt, bounds)), None)
        out.append(Damage(pos, resume))
        if resume is None:
            break
        pos = resume
    return base, out


def batch_items(record: Record) -> list[object]:
    """The items of a batch record, decoded as section 3 says (one compact JSON array)."""
    items = json.loads(record.body)
    assert isinstance(items, list) and len(items) == record.count
    return items


def entry_conversation(segment: str | Path) -> str | None:
    """The conversation a pool entry's first segment names (section 6, "A first append in one sync"), or None."""
    try:
        base, records = read_segment(segment)
    except ValueError:
        return None
    first = records[0] if records else None
    if base != 0 or not isinstance(first, Record) or first.offset != 40 or first.kind != 5 or first.first_seq != 0:
        return None
    ident = first.body.decode("ascii", "replace")
    return ident if re.fullmatch(r"[A-Za-z0-9_-]{8,64}", ident) else None
