"""The single seam for file I/O that matters to durability.

Every write, sync, directory sync, create, rename, unlink and truncate of
the engine goes through here, so that a recorder can log them all to
simulate a power cut (what the disk may hold when power is lost after any
one of them) and named crash points can stop the process between them.
Fault-injection tests can make the writes and the syncs (``fault_hook``:
"write", "fdatasync", "fsync") fail; creates, renames, unlinks and truncates
are not injected.

Crash points are inert unless the environment variable ``CONVMEM_CRASH_AT``
is set when this module is imported, to ``NAME`` or ``NAME:N`` (crash at the
N-th time the point is reached, default 1). The process then exits at once
with status 86 (``os._exit``: no cleanup, no flush), as a SIGKILL would.
Points: ``record-mid-write``, ``before-data-sync``, ``after-data-sync``,
``after-file-create``, ``after-dir-create``, ``segment-roll-sealed``,
``segment-roll-created``, ``manifest-intent``, ``manifest-commit``,
``manifest-compact``, ``extend-ahead-written`` (an extend-ahead chunk's zeros
written, not yet synced; on the job's background thread), ``pool-entry-built``
(a pre-created conversation directory made but not yet named ready),
``pool-claimed`` (a pool entry just renamed into place as a conversation,
nothing written to it yet); in maintenance: ``forget-unlisted`` (the listing
marked incomplete, no file removed yet), ``forget-removed`` (segments removed,
the listing not yet rewritten), ``redact-new-synced`` (a redacted copy synced
as ``<name>.tmp``, not yet renamed), ``redact-renamed`` (renamed over the
segment, directory not yet synced) and ``redact-replaced`` (directory synced,
the old file not yet cut, the index not yet rewritten); these are reached once
per segment rewritten or forget run.
"""

from __future__ import annotations

import concurrent.futures
import errno as _errno
import os
import shutil
import threading
import time
from collections.abc import Callable
from typing import Any

from . import observe

try:
    import fcntl as _fcntl
except ImportError:  # pragma: no cover - not POSIX: fall back to portalocker
    _fcntl = None  # type: ignore[assignment]  # the module's name stands for "no fcntl" here

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


#: Power-cut simulation for tests: when set, called after each durability-relevant
#: operation succeeded, with its name and arguments (descriptors still open):
#: ``("create", path, fd)`` (a file opened with O_CREAT, possibly truncated),
#: ``("write", fd, offset, data)``, ``("sync", fd)`` (fsync or fdatasync),
#: ``("truncate", fd, size)``, ``("dirsync", path)``, ``("mkdir", path)``,
#: ``("rename", src, dst)``, ``("link", src, dst)``, ``("unlink", path)``, ``("rmtree", path)``.
#: None (the default) costs one global lookup per operation.
recorder: Callable[..., None] | None = None


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
    start = offset
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
    if recorder is not None:
        recorder("write", fd, start, bytes(data))


#: ``os.RWF_DSYNC`` where the platform has it (Linux 4.7+), else None: see :func:`pwrite_synced`.
_RWF_DSYNC: int | None = getattr(os, "RWF_DSYNC", None) if hasattr(os, "pwritev") else None


