"""Writing the site manifest's activity log: intents, owed commits, and compaction into a new epoch.

Before a batch is written its conversation logs an *intent*, synced for the
conversation's first batch in the epoch (per writing process); a new
conversation's intent is not synced (the first listing after a reboot walks
the site's directories for it). After the batch is durable its *commit* is not
written at once but owed (:meth:`ManifestWrites.commit`): the conversation's
next intent carries it, or the process logs it at its close, or with its next
record once :data:`OWED_MAX` are owed. Every write of the log is one locked
append (:meth:`ManifestWrites._write_locked`), opening the epoch's log with a
*boot* record first. A commit that may not have been logged is owed again (a
record logged twice is harmless). The log is folded into the next epoch's
snapshot once it outgrows the snapshot's quarter and ``compact_bytes``
(:meth:`ManifestWrites._compact_locked`).
"""

from __future__ import annotations

import os
from typing import Any

from . import bootid, fileio
from .conversation import Tip
from .errors import StoreError
from .manifestapply import ManifestApply
from .manifestcodec import BOOT, COMMIT, INTENT, Damaged, carried_records, encode_log_record, encoder, snap_path

#: Commits owed by this process beyond this many are all logged with its next record.
OWED_MAX = 256


class ManifestWrites(ManifestApply):
    """The write path of the activity log (the :class:`logstore.convstate.ManifestHook` a conversation calls)."""

    def close(self) -> None:
        """Log the commits still owed (best effort: their intents stay pending otherwise), release the files.

        Only into the log this process writes, while it is still linked: when
        another process compacted it away, the new snapshot carries the owed
        batches' intents as pending, and when the site was dropped, writing
        would bring its directory back.
        """
        with self._mutex:
            try:
                if self._owed and self._wfd is not None and os.fstat(self._wfd).st_nlink > 0:
                    self.flush()
            except (OSError, StoreError):
                pass  # each owed batch's intent is pending in the log: a listing probes it
            self._owed.clear()
            for fd in (self._wfd, self._rfd, self._lock_fd):
                if fd is not None:
                    os.close(fd)
            self._wfd = self._rfd = self._lock_fd = None
            self._loaded = False

    def intent(self, conversation_id: str, tip: Tip, *, new: bool) -> None:
        """Log that a batch bringing the conversation to ``tip`` is about to be written.

        Synced when it is this process's first intent for the conversation in
        the epoch, so that a power cut cannot hide from the listing a
        conversation whose log grew. Not for a ``new`` conversation (its first
        batch): after a reboot the listing finds the conversations it does not
        know by walking the site's directories (``_walk_unknown``), so its
        records may be lost; it counts as synced for the rest of the epoch.
        """
        record = [INTENT, str(conversation_id), tip.created_us, tip.last_us, tip.next_seq]
        self._write(record, sync=False, touch=True, new=new)

    def commit(self, conversation_id: str, tip: Tip) -> None:
        """Owe the commit record of a durable batch bringing the conversation to ``tip``.

        Carried by the conversation's next intent (one record, see
        :func:`carried_records`), or logged by :meth:`flush` at close, or with the
        process's next record once more than :data:`OWED_MAX` are owed; this
        process's listings apply it in memory. Until then the batch's intent
        is pending, as after a crash between the data sync and the commit: a
        listing in another process probes the conversation (nobody holds it
        while its writer is idle), so the listing is the same, and an append
        makes one record and one locked write of the log instead of two.
        """
        conv = str(conversation_id)
        with self._mutex:
            old = self._owed.get(conv)
            if old is None or old[4] < tip.next_seq:
                self._owed[conv] = [COMMIT, conv, tip.created_us, tip.last_us, tip.next_seq]

    def shrank(self, conversation_id: str, next_seq: int) -> None:
        """Drop a commit owed for seqs the conversation's log no longer holds (it was forgotten since).

        Logged after the forget, such a commit would make the listing claim
        seqs the log never gets back (entries only move forward), and fsck
        report them as acknowledged and lost.
        """
        conv = str(conversation_id)
        with self._mutex:
            old = self._owed.get(conv)
            if old is not None and old[4] > next_seq:
                del self._owed[conv]

    def flush(self) -> None:
        """Log the commits owed by this process, if any."""
        if self._owed:
            self._write(None, sync=False)

    def _write(self, record: list[Any] | None, sync: bool, touch: bool = False, new: bool = False) -> None:
        """Append ``record`` to the current epoch's log, with the owed commits it takes, in one write.

        An intent takes its conversation's owed commit (it carries it); a
        ``record`` of None, or any record once :data:`OWED_MAX` commits are
        owed, takes them all. ``touch``: sync the write unless this epoch
        already has one of ``record``'s conversation; ``new`` (with ``touch``):
        the conversation's first batch, which needs no sync (see :meth:`intent`).
        """
        with self._mutex:
            if record is None or len(self._owed) >= OWED_MAX:
                owed, self._owed = self._owed, {}
            else:
                # Only the record's own conversation's commit, carried by its intent (see
                # :meth:`carried_records`); the others stay owed until that conversation's next intent.
                prev = self._owed.pop(record[1], None) if record[0] == INTENT else None
                owed = {} if prev is None else {record[1]: prev}
            try:
                self._write_locked(owed, record, sync, touch, new)
            except BaseException:
                # Perhaps not logged: owed again (a record logged twice is harmless).
                for conv, rec in owed.items():
                    now = self._owed.get(conv)
                    if now is None or now[4] < rec[4]:
                        self._owed[conv] = rec
                raise

    def _write_locked(
        self, owed: dict[str, list[Any]], record: list[Any] | None, sync: bool, touch: bool, new: bool
    ) -> None:
        """:meth:`_write` with the mutex held: takes the file lock."""
        self._flock()
        try:
            if self._wfd is None or os.fstat(self._wfd).st_nlink == 0:
                if self._wfd is not None:
                    os.close(self._wfd)
                    self._wfd = None
                epoch = self._current_epoch_locked()
                try:
                    self._wfd, self._wsalt = self._open_log(epoch, os.O_RDWR | os.O_APPEND)
                except Damaged:
                    # Its records are in no snapshot: start an epoch that owes a rebuild.
                    epoch += 1
                    self._write_epoch(epoch, [], False)
                    self._current_epoch_locked()
                    self._wfd, self._wsalt = self._open_log(epoch, os.O_RDWR | os.O_APPEND)
                if epoch != self._wepoch:
                    self._touched.clear()
                self._wepoch = epoch
                self._wsnap = _size(snap_path(self.site_dir, epoch))
                boot = encoder.encode([BOOT, bootid.boot_id, 0, 0, 0])
                fileio.append(self._wfd, encode_log_record(self._wsalt, boot))
            salt = self._wsalt
            if record is not None and (not owed or (len(owed) == 1 and record[0] == INTENT and record[1] in owed)):
                # The common case, one record (an intent carrying its conversation's owed commit), as
                # carried_records makes it.
                one = [*record, *owed[record[1]][2:5]] if owed else record
                data = encode_log_record(salt, encoder.encode(one))
            else:
                data = b"".join([encode_log_record(salt, encoder.encode(rec)) for rec in carried_records(owed, record)])
                if not data:
                    return
            fileio.append(self._wfd, data)
            conv = record[1] if touch and record is not None else None
            if conv is not None and new:
                self._touched.add(conv)
            elif sync or (conv is not None and conv not in self._touched):
                fileio.fdatasync(self._wfd)
                if conv is not None:
                    self._touched.add(conv)
            self._writes += 1
            if self._writes % 512 == 0 and os.fstat(self._wfd).st_size > max(self._compact_bytes, self._wsnap // 4):
                self._compact_locked()
        finally:
            self._funlock()

    def _compact_locked(self, complete: bool | None = None, extra: list[list[Any]] | None = None) -> None:
        """Write the current state (plus ``extra`` records) as the next epoch's snapshot (mutex and file lock held)."""
        if not self._loaded:
            self._load_nolock()
        self._tail(locked=True)
        if not self._loaded:
            self._load_nolock()
            self._tail(locked=True)
        for rec in extra or ():
            self._apply(rec)
        if complete is not None:
            self._complete = complete
        for conv in self._recover if extra is None else ():
            # Not checked since a power cut that may have lost its commits: the next
            # listing probes it (a rebuild has just probed every conversation).
            e = self._repo.get(conv)
            if e is not None and e.pending is None:
                e.pending = (e.created_us, e.last_us, e.next_seq + 1)
                self._pending.add(conv)
        self._recover = set()
        walked = self._walked or (extra is not None and complete is True)  # a rebuild probed every conversation
        self._write_epoch(self._repoch + 1, list(self._repo.values()), self._complete, walked=walked)
        self._current_epoch_locked()


def _size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        return 0
