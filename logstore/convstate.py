"""The state one :class:`~logstore.conversation.Conversation` keeps in memory, its files and its locks.

What is kept (the active segment, :class:`logstore.activesegment.ActiveSegment`,
with its committed end and sparse index; the list of segment bases, next seq,
last ``recorded_at``) is only ever a cache of the files: it is
re-derived (:mod:`logstore.recovery`) whenever another process may have
changed them. The writer (:mod:`logstore.writer`) and the reader
(:mod:`logstore.reader`) both build on it.

Locking: ``mutex`` serializes threads of this process; the ``lock`` file in
the directory serializes processes (exclusive for writers, shared for a
reader that must re-read the tail). Lock order is always conversation, then
site manifest. A writer's exclusive lock is kept between appends while the
conversation is busy (a lease, :mod:`logstore.lease`): the next append finds
it held and, nobody else having been able to write, the tail needs no look.
"""

from __future__ import annotations

import collections
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from . import fileio, layout, lease, observe
from .errors import Corrupted
from .sealedsegment import SealedCache

if TYPE_CHECKING:
    from .activesegment import ActiveSegment
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


def _lock_wait(acquire: Callable[[], bool], fd: int, deadline: float, started: float) -> None:
    if acquire():
        return
    with observe.timed("lock_wait"):
        lease.wait_lock(acquire, fd, deadline, started)