def pwrite_synced(fd: int, data: bytes, offset: int, between: tuple[str, ...] = ()) -> None:
    """Write all of ``data`` at ``offset`` and make it durable, as :func:`pwrite_all` then :func:`fdatasync`.

    Where the platform has it, one ``pwritev(..., RWF_DSYNC)``: the write and
    the data sync of its range in one system call (one release of the
    interpreter lock instead of two). That makes the written range and the
    metadata needed to read it (the file size, newly allocated blocks) durable
    as ``fdatasync`` does, and flushes the device's cache; the file's dirty
    pages outside the range are neither written nor waited for (an
    extend-ahead job's zeros, synced by the job itself before any append
    relies on them). The observer sees the call as one ``fdatasync``. When a
    test watches the seam (a fault hook, a recorder, a crash point) it is the
    two calls, with the crash points ``between`` them reached in order, so
    every fault suite sees the writes and syncs it always saw. A short write
    (never seen for regular files) is finished the two-call way. A file system
    that refuses the flag (``EOPNOTSUPP``, ``EINVAL``: the kernel checks it
    before writing anything) gets the two calls from then on, for every file.
    """
    global _RWF_DSYNC
    flag = _RWF_DSYNC
    if flag is None or fault_hook is not None or recorder is not None or _crash_at is not None:
        pwrite_all(fd, data, offset)
        for name in between:
            crashpoint(name)
        fdatasync(fd)
        return
    try:
        if observe._observer is not None:
            with observe.timed("fdatasync"):
                n = os.pwritev(fd, [data], offset, flag)
        else:
            n = os.pwritev(fd, [data], offset, flag)
    except OSError as exc:
        if exc.errno not in _FLAG_REFUSED:
            raise
        _RWF_DSYNC = None
        pwrite_all(fd, data, offset)
        fdatasync(fd)
        return
    if n != len(data):  # pragma: no cover - regular files take whole writes
        pwrite_all(fd, data[n:], offset + n)
        fdatasync(fd)


#: What ``pwritev`` answers when the file system does not take ``RWF_DSYNC`` (nothing written).
_FLAG_REFUSED = frozenset({_errno.EOPNOTSUPP, _errno.EINVAL, _errno.ENOSYS})


def append(fd: int, data: bytes) -> None:
    """Write all of ``data`` at the end of a file opened with ``O_APPEND`` (derived data: no fault hook)."""
    n = os.write(fd, data)
    if n != len(data):  # pragma: no cover - regular files take whole writes
        view = memoryview(data)[n:]
        while view:
            n = os.write(fd, view)
            if n <= 0:
                raise OSError(_errno.EIO, "short write")
            view = view[n:]
    if recorder is not None:
        recorder("write", fd, os.fstat(fd).st_size - len(data), bytes(data))


def fdatasync(fd: int) -> None:
    """Flush a file's data (and the size needed to read it) to stable storage."""
    _fault("fdatasync")
    if observe._observer is not None:
        with observe.timed("fdatasync"):
            os.fdatasync(fd)
    else:
        os.fdatasync(fd)  # the append path's sync: no timer to set up when nobody observes
    if recorder is not None:
        recorder("sync", fd)


_SYNC_FILE_RANGE_WAIT_BEFORE = 1
_SYNC_FILE_RANGE_WRITE = 2
_SYNC_FILE_RANGE_WAIT_AFTER = 4
_c_functions: dict[str, Callable[..., int] | None] = {}


def _c_function(name: str, argtypes: Callable[[], list[Any]]) -> Callable[..., int] | None:
    """The C library's function ``name`` (returning int, taking ``argtypes()``), or None where it has none.

    Looked up once. The interpreter's own symbols include the C library's it
    is linked with; looking the library up by name (ctypes.util) would import
    subprocess on a cold start, so that is only the fallback.
    """
    if name in _c_functions:
        return _c_functions[name]
    fn: Callable[..., int] | None
    try:
        import ctypes

        try:
            found = getattr(ctypes.CDLL(None, use_errno=True), name)
        except AttributeError:
            import ctypes.util

            found = getattr(ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True), name)
        found.argtypes = argtypes()
        found.restype = ctypes.c_int
        fn = found
    except (OSError, AttributeError):
        fn = None
    _c_functions[name] = fn
    return fn


def _sync_file_range_args() -> list[Any]:
    import ctypes

    return [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]


def _renameat2_args() -> list[Any]:
    import ctypes

    return [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]


