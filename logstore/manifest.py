"""The site manifest: which conversations a site holds, for listings.

It is derived data, rebuilt from the segments whenever missing or damaged.
On disk it is a snapshot plus an append-only activity log (FORMAT.md):

* before a batch is written, its conversation logs an *intent*, synced for
  the conversation's first batch in the epoch (per writing process), so that
  after a power cut the log names every conversation written since its
  snapshot, even when the later, unsynced records are lost; a new
  conversation's intent is not synced: after a reboot the first listing
  *walks* the site's directories for conversations the listing does not know
  and logs a *walked* record of the boot once it found them all;
* after the batch is durable, a *commit* with the conversation's new extent
  (not synced: a power cut may lose it). It is not written at once but owed:
  the conversation's next intent carries it (one record), or the process
  logs it at its close (or with its next record once many are owed; its own
  listings apply it in memory), so an append costs one record and one locked
  write of the log. Until then the batch's intent is pending, exactly as if
  its writer had died after the data sync, and a listing in another process
  probes it;
* an intent that is never followed by a commit (its writer crashed) is
  *resolved* later by probing the conversation itself;
* a writer opening an epoch's log logs a *boot* record naming this boot of
  the machine;
* after loading an epoch, every conversation with an intent logged before the
  first boot record of this boot (a power cut since may have lost its
  commits) is checked against its log (*recovery*): a lost commit is logged
  again, so ``last_appended_at`` and the order always follow the logs. A
  compaction before that check carries those conversations into the snapshot
  as pending, so the next listing probes them.

Entries merge monotonically: a record only ever moves a conversation forward
(larger ``next_seq``), so records may be applied twice or late without harm.
In memory the committed entries are kept in a sorted list keyed by
``(-last_appended_at, conversation_id)``; a page costs a bisection plus what
it returns.
"""

from __future__ import annotations

import functools
import os
import struct
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import msgspec
import xxhash
from sortedcontainers import SortedList

from . import fileio, frame, layout
from .conversation import ManifestHook, Tip
from .errors import StoreError, Timeout
from .incarnation import is_file_at
from .segment import data_end

LOG_MAGIC = b"CVMMLOG\x01"
SNAP_MAGIC = b"CVMMSNP\x01"
LOG_HEADER = struct.Struct("<8sQQQ")  # magic, epoch, salt, xxh3(first 24 bytes)
SNAP_HEADER = struct.Struct("<8sQQQQQ")  # magic, epoch, complete, body_len, xxh3(body), xxh3(first 40)
REC_MAGIC = b"\xc7\x4d"
REC_HEADER = struct.Struct("<2sHIQ")  # magic, reserved, body_len, xxh3(body_len bytes + body, seed=salt)

INTENT, COMMIT, RESOLVE, BOOT, WALKED = 1, 2, 3, 4, 5
#: Commits owed by this process beyond this many are all logged with its next record.
OWED_MAX = 256
LOCK_FILE = "manifest.lock"


def _read_boot_id() -> str:
    """This boot of the machine (Linux); elsewhere a per-process id, which only makes recovery check more."""
    try:
        with open("/proc/sys/kernel/random/boot_id", "rb") as f:
            return f.read().decode("ascii").strip()
    except (OSError, UnicodeDecodeError):
        return f"process-{os.getpid()}-{os.urandom(8).hex()}"


#: Names this boot in the activity log: records logged after a ``BOOT`` record
#: carrying it cannot have been lost to a power cut (this boot's page cache holds
#: them). Tests set it to simulate the restart after a power cut.
boot_id = _read_boot_id()
_enc = msgspec.msgpack.Encoder()
_dec = msgspec.msgpack.Decoder()


def _epoch_files(site_dir: str) -> dict[int, set[str]]:
    out: dict[int, set[str]] = {}
    try:
        names = os.listdir(site_dir)
    except FileNotFoundError:
        return out
    for name in names:
        if name.startswith("manifest-") and name.endswith((".snap", ".log")):
            stem, _, kind = name.partition(".")
            digits = stem[len("manifest-") :]
            if digits.isdigit():
                out.setdefault(int(digits), set()).add(kind)
    return out


