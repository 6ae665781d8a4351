"""``salvage``: replace each damaged record of a conversation by a loss record that keeps its seqs.

The repair behind ``convmem fsck --repair`` for damage to acknowledged data.
Unlike ``truncate_at_corruption`` it keeps every intact record, and every
seq: the damaged stretch becomes one loss record (FORMAT.md, kind 3) carrying
the stretch's exact seq range, so the records after it keep their seqs and a
read of the lost range answers ``ItemsLost`` instead of ``Corrupted``.

A stretch is replaced only when its seq range is established by verified
data: it starts where the intact record before it ends (or at the segment's
base seq), and ends where the next intact record starts, or at the next
segment's base seq for a sealed segment. A batch record whose checksum holds
but whose body is not a JSON array of ``count`` objects is replaced too (its
checksummed header gives its seqs). The one case with no verified end is a
damaged last record of the active segment: its own header gives the range
only when its fields are plausible, its first seq follows on, its length
agrees with the trailer copy and the file's end, and its body, if it still
decodes, holds that many items; otherwise it is refused.
A damaged segment header, seqs out of order and a torn tail are left to
``check`` (``--truncate-at-corruption`` or ``--repair``).

Every segment rewritten is first copied to ``DATA/quarantine/`` with a
``lost.json`` naming each loss; the new segment keeps the header and salt,
is written to ``<name>.tmp``, synced, renamed over the old one and its
directory synced, all under the conversation's exclusive lock. The old file
is then truncated to nothing, so an engine that still has it open sees it
change and reloads. The segment's old index is unlinked and the directory
synced before the rename, and is then written again for the new offsets.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass, field

import msgspec

from .. import fileio, frame, index, layout
from ..frame import ITEM_KINDS, KIND_LOSS, KIND_SEAL, SEGMENT_HEADER_SIZE, RecordHeader
from ..ids import ConversationId, SiteName
from ..segment import Gap, classify_failure, data_end, walk
from ..timefmt import format_us
from ._files import _flocked, _open_ro, _pread_range, _require_data_dir
from ._records import _batch_problem
from ._types import INDEX_INTERVAL, QUARANTINE_DIR, MaintenanceError


@dataclass(frozen=True)
class SalvagedRecord:
    """A damaged stretch replaced by a loss record.

    ``file`` is the segment, ``offset`` where the stretch began (and where the
    loss record now starts), ``size`` how many bytes it spanned; seqs
    ``first_seq..last_seq`` now read as lost (an empty range, ``last_seq`` =
    ``first_seq - 1``, when only a seal was damaged and has been rewritten).
    ``quarantine`` is the directory holding the original segment, relative to
    the data directory.
    """

    file: str
    offset: int
    size: int
    first_seq: int
    last_seq: int
    why: str
    quarantine: str


@dataclass(frozen=True)
class SalvageRefused:
    """Damage that ``salvage`` left in place, and why."""

    file: str
    offset: int
    why: str


@dataclass
class SalvageReport:
    """What :func:`salvage` did to one conversation."""

    salvaged: list[SalvagedRecord] = field(default_factory=list)
    refused: list[SalvageRefused] = field(default_factory=list)


@dataclass
class _Stretch:
    offset: int
    end: int  # byte offset where the stretch ends (the next intact record, or the file's end)
    first_seq: int
    end_seq: int
    recorded_at_us: int
    why: str


_LOSS_BODY = msgspec.json.Encoder()


def salvage(
    data_dir: str | os.PathLike[str], site: str, conversation_id: str, *, lock_timeout: float = 30.0
) -> SalvageReport:
    """Replace every damaged record of one conversation whose seqs are known by a loss record.

    Raises :class:`MaintenanceError` for a directory that is not a data
    directory or a conversation that does not exist; :class:`~logstore.Timeout`
    when the conversation stays locked past ``lock_timeout``.
    """
    root = os.path.abspath(os.fspath(data_dir))
    _require_data_dir(root)
    try:
        conv_dir = layout.conversation_dir(root, SiteName(site), ConversationId(conversation_id))
    except Exception as exc:
        raise MaintenanceError(f"{site!r}/{conversation_id!r} is not a valid site and conversation id: {exc}") from exc
    if not os.path.isdir(conv_dir):
        raise MaintenanceError(f"conversation {conversation_id!r} does not exist in site {site!r}")
    report = SalvageReport()
    with _flocked(os.path.join(conv_dir, layout.LOCK_FILE), True, lock_timeout, create=True):
        bases = sorted(b for b in map(layout.parse_segment_name, os.listdir(conv_dir)) if b is not None)
        last_ts = 0
        for i, base in enumerate(bases):
            nxt = bases[i + 1] if i + 1 < len(bases) else None
            last_ts = _salvage_segment(root, site, conversation_id, conv_dir, base, nxt, last_ts, report)
    return report


def _salvage_segment(
    root: str,
    site: str,
    cid: str,
    conv_dir: str,
    base: int,
    next_base: int | None,
    prev_ts: int,
    report: SalvageReport,
) -> int:
    """Salvage one segment; return the last recorded_at seen in it (or ``prev_ts``)."""
    path = os.path.join(conv_dir, layout.segment_name(base))
    with _open_ro(path) as fd:
        size = os.fstat(fd).st_size
        if next_base is None:
            # The active segment: the zeros preallocated after its records are not part of the log.
            size = data_end(fd, min(size, SEGMENT_HEADER_SIZE), size)
        header = frame.decode_segment_header(os.pread(fd, SEGMENT_HEADER_SIZE, 0))
        if header is None or header.base_seq != base:
            report.refused.append(
                SalvageRefused(path, 0, "the segment header is damaged: without its salt no record can be verified")
            )
            return prev_ts
        stretches, last_ts = _find_stretches(fd, path, base, next_base, size, header.salt, prev_ts, report)
        if not stretches:
            return last_ts
        data = _pread_range(fd, 0, size)
    qdir = _quarantine(root, site, cid, path, stretches)
    rel_q = os.path.relpath(qdir, root)
    new = _rebuild(data, header.salt, stretches, rel_q, sealed=next_base is not None)
    tmp = path + ".tmp"
    out = fileio.open_create(tmp, os.O_WRONLY | os.O_TRUNC)
    try:
        fileio.pwrite_all(out, new, 0)
        fileio.fdatasync(out)
    finally:
        os.close(out)
    with open(path, "r+b") as old:
        # The old index holds the old offsets: it goes, durably, before the rename (in one directory
        # sync with it, a power cut could keep the rename and lose the unlink; POSIX orders neither).
        # An index is derived data: a missing one is rebuilt by the next read.
        with contextlib.suppress(FileNotFoundError):
            fileio.unlink(os.path.join(conv_dir, layout.index_name(base)))
            fileio.fsync_dir(conv_dir)
        fileio.rename(tmp, path)
        fileio.fsync_dir(conv_dir)
        # An engine with the old file open sees its size change, and reloads.
        fileio.truncate(old.fileno(), 0)
    _write_index(conv_dir, base, header.salt, path)
    for s in stretches:
        report.salvaged.append(
            SalvagedRecord(path, s.offset, s.end - s.offset, s.first_seq, s.end_seq - 1, s.why, rel_q)
        )
    return last_ts


def _find_stretches(
    fd: int,
    path: str,
    base: int,
    next_base: int | None,
    size: int,
    salt: int,
    prev_ts: int,
    report: SalvageReport,
) -> tuple[list[_Stretch], int]:
    """The damaged stretches of a segment whose seq ranges are established, and the last recorded_at seen.

    Refusals go to ``report``; after one, the rest of the segment is left alone.
    """
    out: list[_Stretch] = []
    expected = base
    last_ts = prev_ts
    for rec in walk(fd, SEGMENT_HEADER_SIZE, size, salt):
        if isinstance(rec, Gap):
            upper: int | None = None
            if rec.resume is not None:
                if next_base is None and classify_failure(fd, rec.offset, size, salt, expected) == "torn":
                    return out, last_ts  # a torn group write, never acknowledged: check --repair cuts it
                end, end_seq = rec.resume[0], rec.resume[1].first_seq
                upper = rec.resume[1].recorded_at_us
                if end_seq <= expected:
                    report.refused.append(
                        SalvageRefused(
                            path, rec.offset, f"the next intact record starts at seq {end_seq}, not after {expected}"
                        )
                    )
                    return out, last_ts
            else:
                end = size
                found = next_base if next_base is not None else _last_record_end(fd, rec, expected, size, salt)
                if found is None:
                    if classify_failure(fd, rec.offset, size, salt) == "torn":
                        return out, last_ts  # an unfinished write, never acknowledged: check --repair cuts it
                    report.refused.append(
                        SalvageRefused(
                            path,
                            rec.offset,
                            "the last record of the log is damaged and its seq range cannot be established "
                            "(its header does not agree with its trailer); --truncate-at-corruption drops it",
                        )
                    )
                    return out, last_ts
                end_seq = found
                if end_seq < expected:
                    report.refused.append(
                        SalvageRefused(path, rec.offset, f"the segment holds seqs past {end_seq}, its successor's base")
                    )
                    return out, last_ts
            # The loss record's time: the damaged header's, if plausible, kept between its neighbours'.
            ts = rec.header.recorded_at_us if rec.header is not None and rec.header.first_seq == expected else last_ts
            ts = max(ts, last_ts) if upper is None else min(max(ts, last_ts), max(upper, last_ts))
            out.append(_Stretch(rec.offset, end, expected, end_seq, ts, rec.why))
            expected = end_seq
            last_ts = ts
            continue
        off, h, body = rec
        if h.first_seq != expected:
            report.refused.append(
                SalvageRefused(path, off, f"expected seq {expected}, record starts at {h.first_seq}: seqs out of order")
            )
            return out, last_ts
        if h.kind == KIND_SEAL:
            return out, last_ts
        if h.kind in ITEM_KINDS:
            why = _batch_problem(body, h.count, h.kind)
            if why is not None:
                out.append(_Stretch(off, off + h.size, h.first_seq, h.end_seq, max(h.recorded_at_us, last_ts), why))
        last_ts = max(last_ts, h.recorded_at_us)
        expected = h.end_seq
    return out, last_ts


def _last_record_end(fd: int, gap: Gap, expected: int, size: int, salt: int) -> int | None:
    """End seq of a damaged last record, when its header agrees with its trailer, the file's end and its body."""
    h: RecordHeader | None = gap.header
    if h is None or h.kind not in ITEM_KINDS or h.first_seq != expected or gap.offset + h.size != size:
        return None
    trailer = os.pread(fd, frame.TRAILER_SIZE, size - frame.TRAILER_SIZE)
    _check, body_len, magic = frame.TRAILER.unpack(trailer)
    if magic != frame.TRAILER_MAGIC or body_len != h.body_len:
        return None
    # The count is in the header only. A body that still decodes must hold exactly that
    # many items; one that does not decode was itself hit, so the header was not.
    body = os.pread(fd, h.body_len, gap.offset + frame.RECORD_HEADER_SIZE)
    try:
        items = msgspec.json.decode(frame.items_body(h.kind, body))
    except msgspec.DecodeError:
        return h.end_seq
    if isinstance(items, list) and len(items) != h.count:
        return None
    return h.end_seq


