"""Waiting for a conversation to grow, without polling: inotify, plus a wake-up from this process's writer.

Why inotify (through a small ctypes binding, Linux only) and not a
per-conversation FIFO or socket: every append already writes the
conversation's segment file, and the kernel reports that write to a watch on
the conversation's directory (``IN_MODIFY``; a new segment or a claimed
directory shows as ``IN_CREATE``/``IN_MOVED_TO``). Writers need no change and
no extra file, and a writer that crashed leaves nothing behind that a
follower could block on; a FIFO would need every writer of every process to
open and write it on every append, and stale FIFOs cleaned up.

The event comes with the write, before its sync: a follower woken by another
process then reads, and the read waits for the writer's lock as any read does.
This process's own writer acknowledges a group only after its sync, when no
further event comes, so the writer calls :func:`changed` after each group:
that wakes this process's followers of the conversation directly.

One inotify instance serves the whole process (a reader thread dispatches its
events to the waiters of each directory), so followers never use up the
per-user instance limit. Where inotify is not available (another OS, or the
watch limit is reached) a follower re-checks once every
:data:`FALLBACK_CHECK` seconds instead.
"""

from __future__ import annotations

import errno
import os
import struct
import threading
import time
from collections.abc import Callable

IN_MODIFY = 0x00000002
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_DELETE_SELF = 0x00000400
IN_IGNORED = 0x00008000
IN_ONLYDIR = 0x01000000
IN_CLOEXEC = 0o2000000
_EVENT = struct.Struct("iIII")
_MASK = IN_MODIFY | IN_CREATE | IN_MOVED_TO | IN_DELETE_SELF | IN_ONLYDIR

#: Seconds between re-checks of a follower that could not get an inotify watch.
FALLBACK_CHECK = 0.5

# Waiters of this process, by conversation directory (woken by changed()) and by watched directory.
_lock = threading.Lock()
_local: dict[str, set[threading.Event]] = {}


def changed(path: str) -> None:
    """Wake this process's followers of the conversation directory ``path`` (after a group was acknowledged)."""
    if not _local:  # the common case: nobody follows anything
        return
    with _lock:
        waiters = list(_local.get(path, ()))
    for ev in waiters:
        ev.set()


class _Inotify:
    """The process's inotify instance: watches shared by directory, events dispatched to waiters."""

    def __init__(self) -> None:
        # Imported here, not at module load: a process that only reads never pays for ctypes, and
        # the interpreter's own symbols hold libc's inotify calls (ctypes.util would start a subprocess).
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        self._add = libc.inotify_add_watch
        self._add.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
        self._rm = libc.inotify_rm_watch
        self._rm.argtypes = [ctypes.c_int, ctypes.c_int]
        fd = libc.inotify_init1(IN_CLOEXEC)
        if fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1 failed")
        self.fd = fd
        self._by_wd: dict[int, str] = {}
        self._watches: dict[str, tuple[int, set[threading.Event]]] = {}
        threading.Thread(target=self._dispatch, name="convmem-follow", daemon=True).start()

    def watch(self, path: str, ev: threading.Event) -> bool:
        """Wake ``ev`` on changes in directory ``path``; False when no watch could be had."""
        with _lock:
            found = self._watches.get(path)
            if found is None:
                wd = self._add(self.fd, os.fsencode(path), _MASK)
                if wd < 0:
                    return False
                found = (wd, set())
                self._watches[path] = found
                self._by_wd[wd] = path
            found[1].add(ev)
            return True

    def unwatch(self, path: str, ev: threading.Event) -> None:
        with _lock:
            found = self._watches.get(path)
            if found is None:
                return
            found[1].discard(ev)
            if not found[1]:
                del self._watches[path]
                self._by_wd.pop(found[0], None)
                self._rm(self.fd, found[0])  # an already removed watch just fails (EINVAL)

    def _dispatch(self) -> None:
        while True:
            try:
                data = os.read(self.fd, 64 * 1024)
            except InterruptedError:
                continue
            except OSError as exc:
                if exc.errno == errno.EINTR:
                    continue
                return
            pos = 0
            woken: set[threading.Event] = set()
            with _lock:
                while pos + _EVENT.size <= len(data):
                    wd, mask, _cookie, length = _EVENT.unpack_from(data, pos)
                    pos += _EVENT.size + length
                    path = self._by_wd.get(wd)
                    if path is None:
                        continue
                    woken |= self._watches.get(path, (0, set()))[1]
                    if mask & IN_IGNORED:  # the directory is gone: its waiters look again
                        self._by_wd.pop(wd, None)
                        self._watches.pop(path, None)
            for ev in woken:
                ev.set()


_inotify: _Inotify | None = None
_inotify_failed = False


def _instance() -> _Inotify | None:
    global _inotify, _inotify_failed
    with _lock:
        if _inotify is None and not _inotify_failed:
            try:
                _inotify = _Inotify()
            except (OSError, AttributeError):
                _inotify_failed = True  # no inotify here: followers re-check now and then
        return _inotify


def _nearest_existing(path: str, stop: str) -> str:
    """``path`` itself or its nearest existing ancestor, never above ``stop``."""
    while not os.path.isdir(path) and path != stop and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    return path


def wait_until(path: str, root: str, ready: Callable[[], bool], timeout: float) -> bool:
    """Wait until ``ready()`` (checked on each change under conversation directory ``path``), at most ``timeout`` s.

    ``root`` bounds the walk up to a directory that exists when the
    conversation does not yet. ``ready`` is called once at the start and then
    only after an event (or, without inotify, every :data:`FALLBACK_CHECK`
    seconds). True when it returned True in time.
    """
    deadline = time.monotonic() + timeout
    ev = threading.Event()
    ino = _instance()
    with _lock:
        _local.setdefault(path, set()).add(ev)
    try:
        while True:
            target = _nearest_existing(path, root)
            watched = ino is not None and ino.watch(target, ev)
            try:
                ev.clear()  # before the check: a change after it sets the event again
                if ready():
                    return True
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                ev.wait(left if watched else min(left, FALLBACK_CHECK))
            finally:
                if watched and ino is not None:
                    ino.unwatch(target, ev)
    finally:
        with _lock:
            waiters = _local.get(path)
            if waiters is not None:
                waiters.discard(ev)
                if not waiters:
                    del _local[path]
