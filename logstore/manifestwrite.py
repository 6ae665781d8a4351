"""Writing the site manifest's activity log: intents, owed commits, and compaction into a new epoch.

Before a batch is written its conversation logs an *intent*, synced for the
conversation's first batch in the epoch (per writing process); a new
conversation's intent is not synced (the first listing after a reboot walks
the site's directories for it). After the batch is durable its *commit* is not
written at once but owed (:meth:`ManifestWrites.commit`): the conversation's
next intent carries it, or the process logs it at its close, or with its next
record once :data:`OWED_MAX` are owed. Records are queued and written by
whichever thread gets the manifest's mutex first, every record queued by then
in one locked append and at most one sync (:meth:`ManifestWrites._write`),
opening the epoch's log with a *boot* record first; while ``manifest.lock``
is leased (:mod:`logstore.manifestfiles`), an intent needing no sync is one
``O_APPEND`` write of its own, without the mutex
(:meth:`ManifestWrites._write_fast`). A commit that may not have been logged is owed again (a
record logged twice is harmless). The log is folded into the next epoch's
snapshot once it outgrows the snapshot's quarter and ``compact_bytes``
(:meth:`ManifestWrites._compact_locked`).
"""

from __future__ import annotations

import os
import time
from typing import Any

from . import bootid, fileio, lease
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
            with self._qlock:
                self._owed.clear()
            self._closing = True
            self._release_lease()
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
        if not self._write_fast(record, new):
            self._write(record, sync=False, touch=True, new=new)

    def _write_fast(self, record: list[Any], new: bool) -> bool:
        """Write an intent needing no sync without ``_mutex`` while the lock is leased; False: not now.

        The lease proves that no other process took ``manifest.lock`` since the
        write descriptor was last checked, so it is the current log's (a
        compaction, ours or theirs, happens under the lock, and anything that
        takes the lock first stops these writes and waits for those under way:
        :meth:`_stop_fast`). One ``write`` with ``O_APPEND`` puts the whole
        record at the end, whatever other threads append meanwhile. Not when
        the record needs a sync (its conversation's first intent of the epoch
        in this process), when many commits are owed, or when it is the write
        that looks at the log's size for a compaction: :meth:`_write` then.
        """
        conv = record[1]
        with self._qlock:
            fd = self._fast_fd
            if fd is None or len(self._owed) >= OWED_MAX or (self._writes + 1) % 512 == 0:
                return False
            if not new and conv not in self._touched:
                return False
            self._writes += 1
            prev = self._owed.pop(conv, None)
            self._fast_inflight += 1
            now = self._lease_used = time.monotonic()
            look = now - self._knock_looked >= lease.FAST_KNOCK_CHECK
            if look:
                self._knock_looked = now
            salt = self._fast_salt
        try:
            one = record if prev is None else [*record, *prev[2:5]]
            data = encode_log_record(salt, encoder.encode(one))
            fileio.append(fd, data)
            ok = True
            # (While this write counts as under way, so that the descriptor is still open.)
            try:
                knocked = look and lease.knocked(fd)
            except OSError:
                knocked = False
        except BaseException:
            ok = False
            raise
        finally:
            with self._qlock:
                if ok:
                    if new:
                        self._touched.add(conv)
                    if self._log_size is not None:
                        self._log_size += len(data)
                elif prev is not None:
                    cur = self._owed.get(conv)
                    if cur is None or cur[4] < prev[4]:
                        self._owed[conv] = prev  # perhaps not logged: owed again
                self._fast_inflight -= 1
                if not self._fast_inflight:
                    self._qcond.notify_all()
        if knocked:
            self._let_go_on_knock()  # another process waits to write the log: the reaper would be slower
        return True


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
        with self._qlock:
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
        with self._qlock:
            old = self._owed.get(conv)
            if old is not None and old[4] > next_seq:
                del self._owed[conv]

    def flush(self) -> None:
        """Log the commits owed by this process, if any."""
        if self._owed:
            self._write(None, sync=False)

    def _write(self, record: list[Any] | None, sync: bool, touch: bool = False, new: bool = False) -> None:
        """Append ``record`` to the current epoch's log, with the owed commits it takes; written when this returns.

        An intent takes its conversation's owed commit (it carries it); a
        ``record`` of None, or any record once :data:`OWED_MAX` commits are
        owed, takes them all. ``touch``: sync the write unless this epoch
        already has one of ``record``'s conversation; ``new`` (with ``touch``):
        the conversation's first batch, which needs no sync (see :meth:`intent`).

        Group write: the record is queued (under ``_qlock``, no system call),
        then the thread takes ``_mutex``; the first to get it writes every
        record queued by then in one write (one sync if any of them needs
        one), and the threads whose records it wrote find theirs written when
        they get ``_mutex`` in turn. Each record is in the log (and synced
        when it must be) before its caller goes on, as when each wrote its own.
        """
        me = Queued(record, sync, touch, new)
        with self._qlock:
            if record is None or len(self._owed) >= OWED_MAX:
                me.owed, self._owed = self._owed, {}
            elif record[0] == INTENT:
                # Only the record's own conversation's commit, carried by its intent (see
                # :meth:`_records`); the others stay owed until that conversation's next intent.
                prev = self._owed.pop(record[1], None)
                if prev is not None:
                    me.owed = {record[1]: prev}
            self._queue.append(me)
        with self._mutex:
            if not me.done:
                self._write_queued()
        if me.error is not None:
            # Perhaps not logged: owed again (a record logged twice is harmless).
            with self._qlock:
                for conv, rec in me.owed.items():
                    now = self._owed.get(conv)
                    if now is None or now[4] < rec[4]:
                        self._owed[conv] = rec
            raise me.error

    def _write_queued(self) -> None:
        """Write every queued record in one write (``_mutex`` held); each record's outcome is set on it."""
        with self._qlock:
            group, self._queue = self._queue, []
        if not group:
            return
        try:
            self._write_locked(group)
        except BaseException as exc:
            for q in group:
                q.error = exc
        finally:
            for q in group:
                q.done = True

    def _write_locked(self, group: list[Queued]) -> None:
        """Write ``group``'s records (``_mutex`` held): takes the file lock."""
        self._flock()
        try:
            if self._wfd is None or not self._wfd_current:
                # The log may have been compacted away (by another process while we did not hold
                # the lock, or by us): write only into the current epoch's.
                self._open_current_log()
            salt = self._wsalt
            if len(group) == 1 and group[0].plain():
                # The common case, one record (an intent carrying its conversation's owed commit), as
                # carried_records makes it.
                q = group[0]
                assert q.record is not None
                one = [*q.record, *q.owed[q.record[1]][2:5]] if q.owed else q.record
                data = encode_log_record(salt, encoder.encode(one))
            else:
                data = b"".join(
                    [encode_log_record(salt, encoder.encode(rec))
                     for q in group for rec in carried_records(q.owed, q.record)]
                )
                if not data:
                    return
            assert self._wfd is not None
            fileio.append(self._wfd, data)
            if self._log_size is not None:
                self._log_size += len(data)
            synced: list[str] = []
            need = False
            for q in group:
                conv = q.record[1] if q.touch and q.record is not None else None
                if conv is not None and q.new:
                    self._touched.add(conv)
                elif q.sync or (conv is not None and conv not in self._touched):
                    need = True
                    if conv is not None:
                        synced.append(conv)
            if need:
                fileio.fdatasync(self._wfd)
                self._touched.update(synced)
            self._writes += 1
            if self._writes % 512 == 0 and os.fstat(self._wfd).st_size > max(self._compact_bytes, self._wsnap // 4):
                self._compact_locked()
        finally:
            self._funlock()

    def _open_current_log(self) -> None:
        """Make ``_wfd`` the current epoch's log, opened for appending (file lock held)."""
        st = os.fstat(self._wfd) if self._wfd is not None else None
        if st is not None and st.st_nlink > 0:
            self._wfd_current = True
            # Another process wrote the log since we last held its lock (or we cannot tell): it is
            # shared busily, and a lease would only make the other writers knock (see _funlock).
            self._others_wrote = self._expect_size != st.st_size
            self._log_size = st.st_size
            return
        self._others_wrote = True
        self._log_size = None  # (a new descriptor: known from the next time the lock is taken)
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
        self._wfd_current = True

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
        self._wfd_current = False  # the log it wrote to is gone


class Queued:
    """One caller's record waiting in the log's write queue (see :meth:`ManifestWrites._write`), and its outcome."""

    __slots__ = ("done", "error", "new", "owed", "record", "sync", "touch")

    def __init__(self, record: list[Any] | None, sync: bool, touch: bool, new: bool) -> None:
        self.record = record
        self.sync = sync
        self.touch = touch
        self.new = new
        #: The owed commits this record takes (see :func:`_records`).
        self.owed: dict[str, list[Any]] = {}
        self.done = False
        self.error: BaseException | None = None

    def plain(self) -> bool:
        """One record, carrying at most its own conversation's owed commit."""
        r = self.record
        return r is not None and (not self.owed or (len(self.owed) == 1 and r[0] == INTENT and r[1] in self.owed))


def _size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        return 0
