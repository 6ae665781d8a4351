"""Locks kept between uses while busy (leases), the knock that asks a holder for one, and their reaper.

A conversation's ``lock``, a site's ``manifest.lock`` and its ``site.id`` are
``flock`` locks (FORMAT.md 7). Taking and releasing one per append costs two
system calls, and what a process knows of the files they guard must be
checked again each time it takes one afresh (another process may have
written meanwhile): a conversation's tail (an ``fstat`` and a ``pread``), the
manifest log's link count and lock file, the path of ``site.id``. A
**lease** keeps the lock after the use ends, while the object is busy: the
next use finds it held, and nothing needs checking (nobody else can have
taken it). A lease is let go:

* when it was not used for :data:`IDLE` seconds (by the reaper thread here,
  which looks every :data:`TICK` seconds);
* when another process **knocks**: a waiter for a lock that finds it taken
  holds an open-file-description (OFD) read lock on byte 0 of the same file
  while it waits (:func:`wait_lock`); the reaper tests for one every tick
  (:func:`knocked`, one ``fcntl``), and so do the manifest's intents at most
  every :data:`FAST_KNOCK_CHECK`; the lease is let go then, or, when the lock
  is in use, at the end of that use. OFD record locks and ``flock`` locks
  never interact on Linux, and a knock dies with its descriptor (a killed
  waiter knocks no more);
* after :data:`TERM` seconds however busy (for a waiter that does not knock);
* at close, and when the object learns its files changed (site removed).

A lock that several processes use busily is not leased: after a knock, or
after having to wait for the lock itself, a holder keeps no lease for
:data:`CONTENDED` seconds (a knock costs the waiter up to a tick, which a
lock handed back and forth on every use would pay every time); and
``manifest.lock`` is leased only by a hold that found the log as this
process left it (:mod:`logstore.manifestfiles`).

So a waiter that knocks gets the lock within :data:`TICK` plus one use of
the holder under way (an append's write and sync), and at most :data:`IDLE`
plus :data:`TICK` when the holder is idle; one that does not knock within
:data:`TERM` plus that. A holder that let its lease go on a knock stays away
while the knock is there (:func:`yield_to_knock`), so the waiter's next try
finds the lock free.

Where OFD locks do not exist (not Linux) nothing is leased.
"""

from __future__ import annotations

import os
import struct
import threading
import time
import weakref
from collections.abc import Callable

try:
    import fcntl as _fcntl

    _GETLK: int | None = getattr(_fcntl, "F_OFD_GETLK", None)
    _SETLK: int | None = getattr(_fcntl, "F_OFD_SETLK", None)
except ImportError:  # pragma: no cover
    _fcntl = None  # type: ignore[assignment]
    _GETLK = _SETLK = None

from .errors import Timeout

#: Whether this platform can knock (OFD record locks): without them no lock is leased.
SUPPORTED = _fcntl is not None and _GETLK is not None and _SETLK is not None

#: A lease unused this long is let go (seconds).
IDLE = 0.020
#: The reaper looks at the held leases this often while there are any (seconds).
TICK = 0.010
#: A site manifest's intents written under its lease look for a knock at most this often (seconds):
#: writers of the log in several processes hand its lock over faster than the reaper's tick.
FAST_KNOCK_CHECK = 0.001
#: A lease is let go this long after it was taken however busy its holder is (seconds).
TERM = 0.25
#: After another process knocked, or had the lock when we wanted it, no lease is kept for this long
#: (seconds): a lock shared by busy processes is taken and let go per use, as without leases.
CONTENDED = 1.0
#: A holder that let its lease go on a knock waits at most this long for the knock to go (seconds).
YIELD_MAX = 0.1
#: A knocking waiter retries its lock at least this often (seconds).
WAIT_STEP_MAX = 0.002

# struct flock (Linux): short l_type, short l_whence, off_t l_start, off_t l_len, pid_t l_pid.
_FLOCK = struct.Struct("hhqqi4x")


