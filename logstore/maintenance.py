"""The engine's maintenance surface: verify, repair, dump, export, restore, stats.

This is the public API the operator tools (``convmem fsck``, ``dump``,
``export``, ``import``, ``stats``) are built on. It reads the files exactly
as FORMAT.md describes them and takes the engine's own locks, so it is safe
against a live data directory:

* a conversation's ``lock`` is held *shared* only while its file list, sizes
  and index files are snapshotted; the bytes below that committed end never
  change, so they are read without a lock. A conversation where something
  looks wrong is scanned again under the lock (shared to report, exclusive
  to repair) before anything is reported or changed;
* a site's ``manifest.lock`` is held shared while the manifest is read and
  exclusive while a repaired one is written, always after any conversation
  lock (the engine's lock order).

Nothing here ever deletes acknowledged data, except :func:`check` with
``truncate_at_corruption=True``, which first copies every segment it cuts
into ``DATA/quarantine/`` and reports the seqs it dropped.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import msgspec
import xxhash

from . import fileio, frame, index, layout, manifest
from .codec import encode_batch
from .conversation import Conversation, Tip
from .errors import ConversationFull, Corrupted, Io, StoreError, Timeout
from .filestore import FileStore
from .frame import KIND_BATCH, KIND_SEAL, RECORD_HEADER_SIZE, SEGMENT_HEADER_SIZE, RecordHeader
from .ids import ConversationId, SiteName
from .limits import MAX_CONVERSATION_ITEMS
from .model import SeqRange
from .segment import classify_failure
from .timefmt import format_us, parse_rfc3339

#: Name of the folder, directly inside a data directory, that receives copies
#: of segments cut by ``truncate_at_corruption``.
QUARANTINE_DIR = "quarantine"
#: Names a data directory may hold at its top: the engine's, the quarantine,
#: and ``auth/``, which the MCP server keeps beside the engine's files.
_TOP_LEVEL_NAMES = frozenset({"logstore.json", "sites", QUARANTINE_DIR, "auth"})
#: FORMAT.md's index interval: one entry per this many bytes of segment.
INDEX_INTERVAL = 4096

# Problem kinds. Damage to acknowledged data (never repaired by --repair alone):
CORRUPT_RECORD = "corrupt-record"
BAD_SEGMENT_HEADER = "bad-segment-header"
SEQ_GAP = "seq-gap"
SEQ_MISMATCH = "seq-mismatch"
BAD_BATCH = "bad-batch"
RECORD_AFTER_SEAL = "record-after-seal"
RECORDED_AT_DECREASING = "recorded-at-decreasing"
UNSEALED_SEGMENT = "unsealed-segment"
MISPLACED_CONVERSATION = "misplaced-conversation"
# Repairable without losing acknowledged data:
TORN_TAIL = "torn-tail"
INDEX_MISSING = "index-missing"
INDEX_STALE = "index-stale"
INDEX_MISMATCH = "index-mismatch"
ORPHAN_INDEX = "orphan-index"
MANIFEST_MISSING = "manifest-missing"
MANIFEST_DAMAGED = "manifest-damaged"
MANIFEST_INCOMPLETE = "manifest-incomplete"
MANIFEST_STALE = "manifest-stale"
# Left alone (not engine data, or not knowable):
STRAY_FILE = "stray-file"
LOCK_TIMEOUT = "lock-timeout"

#: Kinds at which ``truncate_at_corruption`` may cut a log.
TRUNCATABLE_KINDS = frozenset({CORRUPT_RECORD, BAD_SEGMENT_HEADER, SEQ_GAP, SEQ_MISMATCH, BAD_BATCH, RECORD_AFTER_SEAL})


def format_timestamp(us: int) -> str:
    """``recorded_at`` microseconds as the RFC 3339 text clients see (``2026-11-30T01:54:43.123456Z``)."""
    return format_us(us)


def parse_timestamp(text: str) -> int:
    """Invert :func:`format_timestamp`; raises ValueError on any other text."""
    return parse_rfc3339(text)


class MaintenanceError(Exception):
    """An operational failure: not a data directory, no such site, bad arguments."""


@dataclass
class Problem:
    """One thing found wrong, where it is, and what was or can be done about it.

    ``offset`` is an absolute byte offset in ``file`` (None when the problem is
    a whole file or directory). ``repaired`` is True only when the repair was
    carried out in this run.
    """

    site: str | None
    conversation_id: str | None
    file: str
    offset: int | None
    kind: str
    detail: str
    action: str
    repaired: bool = False
    #: Set by ``truncate_at_corruption`` on the problem where the log was cut:
    #: ``(first, last)`` seqs dropped; ``last`` is None when no later record was readable.
    lost_seqs: tuple[int, int | None] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "site": self.site,
            "conversation_id": self.conversation_id,
            "file": self.file,
            "offset": self.offset,
            "kind": self.kind,
            "detail": self.detail,
            "action": self.action,
            "repaired": self.repaired,
            "lost_seqs": list(self.lost_seqs) if self.lost_seqs is not None else None,
        }


@dataclass(frozen=True)
class Progress:
    """How far a :func:`check` has come (totals are counted before the scan starts)."""

    conversations_done: int
    conversations_total: int
    bytes_done: int
    bytes_total: int


@dataclass
class CheckReport:
    """The outcome of :func:`check`."""

    problems: list[Problem] = field(default_factory=list)
    sites: int = 0
    conversations: int = 0
    segments: int = 0
    records: int = 0
    bytes_scanned: int = 0

    @property
    def unrepaired(self) -> list[Problem]:
        return [p for p in self.problems if not p.repaired]


# --------------------------------------------------------------------------
# Reading records


def _pread_range(fd: int, start: int, end: int) -> bytes:
    """Bytes ``[start, end)`` of a file (fewer if it has shrunk), in few preads."""
    parts: list[bytes] = []
    pos = start
    while pos < end:
        chunk = os.pread(fd, min(end - pos, 1 << 30), pos)
        if not chunk:
            break
        parts.append(chunk)
        pos += len(chunk)
    return parts[0] if len(parts) == 1 else b"".join(parts)


class _Rec(NamedTuple):
    offset: int
    header: RecordHeader
    body: memoryview


class _Bad(NamedTuple):
    offset: int
    why: str
    header: RecordHeader | None  # when the header fields were plausible
    resume: int | None  # start of the next valid record, None when none follows


def _walk(fd: int, start: int, end: int, salt: int) -> Iterator[_Rec | _Bad]:
    """Every record in ``[start, end)``: valid ones, and damaged spans with where valid data resumes.

    The range is read once (a segment is bounded by the engine's segment
    size); the loop is the scan's hot path, hence the inlined checks.
    """
    data = _pread_range(fd, start, end)
    mv = memoryview(data)
    limit = len(data)
    unpack = frame.RECORD_HEADER.unpack_from
    xxh3 = xxhash.xxh3_64_intdigest
    max_body = frame.MAX_BODY
    new_header = tuple.__new__
    pos = 0
    while pos < limit:
        h: RecordHeader | None = None
        if pos + RECORD_HEADER_SIZE > limit:
            why = "the file ends inside the record header"
        else:
            fields = unpack(data, pos)
            _check, n, count, kind, _first, _ts = fields
            if (kind == KIND_BATCH and 1 <= count <= 250 and 2 <= n <= max_body) or (
                kind == KIND_SEAL and count == 0 and n == 0
            ):
                h = new_header(RecordHeader, fields)
                rend = pos + frame.RECORD_OVERHEAD + n
                if rend > limit:
                    why = f"record length {n} runs past the end of the file"
                elif xxh3(mv[pos + 8 : pos + RECORD_HEADER_SIZE + n], salt) != _check:
                    why = "checksum mismatch"
                else:
                    yield _Rec(start + pos, h, mv[pos + RECORD_HEADER_SIZE : pos + RECORD_HEADER_SIZE + n])
                    pos = rend
                    continue
            else:
                why = "record header fields are out of range"
        resume = _next_valid(data, pos, salt)
        yield _Bad(start + pos, why, h, None if resume is None else start + resume)
        if resume is None:
            return
        pos = resume


def _next_valid(data: bytes, pos: int, salt: int) -> int | None:
    """Position in ``data`` of the first valid record starting after ``pos``, found by its trailer magic."""
    probe = pos + 1
    while True:
        m = data.find(frame.TRAILER_MAGIC, probe)
        if m < 0:
            return None
        found = frame.trailer_at_end(data, m + len(frame.TRAILER_MAGIC))
        if found is not None and found[0] > pos:
            start = found[0]
            if start + RECORD_HEADER_SIZE <= len(data):
                h = frame.decode_record_header(data, start)
                if frame.plausible(h) and start + h.size <= len(data) and frame.checksum_ok(data, start, h, salt):
                    return start
        probe = m + 1


class _AnyObject(msgspec.Struct):
    """Decodes any JSON object without building it (validation only)."""


_BATCH_CHECK = msgspec.json.Decoder(type=list[_AnyObject])
_BATCH_RAW = msgspec.json.Decoder(type=list[msgspec.Raw])


def _batch_problem(body: memoryview, count: int) -> str | None:
    """Why a checksummed batch body is not a JSON array of ``count`` objects, or None."""
    try:
        items = _BATCH_CHECK.decode(body)
    except msgspec.DecodeError as exc:
        return f"batch body is not a JSON array of objects: {exc}"
    if len(items) != count:
        return f"batch holds {len(items)} items, its header says {count}"
    return None


# --------------------------------------------------------------------------
# dump


@dataclass(frozen=True)
class RecordInfo:
    """One record of a segment as :func:`scan_segment` sees it.

    ``kind`` is ``"batch"``, ``"seal"`` or ``"damaged"``; ``verdict`` is
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


