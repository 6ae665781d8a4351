"""The state one :class:`~logstore.conversation.Conversation` keeps in memory, its files and its locks.

What is kept (active segment, committed end, next seq, last ``recorded_at``,
the active segment's sparse index) is only ever a cache of the files: it is
re-derived (:mod:`logstore.recovery`) whenever another process may have
changed them. The writer (:mod:`logstore.writer`) and the reader
(:mod:`logstore.reader`) both build on it.

Locking: ``mutex`` serializes threads of this process; the ``lock`` file in
the directory serializes processes (exclusive for writers, shared for a
reader that must re-read the tail). Lock order is always conversation, then
site manifest.
"""

from __future__ import annotations

import collections
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from . import fileio, index, layout, observe
from .errors import Corrupted, Timeout

if TYPE_CHECKING:
    from .convpool import Claim, SitePool


@dataclass(frozen=True)
class Options:
    """Tuning of the engine; the defaults suit production."""

    #: Seconds to wait for a conversation's lock before raising Timeout.
    lock_timeout: float = 5.0
    #: A segment is sealed and a new one started past this many bytes.
    segment_bytes: int = 16 * 1024 * 1024
    #: Roughly one index entry per this many bytes of segment.
    index_interval: int = 4096


@dataclass(frozen=True)
class Tip:
    """What a conversation holds, as seen by the listing."""

    created_us: int
    last_us: int
    next_seq: int


class ManifestHook:
    """Where a conversation reports its appends (implemented by the site manifest)."""

    def intent(self, conversation_id: str, tip: Tip, *, new: bool) -> None:
        raise NotImplementedError

    def commit(self, conversation_id: str, tip: Tip) -> None:
        raise NotImplementedError

    def shrank(self, conversation_id: str, next_seq: int) -> None:
        """The conversation's log was found to end before seqs this process had appended (forgotten since)."""


def _lock_wait(acquire: Callable[[], bool], deadline: float, started: float) -> None:
    if acquire():
        return
    with observe.timed("lock_wait"):
        delay = 0.0005
        while not acquire():
            now = time.monotonic()
            if now >= deadline:
                raise Timeout(now - started)
            time.sleep(min(delay, max(deadline - now, 0.0)))
            delay = min(delay * 2, 0.02)



