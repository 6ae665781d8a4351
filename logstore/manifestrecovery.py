"""Recovering the listing: pending intents resolved, lost commits logged again, unknown conversations walked.

* an intent that is never followed by a commit (its writer crashed) is
  *resolved* by probing the conversation itself (:meth:`ListingRecovery._resolve`);
* after loading an epoch, every conversation with an intent logged before the
  first boot record of this boot (a power cut since may have lost its
  commits) is checked against its log (:meth:`ListingRecovery._recover_listing`):
  a lost commit is logged again, so ``last_appended_at`` and the order always
  follow the logs;
* a new conversation's intent is not synced, so after a reboot the first
  listing *walks* the site's directories for conversations it does not know
  (:meth:`ListingRecovery._walk_unknown`) and logs a *walked* record of the
  boot once it found them all;
* a damaged listing is re-derived from every conversation
  (:meth:`ListingRecovery.rebuild`).

Invariant (enforced here and in the store's probe): every record that
settles an intent from a probe (a resolve, or a commit of a probed extent) is
logged by the probe's ``settle`` callback, under the conversation's lock, so
the log orders it before any intent logged after the probe.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator
from typing import Any

from . import frame, layout
from .conversation import Tip
from .errors import StoreError, Timeout
from .manifestcodec import COMMIT, RESOLVE
from .manifestwrite import ManifestWrites
from .segment import data_end


class ListingRecovery(ManifestWrites):
    """Probes conversations to settle what the log cannot say for itself."""

    def _resolve(self, conv: str, pending_seq: int, tip: Tip | None) -> None:
        """Log what a probe found as settling ``conv``'s pending intent (called under the conversation's lock).

        Logged before the probe lets go of the conversation, so no intent can
        come between the probe and this record in the log: the intent it names
        (and every intent before it) is settled by ``tip``. Logged after the lock
        was released, an intent for a batch ending at or below ``pending_seq``
        (after a dead writer's, whose batch never landed) could be logged first,
        and this record would clear it: its writer killed with the commit owed,
        the acknowledged batch would never be listed.
        """
        rec: list[Any] = [RESOLVE, conv, 0, 0, 0, pending_seq]
        if tip is not None:
            rec[2:5] = [tip.created_us, tip.last_us, tip.next_seq]
        self._write(rec, sync=False)

    def _commit_probed(self, conv: str, only_if_newer: bool, tip: Tip | None) -> None:
        """Log a probe's ``tip`` as ``conv``'s commit (under the conversation's lock, as :meth:`_resolve`)."""
        if tip is None:
            return
        if only_if_newer:
            with self._mutex:
                e = self._repo.get(conv)
                if e is not None and tip.next_seq <= e.next_seq:
                    return
        self._write([COMMIT, conv, tip.created_us, tip.last_us, tip.next_seq], sync=False)

    def _recover_listing(self, convs: set[str], pending: set[str]) -> None:
        """Check the conversations written before this boot; log again any commit a power cut lost.

        Their first intent of the epoch was synced before their first batch was
        written, so ``convs`` holds every conversation appended to since the
        snapshot and before this boot. A conversation held by a writer is
        skipped: its writer is at work and commits. Conversations with a
        pending intent are resolved by the caller.
        """
        for conv in sorted(convs - pending):
            with self._mutex:
                e = self._repo.get(conv)
                listed = (e.next_seq, e.last_us) if e is not None and e.next_seq > 0 else None
            if listed is not None and _ends_at(self._conversation_dir(conv), *listed):
                continue  # its log ends exactly where its entry says: nothing was lost
            try:
                self._probe(conv, False, functools.partial(self._commit_probed, conv, True))
            except StoreError:
                continue  # busy (its writer commits) or damaged (fsck reports it)

    def _walk_unknown(self) -> bool:
        """Find the conversations that hold items the listing does not know; log their extent.

        Run at the first listing of an epoch's log that holds no walked record
        of this boot. A new conversation's intent is not synced (see
        :meth:`intent`), so a power cut can take every record of it from the
        log while its first batch is durable: the conversation's directory says
        it exists. Every directory of the site is looked at (names only); a
        conversation with no entry (or an empty one) and no pending intent is
        probed. True when every one could be probed (a conversation held by a
        writer is left to that writer's commit, and the walk is made again at
        the next listing); a damaged one is left for fsck to report.
        """
        whole = True
        for conv in _conversation_names(self.site_dir):
            with self._mutex:
                e = self._repo.get(conv)
                if e is not None and (e.next_seq > 0 or e.pending is not None):
                    continue
            try:
                self._probe(conv, False, functools.partial(self._commit_probed, conv, False))
            except Timeout:
                whole = False
                continue
            except StoreError:
                continue  # damaged: fsck reports it, as a rebuild leaves it
        return whole

    def _conversation_dir(self, conv: str) -> str:
        return os.path.join(self.site_dir, layout.CONVERSATIONS_DIR, *layout.fanout(conv), layout.encode_name(conv))

    def rebuild(self) -> None:
        """Re-derive every entry from the conversations themselves, then compact."""
        found: list[list[Any]] = []
        for conv in self._walk():
            try:
                tip = self._probe(conv, True, functools.partial(self._commit_probed, conv, False))
            except StoreError:
                continue  # a damaged conversation is left for fsck to report
            if tip is not None:
                found.append([COMMIT, conv, tip.created_us, tip.last_us, tip.next_seq])
        with self._mutex:
            self._flock()
            try:
                self._loaded = False
                # Applied directly too: a damaged length field in the log can swallow what was just written.
                self._compact_locked(complete=True, extra=found)
            finally:
                self._funlock()
            self._loaded = False
            self._load()


def _conversation_names(site_dir: str) -> Iterator[str]:
    """The id of every conversation directory of the site (``c/<aa>/<bb>/<conv-hex>``), by names only."""
    for aa in _subdirs(os.path.join(site_dir, layout.CONVERSATIONS_DIR)):
        for bb in _subdirs(aa):
            for name in _subdirs(bb, names=True):
                conv = layout.decode_name(name)
                if conv is not None:
                    yield conv


def _subdirs(path: str, names: bool = False) -> list[str]:
    """The directories in ``path`` (paths, or names with ``names``); none when it is missing."""
    try:
        with os.scandir(path) as it:
            return [e.name if names else e.path for e in it if e.is_dir(follow_symlinks=False)]
    except (FileNotFoundError, NotADirectoryError):
        return []


def _ends_at(conv_dir: str, next_seq: int, last_us: int) -> bool:
    """True when the conversation's last segment ends with a valid batch ending at ``next_seq``, stamped ``last_us``.

    A cheap check (the last record only, found from its trailer) that spares a
    probe; False whenever anything else is there (a torn tail, a new segment).
    """
    try:
        bases = [b for b in map(layout.parse_segment_name, os.listdir(conv_dir)) if b is not None]
        if not bases:
            return False
        fd = os.open(os.path.join(conv_dir, layout.segment_name(max(bases))), os.O_RDONLY)
    except OSError:
        return False
    try:
        header = frame.decode_segment_header(os.pread(fd, frame.SEGMENT_HEADER_SIZE, 0))
        # Preallocated zeros after the records are no part of the log (FORMAT.md, "Preallocated space").
        size = data_end(fd, frame.SEGMENT_HEADER_SIZE, os.fstat(fd).st_size)
        if header is None or size < frame.SEGMENT_HEADER_SIZE + frame.RECORD_OVERHEAD:
            return False
        _check, body_len, magic = frame.TRAILER.unpack(os.pread(fd, frame.TRAILER_SIZE, size - frame.TRAILER_SIZE))
        start = size - frame.RECORD_OVERHEAD - body_len
        if magic != frame.TRAILER_MAGIC or start < frame.SEGMENT_HEADER_SIZE:
            return False
        data = os.pread(fd, size - start, start)
        h = frame.decode_record_header(data)
        return (
            h.kind in frame.ITEM_KINDS
            and h.end_seq == next_seq
            and h.recorded_at_us == last_us
            and frame.plausible(h)
            and len(data) == h.size
            and frame.checksum_ok(data, 0, h, header.salt)
        )
    except OSError:
        return False
    finally:
        os.close(fd)
