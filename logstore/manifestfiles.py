"""The site manifest's files: its lock, and the epochs (a snapshot and its activity log).

``manifest.lock`` is taken exclusively by every writer of the log, and by a
reader that must not see a record half written; a lock file's descriptor is
checked to be the file at its path once locked (:meth:`ManifestFiles._flock`),
since a deleted lock file excludes nobody. An epoch is a snapshot and its log,
each written durably, the snapshot first (:meth:`ManifestFiles._write_epoch`);
the current epoch is the newest snapshot, and the files of older ones are
removed once it is found (:meth:`ManifestFiles._current_epoch_locked`), which
also repairs a crash between a snapshot and its log. All of the state of a
:class:`logstore.manifest.SiteManifest` is set up here.
"""

from __future__ import annotations

import os
import struct
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import xxhash
from sortedcontainers import SortedList

from . import bootid, fileio
from .conversation import ManifestHook, Tip
from .errors import Timeout
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

LOCK_FILE = "manifest.lock"

#: ``probe(conversation_id, wait, settle)``: see :class:`logstore.manifest.SiteManifest`.
Probe = Callable[[str, bool, Callable[[Tip | None], None] | None], Tip | None]


class ManifestFiles(ManifestHook):
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
