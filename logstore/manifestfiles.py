"""The site manifest's files: its lock, and the epochs (a snapshot and its activity log).

``manifest.lock`` is taken exclusively by every writer of the log, and by a
reader that must not see a record half written; a lock file's descriptor is
checked to be the file at its path once locked (:meth:`ManifestFiles._flock`),
since a deleted lock file excludes nobody. Threads of the process share its
hold, and the last one keeps it as a lease while the log is busy and no other
process wants it (:meth:`ManifestFiles._funlock`, :mod:`logstore.lease`). An
epoch is a snapshot and its log, each written durably, the snapshot first
(:meth:`ManifestFiles._write_epoch`);
the current epoch is the newest snapshot, and the files of older ones are
removed once it is found (:meth:`ManifestFiles._current_epoch_locked`), which
also repairs a crash between a snapshot and its log. All of the state of a
:class:`logstore.manifest.SiteManifest` is set up here.
"""

from __future__ import annotations

import functools
import os
import struct
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import xxhash
from sortedcontainers import SortedList

from . import bootid, fileio, lease
from .conversation import ManifestHook, Tip
from .incarnation import is_file_at
from .manifestcodec import (
    LOG_HEADER,
    LOG_MAGIC,
    SNAP_MAGIC,
    WALKED,
    Damaged,
    Entry,
    encode_log_header,
    encode_log_record,
    encoder,
    epoch_files,
    log_path,
    new_salt,
    snap_path,
)

if TYPE_CHECKING:
    from .manifestwrite import Queued

LOCK_FILE = "manifest.lock"

#: ``probe(conversation_id, wait, settle)``: see :class:`logstore.manifest.SiteManifest`.
Probe = Callable[[str, bool, Callable[[Tip | None], None] | None], Tip | None]


