"""Work the engine does off the caller's path, on a small thread pool, and waiting for it.

Three kinds of job run here: extend-ahead (zeros written and synced into an
active segment before appends need them, :meth:`logstore.preallocation.Preallocated._extend_ahead`),
the cut of a closed conversation's unused zeros (:func:`logstore.zerofill.trim`)
and the refill of a site's pool of conversation directories
(:meth:`logstore.convpool.SitePool.fill`). No caller ever waits for a job to
be acknowledged; every job's failure is harmless (what it leaves is space or
entries that the appends do without). :func:`wait` exists for benchmarks and
tests that must keep a job's I/O out of something they time or compare, and
:func:`busy_seconds` tells how much time the jobs took.
"""

from __future__ import annotations

import concurrent.futures
import os
import threading
import time
from collections.abc import Callable

#: Threads running jobs (two: an extension and a refill can run at once).
WORKERS = 2

_pool: concurrent.futures.ThreadPoolExecutor | None = None
_lock = threading.Lock()
_idle = threading.Condition(_lock)
_pending = 0  # jobs handed over and not finished
#: Seconds spent running jobs, per kind (wall time on the job's thread), since the process started.
_busy: dict[str, float] = {}


def run(job: Callable[[], None], kind: str = "job") -> None:
    """Run ``job`` on a background thread, tracked by :func:`wait`; its time is added to ``kind``.

    Raises RuntimeError when the interpreter is shutting down (the caller then
    does without the job).
    """
    global _pool, _pending
    with _lock:
        if _pool is None:
            _pool = concurrent.futures.ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="logstore-bg")
        _pool.submit(_tracked, job, kind)
        _pending += 1


def _tracked(job: Callable[[], None], kind: str) -> None:
    global _pending
    started = time.perf_counter()
    try:
        job()
    finally:
        took = time.perf_counter() - started
        with _lock:
            _busy[kind] = _busy.get(kind, 0.0) + took
            _pending -= 1
            if not _pending:
                _idle.notify_all()


def wait(timeout: float | None = None) -> bool:
    """Wait until no background job of this process is queued or running; False on timeout.

    Call it holding no conversation's ``mutex`` (an extend-ahead job needs it
    to finish) and no pool's fill lock.
    """
    with _lock:
        return _idle.wait_for(lambda: not _pending, timeout)


def busy_seconds() -> dict[str, float]:
    """Seconds the jobs of each kind have run so far in this process (a copy)."""
    with _lock:
        return dict(_busy)


def _forget() -> None:
    """In a forked child the parent's threads do not exist: start a new pool when needed."""
    global _pool, _lock, _idle, _pending
    _pool = None
    _lock = threading.Lock()
    _idle = threading.Condition(_lock)
    _pending = 0


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget)