class ConversationState:
    """Paths, descriptors, locks and the cached tail of one conversation."""

    def __init__(self, path: str, conversation_id: str, options: Options, manifest: ManifestHook,
                 pool: SitePool | None = None, missing: str | None = None) -> None:
        """``pool``: the site's pool of pre-created conversation directories, if the store uses one.
        ``missing``: the first directory of ``path`` that the store found missing when it made this
        object (its symbolic-link check), if any; see ``_missing`` below."""
        self.path = path
        self.conversation_id = conversation_id
        self.options = options
        self.manifest = manifest
        self.mutex = threading.Lock()
        # The writer queue (logstore.groupcommit): batches waiting, and a group being written
        # with ``mutex`` released.
        self._cond = threading.Condition(self.mutex)
        self._queue: collections.deque[Any] = collections.deque()
        self._inflight = False
        self._last_batches = 0  # batches of the last group written
        self._gathering = False  # a leader waits for more batches (GroupCommit._lead)
        # The active segment is being extended past ``_alloc`` (logstore.preallocation, "extend-ahead"):
        # by a background job, or by a group whose records do not fit. Nothing else writes
        # there, and the active segment is neither closed nor cut until it is over.
        self._growing = False
        self._extend_queued = False  # an extend-ahead job is handed over and has not started
        self.closed = False
        self._lock_fd: int | None = None
        # Threads of this process holding the lock file's lock (see _lock).
        self._lock_holds = 0
        self._loaded = False
        self._fd: int | None = None  # active segment, read-write
        self._idx_fd: int | None = None
        #: :meth:`allocated_bytes` after this object's last append under a quota (-1: none yet).
        self.quota_seen = -1
        #: The site's pool of pre-created conversation directories, and an entry claimed as this
        #: conversation whose first segment is not written yet.
        self.pool = pool
        self._claim: Claim | None = None
        #: A first segment was just made: the pool may be refilled once the append is done.
        self._refill_pool = False
        #: The first directory of ``path`` found missing when this object was made (the symbolic
        #: link check), if any: a hint for a first append's claim, which then does not look again
        #: (another process may have made it since: a claim never replaces what is there).
        self._missing = missing
        self._reset_state()

    def _reset_state(self) -> None:
        self._loaded = False
        self._segments: list[int] = []  # base seqs, ascending
        self._salt = 0
        self._end = 0  # committed end of the active segment
        # Size of the active segment file as last seen or set by us: [_end, _alloc) is
        # preallocated space, all zero (FORMAT.md, "Preallocated space").
        self._alloc = 0
        self._sealed_active = False  # the active segment ends with a seal record
        self._next_seq = 0
        self._last_us = 0
        self._created_us: int | None = None
        self._idx = index.SparseIndex(0, 0)
        #: The writer holds the active segment without an index file: it has no entry yet,
        #: and the file is created with the first one (see ActiveSegment._write_index_entries).
        self._idx_lazy = False
        # Entries of our own appends not yet in the index file (see _note_index_entry).
        self._idx_unwritten: list[bytes] = []
        self._damage: Corrupted | None = None
        self._pending_end: int | None = None
        self._last_group = 0  # bytes of the records of the last group written
        # base seq -> ((inode, size), (salt, end, index)) of sealed segments read lately.
        self._sealed_cache: dict[int, tuple[tuple[int, int], tuple[int, int, index.SparseIndex]]] = {}

    def _settle(self) -> None:
        """Wait until no thread extends the active segment (``mutex`` held; released while waiting)."""
        while self._growing:
            self._cond.wait()

    def _close_files(self) -> None:
        self._settle()
        for fd in (self._fd, self._idx_fd):
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self._fd = self._idx_fd = None
        self._reset_state()

    def _seg_path(self, base: int) -> str:
        return os.path.join(self.path, layout.segment_name(base))

    def _idx_path(self, base: int) -> str:
        return os.path.join(self.path, layout.index_name(base))

    def _lock(self, exclusive: bool, deadline: float, started: float) -> None:
        """Take the lock file's lock (``mutex`` held), or share this process's hold of it.

        The lock belongs to the open file description, which all threads share:
        it is taken by the first holder and released by the last
        (``_lock_holds``). Only an exclusive holder ever releases ``mutex``
        while holding it (a group being written, an extension), so a thread
        that finds it held shares an exclusive hold: nobody else can write, and
        the state is what that holder refreshed plus this process's own writes.
        """
        if self._lock_holds:
            self._lock_holds += 1
            return
        if self._lock_fd is None:
            self._lock_fd = fileio.open_create(os.path.join(self.path, layout.LOCK_FILE))
        fd = self._lock_fd
        if not fileio.try_lock(fd, exclusive):  # the common case first, without a closure
            _lock_wait(lambda: fileio.try_lock(fd, exclusive), deadline, started)
        self._lock_holds = 1

    def _unlock(self) -> None:
        self._lock_holds -= 1
        if self._lock_holds == 0 and self._lock_fd is not None:
            fileio.unlock(self._lock_fd)

    def _close_active(self) -> None:
        self._settle()
        for fd in (self._fd, self._idx_fd):
            if fd is not None:
                os.close(fd)
        self._fd = self._idx_fd = None

    def allocated_bytes(self) -> int:
        """What the disk holds for the active segment and its index (``st_blocks``), -1 when none is open.

        For quota accounting (:mod:`logstore.quota`); ``mutex`` held.
        """
        if self._fd is None:
            return -1
        total = 0
        for fd in (self._fd, self._idx_fd):
            if fd is not None:
                total += os.fstat(fd).st_blocks * 512
        return total

    def holds_segments(self) -> bool:
        """True when the conversation held a segment when its files were last looked at (a hint, not a check)."""
        return self._loaded and bool(self._segments)

    def _list_segments(self) -> list[int]:
        try:
            names = os.listdir(self.path)
        except FileNotFoundError:
            return []
        return sorted(b for b in map(layout.parse_segment_name, names) if b is not None)


class ReadOnlyFile:
    """A read-only descriptor as a context manager."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.fd = -1

    def __enter__(self) -> int:
        self.fd = os.open(self.path, os.O_RDONLY)
        return self.fd

    def __exit__(self, *exc: object) -> None:
        os.close(self.fd)

