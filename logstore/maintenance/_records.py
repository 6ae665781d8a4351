"""What dump and fsck read of a segment: ``scan_segment``, ``build_index``, ``scan_index``.

Records are walked with :func:`logstore.segment.walk`, the walker the engine
reads with, so the tools resynchronise after damage exactly where the engine
does (FORMAT.md section 3: the next plausible header whose checksum matches).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import msgspec

from .. import frame, index
from ..frame import ITEM_KINDS, KIND_BATCH, KIND_IDENTITY, KIND_KEYED, KIND_LOSS, KIND_SEAL, SEGMENT_HEADER_SIZE
from ..segment import Gap, data_end, walk
from ._files import (
    _open_ro,
)
from ._types import (
    INDEX_INTERVAL,
)


class _AnyObject(msgspec.Struct):
    """Decodes any JSON object without building it (validation only)."""


_BATCH_CHECK = msgspec.json.Decoder(type=list[_AnyObject])


_BATCH_RAW = msgspec.json.Decoder(type=list[msgspec.Raw])


def _batch_problem(body: memoryview, count: int, kind: int = KIND_BATCH) -> str | None:
    """Why a checksummed batch body is not a JSON array of ``count`` objects (after a valid key), or None."""
    if kind == KIND_KEYED and frame.record_key(kind, body) is None:
        return "keyed batch body does not start with a valid idempotency key"
    try:
        items = _BATCH_CHECK.decode(frame.items_body(kind, body))
    except msgspec.DecodeError as exc:
        return f"batch body is not a JSON array of objects: {exc}"
    if len(items) != count:
        return f"batch holds {len(items)} items, its header says {count}"
    return None


@dataclass(frozen=True)
class RecordInfo:
    """One record of a segment as :func:`scan_segment` sees it.

    ``kind`` is ``"batch"``, ``"seal"``, ``"loss"`` (a record a repair wrote in
    place of damaged data; it keeps the seqs, not the items), ``"identity"`` (the
    conversation a claimed pool entry's first segment names) or ``"damaged"``; ``verdict`` is
    ``"ok"`` or why the record failed. For a damaged record ``size`` is the
    span up to the next valid record (or the end of the file) and the header
    fields are given when they were plausible. ``payloads`` holds the items'
    stored JSON bytes, for valid batches.
    """

    offset: int
    size: int
    kind: str
    verdict: str
    first_seq: int | None
    count: int | None
    recorded_at_us: int | None
    checksum: int | None
    payloads: tuple[bytes, ...] = ()
    #: For an identity record, the conversation it names.
    conversation_id: str | None = None


@dataclass(frozen=True)
class SegmentInfo:
    """A segment file's header, as :func:`scan_segment` reads it."""

    path: str
    size: int
    header_ok: bool
    base_seq: int | None
    salt: int | None
    #: Where the records end: just after the last non-zero byte. The bytes from
    #: there to ``size`` are zero, preallocated space of an active segment (FORMAT.md).
    data_end: int = 0


def scan_segment(path: str | os.PathLike[str], *, payloads: bool = True) -> tuple[SegmentInfo, list[RecordInfo]]:
    """Read every record of one segment file, verifying each (no locks; read-only).

    A segment whose header is invalid yields one damaged span covering the
    file. Zero bytes at the end of the file (preallocated space) are not
    records: they are left out, and ``SegmentInfo.data_end`` says where they
    start. Raises OSError when the file cannot be read.
    """
    path = os.fspath(path)
    with _open_ro(path) as fd:
        size = os.fstat(fd).st_size
        header = frame.decode_segment_header(os.pread(fd, SEGMENT_HEADER_SIZE, 0))
        if header is None:
            info = SegmentInfo(path, size, False, None, None, size)
            why = "segment header is missing or invalid"
            if not any(os.pread(fd, 512, 0)):
                why += (
                    " (its first sector is all zeros: for a conversation's only segment, base seq 0, a creation "
                    "a power cut interrupted, which never held an acknowledged item)"
                )
            damaged = RecordInfo(0, size, "damaged", why, None, None, None, None)
            return info, [damaged]
        end = data_end(fd, SEGMENT_HEADER_SIZE, size)
        info = SegmentInfo(path, size, True, header.base_seq, header.salt, end)
        out: list[RecordInfo] = []
        for rec in walk(fd, SEGMENT_HEADER_SIZE, end, header.salt):
            if isinstance(rec, Gap):
                stop = rec.resume[0] if rec.resume is not None else end
                h = rec.header
                out.append(
                    RecordInfo(
                        rec.offset,
                        stop - rec.offset,
                        "damaged",
                        rec.why,
                        h.first_seq if h else None,
                        h.count if h else None,
                        h.recorded_at_us if h else None,
                        h.checksum if h else None,
                    )
                )
                continue
            offset, h, body = rec
            items: tuple[bytes, ...] = ()
            verdict = "ok"
            ident: str | None = None
            if h.kind in ITEM_KINDS:
                verdict = _batch_problem(body, h.count, h.kind) or "ok"
                if payloads and verdict == "ok":
                    items = tuple(bytes(r) for r in _BATCH_RAW.decode(frame.items_body(h.kind, body)))
            elif h.kind == KIND_IDENTITY:
                # The conversation a claimed pool entry's first segment names (FORMAT.md 3, "Identity").
                ident = frame.identity_of(body)
                verdict = "ok" if ident is not None else "identity is not a valid conversation id"
                if header.base_seq != 0 or offset != SEGMENT_HEADER_SIZE:
                    verdict = "an identity record belongs only at the start of the first segment (reads fail on it)"
            kind = {KIND_BATCH: "batch", KIND_KEYED: "batch", KIND_SEAL: "seal", KIND_LOSS: "loss",
                    KIND_IDENTITY: "identity"}[h.kind]
            out.append(
                RecordInfo(
                    offset, h.size, kind, verdict, h.first_seq, h.count, h.recorded_at_us, h.checksum, items, ident
                )
            )
        return info, out


def build_index(fd: int, base_seq: int, salt: int, size: int, interval: int = INDEX_INTERVAL) -> index.SparseIndex:
    """The sparse index of a segment as the engine builds it, up to its first bad record."""
    idx = index.SparseIndex(base_seq, salt)
    last = 0
    for rec in walk(fd, SEGMENT_HEADER_SIZE, size, salt):
        if isinstance(rec, Gap):
            break
        offset, h, _body = rec
        if h.kind in ITEM_KINDS and offset - last >= interval and offset > SEGMENT_HEADER_SIZE:
            idx.add(h.first_seq, offset)
            last = offset
    return idx


@dataclass(frozen=True)
class IndexEntryInfo:
    """One entry of an index file and whether the segment beside it agrees."""

    position: int  # byte offset of the entry in the index file
    seq: int
    segment_offset: int
    #: ``"ok"``, why the entry is wrong, or ``"not checked"`` when the segment could not be read.
    verdict: str


@dataclass(frozen=True)
class IndexInfo:
    """An index file (``<base-seq>.idx``) as :func:`scan_index` reads it."""

    path: str
    size: int
    #: Why the header is unusable, or None when it is well-formed.
    header_problem: str | None
    base_seq: int | None
    salt: int | None
    entries: list[IndexEntryInfo]
    #: Bytes after the last whole entry (a write cut short).
    trailing_bytes: int
    #: The segment the entries were checked against (None when there is none beside it).
    segment: str | None
    #: Why the segment does not match the index as a whole (wrong salt or base seq), or None.
    segment_problem: str | None


def scan_index(path: str | os.PathLike[str]) -> IndexInfo:
    """Read an index file and check each entry against the segment of the same name beside it.

    An entry is ``ok`` when its segment offset starts a valid batch record
    holding that seq. Raises OSError when the index file cannot be read.
    """
    path = os.fspath(path)
    with open(path, "rb") as f:
        data = f.read()
    size = len(data)
    if size < index.INDEX_HEADER_SIZE:
        return IndexInfo(path, size, "the header is truncated", None, None, [], size, None, None)
    magic, version, _r, base, salt = index.INDEX_HEADER.unpack_from(data)
    if magic != index.INDEX_MAGIC or version != 1:
        return IndexInfo(path, size, "not an index file (wrong magic or version)", None, None, [], 0, None, None)
    seg_path = path[: -len(".idx")] + ".seg" if path.endswith(".idx") else None
    seg_problem: str | None = None
    fd: int | None = None
    seg_size = 0
    if seg_path is not None:
        try:
            fd = os.open(seg_path, os.O_RDONLY)
        except FileNotFoundError:
            seg_path, seg_problem = None, "no segment of the same name beside it"
    try:
        if fd is not None:
            seg_size = os.fstat(fd).st_size
            header = frame.decode_segment_header(os.pread(fd, SEGMENT_HEADER_SIZE, 0))
            if header is None:
                seg_problem = "the segment's header is invalid"
            elif header.base_seq != base or header.salt != salt:
                seg_problem = "the index belongs to another segment (its base seq or salt differs)"
        whole = size - (size - index.INDEX_HEADER_SIZE) % index.ENTRY_SIZE
        entries: list[IndexEntryInfo] = []
        prev_seq, prev_off = -1, 0
        for n, (rel, off) in enumerate(index.ENTRY.iter_unpack(data[index.INDEX_HEADER_SIZE : whole])):
            seq = base + rel
            at = index.INDEX_HEADER_SIZE + n * index.ENTRY_SIZE
            if seq <= prev_seq or off <= prev_off:
                verdict = "out of order"
            elif fd is None or seg_problem is not None:
                verdict = "not checked"
            elif off >= seg_size:
                verdict = "past the segment's end"
            else:
                stop = min(seg_size, off + frame.RECORD_OVERHEAD + frame.MAX_KEYED_BODY)
                rec = next(walk(fd, off, stop, salt), None)
                if rec is None or isinstance(rec, Gap) or rec[0] != off:
                    verdict = "does not point at a valid record"
                elif rec[1].kind not in ITEM_KINDS or rec[1].first_seq != seq:
                    verdict = f"points at a record starting at seq {rec[1].first_seq}"
                else:
                    verdict = "ok"
            entries.append(IndexEntryInfo(at, seq, off, verdict))
            prev_seq, prev_off = max(prev_seq, seq), max(prev_off, off)
    finally:
        if fd is not None:
            os.close(fd)
    return IndexInfo(path, size, None, base, salt, entries, size - whole, seg_path, seg_problem)