def _rebuild(data: bytes, salt: int, stretches: list[_Stretch], quarantine: str, *, sealed: bool) -> bytes:
    """The segment with each stretch replaced by loss records (and a new seal, if the damage took the old one).

    A stretch that held no seqs (only a seal was damaged) becomes nothing but the new seal.
    """
    parts = [data[:SEGMENT_HEADER_SIZE]]
    pos = SEGMENT_HEADER_SIZE
    last_ts = 0
    for s in stretches:
        parts.append(data[pos : s.offset])
        seq = s.first_seq
        while seq < s.end_seq:
            count = min(s.end_seq - seq, frame.MAX_LOSS_COUNT)
            body = _LOSS_BODY.encode(
                {
                    "lost": [s.first_seq, s.end_seq - 1],
                    "why": s.why[:200],
                    "original_offset": s.offset,
                    "quarantine": quarantine,
                    "repaired_at": format_us(int(time.time() * 1_000_000)),
                }
            )
            parts.append(frame.encode_record(salt, KIND_LOSS, seq, count, s.recorded_at_us, body))
            seq += count
        pos = s.end
        last_ts = s.recorded_at_us
    parts.append(data[pos:])
    if sealed and pos == len(data):
        parts.append(frame.encode_record(salt, KIND_SEAL, stretches[-1].end_seq, 0, last_ts, b""))
    return b"".join(parts)