def snap_path(site_dir: str, epoch: int) -> str:
    return os.path.join(site_dir, f"manifest-{epoch:010d}.snap")


def log_path(site_dir: str, epoch: int) -> str:
    return os.path.join(site_dir, f"manifest-{epoch:010d}.log")


def encode_log_header(epoch: int, salt: int) -> bytes:
    head = struct.pack("<8sQQ", LOG_MAGIC, epoch, salt)
    return head + struct.pack("<Q", xxhash.xxh3_64_intdigest(head))


_U32 = struct.Struct("<I")
_xxh3 = xxhash.xxh3_64_intdigest


def encode_log_record(salt: int, body: bytes) -> bytes:
    n = len(body)
    return REC_HEADER.pack(REC_MAGIC, 0, n, _xxh3(_U32.pack(n) + body, salt)) + body


def iter_log_records(data: bytes, salt: int, start: int) -> Iterator[tuple[int, int, list[Any] | None]]:
    """Yield ``(offset, end, record)`` from ``start``; record None marks skipped damage.

    Stops (without yielding) at a record that runs past the end of ``data``:
    it may still be being written.
    """
    pos = start
    n = len(data)
    while pos < n:
        if pos + REC_HEADER.size > n:
            return
        magic, _, blen, check = REC_HEADER.unpack_from(data, pos)
        end = pos + REC_HEADER.size + blen
        if magic == REC_MAGIC and end > n and blen < 4096:
            return
        ok = magic == REC_MAGIC and end <= n and blen < 4096
        if ok:
            body = data[pos + REC_HEADER.size : end]
            ok = xxhash.xxh3_64_intdigest(data[pos + 4 : pos + 8] + body, salt) == check
        if ok:
            try:
                yield pos, end, _dec.decode(body)
            except msgspec.DecodeError:
                yield pos, end, None
            pos = end
            continue
        # Damage: resynchronise on the next record magic.
        nxt = data.find(REC_MAGIC, pos + 1)
        if nxt < 0:
            # Trailing garbage with no record after it: a torn write, or a write in flight.
            return
        yield pos, nxt, None
        pos = nxt


class _Entry(msgspec.Struct, array_like=True):
    conversation_id: str
    created_us: int
    last_us: int
    next_seq: int
    pending: tuple[int, int, int] | None = None


#: ``probe(conversation_id, wait, settle)``: see :class:`SiteManifest`.
Probe = Callable[[str, bool, Callable[[Tip | None], None] | None], Tip | None]