def write_out(fd: int, offset: int, length: int) -> None:
    """Write a range's dirty pages to the device and wait for them: no cache flush, no metadata, no durability.

    Linux ``sync_file_range`` (through the C library; nothing elsewhere, or
    when it fails): what an extension's zeros need between the steps of one
    chunk, so that an append's ``fdatasync`` meanwhile finds at most one
    step's pages to write, while the chunk costs the device one flush (its
    final :func:`fdatasync`). Not a sync: the recorder is not told, and
    nothing may be relied on after it.
    """
    fn = _c_function("sync_file_range", _sync_file_range_args)
    if fn is not None:
        fn(fd, offset, length,
           _SYNC_FILE_RANGE_WAIT_BEFORE | _SYNC_FILE_RANGE_WRITE | _SYNC_FILE_RANGE_WAIT_AFTER)


def fsync(fd: int) -> None:
    """Flush a file's data and all its metadata."""
    _fault("fsync")
    with observe.timed("fsync"):
        os.fsync(fd)
    if recorder is not None:
        recorder("sync", fd)


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
            with observe.timed("fsync"):
                os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        _unsynced_dirs.add(path)
        raise
    _unsynced_dirs.discard(path)
    if recorder is not None:
        recorder("dirsync", path)


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
        mkdir(path)
    except FileExistsError:
        return False
    fsync_dir(parent)
    _durable_dirs.add(path)
    crashpoint("after-dir-create")
    return True


#: Directories this process has made durably reachable: it synced the parent of each after
#: the directory existed (or created it with :func:`makedirs_durable`). Conversation
#: directories themselves are not kept, so it holds at most the fan-out directories of each
#: site (65,536 + 256). A name is dropped when the engine removes or re-creates the directory
#: (:func:`forget_dirs`, :func:`make_dirs`).
_durable_dirs: set[str] = set()


def make_dirs(path: str) -> list[str]:
    """Create ``path`` and missing parents, none of them synced; return those created, outermost first.

    One ``mkdir`` when only ``path`` is missing (no ``stat`` first). The caller
    makes them durable with :func:`sync_dir_chain` before relying on them.
    """
    try:
        mkdir(path)
    except FileExistsError:
        return []
    except FileNotFoundError:
        parent = os.path.dirname(path)
        if parent == path:
            raise
        created = make_dirs(parent)
        try:
            mkdir(path)
        except FileExistsError:
            return created
        created.append(path)
        _durable_dirs.discard(path)
        crashpoint("after-dir-create")
        return created
    _durable_dirs.discard(path)  # a new directory under a name a removed one had
    crashpoint("after-dir-create")
    return [path]


def dir_chain(path: str, top: str) -> tuple[list[str], list[str]]:
    """The directories :func:`sync_dir_chain` syncs for ``path``, and those it then records as durable."""
    todo = [path]
    linked = []
    d = path
    while d != top and d not in _durable_dirs:
        parent = os.path.dirname(d)
        if parent == d or not d.startswith(top + os.sep):
            break
        todo.append(parent)
        linked.append(d)
        d = parent
    return todo, linked


def not_durable(path: str) -> None:
    """Forget that the directory ``path`` was durably linked (a new directory now has that name)."""
    _durable_dirs.discard(path)


def mark_durable(paths: list[str]) -> None:
    """Record that each of ``paths`` is durably linked in its parent (the parent was synced after it existed)."""
    _durable_dirs.update(paths)


def sync_dir_chain(path: str, top: str, data_fd: int | None = None, also: tuple[str, ...] = ()) -> None:
    """Make the entries of directory ``path`` durable, and ``path`` durably reachable from ``top``.

    Syncs ``path`` itself, then each parent up to ``top`` until one whose
    child is already known durable (:data:`_durable_dirs`): a directory made
    by another process may not be linked durably yet, so a directory this
    process has not synced the parent of is never trusted. ``top`` itself is
    taken as durable (it is made so when it is created, by
    :func:`makedirs_durable`). With ``data_fd``, that file's ``fdatasync`` runs
    at the same time (see :func:`fsync_dirs`), and so do the syncs of the
    directories ``also``.
    """
    todo, linked = dir_chain(path, top)
    todo += [d for d in also if d not in todo]
    fsync_dirs(todo, data_fd)
    # Not ``path`` itself: its entry is made durable once (a conversation directory gets one
    # first segment), so remembering it would only grow the set by one name per conversation.
    _durable_dirs.update(linked[1:])