@dataclass(frozen=True)
class SegmentInfo:
    """A segment file's header, as :func:`scan_segment` reads it."""

    path: str
    size: int
    header_ok: bool
    base_seq: int | None
    salt: int | None


def scan_segment(path: str | os.PathLike[str], *, payloads: bool = True) -> tuple[SegmentInfo, list[RecordInfo]]:
    """Read every record of one segment file, verifying each (no locks; read-only).

    A segment whose header is invalid yields one damaged span covering the
    file. Raises OSError when the file cannot be read.
    """
    path = os.fspath(path)
    with _open_ro(path) as fd:
        size = os.fstat(fd).st_size
        header = frame.decode_segment_header(os.pread(fd, SEGMENT_HEADER_SIZE, 0))
        info = SegmentInfo(path, size, header is not None, header and header.base_seq, header and header.salt)
        if header is None:
            return info, [RecordInfo(0, size, "damaged", "segment header is missing or invalid", *[None] * 4)]
        out: list[RecordInfo] = []
        for rec in _walk(fd, SEGMENT_HEADER_SIZE, size, header.salt):
            if isinstance(rec, _Bad):
                stop = rec.resume if rec.resume is not None else size
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
            h = rec.header
            items: tuple[bytes, ...] = ()
            verdict = "ok"
            if h.kind == KIND_BATCH:
                verdict = _batch_problem(rec.body, h.count) or "ok"
                if payloads and verdict == "ok":
                    items = tuple(bytes(r) for r in _BATCH_RAW.decode(rec.body))
            kind = "batch" if h.kind == KIND_BATCH else "seal"
            out.append(
                RecordInfo(rec.offset, h.size, kind, verdict, h.first_seq, h.count, h.recorded_at_us, h.checksum, items)
            )
        return info, out


# --------------------------------------------------------------------------
# Locks and snapshots


@contextlib.contextmanager
def _open_ro(path: str) -> Iterator[int]:
    fd = os.open(path, os.O_RDONLY)
    try:
        yield fd
    finally:
        os.close(fd)


@contextlib.contextmanager
def _flocked(path: str, exclusive: bool, timeout: float, create: bool) -> Iterator[None]:
    """Hold ``flock`` on ``path`` (as the engine does); without ``create`` a missing file means no lock."""
    try:
        fd = os.open(path, (os.O_RDWR | os.O_CREAT) if create else os.O_RDONLY, 0o644)
    except FileNotFoundError:
        yield
        return
    try:
        started = time.monotonic()
        delay = 0.0005
        while not fileio.try_lock(fd, exclusive):
            waited = time.monotonic() - started
            if waited > timeout:
                raise Timeout(waited)
            time.sleep(delay)
            delay = min(delay * 2, 0.02)
        try:
            yield
        finally:
            fileio.unlock(fd)
    finally:
        os.close(fd)


@dataclass
class _ConvSnapshot:
    """A conversation directory as it stood under its lock."""

    path: str
    names: list[str]
    segments: list[tuple[int, int]]  # (base seq, size), ascending
    indexes: dict[int, bytes]  # base seq -> index file bytes


def _snapshot(path: str) -> _ConvSnapshot | None:
    try:
        names = sorted(os.listdir(path))
    except FileNotFoundError:
        return None
    segments: list[tuple[int, int]] = []
    indexes: dict[int, bytes] = {}
    for name in names:
        base = layout.parse_segment_name(name)
        try:
            if base is not None:
                segments.append((base, os.stat(os.path.join(path, name)).st_size))
            elif len(name) == 24 and name.endswith(layout.INDEX_SUFFIX) and name[:20].isdigit():
                with open(os.path.join(path, name), "rb") as f:
                    indexes[int(name[:20])] = f.read()
        except FileNotFoundError:
            continue
    return _ConvSnapshot(path, names, segments, indexes)


# --------------------------------------------------------------------------
# Checking one conversation


@dataclass
class _Damage:
    """The first place a conversation's log stops being trustworthy."""

    seg_i: int
    offset: int
    seq: int  # first seq that is not readable from here on


@dataclass
class _ConvResult:
    problems: list[Problem]
    tip: Tip | None
    damaged: bool  # damage to acknowledged data remains
    truncated: bool  # truncate_at_corruption cut this log
    records: int
    bytes: int
    segments: int = 0


