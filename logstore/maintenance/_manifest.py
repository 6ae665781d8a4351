"""Reading the site manifest read-only, comparing it with the conversations, writing a repaired one."""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import msgspec
import xxhash

from .. import bootid, layout, manifest, manifestcodec, manifestfiles
from ..conversation import Tip
from ..errors import Timeout
from ._files import (
    _flocked,
    _has_segments,
    _snapshot,
)
from ._scanner import Listed, _ConvScanner
from ._types import (
    ACKNOWLEDGED_LOST,
    INTENT_UNRESOLVED,
    LOCK_TIMEOUT,
    MANIFEST_DAMAGED,
    MANIFEST_INCOMPLETE,
    MANIFEST_MISSING,
    MANIFEST_STALE,
    Problem,
)


@dataclass
class _ManifestState:
    epoch: int | None
    complete: bool
    entries: dict[str, manifestcodec.Entry]
    #: ``(kind, file, offset, detail, note)``; ``note`` is the action text of a state a crash
    #: leaves that the engine resolves by itself (None for a problem).
    problems: list[tuple[str, str, int | None, str, str | None]]
    #: Where reading the activity log can resume: its inode, salt and the end of
    #: the last whole record (0 when the log is unusable).
    log_ino: int = 0
    log_salt: int = 0
    log_done: int = 0
    #: Conversations with an intent logged before this boot's first boot record: a power cut
    #: since may have lost their commits, and the engine re-reads their logs at its first listing.
    recover: set[str] = field(default_factory=set)
    #: Reading records logged before this boot (no boot record of this boot seen yet).
    before_boot: bool = True
    #: The log holds a walked record of this boot: the engine will not look for conversations
    #: the listing does not know (see manifestrecovery.ListingRecovery._walk_unknown).
    walked: bool = False
    #: The engine will rebuild the whole listing from the conversations' logs at its next
    #: listing (a damaged or incomplete activity log marks the listing incomplete).
    rebuild_owed: bool = False
    #: How many intents each conversation has in the epoch's log as read so far: an intent
    #: logged after a check under the conversation's lock changes it (see _write_manifest).
    intents: dict[str, int] = field(default_factory=dict)