class ConversationState(lease.Leased):
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
        # The lock file's lock is held exclusively with no holder: a lease (see _unlock).
        self._leased = False
        self._lock_excl = False  # the lock file's lock was taken exclusively
        self._lease_since = 0.0  # when it was taken (a lease ends TERM after it)
        self._lease_used = 0.0  # when its last holder let it go (an idle lease ends IDLE after it)
        # Whether the exclusive hold now under way began less than lease.IDLE after the previous one
        # ended: only then is it kept as a lease (see _unlock), and when that previous one ended.
        self._busy = False
        self._excl_ended = -lease.IDLE
        self._knock_seen = False  # the reaper saw another process knock (see reap)
        self._contended_until = 0.0  # until then no lease is kept (lease.CONTENDED)
        self._watched = False  # the lease reaper looks at this object
        # Until then, an exclusive take of the lock first waits while another process knocks (we let
        # a lease go on its knock, see lease.yield_to_knock).
        self._yield_until = 0.0
        self._loaded = False
        #: :meth:`allocated_bytes` after this object's last append under a quota (-1: none yet).
        self.quota_seen = -1
        #: The site's pool of pre-created conversation directories, and an entry claimed as this
        #: conversation whose first segment is not written yet.
        self.pool = pool
        self._claim: Claim | None = None
        #: A first segment was just made: the pool may be refilled once the append is done
        #: (:meth:`pool_to_refill`).
        self._refill_pool = False
        #: The first directory of ``path`` found missing when this object was made (the symbolic
        #: link check), if any: a hint for a first append's claim, which then does not look again
        #: (another process may have made it since: a claim never replaces what is there).
        self._missing = missing
        self._reset_state()

    def _reset_state(self) -> None:
        self._loaded = False
        self._segments: list[int] = []  # base seqs, ascending
        #: The active (last) segment, open (:class:`logstore.activesegment.ActiveSegment`); None when none is.
        self.active: ActiveSegment | None = None
        self._next_seq = 0
        self._last_us = 0
        self._created_us: int | None = None
        self._damage: Corrupted | None = None
        self._last_group = 0  # bytes of the records of the last group written
        #: Sealed segments read lately (:class:`logstore.sealedsegment.SealedCache`).
        self.sealed_cache = SealedCache()

    def _settle(self) -> None:
        """Wait until no thread extends the active segment (``mutex`` held; released while waiting)."""
        while self._growing:
            self._cond.wait()

    def _close_files(self) -> None:
        self._settle()
        if self.active is not None:
            self.active.close(quiet=True)
            self.active = None
        self._reset_state()

    def _seg_path(self, base: int) -> str:
        return os.path.join(self.path, layout.segment_name(base))

    def _idx_path(self, base: int) -> str:
        return os.path.join(self.path, layout.index_name(base))

    def _lock(self, exclusive: bool, deadline: float, started: float) -> bool:
        """Take the lock file's lock (``mutex`` held), or share this process's hold of it.

        The lock belongs to the open file description, which all threads share:
        it is taken by the first holder and released by the last
        (``_lock_holds``), or kept as a lease (:meth:`_unlock`). Only an
        exclusive holder ever releases ``mutex`` while holding it (a group
        being written, an extension), so a thread that finds it held shares
        an exclusive hold: nobody else can write, and the state is what that
        holder refreshed plus this process's own writes. A lease is an
        exclusive hold too. True when the lock was held already (shared or
        leased): the state is current unless it was dropped meanwhile.
        """
        if self._lock_holds:
            self._lock_holds += 1
            return True
        if self._leased:
            self._leased = False
            self._lock_holds = 1
            self._busy = True
            return True
        if self._lock_fd is None:
            self._lock_fd = fileio.open_create(os.path.join(self.path, layout.LOCK_FILE))
        fd = self._lock_fd
        if exclusive and self._yield_until and time.monotonic() < self._yield_until:
            lease.yield_to_knock(fd, deadline)  # we let a lease go on a knock: let the knocker in first
        if not fileio.try_lock(fd, exclusive):  # the common case first, without a closure
            self._contended_until = time.monotonic() + lease.CONTENDED  # another process uses it too
            _lock_wait(lambda: fileio.try_lock(fd, exclusive), fd, deadline, started)
        self._lock_holds = 1
        self._lock_excl = exclusive
        self._lease_since = time.monotonic()
        self._busy = exclusive and self._lease_since - self._excl_ended < lease.IDLE
        return False

    def pool_to_refill(self) -> SitePool | None:
        """The site's pool, once, when this conversation's last append made its first segment (``mutex`` held).

        The caller asks for the refill (:meth:`logstore.convpool.SitePool.refill_if_due`)
        once it has let go of ``mutex`` and the site's lock: a fill thread woken
        earlier would take the interpreter lock at the append's next system
        call (the lock file's unlock) and hold the append back.
        """
        if not self._refill_pool:
            return None
        self._refill_pool = False
        return self.pool

    def _unlock(self) -> None:
        """Let one hold of the lock file's lock go; the last one releases it, or keeps it as a lease.

        Kept (exclusive takes only) when the conversation is busy: this hold
        began less than ``lease.IDLE`` after the previous exclusive one ended
        (so a lone append, the usual turn of an agent, lets the lock go at
        once, and another process reading it right after never waits for a
        lease); and not when the conversation is closed, the lease is past its
        term, or another process uses the lock too (the reaper saw it knock,
        :meth:`reap`, or we had to wait for it, less than ``lease.CONTENDED``
        ago). The reaper also lets an idle one go. Invariant: ``_leased``
        implies ``_lock_holds == 0`` and the lock held exclusively through
        ``_lock_fd``.
        """
        self._lock_holds -= 1
        if self._lock_holds == 0 and self._lock_fd is not None:
            if self._lock_excl and lease.SUPPORTED and not self.closed:
                now = self._excl_ended = time.monotonic()
                if self._knock_seen:
                    self._knocked(now)
                elif self._busy and now >= self._contended_until and now - self._lease_since < lease.TERM:
                    self._leased = True
                    self._lease_used = now
                    if not self._watched:
                        self._watched = True  # (under ``mutex``, as in reap: one watch at a time)
                        lease.reaper.watch(self)
                    return
            fileio.unlock(self._lock_fd)

    def _knocked(self, now: float) -> None:
        """Another process knocked: let it in before taking the lock again, and keep no lease for a while."""
        self._knock_seen = False
        self._yield_until = now + 1.0
        self._contended_until = now + lease.CONTENDED

    def _release_lease(self) -> None:
        """Let a lease go now (``mutex`` held)."""
        if self._leased:
            self._leased = False
            if self._lock_fd is not None:
                fileio.unlock(self._lock_fd)

    def reap(self, now: float) -> bool:
        """The reaper's look (:class:`logstore.lease.Leased`), every ``lease.TICK`` while the lock is held.

        A knock is looked for without ``mutex`` (a busy conversation's is
        rarely free), and noted for the last holder's :meth:`_unlock`. An idle,
        knocked or expired lease is let go when ``mutex`` is free. (The
        descriptor may be closed meanwhile: the test is harmless on any
        descriptor, and a wrong answer costs a lease or one tick.)
        """
        fd = self._lock_fd
        if fd is not None and (self._leased or self._lock_holds):
            try:
                if lease.knocked(fd):
                    self._knock_seen = True
            except OSError:
                pass
        if not self.mutex.acquire(blocking=False):
            return False  # in use: looked at again next tick
        try:
            if self._leased:
                if now - self._lease_used < lease.IDLE and now - self._lease_since < lease.TERM:
                    if not self._knock_seen:
                        return False
                if self._knock_seen:
                    self._knocked(now)
                self._release_lease()
            elif self._lock_holds:
                return False  # held for an append: the knock is noted for its end
            self._watched = False
            return True
        finally:
            self.mutex.release()

    def _close_active(self) -> None:
        self._settle()
        if self.active is not None:
            self.active.close(quiet=False)
            self.active = None

    def allocated_bytes(self) -> int:
        """What the disk holds for the active segment and its index (``st_blocks``), -1 when none is open.

        For quota accounting (:mod:`logstore.quota`); ``mutex`` held.
        """
        return -1 if self.active is None else self.active.allocated_bytes()

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