def fsync_dirs(paths: list[str], data_fd: int | None = None) -> None:
    """:func:`fsync_dir` for each of ``paths`` (and :func:`fdatasync` of ``data_fd``), all at the same time.

    Each sync is mostly a wait for the device: concurrent syncs overlap their
    writes and their cache flushes, which the block layer merges. Which sync
    finishes first does not matter: the caller relies on none of them before
    all have returned. (On a filesystem without a journal, such as the one the
    benchmarks ran on, syncing a new file writes its new parent directories
    one after another; the directory syncs running beside it take that off
    the critical path. On a journaling filesystem the directory syncs may
    commit the journal once more than after the file's sync alone.) The fault
    hook and the recorder are called in order on the calling thread, as for
    :func:`fsync_dir` and :func:`fdatasync`. Raises the first error after
    every sync has finished; a directory whose sync failed or did not run is
    synced again later (see :func:`resync_failed_dirs`).
    """
    if data_fd is None and len(paths) < 2:
        for p in paths:
            fsync_dir(p)
        return
    start_dir_syncs(paths).finish(data_fd)


class DirSyncs:
    """Directory syncs started in the background (:func:`start_dir_syncs`), awaited by :meth:`finish`."""

    def __init__(self, paths: list[str], fds: list[int | None], pending: list[_SyncWorker | _Future]) -> None:
        self.paths = paths
        self._fds = fds
        self._pending = pending

    def finish(self, data_fd: int | None = None) -> None:
        """Wait for every sync (``fdatasync`` of ``data_fd`` too, on this thread, meanwhile); raise the first error.

        A directory whose sync failed is synced again later (as for :func:`fsync_dirs`).
        """
        errors: list[BaseException] = []
        if data_fd is not None:
            try:
                fdatasync(data_fd)
            except OSError as exc:
                errors.append(exc)
        for p, fd, w in zip(self.paths, self._fds, self._pending, strict=True):
            failure = _awaited(w)
            if fd is not None:
                os.close(fd)
            if failure is not None:
                errors.append(failure)
                _unsynced_dirs.add(p)
            else:
                _unsynced_dirs.discard(p)
                if recorder is not None:
                    recorder("dirsync", p)
        if errors:
            raise errors[0]


def sync_all(data_fds: list[int], paths: list[str]) -> None:
    """``fdatasync`` every file of ``data_fds`` and sync every directory of ``paths``, all at the same time.

    Raises the first error once all are done (see :func:`fsync_dirs`).
    """
    for _ in data_fds:
        _fault("fdatasync")
    syncs = start_dir_syncs(paths)
    # The calling thread syncs one file itself (it would only wait meanwhile); sync threads the rest.
    rest = data_fds[1:]
    workers = _take_workers(len(rest))
    pending: list[_SyncWorker | _Future] = []
    for fd in rest:
        if workers:
            w = workers.pop()
            w.start(fd, data=True)
            pending.append(w)
        else:
            pending.append(_dir_sync_pool().submit(_fdatasync_timed, fd))
    errors: list[BaseException] = []
    if data_fds:
        try:
            _fdatasync_timed(data_fds[0])
        except OSError as exc:
            errors.append(exc)
    for job in pending:
        failure = _awaited(job)
        if failure is not None:
            errors.append(failure)
    try:
        syncs.finish()
    except OSError as exc:
        errors.append(exc)
    if errors:
        raise errors[0]
    if recorder is not None:
        for fd in data_fds:
            recorder("sync", fd)