class SiteManifest(ManifestHook):
    """One site's listing, shared safely by the threads and processes using it.

    ``probe(conversation_id, wait, settle)`` returns the conversation's true
    extent from its segments, read holding the conversation's file lock (None
    when it holds nothing; with ``wait`` False it raises Timeout rather than
    wait for a writer), and calls ``settle`` with it before letting the lock
    go. A writer holds that lock from before its intent until its batch is
    durable, so what a probe finds settles every intent logged before it.

    Invariant (enforced here and in the store's probe): every record that
    settles an intent from a probe (a resolve, or a commit of a probed
    extent) is logged by ``settle``, under the conversation's lock, so the
    log orders it before any intent logged after the probe. ``walk()`` yields
    every conversation id that has a directory. Both come from the store.
    """

    def __init__(
        self,
        site_dir: str,
        probe: Probe,
        walk: Callable[[], Iterator[str]],
        lock_timeout: float,
        compact_bytes: int = 256 * 1024,
    ) -> None:
        self.site_dir = site_dir
        self._probe = probe
        self._walk = walk
        self._lock_timeout = lock_timeout
        # The log is folded into a new snapshot once it outgrows both this and a
        # quarter of the snapshot: writing snapshots stays O(1) per append, and a
        # cold open replays a log no longer than that.
        self._compact_bytes = compact_bytes
        self._wsnap = 0
        self._mutex = threading.RLock()
        self._recovering = threading.Lock()
        self._lock_fd: int | None = None
        # Writer side.
        self._wfd: int | None = None
        self._wepoch = 0
        self._wsalt = 0
        self._writes = 0
        #: Conversations whose intent this process has synced in the writer epoch.
        self._touched: set[str] = set()
        #: Commit records owed, by conversation (see :meth:`commit`).
        self._owed: dict[str, list[Any]] = {}
        # Reader side (the in-memory listing).
        self._loaded = False
        self._repo: dict[str, _Entry] = {}
        #: The committed entries in listing order; None until a page is asked for (a process
        #: that only writes never builds it, so its compactions apply records to ``_repo`` only).
        self._order: SortedList[tuple[int, str]] | None = None
        #: Conversations with an intent not yet followed by its commit.
        self._pending: set[str] = set()
        self._repoch = 0
        self._rsalt = 0
        self._rfd: int | None = None
        self._roff = 0
        self._complete = True
        #: Conversations whose intent predates this boot in the loaded log, not yet checked.
        self._recover: set[str] = set()
        #: Loading: collecting ``_recover`` until a boot record of this boot is read.
        self._collecting = False
        #: The loaded log holds a walked record of this boot: every conversation that held
        #: items before this boot is named in the snapshot or the log (see ``_walk_unknown``).
        self._walked = False

    # ------------------------------------------------------------ file lock

    def _flock(self) -> None:
        """Take ``manifest.lock`` exclusively, checked to be the file at its path (reopened when it is not).

        A descriptor of a lock file that was deleted (its site removed, or the
        file removed by hand) excludes nobody: the other processes lock the
        file now at the path. So once locked, the descriptor's
        ``(st_dev, st_ino)`` is compared with the path's; on a mismatch the
        descriptor is closed and the path's file is locked instead.
        """
        started = time.monotonic()
        delay = 0.0005
        while True:
            if self._lock_fd is None:
                fileio.makedirs(self.site_dir)
                self._lock_fd = fileio.open_create(os.path.join(self.site_dir, LOCK_FILE))
            if fileio.try_lock(self._lock_fd, True):
                if is_file_at(self._lock_fd, os.path.join(self.site_dir, LOCK_FILE)):
                    return  # the common case: free, and still the file at the path
                fileio.unlock(self._lock_fd)
                os.close(self._lock_fd)
                self._lock_fd = None
                continue
            waited = time.monotonic() - started
            if waited > self._lock_timeout:
                raise Timeout(waited)
            time.sleep(delay)
            delay = min(delay * 2, 0.02)

    def _funlock(self) -> None:
        assert self._lock_fd is not None
        fileio.unlock(self._lock_fd)

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

    # --------------------------------------------------------------- epochs

    def _current_epoch_locked(self) -> int:
        """The current epoch, creating the first one if there is none (EX lock held)."""
        epochs = _epoch_files(self.site_dir)
        snaps = [e for e, kinds in epochs.items() if "snap" in kinds]
        if not snaps:
            complete = not any(True for _ in self._walk())
            # Complete: no conversation holds anything yet, so none can be missing after a reboot.
            self._write_epoch(1, [], complete, walked=complete)
            return 1
        epoch = max(snaps)
        if "log" not in epochs[epoch]:
            if any(e < epoch and "log" in kinds for e, kinds in epochs.items()):
                # A crash between this epoch's snapshot and its log: the snapshot holds it all.
                self._create_log(epoch)
            else:
                # The log is gone (deleted): what it held is in no snapshot, so a rebuild is owed.
                epoch += 1
                self._write_epoch(epoch, [], False)
        for e in epochs:
            if e < epoch:
                for kind in epochs[e]:
                    path = snap_path(self.site_dir, e) if kind == "snap" else log_path(self.site_dir, e)
                    try:
                        fileio.unlink(path)
                    except FileNotFoundError:
                        pass
        return epoch

    def _write_epoch(self, epoch: int, entries: list[_Entry], complete: bool, walked: bool = False) -> None:
        """Write epoch ``epoch``'s snapshot, then its (empty) log, each durably.

        ``walked``: the entries name every conversation that held items before
        this boot (the caller read a walked record of this boot, or probed them
        all): the new log starts with a walked record of this boot, so no
        listing in this boot walks the site's directories again.
        """
        body = _enc.encode(entries)
        head = struct.pack("<8sQQQQ", SNAP_MAGIC, epoch, int(complete), len(body), xxhash.xxh3_64_intdigest(body))
        head += struct.pack("<Q", xxhash.xxh3_64_intdigest(head))
        fileio.makedirs_durable(self.site_dir)
        fileio.write_file_atomic(snap_path(self.site_dir, epoch), head + body)
        self._create_log(epoch, walked)
        fileio.crashpoint("manifest-compact")

    def _create_log(self, epoch: int, walked: bool = False) -> None:
        salt = _new_salt()
        data = encode_log_header(epoch, salt)
        if walked:
            data += encode_log_record(salt, _enc.encode([WALKED, boot_id, 0, 0, 0]))
        fileio.write_file_atomic(log_path(self.site_dir, epoch), data)

    def _open_log(self, epoch: int, flags: int) -> tuple[int, int]:
        fd = os.open(log_path(self.site_dir, epoch), flags)
        head = os.pread(fd, LOG_HEADER.size, 0)
        if len(head) < LOG_HEADER.size:
            os.close(fd)
            raise _Damaged()
        magic, e, salt, check = LOG_HEADER.unpack(head)
        if magic != LOG_MAGIC or e != epoch or xxhash.xxh3_64_intdigest(head[:24]) != check:
            os.close(fd)
            raise _Damaged()
        return fd, salt

    # --------------------------------------------------------------- writes

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
        :func:`_records`), or logged by :meth:`flush` at close, or with the
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
                # :meth:`_records`); the others stay owed until that conversation's next intent.
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
                except _Damaged:
                    # Its records are in no snapshot: start an epoch that owes a rebuild.
                    epoch += 1
                    self._write_epoch(epoch, [], False)
                    self._current_epoch_locked()
                    self._wfd, self._wsalt = self._open_log(epoch, os.O_RDWR | os.O_APPEND)
                if epoch != self._wepoch:
                    self._touched.clear()
                self._wepoch = epoch
                self._wsnap = _size(snap_path(self.site_dir, epoch))
                fileio.append(self._wfd, encode_log_record(self._wsalt, _enc.encode([BOOT, boot_id, 0, 0, 0])))
            salt = self._wsalt
            if record is not None and (not owed or (len(owed) == 1 and record[0] == INTENT and record[1] in owed)):
                # The common case, one record (an intent carrying its conversation's owed commit), as _records makes it.
                one = [*record, *owed[record[1]][2:5]] if owed else record
                data = encode_log_record(salt, _enc.encode(one))
            else:
                data = b"".join([encode_log_record(salt, _enc.encode(rec)) for rec in _records(owed, record)])
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

    # ---------------------------------------------------------------- reads

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
            entries, complete = _decode_snapshot(_read(snap_path(self.site_dir, epoch)), epoch)
            rfd, rsalt = self._open_log(epoch, os.O_RDONLY)
        except _Damaged:
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
            except (FileNotFoundError, _Damaged):
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
            if self._collecting and conv == boot_id:
                self._collecting = False  # everything after it was logged in this boot
            return
        if kind == WALKED:
            if conv == boot_id:
                self._walked = True
            return
        if kind == INTENT:
            if self._collecting:
                self._recover.add(conv)
            if e is None:
                self._repo[conv] = e = _Entry(conv, 0, 0, 0)
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
            self._repo[conv] = e = _Entry(conv, created, last, 0)
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

    def _refresh(self) -> None:
        with self._mutex:
            if not self._loaded:
                self._load()
            self._tail()
            if not self._loaded:
                self._load()
                self._tail()
            # The commits this process still owes are applied to the listing in memory (a
            # listing writes nothing): its own batches are listed from them, never probed.
            for owed in self._owed.values():
                self._apply(owed)
            rebuild = not self._complete
            # An intent without its commit: its writer still owes the commit (idle, or
            # at work on its next batch), or it died or failed to log the commit after
            # the data sync. Each is probed, waiting (as a read does) for a writer that
            # holds the conversation: with the commit owed, its acknowledged batch is
            # known only from the log until the writer's next intent carries the commit.
            due = [(c, p) for c in self._pending if (p := self._repo[c].pending) is not None]
        if rebuild:
            self.rebuild()
            return
        with self._recovering:
            # Other threads wait for the check rather than list what it is about to correct.
            with self._mutex:
                recover, self._recover = self._recover, set()
                walk = not self._walked
            if recover:
                self._recover_listing(recover, {c for c, _ in due})
                with self._mutex:
                    self._tail()
            if walk:
                with self._mutex:
                    self._tail()
                    walk = not self._walked  # another process may have walked meanwhile
                if walk and self._walk_unknown():
                    self._write([WALKED, boot_id, 0, 0, 0], sync=False)
                with self._mutex:
                    self._tail()
        for conv, pending in due:
            assert pending is not None
            # Probed without holding the manifest: an appender holds the conversation, then the manifest.
            try:
                self._probe(conv, True, functools.partial(self._resolve, conv, pending[2]))
            except StoreError:
                continue  # busy or damaged: listed as last committed; fsck reports damage
        if due:
            with self._mutex:
                self._tail()

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

    def page(self, after: tuple[int, str] | None, limit: int) -> tuple[list[_Entry], bool]:
        """Up to ``limit`` entries after keyset position ``(last_us, id)``; and whether more remain."""
        self._refresh()
        with self._mutex:
            order = self._order
            if order is None:
                order = self._order = SortedList((-e.last_us, c) for c, e in self._repo.items() if e.next_seq > 0)
            i = 0 if after is None else order.bisect_right((-after[0], after[1]))
            keys = list(order.islice(i, i + limit + 1))
            more = len(keys) > limit
            out = []
            for _neg, conv in keys[:limit]:
                e = self._repo[conv]
                out.append(_Entry(conv, e.created_us, e.last_us, e.next_seq))
            return out, more

    def entries(self) -> list[_Entry]:
        """Every committed entry (for checks and tools)."""
        self._refresh()
        with self._mutex:
            return [
                _Entry(e.conversation_id, e.created_us, e.last_us, e.next_seq)
                for e in self._repo.values()
                if e.next_seq > 0
            ]


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