class _ConvScanner:
    """Scans (and, holding the exclusive lock, repairs) one conversation."""

    def __init__(self, root: str, site: str, cid: str, snap: _ConvSnapshot) -> None:
        self.root = root
        self.site = site
        self.cid = cid
        self.snap = snap
        self.problems: list[Problem] = []
        self.damage: _Damage | None = None
        self.unsafe_damage = False  # damage that truncate_at_corruption does not cut
        self.rebuild_index: set[int] = set()
        self.created_us: int | None = None
        self.last_us = 0
        self.next_seq = 0
        self.seen_end = 0  # largest end seq of any valid record, even past damage
        self.records = 0
        self.bytes = 0
        self.torn: tuple[Problem, int, int] | None = None
        self.damage_problem: Problem | None = None

    def _path(self, name: str) -> str:
        return os.path.join(self.snap.path, name)

    def problem(self, file: str, offset: int | None, kind: str, detail: str, action: str) -> Problem:
        p = Problem(self.site, self.cid, file, offset, kind, detail, action)
        self.problems.append(p)
        return p

    def damaged(self, file: str, seg_i: int, offset: int, seq: int | None, kind: str, detail: str) -> None:
        seq = self.next_seq if seq is None else seq
        first = self.damage is None
        if first:
            self.damage = _Damage(seg_i, offset, seq)
        p = self.problem(
            file,
            offset,
            kind,
            detail,
            "left in place: acknowledged data is never removed by --repair; inspect with `convmem dump`, "
            "or drop the log from here with --truncate-at-corruption",
        )
        if first:
            self.damage_problem = p

    # ------------------------------------------------------------- the scan

    def scan(self) -> None:
        expected: int | None = 0
        last_ts = 0
        segs = self.snap.segments
        for i, (base, size) in enumerate(segs):
            last_seg = i == len(segs) - 1
            path = self._path(layout.segment_name(base))
            self.bytes += size
            try:
                fd = os.open(path, os.O_RDONLY)
            except FileNotFoundError:
                continue  # removed under us: only possible for a dropped site
            try:
                header = frame.decode_segment_header(os.pread(fd, SEGMENT_HEADER_SIZE, 0))
                if header is None or header.base_seq != base:
                    self.damaged(path, i, 0, expected, BAD_SEGMENT_HEADER, "segment header is missing or invalid")
                    expected = None
                    continue
                if expected is not None and base != expected:
                    what = f"seqs {expected}..{base - 1} are missing" if base > expected else "segments overlap"
                    self.damaged(
                        path,
                        i,
                        0,
                        expected,
                        SEQ_GAP,
                        f"segment starts at seq {base}, the log before it ends at {expected}: {what}",
                    )
                expected = base
                entries = self._index_entries(base, header.salt, path, size)
                verified: set[int] = set()
                sealed = False
                batch_problem = _batch_problem
                for rec in _walk(fd, SEGMENT_HEADER_SIZE, size, header.salt):
                    if type(rec) is _Bad:
                        self._bad(fd, path, i, last_seg, size, header.salt, rec, expected)
                        expected = None
                        continue
                    offset, h, body = rec
                    _ck, _n, count, kind, first, ts = h
                    self.records += 1
                    if expected is None:
                        expected = first  # resynchronised after damage
                    if sealed:
                        self.damaged(
                            path, i, offset, expected, RECORD_AFTER_SEAL, "a record follows the segment's seal"
                        )
                    elif first != expected:
                        self.damaged(
                            path,
                            i,
                            offset,
                            expected,
                            SEQ_MISMATCH,
                            f"expected seq {expected}, record starts at {first}",
                        )
                    if ts < last_ts:
                        self.unsafe_damage = True
                        self.problem(
                            path,
                            offset,
                            RECORDED_AT_DECREASING,
                            f"recorded_at {ts} us is earlier than the previous record's {last_ts} us",
                            "left in place: the items themselves are intact",
                        )
                    else:
                        last_ts = ts
                    if kind == KIND_SEAL:
                        sealed = True
                        expected = first
                        continue
                    why = batch_problem(body, count)
                    if why is not None:
                        self.damaged(path, i, offset, first, BAD_BATCH, why)
                    if entries:
                        entry = entries.get(offset)
                        if entry is not None and entry[0] == first:
                            verified.add(offset)
                    expected = first + count
                    if expected > self.seen_end:
                        self.seen_end = expected
                    if self.damage is None:
                        if self.created_us is None:
                            self.created_us = ts
                        self.last_us = ts
                        self.next_seq = expected
                for off, (seq, at) in entries.items():
                    if off not in verified:
                        self._index_problem(
                            base,
                            INDEX_MISMATCH,
                            at,
                            f"the entry for seq {seq} points at segment byte {off}, which is not the start "
                            "of a valid batch record carrying that seq",
                        )
                if not last_seg and not sealed and expected is not None:
                    self.unsafe_damage = True
                    self.problem(
                        path,
                        size,
                        UNSEALED_SEGMENT,
                        "a segment that is not the last one has no seal",
                        "left in place: the items are readable; report this as an engine defect",
                    )
            finally:
                os.close(fd)
        self._check_names()

    def _check_names(self) -> None:
        """Report files the engine would not have left in a conversation directory."""
        bases = {b for b, _ in self.snap.segments}
        for name in self.snap.names:
            if name == layout.LOCK_FILE or layout.parse_segment_name(name) is not None or ".tmp" in name:
                continue
            if len(name) == 24 and name.endswith(layout.INDEX_SUFFIX) and name[:20].isdigit():
                if int(name[:20]) not in bases:
                    self.problem(
                        self._path(name),
                        None,
                        ORPHAN_INDEX,
                        "an index file without its segment",
                        "remove it (--repair); indexes are derived data",
                    )
                continue
            self.problem(
                self._path(name),
                None,
                STRAY_FILE,
                "a file the engine does not create",
                "left in place: move it out of the data directory if it is not needed",
            )

    def _bad(
        self, fd: int, path: str, seg_i: int, last_seg: bool, size: int, salt: int, rec: _Bad, expected: int | None
    ) -> None:
        if last_seg and rec.resume is None and classify_failure(fd, rec.offset, size, salt) == "torn":
            p = self.problem(
                path,
                rec.offset,
                TORN_TAIL,
                f"{size - rec.offset} bytes of an unfinished write ({rec.why}); never acknowledged",
                "truncate the segment here (--repair)",
            )
            self.torn = (p, seg_i, rec.offset)
            return
        seq = expected if expected is not None else (rec.header.first_seq if rec.header else None)
        self.damaged(
            path,
            seg_i,
            rec.offset,
            seq,
            CORRUPT_RECORD,
            f"{rec.why}; "
            + (
                "valid records follow"
                if rec.resume is not None
                else "record written whole, then damaged"
                if last_seg
                else "in a sealed segment"
            ),
        )
        if rec.header is not None and rec.header.first_seq == seq:
            # A damaged record whose header still agrees with the log: its count is likely right.
            self.seen_end = max(self.seen_end, rec.header.end_seq)

    # -------------------------------------------------------------- indexes

    def _index_entries(self, base: int, salt: int, seg_path: str, size: int) -> dict[int, tuple[int, int]]:
        """The index's entries as ``{segment offset: (seq, offset in the index file)}``.

        A missing or stale index, or entries out of order, are reported here.
        """
        data = self.snap.indexes.get(base)
        if data is None:
            self._index_problem(base, INDEX_MISSING, None, "the segment has no index file")
            return {}
        if len(data) < index.INDEX_HEADER_SIZE:
            self._index_problem(base, INDEX_STALE, 0, "index header is truncated")
            return {}
        magic, version, _r, ibase, isalt = index.INDEX_HEADER.unpack_from(data)
        if magic != index.INDEX_MAGIC or version != 1 or ibase != base or isalt != salt:
            self._index_problem(
                base, INDEX_STALE, 0, "index header does not belong to this segment (wrong magic, base seq or salt)"
            )
            return {}
        out: dict[int, tuple[int, int]] = {}
        prev_seq, prev_off = -1, 0
        whole = len(data) - (len(data) - index.INDEX_HEADER_SIZE) % index.ENTRY_SIZE
        for n, (rel, off) in enumerate(index.ENTRY.iter_unpack(data[index.INDEX_HEADER_SIZE : whole])):
            seq = base + rel
            if seq <= prev_seq or off <= prev_off or off >= size:
                self._index_problem(
                    base,
                    INDEX_MISMATCH,
                    index.INDEX_HEADER_SIZE + n * index.ENTRY_SIZE,
                    f"entry {n} (seq {seq}, byte {off}) is out of order or past the segment's end",
                )
                return out
            out[off] = (seq, index.INDEX_HEADER_SIZE + n * index.ENTRY_SIZE)
            prev_seq, prev_off = seq, off
        return out

    def _index_problem(self, base: int, kind: str, offset: int | None, detail: str) -> None:
        if base in self.rebuild_index and kind == INDEX_MISMATCH:
            return  # one problem per index file is enough
        self.rebuild_index.add(base)
        self.problem(
            self._path(layout.index_name(base)), offset, kind, detail, "rebuild the index from its segment (--repair)"
        )

    # --------------------------------------------------------------- repair

    def repair(self, truncate_at_corruption: bool) -> bool:
        """Carry out what can be repaired (caller holds the exclusive lock). True when the log was cut."""
        torn = self.torn
        cut = False
        if torn is not None and self.damage is None:
            p, seg_i, offset = torn
            base = self.snap.segments[seg_i][0]
            with _open_rw(self._path(layout.segment_name(base))) as fd:
                fileio.truncate(fd, offset)
            self.snap.segments[seg_i] = (base, offset)
            self.rebuild_index.add(base)
            p.repaired = True
            p.action = f"truncated the segment to {offset} bytes (the torn write was never acknowledged)"
        elif torn is not None:
            torn[0].action = "left in place: the log is damaged before it (see above)"
        if self.damage is not None and truncate_at_corruption:
            self._truncate_at_corruption()
            cut = True
        self._repair_orphans()
        for base in sorted(self.rebuild_index):
            ok = self._rebuild_index(base)
            for p in self.problems:
                if p.kind in (INDEX_MISSING, INDEX_STALE, INDEX_MISMATCH) and p.file == self._path(
                    layout.index_name(base)
                ):
                    p.repaired = ok
                    p.action = "rebuilt the index from its segment" if ok else p.action
        return cut

    def _rebuild_index(self, base: int) -> bool:
        segs = dict(self.snap.segments)
        if base not in segs:
            return True  # the segment went to quarantine with its index
        path = self._path(layout.segment_name(base))
        with _open_ro(path) as fd:
            size = os.fstat(fd).st_size
            header = frame.decode_segment_header(os.pread(fd, SEGMENT_HEADER_SIZE, 0))
            if header is None:
                return False
            idx = build_index(fd, header.base_seq, header.salt, size)
        index.write(self._path(layout.index_name(base)), idx)
        return True

    def _repair_orphans(self) -> None:
        for p in self.problems:
            if p.kind == ORPHAN_INDEX and not p.repaired:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(p.file)
                p.repaired = True
                p.action = "removed the index (derived data; its segment does not exist)"

    def _truncate_at_corruption(self) -> None:
        dmg = self.damage
        assert dmg is not None
        segs = self.snap.segments
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        qdir = os.path.join(
            self.root,
            QUARANTINE_DIR,
            f"{stamp}-{layout.encode_name(self.site)}-"
            f"{layout.encode_name(self.cid)}-{time.time_ns() % 1_000_000_000:09d}",
        )
        fileio.makedirs_durable(qdir)
        cut = segs[dmg.seg_i :]
        for base, _size in cut:
            name = layout.segment_name(base)
            shutil.copyfile(self._path(name), os.path.join(qdir, name))
            with _open_ro(os.path.join(qdir, name)) as qfd:
                fileio.fsync(qfd)
        lost_last = max(self.seen_end, dmg.seq) - 1
        lost = f"seqs {dmg.seq}..{lost_last}" if lost_last >= dmg.seq else f"seqs from {dmg.seq} on"
        info = {
            "site": self.site,
            "conversation_id": self.cid,
            "first_lost_seq": dmg.seq,
            "last_lost_seq_seen": lost_last if lost_last >= dmg.seq else None,
            "cut_file": self._path(layout.segment_name(cut[0][0])),
            "cut_offset": dmg.offset,
            "segments": [layout.segment_name(b) for b, _ in cut],
        }
        fileio.write_file_atomic(os.path.join(qdir, "lost.json"), msgspec.json.encode(info) + b"\n")
        fileio.fsync_dir(qdir)
        first_base = cut[0][0]
        keep_first = dmg.offset >= SEGMENT_HEADER_SIZE
        for base, _size in reversed(cut):
            seg = self._path(layout.segment_name(base))
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._path(layout.index_name(base)))
            with _open_rw(seg) as fd:
                if base == first_base and keep_first:
                    _replace_with_prefix(seg, fd, dmg.offset)
                else:
                    os.unlink(seg)
                # Shrink the old file to nothing: an engine holding it open sees its size
                # change, drops what it knew (including a remembered Corrupted) and reloads.
                fileio.truncate(fd, 0)
        fileio.fsync_dir(self.snap.path)
        self.snap.segments = segs[: dmg.seg_i] + ([(first_base, dmg.offset)] if keep_first else [])
        if keep_first:
            self.rebuild_index.add(first_base)
        action = (
            f"dropped {lost} from byte {dmg.offset} of {cut[0][0]:020d}.seg on; the original segments are in {qdir}"
        )
        for p in self.problems:
            if p.kind in TRUNCATABLE_KINDS or (
                p.kind in (TORN_TAIL, RECORDED_AT_DECREASING, UNSEALED_SEGMENT)
                and _at_or_after(p, segs, dmg, self.snap.path)
            ):
                p.repaired = True
                p.action = action
            elif p.kind in (INDEX_MISSING, INDEX_STALE, INDEX_MISMATCH):
                base = int(os.path.basename(p.file)[:20])
                if base >= first_base and not (keep_first and base == first_base):
                    p.repaired, p.action = True, action
        self.rebuild_index = {b for b in self.rebuild_index if b < first_base or (keep_first and b == first_base)}
        if self.damage_problem is not None:
            self.damage_problem.lost_seqs = (dmg.seq, lost_last if lost_last >= dmg.seq else None)
        self.unsafe_damage = any(
            not p.repaired for p in self.problems if p.kind in (RECORDED_AT_DECREASING, UNSEALED_SEGMENT)
        )

    def result(self, truncated: bool) -> _ConvResult:
        tip = Tip(self.created_us, self.last_us, self.next_seq) if self.created_us is not None else None
        damaged = (self.damage is not None and not truncated) or self.unsafe_damage
        return _ConvResult(self.problems, tip, damaged, truncated, self.records, self.bytes, len(self.snap.segments))