def start_dir_syncs(paths: list[str]) -> DirSyncs:
    """Start syncing each directory of ``paths`` at once, in the background; :meth:`DirSyncs.finish` waits.

    The syncs overlap whatever the caller does meanwhile; best started right
    before the caller's own sync (as :meth:`DirSyncs.finish` with
    ``data_fd`` does): a sync thread takes the interpreter lock when it is
    woken and when its ``fsync`` returns, at the caller's next system call,
    which then waits for it back (measured: a first append that started its
    claim's syncs before its intent and encoding instead, about 60 us more
    CPU and 40 us more latency). The directories are opened here, on the
    calling thread, so that the sync threads (:class:`_SyncWorker`) only wait
    in ``fsync``, and all of them before the first sync is handed over, for
    the same reason (4 directories opened between hand-overs cost a first
    append about 4 such waits). The fault hook runs here; the recorder hears
    of each sync when it is awaited.
    """
    try:
        for _ in paths:
            _fault("fsync")
    except OSError:
        _unsynced_dirs.update(paths)
        raise
    fds: list[int | None] = []
    pending: list[_SyncWorker | _Future] = []
    for p in paths:
        try:
            fds.append(os.open(p, os.O_RDONLY | os.O_DIRECTORY))
        except OSError as exc:  # this one fails at finish(), like a failed sync; the others still run
            failed: _Future = concurrent.futures.Future()
            failed.set_exception(exc)
            fds.append(None)
            pending.append(failed)
            continue
        pending.append(_PENDING_FUTURE)
    if fds:
        workers = _take_workers(sum(fd is not None for fd in fds))
        for i, fd in enumerate(fds):
            if fd is None:
                continue
            if workers:
                w = workers.pop()
                w.start(fd)
                pending[i] = w
            else:  # every sync thread is busy (other callers): the pool's threads take the rest
                pending[i] = _dir_sync_pool().submit(_fsync_timed, fd)
    return DirSyncs(list(paths), fds, pending)


_Future = concurrent.futures.Future[None]
#: A placeholder in start_dir_syncs' list until the sync is handed over (never awaited).
_PENDING_FUTURE: _Future = concurrent.futures.Future()


class _SyncWorker:
    """A thread that syncs one descriptor when told to: :meth:`start`, then :meth:`wait` (once each, in turn).

    What :func:`start_dir_syncs` hands its syncs to: a hand-over is one lock
    release and the wait one lock acquire, where a thread pool's
    ``submit`` and future cost the calling thread twice the interpreter time
    (measured: 4 syncs handed over and awaited, 31-34 us of the caller's CPU
    against 65-69 us). Workers are kept in :data:`_idle_workers` between
    uses, at most :data:`MAX_SYNC_WORKERS` of them.
    """

    __slots__ = ("_data", "_done", "_error", "_fd", "_go")

    def __init__(self) -> None:
        self._go = threading.Lock()
        self._go.acquire()
        self._done = threading.Lock()
        self._done.acquire()
        self._fd = -1
        self._data = False
        self._error: BaseException | None = None
        threading.Thread(target=self._run, name="logstore-dirsync", daemon=True).start()

    def start(self, fd: int, data: bool = False) -> None:
        """Have ``fd`` synced: ``fsync`` (a directory), or with ``data`` ``fdatasync`` (a file)."""
        self._fd = fd
        self._data = data
        self._go.release()

    def wait(self) -> BaseException | None:
        """Wait for the sync :meth:`start` asked for; its error, or None."""
        self._done.acquire()
        return self._error

    def _run(self) -> None:
        while True:
            self._go.acquire()
            try:
                if self._data:
                    _fdatasync_timed(self._fd)
                else:
                    _fsync_timed(self._fd)
                self._error = None
            except BaseException as exc:  # reported by wait() as the sync's failure
                self._error = exc
            finally:
                self._done.release()


#: Sync threads of this process (see _SyncWorker): more than one caller's syncs at a time go
#: to the thread pool beyond this.
MAX_SYNC_WORKERS = 8
_idle_workers: list[_SyncWorker] = []
_workers_made = 0
_workers_lock = threading.Lock()


