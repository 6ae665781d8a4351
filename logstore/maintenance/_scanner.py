"""Checking (and, under the exclusive lock, repairing) one conversation."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

import msgspec

from .. import fileio, frame, index, layout
from ..conversation import Tip
from ..errors import Timeout
from ..frame import KIND_IDENTITY, KIND_LOSS, KIND_SEAL, SEGMENT_HEADER_SIZE
from ..recovery import is_torn_creation
from ..segment import Gap, classify_failure, walk
from ._files import (
    _ConvSnapshot,
    _flocked,
    _open_ro,
    _open_rw,
    _replace_with_prefix,
    _snapshot,
)
from ._records import (
    _batch_problem,
    build_index,
)
from ._types import (
    BAD_BATCH,
    BAD_SEGMENT_HEADER,
    CORRUPT_RECORD,
    IDENTITY_MISMATCH,
    INDEX_INTERVAL,
    INDEX_MISMATCH,
    INDEX_MISSING,
    INDEX_SHORT,
    INDEX_STALE,
    LOCK_TIMEOUT,
    ORPHAN_INDEX,
    QUARANTINE_DIR,
    RECORD_AFTER_SEAL,
    RECORDED_AT_DECREASING,
    SEQ_GAP,
    SEQ_MISMATCH,
    STRAY_FILE,
    TORN_CREATION,
    TORN_TAIL,
    TRUNCATABLE_KINDS,
    UNSEALED_SEGMENT,
    Problem,
)

#: The index kinds: derived data that ``--repair`` rebuilds from the segment.
_INDEX_KINDS = (INDEX_MISSING, INDEX_STALE, INDEX_MISMATCH, INDEX_SHORT)

#: How many entries an index may lack after its last one before fsck calls it
#: short: a writer writes its entries sixteen at a time, so a killed writer
#: can leave up to fifteen unwritten, which the next opening scans past.
INDEX_SHORT_TOLERANCE = 16


@dataclass(frozen=True)
class Listed:
    """What the site's listing says of one conversation, read under the conversation's lock."""

    committed_next_seq: int  # 0 when the listing holds no commit for it
    pending_next_seq: int | None  # an intent's extent not yet followed by its commit


#: Reads the listing's entry for a conversation (None when the listing cannot be read).
ListingReader = Callable[[str], Listed | None]


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

    def __init__(self, root: str, site: str, cid: str, snap: _ConvSnapshot, lock_timeout: float = 30.0) -> None:
        self.root = root
        self.lock_timeout = lock_timeout
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
        self.segments = 0
        self.torn: tuple[Problem, int, int] | None = None  # problem, segment index, offset
        self.torn_first_seq = 0  # first seq the torn record would have held
        self.torn_acknowledged = False
        self.torn_creation: Problem | None = None  # an unfinished first segment (never acknowledged)
        self.index_absent = False  # the last segment has no index file (see _index_entries)
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
            f"{detail} (first affected seq: {seq})",
            "none: acknowledged data is never removed by --repair; inspect it with `convmem dump FILE`, "
            "restore the conversation from a backup, or drop the log from here on with --truncate-at-corruption",
        )
        if first:
            self.damage_problem = p

    # ------------------------------------------------------------- the scan

    def scan(self) -> None:
        expected: int | None = 0
        last_ts = 0
        segs = self.snap.segments
        self.segments = len(segs)
        for i, (base, size) in enumerate(segs):
            last_seg = i == len(segs) - 1
            path = self._path(layout.segment_name(base))
            try:
                fd = os.open(path, os.O_RDONLY)
            except FileNotFoundError:
                continue  # removed under us: only possible for a dropped site
            try:
                # Bytes read from disk, the preallocated zeros of the last segment included
                # (``size`` stops at its data end: the records are walked up to there).
                self.bytes += max(size, os.fstat(fd).st_size)
                header = frame.decode_segment_header(os.pread(fd, SEGMENT_HEADER_SIZE, 0))
                if header is None and is_torn_creation(fd, base, last_seg, len(segs) == 1):
                    self.torn_creation = self.problem(
                        path,
                        0,
                        TORN_CREATION,
                        f"the conversation's first segment ({size} bytes) was never finished: its first sector, "
                        "where the header goes, is all zeros (a power cut during its creation); it holds no "
                        "acknowledged item",
                        "none needed: the engine treats the conversation as empty and rewrites the file at its "
                        "next append; --repair removes it now",
                    )
                    self.torn_creation.resolves_itself = True
                    continue
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
                entries = self._index_entries(base, header.salt, path, size, last_seg)
                verified: set[int] = set()
                sealed = False
                batch_problem = _batch_problem
                # Entries a rebuild would add after the index's last one (until the first damage).
                indexed_to = max(entries, default=0)
                missing_entries = 0
                walking_whole = True
                for rec in walk(fd, SEGMENT_HEADER_SIZE, size, header.salt):
                    if isinstance(rec, Gap):
                        self._bad(fd, path, i, last_seg, size, header.salt, rec, expected)
                        expected = None
                        walking_whole = False
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
                            "none: the items themselves are intact and readable",
                        )
                    else:
                        last_ts = ts
                    if kind == KIND_SEAL:
                        sealed = True
                        expected = first
                        continue
                    if kind == KIND_IDENTITY:
                        # A claimed conversation's identity: no seqs, no items; only ever the first record of
                        # its first segment, where the reader takes it (anywhere else it fails to read it).
                        if base != 0 or offset != SEGMENT_HEADER_SIZE:
                            self.damaged(
                                path, i, offset, first, BAD_BATCH,
                                "an identity record, which belongs only at the start of the conversation's first "
                                "segment: reads fail on it here",
                            )
                        elif (named := frame.identity_of(body)) != self.cid:
                            self.problem(
                                path, offset, IDENTITY_MISMATCH,
                                f"the segment's identity record names conversation {named!r}, not {self.cid!r}",
                                "none: reads of this conversation are not affected; if a power cut moved this "
                                "directory back into the pool it would settle under the other name, so restore "
                                "the conversation from a backup (or export it, forget it and import it again)",
                            )
                        expected = first
                        continue
                    if kind == KIND_LOSS:
                        # Seqs a repair recorded as lost: not a problem, they read as ItemsLost.
                        expected = first + count
                        self.seen_end = max(self.seen_end, expected)
                        if self.damage is None:
                            if self.created_us is None:
                                self.created_us = ts
                            self.last_us = ts
                            self.next_seq = expected
                        continue
                    why = batch_problem(body, count, kind)
                    if why is not None:
                        self.damaged(path, i, offset, first, BAD_BATCH, why)
                    if walking_whole and offset - indexed_to >= INDEX_INTERVAL and offset > SEGMENT_HEADER_SIZE:
                        missing_entries += 1
                        indexed_to = offset
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
                if self.index_absent and last_seg:
                    if missing_entries >= INDEX_SHORT_TOLERANCE:
                        p = self._index_problem(
                            base,
                            INDEX_MISSING,
                            None,
                            f"the segment has no index file, and its records call for {missing_entries} entries",
                        )
                        self._index_note(p, last_seg)  # a crash before the unsynced index reached the disk
                elif missing_entries > INDEX_SHORT_TOLERANCE and base not in self.rebuild_index:
                    last = max(entries, default=None)
                    where = f"its last entry points at segment byte {last}" if last is not None else "it has no entry"
                    self._index_problem(
                        base,
                        INDEX_SHORT,
                        None,
                        f"the index stops short of its segment: {where}, and {missing_entries} entries are "
                        f"missing for the records after it (the segment is {size} bytes)",
                    )
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
                        "none: the items are readable; report this as an engine defect",
                    )
            finally:
                os.close(fd)
        self._check_names()
        self._settle_index_notes()

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
                "none: not engine data; move it out of the data directory if it is not needed",
            )

    def _bad(
        self, fd: int, path: str, seg_i: int, last_seg: bool, size: int, salt: int, rec: Gap, expected: int | None
    ) -> None:
        if last_seg and classify_failure(fd, rec.offset, size, salt, expected) == "torn":
            p = self.problem(
                path,
                rec.offset,
                TORN_TAIL,
                f"{size - rec.offset} bytes of an unfinished write ({rec.why})",
                "truncate the segment here (--repair)",
            )
            self.torn = (p, seg_i, rec.offset)
            self.torn_first_seq = self.next_seq if self.damage is None else (expected or 0)
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

    def _index_entries(
        self, base: int, salt: int, seg_path: str, size: int, last_seg: bool
    ) -> dict[int, tuple[int, int]]:
        """The index's entries as ``{segment offset: (seq, offset in the index file)}``.

        A missing or stale index, or entries out of order, are reported here.
        """
        data = self.snap.indexes.get(base)
        if data is None and last_seg:
            # The writer creates the last segment's index file with its first group of entries:
            # judged after the walk, from how many entries the segment calls for.
            self.index_absent = True
            return {}
        if data is None:
            p = self._index_problem(base, INDEX_MISSING, None, "the segment has no index file")
            self._index_note(p, last_seg)  # a crash before the unsynced index reached the disk
            return {}
        if len(data) < index.INDEX_HEADER_SIZE:
            p = self._index_problem(base, INDEX_STALE, 0, "index header is truncated")
            self._index_note(p, last_seg)  # the file's name reached the disk, not (all of) its bytes
            return {}
        magic, version, _r, ibase, isalt = index.INDEX_HEADER.unpack_from(data)
        if magic != index.INDEX_MAGIC or version != 1 or ibase != base or isalt != salt:
            zeroed = not any(data[: index.INDEX_HEADER_SIZE])
            p = self._index_problem(
                base,
                INDEX_STALE,
                0,
                "index header is all zeros (its bytes never reached the disk)"
                if zeroed
                else "index header does not belong to this segment (wrong magic, base seq or salt)",
            )
            if zeroed:
                self._index_note(p, last_seg)
            elif p is not None:
                # Not a power cut's work (it zeroes what it loses; it does not write another
                # header): a file from elsewhere, an earlier segment of this name or a copy,
                # is in the directory. The engine ignores it and rebuilds the index (see
                # Conversation._sealed and _open_active), so nothing is lost, but how it got
                # there is for the operator to find out: a problem, not a note.
                p.action += "; the engine ignores it and rebuilds the index from the segment, so no data is at risk"
            return {}
        out: dict[int, tuple[int, int]] = {}
        prev_seq, prev_off = -1, 0
        whole = len(data) - (len(data) - index.INDEX_HEADER_SIZE) % index.ENTRY_SIZE
        for n, (rel, off) in enumerate(index.ENTRY.iter_unpack(data[index.INDEX_HEADER_SIZE : whole])):
            seq = base + rel
            if seq <= prev_seq or off <= prev_off or off >= size:
                at = index.INDEX_HEADER_SIZE + n * index.ENTRY_SIZE
                p = self._index_problem(
                    base,
                    INDEX_MISMATCH,
                    at,
                    f"entry {n} (seq {seq}, byte {off}) is out of order or past the segment's end",
                )
                # A power cut zeroes entries it lost (byte 0 is never an entry's offset), and
                # can keep entries of the active segment's records whose bytes it lost. Other
                # bad entries (pointing inside the segment, out of order) are not its work:
                # they stay problems, though the engine drops them and rebuilds the index too.
                if off == 0 or (last_seg and off >= size):
                    self._index_note(p, last_seg)
                return out
            out[off] = (seq, index.INDEX_HEADER_SIZE + n * index.ENTRY_SIZE)
            prev_seq, prev_off = seq, off
        return out

    def _index_note(self, p: Problem | None, last_seg: bool) -> None:
        """Mark an index problem a note: what a crash leaves, and what the engine rebuilds by itself.

        An index is derived data: never synced, and each entry is verified against
        its segment before use (``index.load`` drops malformed entries, a read whose
        entry does not verify rebuilds the index). For the active segment the engine
        writes the index afresh when it next opens the conversation for an append
        (``Conversation._open_active``: a missing, foreign or malformed index is not
        kept); for a sealed one, the first read that reaches the segment builds the
        index from it and saves it (``Conversation._sealed``). Neither saves around
        damage, so :meth:`_settle_index_notes` takes the note back from a damaged segment.
        """
        if p is None:
            return
        p.resolves_itself = True
        p.action = (
            "none needed: the engine ignores it and writes the index afresh from the segment when it next "
            "opens the conversation for an append (reads meanwhile scan the segment); --repair rebuilds it now"
            if last_seg
            else "none needed: the engine ignores it, rebuilds the index from the segment and saves it the first "
            "time a read reaches this segment; --repair rebuilds it now"
        )

    def _settle_index_notes(self) -> None:
        """An index of a segment with damage in it is not rebuilt by the engine: a problem again."""
        damaged = {
            os.path.basename(p.file)[:20]
            for p in self.problems
            if p.kind in TRUNCATABLE_KINDS or p.kind in (RECORDED_AT_DECREASING, UNSEALED_SEGMENT)
        }
        for p in self.problems:
            if p.kind in _INDEX_KINDS and p.resolves_itself and os.path.basename(p.file)[:20] in damaged:
                p.resolves_itself = False
                p.action = (
                    "rebuild the index from its segment (--repair); the engine does not save an index "
                    "of a segment with damage in it"
                )

    def _index_problem(self, base: int, kind: str, offset: int | None, detail: str) -> Problem | None:
        if base in self.rebuild_index and kind == INDEX_MISMATCH:
            return None  # one problem per index file is enough
        self.rebuild_index.add(base)
        return self.problem(
            self._path(layout.index_name(base)), offset, kind, detail, "rebuild the index from its segment (--repair)"
        )

    def judge_tail(self, listed: Listed | None) -> None:
        """Say whether a torn tail held acknowledged items, from the listing's last commit.

        The engine syncs a batch before it logs the commit and answers, so a
        record that starts at or past the committed extent was never
        acknowledged: the engine cuts it at the conversation's next append.
        One that starts before it held acknowledged items (see the
        ``acknowledged-lost`` problem the listing check adds).
        """
        if self.torn is None:
            return
        p = self.torn[0]
        committed = listed.committed_next_seq if listed is not None else 0
        first = self.torn_first_seq
        if self.damage is None and first < committed:
            self.torn_acknowledged = True
            p.detail += (
                f"; it holds seqs from {first} on, which the listing recorded as committed "
                f"(next_seq={committed}): acknowledged items were lost"
            )
            p.action = "truncate the segment here, keeping a copy in quarantine/ (--repair)"
            return
        if self.damage is None:
            known = f"the listing's commits end before seq {committed}" if committed else "the listing has no commit"
            p.detail += f"; never acknowledged ({known})"
            p.action = "none needed: the engine cuts it at the conversation's next append; --repair cuts it now"
            p.resolves_itself = True

    # --------------------------------------------------------------- repair

    def repair(self, truncate_at_corruption: bool) -> bool:
        """Carry out what can be repaired (caller holds the exclusive lock). True when the log was cut."""
        torn = self.torn
        cut = False
        if torn is not None and self.damage is None:
            p, seg_i, offset = torn
            base = self.snap.segments[seg_i][0]
            kept = ""
            if self.torn_acknowledged:
                qdir = self._quarantine_copy([base])
                kept = f"; the original segment is in {qdir}"
            with _open_rw(self._path(layout.segment_name(base))) as fd:
                fileio.truncate(fd, offset)
            self.snap.segments[seg_i] = (base, offset)
            self.rebuild_index.add(base)
            p.repaired = True
            why = "it held acknowledged items, see below" if self.torn_acknowledged else "never acknowledged"
            p.action = f"truncated the segment to {offset} bytes ({why}){kept}"
        elif torn is not None:
            torn[0].action = "none: the log is damaged before it (see above); --truncate-at-corruption cuts both"
        if self.torn_creation is not None:
            self._remove_torn_creation(self.torn_creation)
        if self.damage is not None and truncate_at_corruption:
            self._truncate_at_corruption()
            cut = True
        self._repair_orphans()
        for base in sorted(self.rebuild_index):
            ok = self._rebuild_index(base)
            for p in self.problems:
                if p.kind in _INDEX_KINDS and p.file == self._path(layout.index_name(base)):
                    p.repaired = ok
                    p.action = "rebuilt the index from its segment" if ok else p.action
        return cut

    def _remove_torn_creation(self, p: Problem) -> None:
        """Remove an unfinished first segment (and any index of it), as if its creation never began."""
        for name in (layout.segment_name(0), layout.index_name(0)):
            try:
                fileio.unlink(self._path(name))
            except FileNotFoundError:
                pass
        fileio.fsync_dir(self.snap.path)
        self.snap.segments = [(b, s) for b, s in self.snap.segments if b != 0]
        p.repaired = True
        p.action = "removed the unfinished segment (it held no acknowledged item)"

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
                    fileio.unlink(p.file)
                p.repaired = True
                p.action = "removed the index (derived data; its segment does not exist)"

    def _quarantine_copy(self, bases: list[int]) -> str:
        """Copy (and sync) these segments into a new folder under ``DATA/quarantine/``; return its path."""
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        qdir = os.path.join(
            self.root,
            QUARANTINE_DIR,
            f"{stamp}-{layout.encode_name(self.site)}-"
            f"{layout.encode_name(self.cid)}-{time.time_ns() % 1_000_000_000:09d}",
        )
        fileio.makedirs_durable(qdir)
        for base in bases:
            name = layout.segment_name(base)
            fileio.copy_file(self._path(name), os.path.join(qdir, name))
            with _open_ro(os.path.join(qdir, name)) as qfd:
                fileio.fsync(qfd)
        fileio.fsync_dir(qdir)
        return qdir

    def _truncate_at_corruption(self) -> None:
        dmg = self.damage
        assert dmg is not None
        segs = self.snap.segments
        cut = segs[dmg.seg_i :]
        qdir = self._quarantine_copy([b for b, _ in cut])
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
        # The listing only grows by itself: drop the conversation from it (marked for a rebuild
        # from the logs at the next open) before its log shrinks; check writes the true listing after.
        from ._manifest import _mark_manifest_incomplete  # here: _manifest imports this module

        _mark_manifest_incomplete(self.root, self.site, {self.cid}, self.lock_timeout)
        with contextlib.ExitStack() as stack:
            held = []
            for base, _size in reversed(cut):
                seg = self._path(layout.segment_name(base))
                with contextlib.suppress(FileNotFoundError):
                    fileio.unlink(self._path(layout.index_name(base)))
                fd = stack.enter_context(_open_rw(seg))
                held.append(fd)
                if base == first_base and keep_first:
                    _replace_with_prefix(seg, fd, dmg.offset)
                else:
                    fileio.unlink(seg)
            fileio.fsync_dir(self.snap.path)
            # Only once the removals are durable, shrink the old files to nothing: an engine holding
            # one open sees its size change, drops what it knew (a remembered Corrupted too) and reloads.
            for fd in held:
                fileio.truncate(fd, 0)
        self.snap.segments = segs[: dmg.seg_i] + ([(first_base, dmg.offset)] if keep_first else [])
        if keep_first:
            self.rebuild_index.add(first_base)
        action = (
            f"dropped {lost} from byte {dmg.offset} of {cut[0][0]:020d}.seg on; the original segments are in {qdir}"
        )
        for p in self.problems:
            if p.kind in TRUNCATABLE_KINDS or (
                p.kind in (TORN_TAIL, RECORDED_AT_DECREASING, UNSEALED_SEGMENT) and _at_or_after(p, segs, dmg)
            ):
                p.repaired = True
                p.action = action
            elif p.kind in _INDEX_KINDS:
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
        return _ConvResult(self.problems, tip, damaged, truncated, self.records, self.bytes, self.segments)


def _at_or_after(p: Problem, segs: list[tuple[int, int]], dmg: _Damage) -> bool:
    """True when problem ``p`` lies in the part of the log that was cut."""
    name = os.path.basename(p.file)
    base = layout.parse_segment_name(name)
    if base is None:
        return False
    first_base = segs[dmg.seg_i][0]
    return base > first_base or (base == first_base and (p.offset or 0) >= dmg.offset)


def _check_conversation(
    root: str,
    site: str,
    cid: str,
    conv_dir: str,
    repair: bool,
    truncate: bool,
    lock_timeout: float,
    listing: ListingReader | None = None,
) -> _ConvResult | None:
    """Scan one conversation: first from a snapshot taken under its shared lock, then, if
    anything looks wrong, again under the lock (exclusive when repairing).

    ``listing`` reads the site listing's entry for the conversation; it is
    consulted under the conversation's lock (so no append of it is half done)
    to tell a torn tail that was never acknowledged from one that was.
    """
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
            sc = _ConvScanner(root, site, cid, snap, lock_timeout)
            sc.scan()
            if sc.torn is not None:
                sc.judge_tail(listing(cid) if listing is not None else None)
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
