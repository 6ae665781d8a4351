"""Turning off SQLite's heap statistics, once, at a process's start-up.

SQLite counts every allocation it makes (``sqlite3_memory_used``) unless it
was built or configured without memory statistics; the counters sit behind
one process-wide mutex, taken on every ``malloc`` and ``free`` of every
connection. FTS5 allocates on each step of a BM25 lookup, so lookups on
several threads, which otherwise run in parallel (SQLite releases the GIL
while it steps), queue on that mutex whenever two run at once
(``python -m bench.probes.fts_threads``; figures in docs/retrieval.md). SQLite's own documentation recommends building
with ``SQLITE_DEFAULT_MEMSTATUS=0`` for speed; Python's ``sqlite3`` module
does not expose ``sqlite3_config``, so it is called through :mod:`ctypes`
on the library the ``_sqlite3`` extension loaded.

``SQLITE_CONFIG_MEMSTATUS`` may only be changed while SQLite is shut down,
and ``sqlite3_shutdown`` with a connection open is undefined behaviour.
:func:`turn_off_sqlite_statistics` therefore acts only when it can establish
that nothing of SQLite's is alive in the process: with the statistics on,
``sqlite3_memory_used`` counts every outstanding allocation, so after a
probe connection is closed it reads 0 exactly when no other connection,
statement or buffer exists. That check cannot see a connection another
thread opens after it: the function must be called before the process
starts threads that use SQLite (``convmem serve`` calls it first thing, in
each worker). It changes nothing for a process that has SQLite in use, and
says why.

``CONVMEM_SQLITE_MEMSTATUS=1`` in the environment keeps the statistics on.
"""

from __future__ import annotations

import ctypes
import os
import sqlite3
from typing import NamedTuple

#: ``SQLITE_CONFIG_MEMSTATUS`` of sqlite3.h.
_CONFIG_MEMSTATUS = 9
#: ``SQLITE_OK`` of sqlite3.h.
_OK = 0
#: Set to ``1`` to keep SQLite's heap statistics on.
KEEP_VARIABLE = "CONVMEM_SQLITE_MEMSTATUS"


class StatisticsOutcome(NamedTuple):
    """What :func:`turn_off_sqlite_statistics` found and did."""

    #: The statistics are off now (turned off by this call, or found off).
    off: bool
    #: One sentence for the log: what was done, or why nothing was.
    detail: str
    #: They are on although they were not asked to be (a reason to warn).
    failed: bool = False


def _failed(detail: str) -> StatisticsOutcome:
    return StatisticsOutcome(False, detail, failed=True)


def _library() -> ctypes.CDLL:
    """The SQLite library Python's ``sqlite3`` runs on (symbol lookups through the extension reach its dependencies)."""
    import _sqlite3

    lib = ctypes.CDLL(_sqlite3.__file__)
    lib.sqlite3_memory_used.restype = ctypes.c_int64
    lib.sqlite3_memory_used.argtypes = []
    lib.sqlite3_shutdown.restype = ctypes.c_int
    lib.sqlite3_initialize.restype = ctypes.c_int
    lib.sqlite3_config.restype = ctypes.c_int  # variadic: arguments passed as explicit c_int
    return lib


def _counted(lib: ctypes.CDLL) -> tuple[int, int]:
    """``sqlite3_memory_used`` while a probe connection is open, and after it is closed."""
    probe = sqlite3.connect(":memory:")
    try:
        probe.execute("SELECT 1").fetchall()
        while_open = int(lib.sqlite3_memory_used())
    finally:
        probe.close()
    return while_open, int(lib.sqlite3_memory_used())


def turn_off_sqlite_statistics() -> StatisticsOutcome:
    """Turn off SQLite's heap statistics for this process if nothing of SQLite's is alive in it.

    Call once, at start-up, before any thread that uses SQLite exists (see
    the module's docstring). Never raises for a library it cannot configure:
    the outcome says what happened.
    """
    if os.environ.get(KEEP_VARIABLE) == "1":
        return StatisticsOutcome(False, f"SQLite's heap statistics kept on ({KEEP_VARIABLE}=1)")
    try:
        lib = _library()
    except (OSError, AttributeError, ImportError) as exc:
        return _failed(f"SQLite's heap statistics left on: its configuration is not reachable ({exc})")
    while_open, after = _counted(lib)
    if while_open == after:  # an open connection holds memory: a counter that did not move is not counting
        return StatisticsOutcome(True, "SQLite's heap statistics were already off")
    if after != 0:
        return StatisticsOutcome(
            False,
            f"SQLite's heap statistics left on: {after} bytes of SQLite's are in use in this process, "
            "so it cannot be shut down to reconfigure",
            failed=True,
        )
    if lib.sqlite3_shutdown() != _OK:
        return _failed("SQLite's heap statistics left on: sqlite3_shutdown failed")
    configured = lib.sqlite3_config(ctypes.c_int(_CONFIG_MEMSTATUS), ctypes.c_int(0))
    initialized = lib.sqlite3_initialize()
    if initialized != _OK:  # sqlite3.connect initialises on its own; this only reports it early
        return _failed(f"SQLite's heap statistics: sqlite3_initialize returned {initialized}")
    if configured != _OK:
        return _failed(f"SQLite's heap statistics left on: sqlite3_config returned {configured}")
    while_open, after = _counted(lib)
    if while_open != after:
        return _failed("SQLite's heap statistics still count after being turned off")
    return StatisticsOutcome(
        True, "SQLite's heap statistics turned off (their mutex was taken on every allocation of every connection)"
    )