def _at_or_after(p: Problem, segs: list[tuple[int, int]], dmg: _Damage, conv_dir: str) -> bool:
    """True when problem ``p`` lies in the part of the log that was cut."""
    name = os.path.basename(p.file)
    base = layout.parse_segment_name(name)
    if base is None:
        return False
    first_base = segs[dmg.seg_i][0]
    return base > first_base or (base == first_base and (p.offset or 0) >= dmg.offset)


def _replace_with_prefix(path: str, fd: int, length: int) -> None:
    """Replace the file at ``path`` (open as ``fd``) with a new file holding its first ``length`` bytes.

    Written as the engine creates a segment: ``<name>.tmp``, synced, renamed
    into place, directory synced.
    """
    prefix = _pread_range(fd, 0, length)
    tmp = path + ".tmp"
    out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        fileio.pwrite_all(out, prefix, 0)
        fileio.fdatasync(out)
    finally:
        os.close(out)
    os.rename(tmp, path)
    fileio.fsync_dir(os.path.dirname(path))


@contextlib.contextmanager
def _open_rw(path: str) -> Iterator[int]:
    fd = os.open(path, os.O_RDWR)
    try:
        yield fd
    finally:
        os.close(fd)


def build_index(fd: int, base_seq: int, salt: int, size: int, interval: int = INDEX_INTERVAL) -> index.SparseIndex:
    """The sparse index of a segment as the engine builds it, up to its first bad record."""
    idx = index.SparseIndex(base_seq, salt)
    last = 0
    for rec in _walk(fd, SEGMENT_HEADER_SIZE, size, salt):
        if isinstance(rec, _Bad):
            break
        if rec.header.kind == KIND_BATCH and rec.offset - last >= interval and rec.offset > SEGMENT_HEADER_SIZE:
            idx.add(rec.header.first_seq, rec.offset)
            last = rec.offset
    return idx


