"""Reading the site manifest into memory: a snapshot loaded, the activity log's records applied.

Entries merge monotonically: a record only ever moves a conversation forward
(larger ``next_seq``), so records may be applied twice or late without harm
(:meth:`ManifestApply._apply`). Damaged records lose whatever they said, so
they mark the listing incomplete, and so do bytes that are not a whole record
still there under the file lock: the next refresh rebuilds the listing from the
segments (:meth:`ManifestApply._tail`). A log compacted away is followed into
the next epoch, whose snapshot holds everything up to its end. While an epoch
is loaded, every conversation with an intent logged before the first boot
record of this boot is collected for recovery (:mod:`logstore.manifestrecovery`).
"""

from __future__ import annotations

import os
from typing import Any

from . import bootid
from .manifestcodec import (
    BOOT,
    COMMIT,
    INTENT,
    LOG_HEADER,
    RESOLVE,
    WALKED,
    Damaged,
    Entry,
    decode_snapshot,
    iter_log_records,
    read_or_damaged,
    snap_path,
)
from .manifestfiles import ManifestFiles


class ManifestApply(ManifestFiles):
    """Loads the listing from the current epoch and applies the log's records as they come."""

    def _load(self) -> None:
        """(Re)load the listing from the current snapshot and log (mutex held)."""
        self._flock()
        try:
            self._load_nolock()
        finally:
            self._funlock()

    def _load_nolock(self) -> None:
        epoch = self._current_epoch_locked()
        try:
            entries, complete = decode_snapshot(read_or_damaged(snap_path(self.site_dir, epoch)), epoch)
            rfd, rsalt = self._open_log(epoch, os.O_RDONLY)
        except Damaged:
            # A damaged snapshot or log header: start a fresh epoch and rebuild from the segments.
            entries, complete = [], False
            epoch += 1
            self._write_epoch(epoch, [], False)
            rfd, rsalt = self._open_log(epoch, os.O_RDONLY)
            self._current_epoch_locked()
        if self._rfd is not None:
            os.close(self._rfd)
        self._repo = {e.conversation_id: e for e in entries}
        self._order = None
        self._pending = {e.conversation_id for e in entries if e.pending is not None}
        self._rfd, self._rsalt, self._repoch, self._roff = rfd, rsalt, epoch, LOG_HEADER.size
        self._complete = complete
        self._loaded = True
        # Note which conversations were written before this boot (see _recover_listing).
        self._recover = set()
        self._walked = False
        self._collecting = True
        try:
            self._tail(locked=True)
        finally:
            self._collecting = False

    def _tail(self, locked: bool = False) -> None:
        """Apply log records written since we last looked (``locked``: the file lock is held).

        Damaged records lose whatever they said, so they mark the listing
        incomplete: the next refresh rebuilds it from the segments.
        """
        assert self._rfd is not None
        while True:
            st = os.fstat(self._rfd)
            if st.st_size > self._roff:
                data = os.pread(self._rfd, st.st_size - self._roff, self._roff)
                for _off, end, rec in iter_log_records(data, self._rsalt, 0):
                    if rec is not None:
                        self._apply(rec)
                    else:
                        self._complete = False
                    self._roff += end - _off
            if st.st_nlink > 0:
                if self._roff < st.st_size and self._complete:
                    # Bytes that are not a whole record: a write in flight, unless they are
                    # still there under the file lock (writers append whole records under it).
                    if locked:
                        self._complete = False
                    else:
                        self._flock()
                        try:
                            self._tail(locked=True)
                        finally:
                            self._funlock()
                return
            # Compacted away: everything up to its end is in the next snapshot.
            try:
                fd, salt = self._open_log(self._repoch + 1, os.O_RDONLY)
            except (FileNotFoundError, Damaged):
                self._loaded = False
                return
            os.close(self._rfd)
            self._rfd, self._rsalt, self._repoch, self._roff = fd, salt, self._repoch + 1, LOG_HEADER.size
            self._walked = False  # the next epoch's log says again (its compactor carried it over)

    def _apply(self, rec: list[Any]) -> None:
        try:
            kind, conv, created, last, nxt = rec[:5]
        except (ValueError, TypeError):
            return
        if kind == INTENT and len(rec) >= 8:
            # An intent carrying the commit of the conversation's previous batch: that first.
            self._apply([COMMIT, conv, *rec[5:8]])
        e = self._repo.get(conv)
        if kind == BOOT:
            if self._collecting and conv == bootid.boot_id:
                self._collecting = False  # everything after it was logged in this boot
            return
        if kind == WALKED:
            if conv == bootid.boot_id:
                self._walked = True
            return
        if kind == INTENT:
            if self._collecting:
                self._recover.add(conv)
            if e is None:
                self._repo[conv] = e = Entry(conv, 0, 0, 0)
            if nxt > e.next_seq and (e.pending is None or nxt > e.pending[2]):
                e.pending = (created, last, nxt)
                self._pending.add(conv)
            return
        if kind == RESOLVE and e is not None and e.pending is not None and len(rec) > 5 and e.pending[2] == rec[5]:
            e.pending = None
            self._pending.discard(conv)
        if nxt <= 0:
            return
        if e is None:
            self._repo[conv] = e = Entry(conv, created, last, 0)
        if nxt > e.next_seq:
            order = self._order
            if order is not None:
                if e.next_seq > 0:
                    order.discard((-e.last_us, conv))
                order.add((-last, conv))
            e.created_us, e.last_us, e.next_seq = created, last, nxt
        if e.pending is not None and e.pending[2] <= e.next_seq:
            e.pending = None
            self._pending.discard(conv)