def _ofd(fd: int, cmd: int | None, kind: int) -> int:
    assert _fcntl is not None and cmd is not None
    out = _fcntl.fcntl(fd, cmd, _FLOCK.pack(kind, 0, 0, 1, 0))
    return int(_FLOCK.unpack(out)[0])


def knock(fd: int) -> None:
    """Ask the holder of ``fd``'s file's lock to let it go (an OFD read lock on byte 0, held until :func:`unknock`)."""
    if SUPPORTED:
        _ofd(fd, _SETLK, _fcntl.F_RDLCK)


def unknock(fd: int) -> None:
    if SUPPORTED:
        _ofd(fd, _SETLK, _fcntl.F_UNLCK)


def knocked(fd: int) -> bool:
    """Whether another open file description knocks on ``fd``'s file (one ``fcntl``)."""
    if not SUPPORTED:
        return False
    return _ofd(fd, _GETLK, _fcntl.F_WRLCK) != _fcntl.F_UNLCK


def wait_lock(acquire: Callable[[], bool], fd: int, deadline: float, started: float) -> None:
    """Retry ``acquire`` (a non-blocking lock of ``fd``'s file) until it succeeds, knocking meanwhile.

    Raises Timeout at ``deadline`` (a ``time.monotonic()`` value). The knock is
    taken after the first failed try and dropped before returning.
    """
    if acquire():
        return
    knock(fd)
    try:
        delay = 0.0005
        while not acquire():
            now = time.monotonic()
            if now >= deadline:
                raise Timeout(now - started)
            time.sleep(min(delay, max(deadline - now, 0.0)))
            delay = min(delay * 2, WAIT_STEP_MAX)
    finally:
        unknock(fd)


def yield_to_knock(fd: int, deadline: float) -> None:
    """Wait while another process knocks on ``fd``'s file (at most :data:`YIELD_MAX`, never past ``deadline``).

    For a holder that has just let its lease go on a knock: taking the lock
    back at once would leave the knocking waiter, which retries between
    sleeps, without a chance.
    """
    until = min(deadline, time.monotonic() + YIELD_MAX)
    delay = 0.0002
    while knocked(fd) and time.monotonic() < until:
        time.sleep(delay)
        delay = min(delay * 2, WAIT_STEP_MAX)


class Leased:
    """What the reaper asks of an object holding a lease."""

    def reap(self, now: float) -> bool:
        """Let the lease go if it is due (idle, knocked, past its term); True when none is held any more.

        Never blocks (a lock it needs that is taken means: look again next tick).
        """
        raise NotImplementedError


class _Reaper:
    """One daemon thread per process that lets idle and knocked leases go (see the module doc)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._held: weakref.WeakSet[Leased] = weakref.WeakSet()
        self._thread: threading.Thread | None = None

    def watch(self, obj: Leased) -> None:
        """Look at ``obj`` every tick until its :meth:`Leased.reap` lets the lease go."""
        with self._cond:
            if obj in self._held:
                return
            self._held.add(obj)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="convmem-lease-reaper", daemon=True)
                self._thread.start()
            self._cond.notify_all()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._held:
                    self._cond.wait()
            time.sleep(TICK)
            with self._cond:
                # Under the condition's lock: a lease taken again right after ``reap`` let it go is
                # watched again (``watch`` waits), never dropped here. ``reap`` never blocks.
                now = time.monotonic()
                for obj in list(self._held):
                    try:
                        done = obj.reap(now)
                    except Exception:
                        done = True
                    if done:
                        self._held.discard(obj)
                if not self._held:
                    self._cond.notify_all()  # (wait_let_go)

    def wait_let_go(self, timeout: float) -> bool:
        """Wait until this process holds no lease (False on timeout). For tests and benchmarks."""
        until = time.monotonic() + timeout
        with self._cond:
            while self._held:
                left = until - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
            return True


    def _after_fork(self) -> None:
        """In a forked child: no thread runs, and the parent's objects are not the child's to reap."""
        self._cond = threading.Condition()
        self._held = weakref.WeakSet()
        self._thread = None


reaper = _Reaper()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=reaper._after_fork)