def _read_manifest(site_dir: str) -> _ManifestState:
    """The committed listing as the engine would load it, without changing anything."""
    epochs = manifestcodec.epoch_files(site_dir)
    snaps = [e for e, kinds in epochs.items() if "snap" in kinds]
    if not snaps:
        return _ManifestState(
            None,
            False,
            {},
            [
                (
                    MANIFEST_MISSING,
                    os.path.join(site_dir, "manifest-*.snap"),
                    None,
                    "the site has no manifest snapshot",
                    None,
                )
            ],
        )
    epoch = max(snaps)
    spath = manifestcodec.snap_path(site_dir, epoch)
    try:
        entries, complete = manifestcodec.decode_snapshot(manifestcodec.read_or_damaged(spath), epoch)
    except manifestcodec.Damaged:
        return _ManifestState(
            epoch, False, {}, [(MANIFEST_DAMAGED, spath, 0, "the snapshot fails its checksums", None)]
        )
    state = _ManifestState(epoch, complete, {e.conversation_id: e for e in entries}, [])
    if not complete:
        # Written so by the engine itself (a lost or damaged log, see manifest.SiteManifest) or by
        # a repair that is cutting a log; a crash can stop either before the rebuild. The engine
        # rebuilds an incomplete listing at its next listing.
        state.rebuild_owed = True
        state.problems.append(
            (
                MANIFEST_INCOMPLETE,
                spath,
                16,
                "the snapshot is marked incomplete (a full rebuild is owed)",
                "none needed: the engine rebuilds the whole listing from the conversations' logs at the site's "
                "next listing; --repair rewrites the manifest now",
            )
        )
    lpath = manifestcodec.log_path(site_dir, epoch)
    try:
        with open(lpath, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        # The snapshot and its log are each written durably (write_file_atomic), the log
        # second: a crash between the two leaves this (manifestfiles.ManifestFiles._current_epoch_locked).
        if any(e < epoch and "log" in kinds for e, kinds in epochs.items()):
            note = (
                "none needed: a crash came between writing this epoch's snapshot and its log, so the snapshot "
                "holds the whole listing; the engine creates the empty log when it next opens the site's "
                "listing; --repair rewrites the manifest now"
            )
        else:
            note = (
                "none needed: the engine starts a new epoch marked incomplete when it next opens the site's "
                "listing, and rebuilds the listing from the conversations' logs; --repair rewrites it now"
            )
        state.problems.append((MANIFEST_DAMAGED, lpath, None, "the current epoch has no activity log", note))
        return state
    head = data[: manifestcodec.LOG_HEADER.size]
    if len(head) < manifestcodec.LOG_HEADER.size:
        # Not a crash's work (the log is created whole and synced before it is used); the engine
        # would start a new epoch and rebuild the listing, but the file was damaged: a problem.
        state.problems.append((MANIFEST_DAMAGED, lpath, 0, "the activity log's header is truncated", None))
        return state
    magic, e, salt, check = manifestcodec.LOG_HEADER.unpack(head)
    if magic != manifestcodec.LOG_MAGIC or e != epoch or xxhash.xxh3_64_intdigest(head[:24]) != check:
        state.problems.append((MANIFEST_DAMAGED, lpath, 0, "the activity log's header fails its checksum", None))
        return state
    state.log_salt, state.log_done = salt, manifestcodec.LOG_HEADER.size
    state.log_ino = os.stat(lpath).st_ino
    _apply_log(state, lpath, data[manifestcodec.LOG_HEADER.size :], manifestcodec.LOG_HEADER.size)
    return state


def _iter_log(data: bytes, salt: int) -> Iterator[tuple[int, int, list[Any] | None]]:
    """``manifestcodec.iter_log_records(data, salt, 0)``, with its common case (whole, valid records) inlined.

    At the first record that is not plainly valid it hands over to the
    engine's reader, which resynchronises after damage exactly as the engine does.
    """
    unpack = manifestcodec.REC_HEADER.unpack_from
    hsize = manifestcodec.REC_HEADER.size
    magic_ok = manifestcodec.REC_MAGIC
    xxh3 = xxhash.xxh3_64_intdigest
    decode = _MSGPACK.decode
    pos, n = 0, len(data)
    while pos + hsize <= n:
        magic, _r, blen, check = unpack(data, pos)
        end = pos + hsize + blen
        if (
            magic != magic_ok
            or blen >= 4096
            or end > n
            or xxh3(data[pos + 4 : pos + 8] + data[pos + hsize : end], salt) != check
        ):
            break
        try:
            rec = decode(data[pos + hsize : end])
        except msgspec.DecodeError:
            break
        yield pos, end, rec
        pos = end
    for off, end, rec in manifestcodec.iter_log_records(data, salt, pos):
        yield off, end, rec


_MSGPACK = msgspec.msgpack.Decoder()

#: What the engine does about a damaged activity log (see manifestapply.ManifestApply._tail and _refresh).
_REBUILD_NOTE = (
    "none needed: the engine marks its listing incomplete on reading this and rebuilds the whole listing "
    "from the conversations' logs at the site's next listing; --repair rewrites the manifest now"
)


def _apply_log(state: _ManifestState, lpath: str, data: bytes, base: int) -> None:
    """Apply the log records in ``data`` (the log's bytes from offset ``base``) to ``state``."""
    done = 0
    apply = _apply_log_record
    entries = state.entries
    for off, end, rec in _iter_log(data, state.log_salt):
        if rec is None:
            # Commits are appended unsynced (an intent's sync covers the records before it), so
            # a power cut can zero or tear a record and keep later ones: the power-cut simulator
            # leaves both all-zero and half-written records with whole ones after them. Whatever
            # the cause, the engine marks its listing incomplete at a damaged record and rebuilds
            # it from the conversations' logs (the listing is derived from them): nothing is lost.
            # So it is a note, wherever in the log it is.
            state.rebuild_owed = True
            state.problems.append(
                (MANIFEST_DAMAGED, lpath, base + off, "an activity log record fails its checksum", _REBUILD_NOTE)
            )
            continue
        if rec and rec[0] == manifestcodec.WALKED and len(rec) > 1 and rec[1] == bootid.boot_id:
            state.walked = True
        if state.before_boot and rec:
            # As the engine's loader does: note who was written before this boot (see ManifestApply._apply).
            if rec[0] == manifestcodec.BOOT and len(rec) > 1 and rec[1] == bootid.boot_id:
                state.before_boot = False
            elif rec[0] == manifestcodec.INTENT and len(rec) > 1:
                state.recover.add(rec[1])
        if rec and rec[0] == manifestcodec.INTENT and len(rec) > 1 and isinstance(rec[1], str):
            state.intents[rec[1]] = state.intents.get(rec[1], 0) + 1
        apply(entries, rec)
        done = end
    state.log_done = base + done if done else state.log_done
    if state.log_done < base + len(data):
        # Read under the manifest lock, so no writer is half way through a record.
        # A torn or zeroed append. Under the manifest lock the engine marks the listing
        # incomplete at bytes that are not a whole record and rebuilds it (manifestapply.ManifestApply._tail).
        extra = base + len(data) - state.log_done
        state.rebuild_owed = True
        state.problems.append(
            (
                MANIFEST_DAMAGED,
                lpath,
                state.log_done,
                f"{extra} bytes at the end of the activity log are not a record",
                _REBUILD_NOTE,
            )
        )


def _refresh_manifest(site_dir: str, state: _ManifestState | None) -> _ManifestState:
    """``state`` brought up to date by reading only what was appended to its log, or a full re-read."""
    if state is None or state.epoch is None or not state.log_done:
        return _read_manifest(site_dir)
    epochs = manifestcodec.epoch_files(site_dir)
    if max((e for e, kinds in epochs.items() if "snap" in kinds), default=None) != state.epoch:
        return _read_manifest(site_dir)  # compacted since: a new snapshot holds it all
    lpath = manifestcodec.log_path(site_dir, state.epoch)
    try:
        with open(lpath, "rb") as f:
            if os.fstat(f.fileno()).st_ino != state.log_ino:
                return _read_manifest(site_dir)
            f.seek(state.log_done)
            data = f.read()
    except FileNotFoundError:
        return _read_manifest(site_dir)
    _apply_log(state, lpath, data, state.log_done)
    return state


def _apply_log_record(entries: dict[str, manifestcodec.Entry], rec: list[Any]) -> None:
    """Merge one activity-log record, monotonically, as the engine does."""
    try:
        kind, conv, created, last, nxt = rec[:5]
    except (ValueError, TypeError):
        return
    if kind == manifestcodec.INTENT and len(rec) >= 8:
        _apply_log_record(entries, [manifestcodec.COMMIT, conv, *rec[5:8]])  # the commit it carries comes first
    e = entries.get(conv)
    if kind == manifestcodec.INTENT:
        if e is None:
            e = entries[conv] = manifestcodec.Entry(conv, 0, 0, 0)
        if nxt > e.next_seq and (e.pending is None or nxt > e.pending[2]):
            e.pending = (created, last, nxt)
        return
    if (
        kind == manifestcodec.RESOLVE and e is not None and e.pending is not None and len(rec) > 5
        and e.pending[2] == rec[5]
    ):
        e.pending = None
    if nxt <= 0:
        return
    if e is None:
        e = entries[conv] = manifestcodec.Entry(conv, created, last, 0)
    if nxt > e.next_seq:
        e.created_us, e.last_us, e.next_seq = created, last, nxt
    if e.pending is not None and e.pending[2] <= e.next_seq:
        e.pending = None


def _committed(e: manifestcodec.Entry | None) -> Tip | None:
    return Tip(e.created_us, e.last_us, e.next_seq) if e is not None and e.next_seq > 0 else None


def _describe(t: Tip | None) -> str:
    return "no items" if t is None else f"next_seq={t.next_seq} created_us={t.created_us} last_us={t.last_us}"


class _ListingReader:
    """Reads one site's listing entries on demand, incrementally (for :func:`_check_conversation`)."""

    def __init__(self, site_dir: str, lock_timeout: float) -> None:
        self.site_dir = site_dir
        self.lock_timeout = lock_timeout
        self.state: _ManifestState | None = None

    def __call__(self, conversation_id: str) -> Listed | None:
        try:
            self.state = _read_manifest_locked(self.site_dir, self.lock_timeout, self.state)
        except (Timeout, OSError):
            return None
        if self.state.epoch is None:
            return None
        e = self.state.entries.get(conversation_id)
        if e is None:
            return Listed(0, None)
        return Listed(e.next_seq, e.pending[2] if e.pending is not None else None)


@dataclass
class _Verified:
    """What the listing check established for a conversation under its lock."""

    truth: Tip | None  # the log's extent
    listed: Tip | None  # the listing's committed extent at that moment
    pending: tuple[int, int, int] | None  # the orphaned intent seen then (None if none)
    intents: tuple[int | None, int] = (None, 0)  # (epoch, intents of it in that epoch's log) then


def _read_manifest_locked(site_dir: str, lock_timeout: float, state: _ManifestState | None = None) -> _ManifestState:
    """:func:`_refresh_manifest` under the manifest's lock, held shared: no writer is mid-record."""
    with _flocked(os.path.join(site_dir, manifestfiles.LOCK_FILE), False, lock_timeout, create=False):
        return _refresh_manifest(site_dir, state)


def _write_manifest(
    root: str,
    site: str,
    tips: Mapping[str, Tip | None],
    truncated: set[str],
    whole_site: bool,
    lock_timeout: float,
    verified: Mapping[str, _Verified] | None = None,
) -> None:
    """Write the site's listing as a new, complete epoch (under the manifest lock).

    The scanned extents are the truth. A larger committed extent in the
    current manifest wins only when it is newer than the scan: not for a log
    this run cut, and not for a conversation whose extent was verified under
    its lock (``verified``) while the listing still says what it said then
    (a commit logged since is an append since, and wins). Pending intents are
    carried over for the engine to resolve, except the orphaned ones verified
    here: the rewritten entry is their resolution.

    Invariant: a verified conversation's pending intent is dropped only when no
    intent of it was logged since it was verified under its lock (same epoch,
    same count of its intents). Comparing the pending intent alone is not
    enough: a live writer's intent for a batch ending at or below a dead
    writer's leaves the pending intent as it was, and dropping it would leave
    that batch unlisted once its writer is gone with its commit owed.
    """
    verified = verified or {}
    sdir = layout.site_dir(root, site)
    m = manifest.SiteManifest(sdir, probe=lambda _c, _w, _s: None, walk=lambda: iter(()), lock_timeout=lock_timeout)
    try:
        m._flock()
        try:
            state = _read_manifest(sdir)
            out: dict[str, manifestcodec.Entry] = (
                {}
                if whole_site
                else {
                    c: manifestcodec.Entry(c, e.created_us, e.last_us, e.next_seq, e.pending)
                    for c, e in state.entries.items()
                }
            )
            for conv, tip in tips.items():
                out.pop(conv, None)
                if tip is not None:
                    out[conv] = manifestcodec.Entry(conv, tip.created_us, tip.last_us, tip.next_seq)
            for conv, e in state.entries.items():
                mine = out.get(conv)
                if conv in truncated:
                    continue
                v = verified.get(conv)
                if (
                    v is not None
                    and _committed(e) == v.listed
                    and e.pending in (None, v.pending)
                    and (state.epoch, state.intents.get(conv, 0)) == v.intents
                ):
                    continue  # nothing happened to it since it was verified: the log's extent stands
                if e.next_seq > 0 and (mine is None or e.next_seq > mine.next_seq):
                    if mine is not None or (
                        conv not in tips and _has_segments(layout.conversation_dir(root, site, conv))
                    ):
                        out[conv] = mine = manifestcodec.Entry(conv, e.created_us, e.last_us, e.next_seq)
                if e.pending is not None and (mine is None or e.pending[2] > mine.next_seq):
                    if mine is None:
                        out[conv] = mine = manifestcodec.Entry(conv, 0, 0, 0)
                    mine.pending = e.pending
            epochs = manifestcodec.epoch_files(sdir)
            epoch = max(epochs, default=0) + 1
            m._write_epoch(epoch, sorted(out.values(), key=lambda e: e.conversation_id), True)
            m._current_epoch_locked()
        finally:
            m._funlock()
    finally:
        m.close()


def _mark_manifest_incomplete(root: str, site: str, drop: set[str], lock_timeout: float) -> None:
    """Write the site's listing again without ``drop``, as an epoch marked incomplete.

    Done (durably) before a repair removes conversations' logs: an engine's listing
    only grows by itself, so it would keep listing a removed conversation. An
    incomplete listing is rebuilt from the logs at the next open, which adds back
    whatever part of a dropped conversation a power cut left on disk.
    """
    sdir = layout.site_dir(root, site)
    if not os.path.isdir(sdir):
        return
    m = manifest.SiteManifest(sdir, probe=lambda _c, _w, _s: None, walk=lambda: iter(()), lock_timeout=lock_timeout)
    try:
        m._flock()
        try:
            state = _read_manifest(sdir)
            entries = [
                manifestcodec.Entry(c, e.created_us, e.last_us, e.next_seq, e.pending)
                for c, e in state.entries.items()
                if c not in drop
            ]
            epoch = max(manifestcodec.epoch_files(sdir), default=0) + 1
            m._write_epoch(epoch, sorted(entries, key=lambda e: e.conversation_id), False)
            m._current_epoch_locked()
        finally:
            m._funlock()
    finally:
        m.close()


def _check_manifest(
    root: str,
    site: str,
    tips: dict[str, Tip | None],
    damaged: set[str],
    only: str | None,
    lock_timeout: float,
    verified: dict[str, _Verified] | None = None,
) -> list[Problem]:
    """Compare the site's listing with the scanned conversations; re-verify each difference under locks.

    Each difference, and each intent without its commit, is looked at again
    under the conversation's lock (no append of it is then half done) and
    recorded in ``verified``. It is then one of: an orphaned intent (its
    writer stopped before the commit; the engine resolves it by reading the
    log at the next listing: a note), a stale listing (behind the log), or
    acknowledged items lost (the log ends before the committed extent).
    """
    verified = {} if verified is None else verified
    sdir = layout.site_dir(root, site)
    try:
        state = _read_manifest_locked(sdir, lock_timeout)
    except Timeout as exc:
        return [Problem(site, None, sdir, None, LOCK_TIMEOUT, f"could not lock the manifest: {exc}", "not checked")]
    out: list[Problem] = []
    action = "rewrite the manifest from the conversations (--repair)"
    if only is None:
        has_data = any(t is not None for t in tips.values()) or bool(damaged)
        for kind, file, offset, detail, note in state.problems:
            if kind == MANIFEST_MISSING and not has_data:
                continue
            out.append(
                Problem(site, None, file, offset, kind, detail, note or action, resolves_itself=note is not None)
            )
        if any(p.kind in (MANIFEST_MISSING, MANIFEST_DAMAGED) and p.offset in (None, 0) for p in out):
            return out  # nothing to compare against
    suspects = [c for c, t in tips.items() if c not in damaged and _committed(state.entries.get(c)) != t]
    if only is None:
        suspects += [c for c, e in state.entries.items() if e.next_seq > 0 and c not in tips and c not in damaged]
    suspects += [
        c
        for c, e in state.entries.items()
        if e.pending is not None and c not in damaged and c not in suspects and (only is None or c == only)
    ]
    spath = manifestcodec.snap_path(sdir, state.epoch or 0)
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
                state = now = _read_manifest_locked(sdir, lock_timeout, state)
        except Timeout:
            continue
        entry = now.entries.get(conv)
        listed = _committed(entry)
        pending = entry.pending if entry is not None else None
        tips[conv] = truth
        verified[conv] = _Verified(truth, listed, pending, (now.epoch, now.intents.get(conv, 0)))
        problem = _judge_listing(
            site, conv, conv_dir, spath, listed, truth, pending, conv in now.recover, now.rebuild_owed,
            not now.walked,
        )
        if problem is not None:
            out.append(problem)
    return out


def _judge_listing(
    site: str,
    conv: str,
    conv_dir: str,
    spath: str,
    listed: Tip | None,
    truth: Tip | None,
    pending: tuple[int, int, int] | None,
    before_boot: bool = False,
    rebuild_owed: bool = False,
    walk_owed: bool = False,
) -> Problem | None:
    """The problem (or note) for one conversation's listed extent against its log's, both verified under its lock.

    ``before_boot``: the conversation was written before this boot of the machine, so the
    engine re-reads its log at its first listing (a power cut may have lost its commits).
    ``rebuild_owed``: the engine rebuilds the whole listing from the logs at its next listing.
    ``walk_owed``: the engine looks for conversations the listing does not know at its next listing.
    """
    have = truth.next_seq if truth is not None else 0
    committed = listed.next_seq if listed is not None else 0
    action = "rewrite the manifest from the conversations (--repair)"
    if have < committed:
        last = committed - 1
        return Problem(
            site,
            conv,
            conv_dir,
            None,
            ACKNOWLEDGED_LOST,
            f"the listing recorded next_seq={committed} as committed, the log ends before seq {have}: "
            f"acknowledged seqs {have}..{last} are gone",
            "none in fsck: restore the conversation from an export (`convmem import --conversation`); "
            "--repair makes the listing agree with the log",
            lost_seqs=(have, last),
        )
    if pending is not None and committed <= have:
        # The engine probes every conversation with a pending intent at the next listing and
        # records the log's extent, whatever it is (a compaction after a power cut also marks
        # the conversations it could not check as pending, with an intent one past their entry).
        wrote = (
            "its batch is in the log"
            if have == pending[2]
            else "its batch is not in the log" if have < pending[2] else "the log holds more than it named"
        )
        return Problem(
            site,
            conv,
            spath,
            None,
            INTENT_UNRESOLVED,
            f"an intent for next_seq={pending[2]} has no commit (its writer stopped before it, or still "
            f"owes it: a writer logs it with its next intent or at close); {wrote}, "
            f"which holds {_describe(truth)}",
            "none needed: the engine resolves it by reading the log at the site's next listing; "
            + (
                "--repair leaves it (a running writer may still owe the commit)"
                if have == pending[2]
                else "--repair resolves it now"
            ),
            resolves_itself=True,
        )
    def stale(detail: str, note: str, resolves_itself: bool = True) -> Problem:
        return Problem(site, conv, spath, None, MANIFEST_STALE, detail, note, resolves_itself=resolves_itself)

    if listed != truth and before_boot and have > committed:
        return stale(
            f"the listing has {_describe(listed)}, the log holds {_describe(truth)}: commits logged before "
            "this boot of the machine were lost (a power cut), the log itself is whole",
            "none needed: the engine re-reads this conversation's log at the site's first listing after "
            "the restart and logs its extent again; --repair does it now",
        )
    if listed is None and pending is None and have > 0 and walk_owed:
        return stale(
            f"the listing does not name this conversation, whose log holds {_describe(truth)}: a new "
            "conversation's first records in the activity log are not synced, so a power cut can lose them; "
            "the log itself is whole",
            "none needed: at the site's first listing after the restart the engine looks for conversations "
            "the listing does not know and logs their extent; --repair does it now",
        )
    if listed != truth and rebuild_owed:
        return stale(
            f"the listing has {_describe(listed)}, the log holds {_describe(truth)}; the activity log is "
            "damaged (see above), which may be where its commit was",
            _REBUILD_NOTE,
        )
    if listed != truth:
        return stale(f"the listing has {_describe(listed)}, the log holds {_describe(truth)}", action, False)
    return None