def _take_workers(n: int) -> list[_SyncWorker]:
    """Up to ``n`` idle sync threads (started as needed, up to MAX_SYNC_WORKERS), now the caller's."""
    global _workers_made
    with _workers_lock:
        got = _idle_workers[-n:] if n else []
        del _idle_workers[len(_idle_workers) - len(got) :]
        while len(got) < n and _workers_made < MAX_SYNC_WORKERS:
            got.append(_SyncWorker())
            _workers_made += 1
        return got


def _give_back(worker: _SyncWorker) -> None:
    with _workers_lock:
        _idle_workers.append(worker)


def _awaited(job: _SyncWorker | _Future) -> BaseException | None:
    """Wait for a sync handed to a sync thread (given back once done) or to the pool; its error, or None."""
    if isinstance(job, _SyncWorker):
        failure = job.wait()
        _give_back(job)
        return failure
    return job.exception()


def _fdatasync_timed(fd: int) -> None:
    """``fdatasync`` on any thread, reported to the observer like :func:`fdatasync` (the metrics count it)."""
    if observe._observer is None:
        os.fdatasync(fd)
        return
    started = time.perf_counter()
    try:
        os.fdatasync(fd)
    finally:
        observe.emit("fdatasync", time.perf_counter() - started)


def _fsync_timed(fd: int) -> None:
    """``fsync`` on a pool thread, reported to the observer like the calling thread's syncs."""
    started = time.perf_counter()
    try:
        os.fsync(fd)
    finally:
        observe.emit("fsync", time.perf_counter() - started)


_pool: concurrent.futures.ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _dir_sync_pool() -> concurrent.futures.ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = concurrent.futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="logstore-dirsync")
        return _pool


def _forget_pool() -> None:
    """In a forked child the parent's pool and sync threads do not exist: start new ones when needed."""
    global _pool, _pool_lock, _workers_made, _workers_lock
    _pool = None
    _pool_lock = threading.Lock()
    _idle_workers.clear()
    _workers_made = 0
    _workers_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool)


def forget_dirs(path: str) -> None:
    """Forget that ``path`` and the directories below it were durable (they are being removed)."""
    prefix = path + os.sep
    for d in [d for d in _durable_dirs if d == path or d.startswith(prefix)]:
        _durable_dirs.discard(d)


def resync_failed_dirs(path: str) -> None:
    """Sync again every directory at or above ``path`` whose earlier sync failed (cheap when none did)."""
    if _unsynced_dirs:
        _resync_dirs(path)


def write_file_atomic(path: str, data: bytes) -> None:
    """Replace ``path`` with ``data``: temp file, sync, rename, sync directory."""
    directory = os.path.dirname(path)
    tmp = f"{path}.tmp.{os.getpid()}"
    fd = open_create(tmp, os.O_WRONLY | os.O_TRUNC)
    try:
        pwrite_all(fd, data, 0)
        fsync(fd)
    finally:
        os.close(fd)
    rename(tmp, path)
    fsync_dir(directory)


def write_file(path: str, data: bytes) -> None:
    """Create or replace the file ``path`` with ``data``, in place and unsynced (derived data)."""
    fd = open_create(path, os.O_WRONLY | os.O_TRUNC)
    try:
        pwrite_all(fd, data, 0)
    finally:
        os.close(fd)


def copy_file(src: str, dst: str) -> int:
    """Copy the bytes of ``src`` to ``dst``, created (or emptied) with :data:`FILE_MODE`; bytes copied.

    Unsynced: the caller syncs the copy (and its directory) before relying on it.
    """
    return copy_prefix(src, dst, None)