def _records(owed: dict[str, list[Any]], record: list[Any] | None) -> list[list[Any]]:
    """The log records for the commits ``owed`` and then ``record``.

    An intent whose conversation has a commit owed carries it (FORMAT.md 5:
    ``[1, conversation_id, created_us, last_us, next_seq, committed created_us,
    last_us, next_seq]``), so an append to the conversation it wrote last is
    one record.
    """
    carried = record[1] if record is not None and record[0] == INTENT and record[1] in owed else None
    out = [rec for conv, rec in owed.items() if conv != carried]
    if record is not None:
        out.append(record if carried is None else [*record, *owed[carried][2:5]])
    return out


class _Damaged(Exception):
    pass


def _new_salt() -> int:
    return int.from_bytes(os.urandom(8), "little") | 1


def _size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        return 0


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        raise _Damaged() from None


def _decode_snapshot(data: bytes, epoch: int) -> tuple[list[_Entry], bool]:
    if len(data) < SNAP_HEADER.size:
        raise _Damaged()
    magic, e, complete, blen, bcheck, hcheck = SNAP_HEADER.unpack_from(data)
    if magic != SNAP_MAGIC or e != epoch or xxhash.xxh3_64_intdigest(data[:40]) != hcheck:
        raise _Damaged()
    body = data[SNAP_HEADER.size : SNAP_HEADER.size + blen]
    if len(body) != blen or xxhash.xxh3_64_intdigest(body) != bcheck:
        raise _Damaged()
    try:
        entries = msgspec.msgpack.decode(body, type=list[_Entry])
    except msgspec.DecodeError:
        raise _Damaged() from None
    return entries, bool(complete)