def _check_conversation(
    root: str, site: str, cid: str, conv_dir: str, repair: bool, truncate: bool, lock_timeout: float
) -> _ConvResult | None:
    """Scan one conversation: first from a snapshot taken under its shared lock, then, if
    anything looks wrong, again under the lock (exclusive when repairing)."""
    lock_path = os.path.join(conv_dir, layout.LOCK_FILE)
    try:
        with _flocked(lock_path, False, lock_timeout, create=False):
            snap = _snapshot(conv_dir)
        if snap is None:
            return None
        sc = _ConvScanner(root, site, cid, snap)
        sc.scan()
        if not sc.problems:
            return sc.result(False)
        # Something looks wrong: look again with appenders held off, so a write
        # in flight (or a tail the engine just cut) is never reported as damage.
        with _flocked(lock_path, repair, lock_timeout, create=repair):
            snap = _snapshot(conv_dir)
            if snap is None:
                return None
            sc = _ConvScanner(root, site, cid, snap)
            sc.scan()
            cut = sc.repair(truncate) if repair and sc.problems else False
        return sc.result(cut)
    except Timeout as exc:
        p = Problem(
            site,
            cid,
            conv_dir,
            None,
            LOCK_TIMEOUT,
            f"could not lock the conversation: {exc}",
            "not checked: run fsck again when the conversation is less busy",
        )
        return _ConvResult([p], None, True, False, 0, 0)


# --------------------------------------------------------------------------
# Walking a data directory


def _require_data_dir(root: str) -> None:
    marker = os.path.join(root, layout.MARKER_FILE)
    try:
        with open(marker, "rb") as f:
            info = msgspec.json.decode(f.read())
    except FileNotFoundError:
        raise MaintenanceError(f"{root} is not a logstore data directory (no {layout.MARKER_FILE})") from None
    except (OSError, msgspec.DecodeError) as exc:
        raise MaintenanceError(f"cannot read {marker}: {exc}") from exc
    if not isinstance(info, dict) or info.get("format") != "convmem-logstore" or info.get("version") != 1:
        raise MaintenanceError(f"{marker} names an unknown format: {info!r}")
    if not os.access(root, os.R_OK | os.X_OK):
        raise MaintenanceError(f"{root} is not readable")


def _valid_id(value: str, kind: type[str]) -> bool:
    try:
        kind(value)
    except (StoreError, TypeError):
        return False
    return True


def list_sites(data_dir: str | os.PathLike[str]) -> list[str]:
    """Names of the sites in a data directory, sorted (raises MaintenanceError when it is not one)."""
    root = os.path.abspath(os.fspath(data_dir))
    _require_data_dir(root)
    names = (layout.decode_name(n) for n in _listdir(os.path.join(root, layout.SITES_DIR)))
    return sorted(n for n in names if n is not None and _valid_id(n, SiteName))


def _select_sites(root: str, site: str | None) -> list[str]:
    _require_data_dir(root)
    if site is None:
        return list_sites(root)
    if not _valid_id(site, SiteName):
        raise MaintenanceError(f"{site!r} is not a valid site name (8-64 characters of [A-Za-z0-9_-])")
    if not os.path.isdir(layout.site_dir(root, site)):
        raise MaintenanceError(f"site {site!r} does not exist in {root}")
    return [site]


def _listdir(path: str) -> list[str]:
    try:
        return sorted(os.listdir(path))
    except (FileNotFoundError, NotADirectoryError):
        return []


def _is_hex2(name: str) -> bool:
    return len(name) == 2 and all(c in "0123456789abcdef" for c in name)


def iter_conversations(
    data_dir: str | os.PathLike[str], site: str, strays: list[Problem] | None = None
) -> Iterator[tuple[str, str]]:
    """``(conversation_id, directory)`` of every conversation directory of ``site``, in directory order.

    Names the engine does not create are appended to ``strays`` as problems.
    """
    root = os.path.abspath(os.fspath(data_dir))
    sdir = layout.site_dir(root, site)

    def stray(path: str, kind: str = STRAY_FILE, detail: str = "a file the engine does not create") -> None:
        if strays is not None:
            strays.append(
                Problem(
                    site,
                    None,
                    path,
                    None,
                    kind,
                    detail,
                    "left in place: move it out of the data directory if it is not needed",
                )
            )

    for name in _listdir(sdir):
        if name in (manifest.LOCK_FILE, layout.CONVERSATIONS_DIR) or ".tmp" in name:
            continue
        stem, _, ext = name.partition(".")
        if stem.startswith("manifest-") and stem[9:].isdigit() and ext in ("snap", "log"):
            continue
        stray(os.path.join(sdir, name))
    cdir = os.path.join(sdir, layout.CONVERSATIONS_DIR)
    for a in _listdir(cdir):
        if not _is_hex2(a) or not os.path.isdir(os.path.join(cdir, a)):
            stray(os.path.join(cdir, a))
            continue
        for b in _listdir(os.path.join(cdir, a)):
            bdir = os.path.join(cdir, a, b)
            if not _is_hex2(b) or not os.path.isdir(bdir):
                stray(bdir)
                continue
            for name in _listdir(bdir):
                path = os.path.join(bdir, name)
                cid = layout.decode_name(name)
                if cid is None or not _valid_id(cid, ConversationId) or not os.path.isdir(path):
                    stray(path)
                elif layout.fanout(cid) != (a, b):
                    stray(
                        path,
                        MISPLACED_CONVERSATION,
                        f"conversation {cid!r} sits under {a}/{b}, the engine looks for it under "
                        f"{'/'.join(layout.fanout(cid))}, so its data is unreachable",
                    )
                else:
                    yield cid, path


def _segment_bytes(conv_dir: str) -> int:
    total = 0
    try:
        with os.scandir(conv_dir) as it:
            for entry in it:
                if layout.parse_segment_name(entry.name) is not None:
                    with contextlib.suppress(FileNotFoundError):
                        total += entry.stat().st_size
    except FileNotFoundError:
        pass
    return total


# --------------------------------------------------------------------------
# The site manifest


@dataclass
class _ManifestState:
    epoch: int | None
    complete: bool
    entries: dict[str, manifest._Entry]
    problems: list[tuple[str, str, int | None, str]]  # kind, file, offset, detail