def copy_prefix(src: str, dst: str, length: int | None) -> int:
    """Copy the first ``length`` bytes of ``src`` (all of it for None) to ``dst``, as :func:`copy_file`."""
    done = 0
    fin = os.open(src, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        fout = open_create(dst, os.O_WRONLY | os.O_TRUNC)
        try:
            while length is None or done < length:
                want = _COPY_CHUNK if length is None else min(_COPY_CHUNK, length - done)
                chunk = os.pread(fin, want, done)
                if not chunk:
                    break
                pwrite_all(fout, chunk, done)
                done += len(chunk)
        finally:
            os.close(fout)
    finally:
        os.close(fin)
    return done


_COPY_CHUNK = 1 << 20


def open_create(path: str, flags: int = os.O_RDWR, mode: int = FILE_MODE) -> int:
    """``os.open(path, flags | O_CREAT | O_NOFOLLOW)``: a descriptor of a file that may be new (or emptied).

    ``O_NOFOLLOW``: a symbolic link planted at ``path`` fails with ELOOP, never
    creates, empties or writes the file it points to (:mod:`logstore.links`).
    """
    fd = os.open(path, flags | os.O_CREAT | os.O_NOFOLLOW, mode)
    if recorder is not None:
        recorder("create", path, fd)
    return fd


def mkdir(path: str) -> None:
    """Create one directory (not synced: see :func:`makedirs_durable`)."""
    os.mkdir(path, DIR_MODE)
    if recorder is not None:
        recorder("mkdir", path)


def makedirs(path: str) -> None:
    """Create ``path`` and any missing parents, none of them synced."""
    if not path or os.path.isdir(path):
        return
    makedirs(os.path.dirname(path))
    try:
        mkdir(path)
    except FileExistsError:
        pass


def rename(src: str, dst: str) -> None:
    """Rename ``src`` to ``dst``, replacing it (durable once the directory is synced)."""
    os.replace(src, dst)
    if recorder is not None:
        recorder("rename", src, dst)


_RENAME_NOREPLACE = 1


def _load_renameat2() -> Callable[..., int] | None:
    return _c_function("renameat2", _renameat2_args)


def can_rename_noreplace() -> bool:
    """Whether :func:`rename_noreplace` is available (Linux ``renameat2``, through the C library)."""
    return _load_renameat2() is not None


def rename_noreplace(src: str, dst: str) -> None:
    """Rename ``src`` to ``dst`` only if no ``dst`` exists (not even an empty directory): atomic.

    Raises FileExistsError when ``dst`` exists, FileNotFoundError when ``src``
    does not, and OSError(ENOSYS or EINVAL) when the kernel or filesystem
    cannot (the caller falls back to another way). Durable once both
    directories are synced.
    """
    import ctypes

    fn = _load_renameat2()
    if fn is None:
        raise OSError(_errno.ENOSYS, "renameat2 is not available")
    at_fdcwd = -100
    if fn(at_fdcwd, os.fsencode(src), at_fdcwd, os.fsencode(dst), _RENAME_NOREPLACE) != 0:
        err = ctypes.get_errno()
        if err == _errno.EEXIST:
            raise FileExistsError(err, os.strerror(err), dst)
        if err == _errno.ENOENT:
            raise FileNotFoundError(err, os.strerror(err), src)
        raise OSError(err, os.strerror(err), dst)
    if recorder is not None:
        recorder("rename", src, dst)


def link(src: str, dst: str) -> None:
    """Give the file ``src`` a second name ``dst`` (raises FileExistsError when ``dst`` exists).

    Durable once the directory is synced. Publishing a synced temporary file
    this way is an atomic create-if-absent: the name never shows a partial file.
    """
    os.link(src, dst)
    if recorder is not None:
        recorder("link", src, dst)


def unlink(path: str) -> None:
    """Remove a file name (raises FileNotFoundError as ``os.unlink``)."""
    os.unlink(path)
    if recorder is not None:
        recorder("unlink", path)


def remove_tree(path: str, *, ignore_errors: bool = False) -> None:
    """Remove a directory and everything below it (as much as possible, with ``ignore_errors``)."""
    shutil.rmtree(path, ignore_errors=ignore_errors)
    if recorder is not None:
        recorder("rmtree", path)


def truncate(fd: int, size: int) -> None:
    """Cut a file to ``size`` bytes and make that durable."""
    os.ftruncate(fd, size)
    if recorder is not None:
        recorder("truncate", fd, size)
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