def _quarantine(root: str, site: str, cid: str, path: str, stretches: list[_Stretch]) -> str:
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    qdir = os.path.join(
        root,
        QUARANTINE_DIR,
        f"{stamp}-{layout.encode_name(site)}-{layout.encode_name(cid)}-{time.time_ns() % 1_000_000_000:09d}",
    )
    fileio.makedirs_durable(qdir)
    name = os.path.basename(path)
    fileio.copy_file(path, os.path.join(qdir, name))
    with _open_ro(os.path.join(qdir, name)) as qfd:
        fileio.fsync(qfd)
    info = {
        "site": site,
        "conversation_id": cid,
        "repair": "salvage: damaged records replaced by loss records; every other record and every seq kept",
        "segments": [name],
        "losses": [
            {
                "file": name,
                "offset": s.offset,
                "bytes": s.end - s.offset,
                "first_seq": s.first_seq,
                "last_seq": s.end_seq - 1,
                "why": s.why,
            }
            for s in stretches
        ],
    }
    fileio.write_file_atomic(os.path.join(qdir, "lost.json"), msgspec.json.encode(info) + b"\n")
    fileio.fsync_dir(qdir)
    return qdir


def _write_index(conv_dir: str, base: int, salt: int, path: str) -> None:
    """The repaired segment's index (derived data: offsets moved)."""
    idx = index.SparseIndex(base, salt)
    last = 0
    with _open_ro(path) as fd:
        for rec in walk(fd, SEGMENT_HEADER_SIZE, data_end(fd, SEGMENT_HEADER_SIZE, os.fstat(fd).st_size), salt):
            if isinstance(rec, Gap):
                break
            off, h, _ = rec
            if h.kind in ITEM_KINDS and off - last >= INDEX_INTERVAL and off > SEGMENT_HEADER_SIZE:
                idx.add(h.first_seq, off)
                last = off
    index.write(os.path.join(conv_dir, layout.index_name(base)), idx)