class ManifestFiles(ManifestHook, lease.Leased):
    """The lock and epochs of one site's manifest, and the state of the listing built from them."""

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
        #: Holds of ``manifest.lock`` by this process's threads (``_mutex`` held), and its lease: held
        #: with no holder (see _funlock), taken at ``_lease_since``, last let go at ``_lease_used``.
        self._lock_holds = 0
        self._leased = False
        self._lease_since = 0.0
        self._lease_used = 0.0
        self._yield_until = 0.0  # until then a fresh take first waits while another process knocks
        self._contended_until = 0.0  # until then no lease is kept (lease.CONTENDED)
        self._watched = False
        self._knock_looked = 0.0  # when an intent written without the mutex last looked for a knock
        #: Since the lock was last taken afresh: the write descriptor is known to be the current log's.
        self._wfd_current = False
        self._closing = False
        #: The log's size as this process left it when it last let the lock go (None: not known), and
        #: as it is now while this process holds it (None: not known); whether, when the lock was last
        #: taken to write, the log had grown meanwhile: another process writes it too (see _funlock).
        self._expect_size: int | None = None
        self._log_size: int | None = None
        self._others_wrote = True
        #: The records waiting to be written, and the commits owed (see commit): under this lock,
        #: never held across a system call, so that an append neither queues behind a write of the
        #: log to owe its commit nor to queue its intent (see _write).
        self._qlock = threading.Lock()
        self._queue: list[Queued] = []
        #: While leased (see _funlock): the log's descriptor and salt for writes made without
        #: ``_mutex`` (_write_fast), and how many of those are under way; under ``_qlock``.
        self._qcond = threading.Condition(self._qlock)
        self._fast_fd: int | None = None
        self._fast_salt = 0
        self._fast_inflight = 0
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
        self._repo: dict[str, Entry] = {}
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

    def _flock(self) -> None:
        """Take ``manifest.lock`` exclusively, checked to be the file at its path (reopened when it is not).

        ``_mutex`` held. Threads share this process's hold (``_lock_holds``),
        and the last one to let it go keeps it as a lease while the log is
        busy (:meth:`_funlock`, :mod:`logstore.lease`). A descriptor of a lock
        file that was deleted (its site removed, or the file removed by hand)
        excludes nobody: the other processes lock the file now at the path.
        So once locked afresh, the descriptor's ``(st_dev, st_ino)`` is
        compared with the path's; on a mismatch the descriptor is closed and
        the path's file is locked instead. While waiting this process knocks
        (a holder elsewhere lets its lease go).
        """
        if self._lock_holds:
            self._lock_holds += 1
            return
        if self._leased:
            self._stop_fast()
            self._leased = False
            self._lock_holds = 1
            return
        started = time.monotonic()
        while True:
            if self._lock_fd is None:
                fileio.makedirs(self.site_dir)
                self._lock_fd = fileio.open_create(os.path.join(self.site_dir, LOCK_FILE))
            fd = self._lock_fd
            if started < self._yield_until:
                lease.yield_to_knock(fd, started + self._lock_timeout)  # we let the lease go on a knock
            if not fileio.try_lock(fd, True):
                self._contended_until = time.monotonic() + lease.CONTENDED  # another process writes too
                lease.wait_lock(functools.partial(fileio.try_lock, fd, True), fd, started + self._lock_timeout, started)
            if is_file_at(fd, os.path.join(self.site_dir, LOCK_FILE)):
                break  # the common case: still the file at the path
            fileio.unlock(fd)
            os.close(fd)
            self._lock_fd = None
        self._lock_holds = 1
        self._lease_since = time.monotonic()
        self._wfd_current = False  # another process may have compacted the log since we last held it

    def _funlock(self) -> None:
        """Let one hold go (``_mutex`` held); the last one keeps the lock as a lease unless it is due.

        Kept only by a hold that wrote the log, found it as this process left
        it (nobody else wrote it since: a log that several processes write
        busily is locked per write, as without leases), and not past
        ``lease.TERM``, the manifest not closing, and no other process wanting
        it lately (it knocked, or we had to wait for the lock, less than
        ``lease.CONTENDED`` ago); the reaper lets an idle or knocked one go
        (:meth:`reap`). While leased, appends' intents are written without
        ``_mutex`` (:meth:`_write_fast`).
        """
        assert self._lock_fd is not None
        self._lock_holds -= 1
        if self._lock_holds:
            return
        now = time.monotonic()
        if (lease.SUPPORTED and not self._closing and now >= self._contended_until and self._wfd_current
                and not self._others_wrote and now - self._lease_since < lease.TERM):
            self._leased = True
            with self._qlock:
                self._lease_used = now
                if self._wfd is not None and self._wfd_current:
                    self._fast_fd, self._fast_salt = self._wfd, self._wsalt
            if not self._watched:
                self._watched = True
                lease.reaper.watch(self)
            return
        self._note_size()
        fileio.unlock(self._lock_fd)

    def _note_size(self) -> None:
        """Before letting the lock go: the log's size as we leave it, to tell at the next take whether others wrote."""
        if self._wfd_current:  # (a hold that did not write leaves what we knew: nobody else wrote meanwhile)
            self._expect_size = self._log_size

    def _stop_fast(self) -> None:
        """No more writes without ``_mutex``; wait for those under way (``_mutex`` held)."""
        with self._qlock:
            self._fast_fd = None
            while self._fast_inflight:
                self._qcond.wait()

    def _let_go_on_knock(self) -> None:
        """Another process knocks (seen by an intent written without ``_mutex``): let the lease go if we can now.

        Else (``_mutex`` taken) the lock is let go by whoever holds the mutex,
        or by the reaper; either way no lease is kept for ``lease.CONTENDED``.
        """
        now = time.monotonic()
        self._yield_until = now + 1.0
        self._contended_until = now + lease.CONTENDED
        with self._qlock:
            self._fast_fd = None  # no more writes without the mutex: the next one takes the lock's hold
        if self._mutex.acquire(blocking=False):
            try:
                self._release_lease()
            finally:
                self._mutex.release()

    def _release_lease(self) -> None:
        """Let the lease go now (``_mutex`` held)."""
        if self._leased:
            self._stop_fast()
            self._leased = False
            if self._lock_fd is not None:
                self._note_size()
                fileio.unlock(self._lock_fd)

    def reap(self, now: float) -> bool:
        """The reaper's look (:class:`logstore.lease.Leased`): let the lease go once idle, knocked or past its term."""
        if not self._mutex.acquire(blocking=False):
            return False
        try:
            with self._qlock:
                used = self._lease_used
            if self._leased:
                assert self._lock_fd is not None
                if lease.knocked(self._lock_fd):
                    self._yield_until = now + 1.0  # let the knocker in before taking it again
                    self._contended_until = now + lease.CONTENDED
                elif now - used < lease.IDLE and now - self._lease_since < lease.TERM:
                    return False
            self._release_lease()
            self._watched = False
            return True
        finally:
            self._mutex.release()

    def _current_epoch_locked(self) -> int:
        """The current epoch, creating the first one if there is none (EX lock held)."""
        epochs = epoch_files(self.site_dir)
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

    def _write_epoch(self, epoch: int, entries: list[Entry], complete: bool, walked: bool = False) -> None:
        """Write epoch ``epoch``'s snapshot, then its (empty) log, each durably.

        ``walked``: the entries name every conversation that held items before
        this boot (the caller read a walked record of this boot, or probed them
        all): the new log starts with a walked record of this boot, so no
        listing in this boot walks the site's directories again.
        """
        body = encoder.encode(entries)
        head = struct.pack("<8sQQQQ", SNAP_MAGIC, epoch, int(complete), len(body), xxhash.xxh3_64_intdigest(body))
        head += struct.pack("<Q", xxhash.xxh3_64_intdigest(head))
        fileio.makedirs_durable(self.site_dir)
        fileio.write_file_atomic(snap_path(self.site_dir, epoch), head + body)
        self._create_log(epoch, walked)
        fileio.crashpoint("manifest-compact")

    def _create_log(self, epoch: int, walked: bool = False) -> None:
        salt = new_salt()
        data = encode_log_header(epoch, salt)
        if walked:
            data += encode_log_record(salt, encoder.encode([WALKED, bootid.boot_id, 0, 0, 0]))
        fileio.write_file_atomic(log_path(self.site_dir, epoch), data)

    def _open_log(self, epoch: int, flags: int) -> tuple[int, int]:
        fd = os.open(log_path(self.site_dir, epoch), flags)
        head = os.pread(fd, LOG_HEADER.size, 0)
        if len(head) < LOG_HEADER.size:
            os.close(fd)
            raise Damaged()
        magic, e, salt, check = LOG_HEADER.unpack(head)
        if magic != LOG_MAGIC or e != epoch or xxhash.xxh3_64_intdigest(head[:24]) != check:
            os.close(fd)
            raise Damaged()
        return fd, salt
