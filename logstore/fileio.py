"""The single seam for file I/O that matters to durability.

Every write, sync, directory sync, rename and truncate of the engine goes
through here, so that fault-injection tests can make any of them fail and
named crash points can stop the process between them.

Crash points are inert unless the environment variable ``CONVMEM_CRASH_AT``
is set when this module is imported, to ``NAME`` or ``NAME:N`` (crash at the
N-th time the point is reached, default 1). The process then exits at once
with status 86 (``os._exit``: no cleanup, no flush), as a SIGKILL would.
Points: ``record-mid-write``, ``before-data-sync``, ``after-data-sync``,
``after-file-create``, ``after-dir-create``, ``segment-roll-sealed``,
``segment-roll-created``, ``manifest-intent``, ``manifest-commit``,
``manifest-compact``.
"""

from __future__ import annotations

import errno as _errno
import os
from collections.abc import Callable

try:
    import fcntl as _fcntl
except ImportError:  # pragma: no cover - not POSIX: fall back to portalocker
    _fcntl = None  # type: ignore[assignment]

CRASH_EXIT_STATUS = 86

#: Mode of every file the engine creates: owner only. Sites are tenants; no other local
#: user may read their conversations or hold their lock files.
FILE_MODE = 0o600
#: Mode of every directory the engine creates (the data directory included): owner only.
DIR_MODE = 0o700


def _parse_crash_env() -> tuple[str, int] | None:
    spec = os.environ.get("CONVMEM_CRASH_AT", "")
    if not spec:
        return None
    name, _, nth = spec.partition(":")
    return name, int(nth) if nth else 1


_crash_at = _parse_crash_env()
_crash_hits = 0

#: Fault injection for tests: when set, called with the operation's name
#: ("fdatasync", "fsync", "write") before it runs; it may raise OSError.
fault_hook: Callable[[str], None] | None = None


def crashpoint(name: str) -> None:
    """Exit the process here if ``CONVMEM_CRASH_AT`` names this point."""
    global _crash_hits
    if _crash_at is None or _crash_at[0] != name:
        return
    _crash_hits += 1
    if _crash_hits >= _crash_at[1]:
        os._exit(CRASH_EXIT_STATUS)


def _fault(op: str) -> None:
    if fault_hook is not None:
        fault_hook(op)


def pwrite_all(fd: int, data: bytes, offset: int) -> None:
    """Write all of ``data`` at ``offset``; short writes are continued."""
    _fault("write")
    view = memoryview(data)
    if _crash_at is not None and _crash_at[0] == "record-mid-write" and len(view) > 1:
        half = len(view) // 2
        os.pwrite(fd, view[:half], offset)
        crashpoint("record-mid-write")
        view, offset = view[half:], offset + half
    while view:
        n = os.pwrite(fd, view, offset)
        if n <= 0:  # pragma: no cover - the kernel reports errors by raising
            raise OSError(_errno.EIO, "short write")
        view, offset = view[n:], offset + n


def fdatasync(fd: int) -> None:
    """Flush a file's data (and the size needed to read it) to stable storage."""
    _fault("fdatasync")
    os.fdatasync(fd)


def fsync(fd: int) -> None:
    """Flush a file's data and all its metadata."""
    _fault("fsync")
    os.fsync(fd)


#: Directories whose sync failed: an entry made in them (a new directory or
#: segment) may exist only in memory. :func:`makedirs_durable` syncs them again
#: before the path below them is used, so nothing is acknowledged on top of them.
_unsynced_dirs: set[str] = set()


def fsync_dir(path: str) -> None:
    """Make a directory's entries (creations, renames, removals) durable."""
    try:
        _fault("fsync")
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        _unsynced_dirs.add(path)
        raise
    _unsynced_dirs.discard(path)


def _resync_dirs(path: str) -> None:
    """Sync again every directory at or above ``path`` whose earlier sync failed."""
    for d in sorted(_unsynced_dirs):
        if path == d or path.startswith(d + os.sep):
            fsync_dir(d)


def makedirs_durable(path: str) -> bool:
    """Create ``path`` and missing parents, syncing each parent that changed.

    Also syncs again any directory at or above ``path`` whose sync failed
    before. Returns True when anything was created.
    """
    if os.path.isdir(path):
        if _unsynced_dirs:
            _resync_dirs(path)
        return False
    parent = os.path.dirname(path)
    makedirs_durable(parent)
    try:
        os.mkdir(path, DIR_MODE)
    except FileExistsError:
        return False
    fsync_dir(parent)
    crashpoint("after-dir-create")
    return True


def write_file_atomic(path: str, data: bytes) -> None:
    """Replace ``path`` with ``data``: temp file, sync, rename, sync directory."""
    directory = os.path.dirname(path)
    tmp = f"{path}.tmp.{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE)
    try:
        pwrite_all(fd, data, 0)
        fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(directory)


def truncate(fd: int, size: int) -> None:
    """Cut a file to ``size`` bytes and make that durable."""
    os.ftruncate(fd, size)
    fsync(fd)


def try_lock(fd: int, exclusive: bool) -> bool:
    """Take an advisory ``flock`` on ``fd`` without waiting; False when another holder has it.

    Calls ``fcntl.flock`` directly: the same lock portalocker takes on POSIX,
    without its per-call overhead (a large share of an append's CPU time).
    """
    if _fcntl is None:  # pragma: no cover
        import portalocker

        try:
            portalocker.lock(fd, (portalocker.LOCK_EX if exclusive else portalocker.LOCK_SH) | portalocker.LOCK_NB)
            return True
        except portalocker.AlreadyLocked:
            return False
    try:
        _fcntl.flock(fd, (_fcntl.LOCK_EX if exclusive else _fcntl.LOCK_SH) | _fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False


def unlock(fd: int) -> None:
    """Release a lock taken by :func:`try_lock`."""
    if _fcntl is None:  # pragma: no cover
        import portalocker

        portalocker.unlock(fd)
        return
    _fcntl.flock(fd, _fcntl.LOCK_UN)