def _read_manifest(site_dir: str) -> _ManifestState:
    """The committed listing as the engine would load it, without changing anything."""
    epochs = manifest._epoch_files(site_dir)
    snaps = [e for e, kinds in epochs.items() if "snap" in kinds]
    if not snaps:
        return _ManifestState(
            None,
            False,
            {},
            [(MANIFEST_MISSING, os.path.join(site_dir, "manifest-*.snap"), None, "the site has no manifest snapshot")],
        )
    epoch = max(snaps)
    spath = manifest.snap_path(site_dir, epoch)
    try:
        entries, complete = manifest._decode_snapshot(manifest._read(spath), epoch)
    except manifest._Damaged:
        return _ManifestState(epoch, False, {}, [(MANIFEST_DAMAGED, spath, 0, "the snapshot fails its checksums")])
    state = _ManifestState(epoch, complete, {e.conversation_id: e for e in entries}, [])
    if not complete:
        state.problems.append(
            (MANIFEST_INCOMPLETE, spath, 16, "the snapshot is marked incomplete (a full rebuild is owed)")
        )
    lpath = manifest.log_path(site_dir, epoch)
    try:
        with open(lpath, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        state.problems.append((MANIFEST_DAMAGED, lpath, None, "the current epoch has no activity log"))
        return state
    head = data[: manifest.LOG_HEADER.size]
    if len(head) < manifest.LOG_HEADER.size:
        state.problems.append((MANIFEST_DAMAGED, lpath, 0, "the activity log's header is truncated"))
        return state
    magic, e, salt, check = manifest.LOG_HEADER.unpack(head)
    if magic != manifest.LOG_MAGIC or e != epoch or xxhash.xxh3_64_intdigest(head[:24]) != check:
        state.problems.append((MANIFEST_DAMAGED, lpath, 0, "the activity log's header fails its checksum"))
        return state
    done = manifest.LOG_HEADER.size
    for off, end, rec in manifest.iter_log_records(data, salt, manifest.LOG_HEADER.size):
        if rec is None:
            state.problems.append((MANIFEST_DAMAGED, lpath, off, "an activity log record fails its checksum"))
        else:
            _apply_log_record(state.entries, rec)
        done = end
    if done < len(data):
        # Read under the manifest lock, so no writer is half way through a record.
        state.problems.append(
            (MANIFEST_DAMAGED, lpath, done, f"{len(data) - done} bytes at the end of the activity log are not a record")
        )
    return state


def _apply_log_record(entries: dict[str, manifest._Entry], rec: list[Any]) -> None:
    """Merge one activity-log record, monotonically, as the engine does."""
    try:
        kind, conv, created, last, nxt = rec[:5]
    except (ValueError, TypeError):
        return
    e = entries.get(conv)
    if kind == manifest.INTENT:
        if e is None:
            e = entries[conv] = manifest._Entry(conv, 0, 0, 0)
        if nxt > e.next_seq and (e.pending is None or nxt > e.pending[2]):
            e.pending = (created, last, nxt)
        return
    if kind == manifest.RESOLVE and e is not None and e.pending is not None and len(rec) > 5 and e.pending[2] == rec[5]:
        e.pending = None
    if nxt <= 0:
        return
    if e is None:
        e = entries[conv] = manifest._Entry(conv, created, last, 0)
    if nxt > e.next_seq:
        e.created_us, e.last_us, e.next_seq = created, last, nxt
    if e.pending is not None and e.pending[2] <= e.next_seq:
        e.pending = None


def _committed(e: manifest._Entry | None) -> Tip | None:
    return Tip(e.created_us, e.last_us, e.next_seq) if e is not None and e.next_seq > 0 else None


def _describe(t: Tip | None) -> str:
    return "no items" if t is None else f"next_seq={t.next_seq} created_us={t.created_us} last_us={t.last_us}"


def _read_manifest_locked(site_dir: str, lock_timeout: float) -> _ManifestState:
    with _flocked(os.path.join(site_dir, manifest.LOCK_FILE), False, lock_timeout, create=False):
        return _read_manifest(site_dir)


def _write_manifest(
    root: str, site: str, tips: Mapping[str, Tip | None], truncated: set[str], whole_site: bool, lock_timeout: float
) -> None:
    """Write the site's listing as a new, complete epoch (under the manifest lock).

    The scanned extents are the truth, except that a larger committed extent in
    the current manifest is newer (an append since the scan) and wins, unless
    the log was cut by this run. Pending intents are carried over for the
    engine to resolve.
    """
    sdir = layout.site_dir(root, site)
    m = manifest.SiteManifest(sdir, probe=lambda _c: None, walk=lambda: iter(()), lock_timeout=lock_timeout)
    try:
        m._flock()
        try:
            state = _read_manifest(sdir)
            out: dict[str, manifest._Entry] = (
                {}
                if whole_site
                else {
                    c: manifest._Entry(c, e.created_us, e.last_us, e.next_seq, e.pending)
                    for c, e in state.entries.items()
                }
            )
            for conv, tip in tips.items():
                out.pop(conv, None)
                if tip is not None:
                    out[conv] = manifest._Entry(conv, tip.created_us, tip.last_us, tip.next_seq)
            for conv, e in state.entries.items():
                mine = out.get(conv)
                if conv in truncated:
                    continue
                if e.next_seq > 0 and (mine is None or e.next_seq > mine.next_seq):
                    if mine is not None or (
                        conv not in tips and _has_segments(layout.conversation_dir(root, site, conv))
                    ):
                        out[conv] = mine = manifest._Entry(conv, e.created_us, e.last_us, e.next_seq)
                if e.pending is not None and (mine is None or e.pending[2] > mine.next_seq):
                    if mine is None:
                        out[conv] = mine = manifest._Entry(conv, 0, 0, 0)
                    mine.pending = e.pending
            epochs = manifest._epoch_files(sdir)
            epoch = max(epochs, default=0) + 1
            m._write_epoch(epoch, sorted(out.values(), key=lambda e: e.conversation_id), True)
            m._current_epoch_locked()
        finally:
            m._funlock()
    finally:
        m.close()


def _has_segments(conv_dir: str) -> bool:
    return any(layout.parse_segment_name(n) is not None for n in _listdir(conv_dir))


def _check_manifest(
    root: str,
    site: str,
    tips: dict[str, Tip | None],
    damaged: set[str],
    only: str | None,
    lock_timeout: float,
) -> list[Problem]:
    """Compare the site's listing with the scanned conversations; re-verify each difference under locks."""
    sdir = layout.site_dir(root, site)
    try:
        state = _read_manifest_locked(sdir, lock_timeout)
    except Timeout as exc:
        return [Problem(site, None, sdir, None, LOCK_TIMEOUT, f"could not lock the manifest: {exc}", "not checked")]
    out: list[Problem] = []
    action = "rewrite the manifest from the conversations (--repair)"
    if only is None:
        has_data = any(t is not None for t in tips.values()) or bool(damaged)
        for kind, file, offset, detail in state.problems:
            if kind == MANIFEST_MISSING and not has_data:
                continue
            out.append(Problem(site, None, file, offset, kind, detail, action))
        if any(p.kind in (MANIFEST_MISSING, MANIFEST_DAMAGED) and p.offset in (None, 0) for p in out):
            return out  # nothing to compare against
    suspects = [c for c, t in tips.items() if c not in damaged and _committed(state.entries.get(c)) != t]
    if only is None:
        suspects += [c for c, e in state.entries.items() if e.next_seq > 0 and c not in tips and c not in damaged]
    spath = manifest.snap_path(sdir, state.epoch or 0)
    for conv in suspects:
        conv_dir = layout.conversation_dir(root, site, conv)
        try:
            # Under the conversation's lock no append of it is half done, so its
            # commit (if any) is in the manifest: lock order conversation, then manifest.
            with _flocked(os.path.join(conv_dir, layout.LOCK_FILE), False, lock_timeout, create=False):
                snap = _snapshot(conv_dir)
                truth: Tip | None = None
                if snap is not None:
                    sc = _ConvScanner(root, site, conv, snap)
                    sc.scan()
                    if sc.damage is not None:
                        continue
                    truth = sc.result(False).tip
                now = _read_manifest_locked(sdir, lock_timeout)
        except Timeout:
            continue
        listed = _committed(now.entries.get(conv))
        tips[conv] = truth
        if listed != truth:
            out.append(
                Problem(
                    site,
                    conv,
                    spath,
                    None,
                    MANIFEST_STALE,
                    f"the listing has {_describe(listed)}, the log holds {_describe(truth)}",
                    action,
                )
            )
    return out


# --------------------------------------------------------------------------
# check


def check(
    data_dir: str | os.PathLike[str],
    site: str | None = None,
    conversation: str | None = None,
    *,
    repair: bool = False,
    truncate_at_corruption: bool = False,
    progress: Callable[[Progress], None] | None = None,
    lock_timeout: float = 30.0,
) -> CheckReport:
    """Verify a data directory (or one site, or one conversation) and optionally repair it.

    Checks every record's framing and checksum, seqs gapless within and across
    segments, batches whole, ``recorded_at`` never decreasing, every sparse
    index against its segment, the site manifest against the conversations, and
    stray files. With ``repair`` it truncates torn tails, rebuilds indexes,
    removes orphan indexes and rewrites stale manifests; damage to acknowledged
    data is left in place unless ``truncate_at_corruption`` (which implies
    ``repair``) cuts the log at its first damaged record, after copying the
    segments it cuts into ``DATA/quarantine/``.

    Raises :class:`MaintenanceError` for a directory that is not a data
    directory, a site that does not exist, or a malformed id.
    """
    root = os.path.abspath(os.fspath(data_dir))
    repair = repair or truncate_at_corruption
    sites = _select_sites(root, site)
    if conversation is not None and not _valid_id(conversation, ConversationId):
        raise MaintenanceError(f"{conversation!r} is not a valid conversation id")
    report = CheckReport(sites=len(sites))
    if site is None and conversation is None:
        for name in _listdir(root):
            if name in _TOP_LEVEL_NAMES or ".tmp" in name:
                continue
            report.problems.append(
                Problem(
                    None,
                    None,
                    os.path.join(root, name),
                    None,
                    STRAY_FILE,
                    "a file the engine does not create",
                    "left in place",
                )
            )
        for name in _listdir(os.path.join(root, layout.SITES_DIR)):
            decoded = layout.decode_name(name)
            if name.startswith(".dropped-") or (decoded is not None and _valid_id(decoded, SiteName)):
                continue
            report.problems.append(
                Problem(
                    None,
                    None,
                    os.path.join(root, layout.SITES_DIR, name),
                    None,
                    STRAY_FILE,
                    "not a site directory",
                    "left in place",
                )
            )
    plan: list[tuple[str, list[tuple[str, str]] | Iterator[tuple[str, str]]]] = []
    for s in sites:
        if conversation is not None:
            cdir = layout.conversation_dir(root, s, conversation)
            if os.path.isdir(cdir):
                plan.append((s, [(conversation, cdir)]))
        else:
            plan.append((s, iter_conversations(root, s, report.problems)))
    if conversation is not None and not plan:
        where = f"site {site!r}" if site is not None else "any site"
        raise MaintenanceError(f"conversation {conversation!r} does not exist in {where}")
    totals = (0, 0)
    if progress is not None:
        plan = [(s, list(convs)) for s, convs in plan]
        totals = (
            sum(len(c) for _, c in plan),  # type: ignore[arg-type]
            sum(_segment_bytes(d) for _, c in plan for _, d in c),
        )
    done = 0
    for s, convs in plan:
        tips: dict[str, Tip | None] = {}
        damaged: set[str] = set()
        truncated: set[str] = set()
        for cid, cdir in convs:
            res = _check_conversation(root, s, cid, cdir, repair, truncate_at_corruption, lock_timeout)
            done += 1
            if res is not None:
                report.problems.extend(res.problems)
                report.conversations += 1
                report.records += res.records
                report.bytes_scanned += res.bytes
                report.segments += res.segments
                if res.damaged:
                    damaged.add(cid)
                else:
                    tips[cid] = res.tip
                if res.truncated:
                    truncated.add(cid)
            if progress is not None:
                progress(Progress(done, totals[0], report.bytes_scanned, totals[1]))
        if conversation is not None and conversation not in tips and conversation not in damaged:
            tips[conversation] = None
        mproblems = _check_manifest(root, s, tips, damaged, conversation, lock_timeout)
        if truncated or (repair and any(p.kind != LOCK_TIMEOUT for p in mproblems)):
            try:
                _write_manifest(root, s, tips, truncated, conversation is None, lock_timeout)
                for p in mproblems:
                    if p.kind != LOCK_TIMEOUT:
                        p.repaired = True
                        p.action = "rewrote the manifest from the conversations"
            except (Timeout, OSError) as exc:
                for p in mproblems:
                    p.action = f"rewriting the manifest failed: {exc}"
        report.problems.extend(mproblems)
    return report


# --------------------------------------------------------------------------
# export


@dataclass(frozen=True)
class ExportedItem:
    """One item as stored: ``payload`` is its exact compact JSON bytes."""

    conversation_id: str
    seq: int
    recorded_at_us: int
    payload: bytes


def _committed_segments(conv_dir: str, lock_timeout: float) -> list[tuple[int, int]]:
    with _flocked(os.path.join(conv_dir, layout.LOCK_FILE), False, lock_timeout, create=False):
        snap = _snapshot(conv_dir)
    return [] if snap is None else snap.segments


def iter_conversation_items(
    data_dir: str | os.PathLike[str], site: str, conversation_id: str, *, lock_timeout: float = 30.0
) -> Iterator[ExportedItem]:
    """Every item of one conversation in seq order, verified, as it stood when the read began.

    Reads one record at a time (constant memory). A torn tail (never
    acknowledged) ends the log; any damage to acknowledged data raises
    :class:`~logstore.Corrupted` with its file and offset.
    """
    root = os.path.abspath(os.fspath(data_dir))
    conv_dir = layout.conversation_dir(root, SiteName(site), ConversationId(conversation_id))
    segs = _committed_segments(conv_dir, lock_timeout)
    expected = 0
    decode = _BATCH_RAW.decode
    for i, (base, size) in enumerate(segs):
        path = os.path.join(conv_dir, layout.segment_name(base))
        with _open_ro(path) as fd:
            header = frame.decode_segment_header(os.pread(fd, SEGMENT_HEADER_SIZE, 0))
            if header is None or header.base_seq != base:
                raise Corrupted(path, 0, "segment header is missing or invalid")
            if base != expected:
                raise Corrupted(path, 0, f"segment starts at seq {base}, expected {expected}")
            for rec in _walk(fd, SEGMENT_HEADER_SIZE, size, header.salt):
                if isinstance(rec, _Bad):
                    if i == len(segs) - 1 and rec.resume is None:
                        if classify_failure(fd, rec.offset, size, header.salt) == "torn":
                            return
                    raise Corrupted(path, rec.offset, rec.why)
                h = rec.header
                if h.first_seq != expected:
                    raise Corrupted(path, rec.offset, f"expected seq {expected}, record starts at {h.first_seq}")
                if h.kind != KIND_BATCH:
                    break
                why = _batch_problem(rec.body, h.count)
                if why is not None:
                    raise Corrupted(path, rec.offset, why)
                for n, raw in enumerate(decode(rec.body)):
                    yield ExportedItem(conversation_id, h.first_seq + n, h.recorded_at_us, bytes(raw))
                expected = h.end_seq


def export_items(
    data_dir: str | os.PathLike[str], site: str, conversation_id: str | None = None, *, lock_timeout: float = 30.0
) -> Iterator[ExportedItem]:
    """Every item of a site (or of one conversation), conversation by conversation, in constant memory."""
    root = os.path.abspath(os.fspath(data_dir))
    _select_sites(root, site)
    if conversation_id is not None:
        yield from iter_conversation_items(root, site, conversation_id, lock_timeout=lock_timeout)
        return
    for cid, _dir in iter_conversations(root, site):
        yield from iter_conversation_items(root, site, cid, lock_timeout=lock_timeout)


# --------------------------------------------------------------------------
# restore (import)


class RestoreConflict(StoreError):
    """A restored batch does not continue its conversation (wrong seq or earlier ``recorded_at``)."""

    code = "RestoreConflict"


class _RestoringConversation(Conversation):
    """A conversation that appends batches with given seqs and ``recorded_at``."""

    def restore(self, body: bytes, count: int, first_seq: int, stamp: int, deadline: float, started: float) -> None:
        """Append one encoded batch at ``first_seq`` stamped ``stamp``, durably, as ``append`` does."""
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
            if first_seq != self._next_seq:
                raise RestoreConflict(f"batch starts at seq {first_seq}, the conversation holds {self._next_seq}")
            if stamp < self._last_us:
                raise RestoreConflict(f"recorded_at {stamp} us is earlier than the last batch's {self._last_us} us")
            if first_seq + count > MAX_CONVERSATION_ITEMS:
                raise ConversationFull(MAX_CONVERSATION_ITEMS, first_seq + count)
            created = self._created_us if self._created_us is not None else stamp
            tip = Tip(created, stamp, first_seq + count)
            self.manifest.intent(self.conversation_id, tip, new=first_seq == 0)
            self._pending_end = None
            try:
                self._write_batch(body, count, first_seq, stamp)
            except OSError as exc:
                self._poison()
                raise Io(f"appending to the log failed: {exc}", exc.errno) from exc
            self._created_us = created
            self.manifest.commit(self.conversation_id, tip)
        finally:
            self._unlock()


class Restorer:
    """Writes items back with their original seqs and ``recorded_at`` (for ``convmem import``).

    Each batch is framed, written and ``fdatasync``\\ ed exactly as an append
    is, under the conversation's exclusive lock, with the manifest's intent and
    commit records. Use as a context manager.
    """

    def __init__(
        self, data_dir: str | os.PathLike[str], *, lock_timeout: float = 30.0, segment_bytes: int = 16 * 1024 * 1024
    ) -> None:
        self._store = FileStore(data_dir, lock_timeout=lock_timeout, segment_bytes=segment_bytes)
        self._convs: dict[tuple[str, str], _RestoringConversation] = {}

    def site_is_empty(self, site: str) -> bool:
        """True when ``site`` holds no conversation with a segment."""
        return not any(True for _ in self._store._walk(SiteName(site)))

    def conversation_is_empty(self, site: str, conversation_id: str) -> bool:
        return not _has_segments(
            layout.conversation_dir(self._store.root, SiteName(site), ConversationId(conversation_id))
        )

    def restore_batch(
        self,
        site: str,
        conversation_id: str,
        first_seq: int,
        recorded_at_us: int,
        payloads: Sequence[Mapping[str, Any]],
    ) -> SeqRange:
        """Append ``payloads`` as one batch occupying seqs ``first_seq..``, stamped ``recorded_at_us``.

        Raises :class:`RestoreConflict` unless the conversation holds exactly
        ``first_seq`` items and its last batch is not later than
        ``recorded_at_us``; the payload limits apply as for an append.
        """
        site, conversation_id = SiteName(site), ConversationId(conversation_id)
        body, count = encode_batch(payloads)
        key = (site, conversation_id)
        conv = self._convs.get(key)
        if conv is None:
            if len(self._convs) >= 64:
                old = self._convs.pop(next(iter(self._convs)))
                old.close()
            conv = _RestoringConversation(
                layout.conversation_dir(self._store.root, site, conversation_id),
                conversation_id,
                self._store.options,
                self._store._manifest(site),
            )
            self._convs[key] = conv
        started = time.monotonic()
        conv.restore(body, count, first_seq, recorded_at_us, started + self._store.options.lock_timeout, started)
        return SeqRange(first_seq, first_seq + count - 1)

    def close(self) -> None:
        for conv in self._convs.values():
            conv.close()
        self._convs.clear()
        self._store.close()

    def __enter__(self) -> Restorer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# --------------------------------------------------------------------------
# stats


@dataclass(frozen=True)
class ConversationStats:
    conversation_id: str
    items: int
    bytes: int
    #: ``items / MAX_CONVERSATION_ITEMS``.
    fill: float
    #: Set when the log's tail could not be read.
    error: str | None = None


@dataclass(frozen=True)
class SiteStats:
    site: str
    conversations: int
    items: int
    #: Every file under the site's directory (segments, indexes, manifest).
    bytes_on_disk: int
    largest: list[ConversationStats]
    damaged: list[ConversationStats]


def _probe_items(conv_dir: str, lock_timeout: float) -> tuple[int, int, str | None]:
    """``(items, segment bytes, error)``, counting from the last segment's last verified index entry."""
    segs = _committed_segments(conv_dir, lock_timeout)
    if not segs:
        return 0, 0, None
    base, size = segs[-1]
    path = os.path.join(conv_dir, layout.segment_name(base))
    total = sum(s for _, s in segs)
    with _open_ro(path) as fd:
        header = frame.decode_segment_header(os.pread(fd, SEGMENT_HEADER_SIZE, 0))
        if header is None:
            return base, total, f"{path}: segment header is invalid"
        idx = index.load(os.path.join(conv_dir, layout.index_name(base)), base, header.salt, size)
        start, seq = SEGMENT_HEADER_SIZE, base
        for s, off in reversed(list(zip(idx.seqs, idx.offsets, strict=True)) if idx else []):
            first = next(_walk(fd, off, size, header.salt), None)
            if isinstance(first, _Rec) and first.header.first_seq == s:
                start, seq = off, s
                break
        for rec in _walk(fd, start, size, header.salt):
            if isinstance(rec, _Bad):
                torn = rec.resume is None and classify_failure(fd, rec.offset, size, header.salt) == "torn"
                return seq, total, None if torn else f"{path} is damaged at byte {rec.offset}: {rec.why}"
            if rec.header.kind == KIND_BATCH:
                seq = rec.header.end_seq
    return seq, total, None


def _tree_bytes(path: str) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(FileNotFoundError):
                total += os.lstat(os.path.join(dirpath, name)).st_size
    return total


def stats(
    data_dir: str | os.PathLike[str], site: str | None = None, *, top: int = 10, lock_timeout: float = 30.0
) -> list[SiteStats]:
    """Per site: conversations, items, bytes on disk, and the ``top`` largest conversations.

    Item counts come from each conversation's last segment (its base seq plus
    the records after its last verified index entry), so this reads little.
    """
    root = os.path.abspath(os.fspath(data_dir))
    out: list[SiteStats] = []
    for s in _select_sites(root, site):
        convs: list[ConversationStats] = []
        damaged: list[ConversationStats] = []
        items = count = 0
        for cid, cdir in iter_conversations(root, s):
            try:
                n, nbytes, err = _probe_items(cdir, lock_timeout)
            except (OSError, Timeout) as exc:
                n, nbytes, err = 0, 0, str(exc)
            if n == 0 and err is None:
                continue  # a directory without items (its first append never completed)
            cs = ConversationStats(cid, n, nbytes, n / MAX_CONVERSATION_ITEMS, err)
            count += 1
            items += n
            convs.append(cs)
            if err is not None:
                damaged.append(cs)
            if len(convs) > 4 * max(top, 1):
                convs.sort(key=lambda c: (-c.items, c.conversation_id))
                del convs[top:]
        convs.sort(key=lambda c: (-c.items, c.conversation_id))
        out.append(SiteStats(s, count, items, _tree_bytes(layout.site_dir(root, s)), convs[:top], damaged))
    return out
