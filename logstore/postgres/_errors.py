"""Mapping PostgreSQL and driver failures onto the store's error taxonomy.

The rule that matters: nothing is acknowledged unless the statement that
committed it returned. A lost connection, a server shutting down, a standby
that does not accept writes (mid-failover) or an exhausted pool are all
``Unavailable`` (retryable; the batch may or may not have been committed, so
a retry can store it twice but never loses an acknowledged one). A statement
or lock timeout is ``Timeout``.
"""

from __future__ import annotations

import psycopg
import psycopg_pool
from psycopg import errors as pgerr

from ..errors import StoreError, Timeout, Unavailable


class DatabaseTimeout(Timeout):
    """PostgreSQL cancelled the statement (``statement_timeout``) or a lock wait (``lock_timeout``)."""

    def __init__(self, waited: float, what: str) -> None:
        super().__init__(waited)
        self.args = (f"PostgreSQL gave up after {waited:.3f}s ({what}); nothing was written",)


def translate(exc: BaseException, waited: float, *, writing: bool) -> StoreError:
    """The store error reporting ``exc`` (a driver or pool exception)."""
    outcome = "the batch may or may not have been committed; " if writing else ""
    if isinstance(exc, pgerr.LockNotAvailable):
        return DatabaseTimeout(waited, "waiting for the conversation's row lock")
    if isinstance(exc, pgerr.QueryCanceled):
        return DatabaseTimeout(waited, "statement timeout")
    if isinstance(exc, psycopg_pool.PoolTimeout):
        return Unavailable(f"no PostgreSQL connection became available in time: {exc}")
    if isinstance(exc, pgerr.ReadOnlySqlTransaction):
        return Unavailable(
            "the PostgreSQL server is read-only (a standby, or a failover is under way); nothing written"
        )
    if isinstance(exc, (psycopg.OperationalError, pgerr.AdminShutdown, pgerr.CannotConnectNow)):
        return Unavailable(f"lost the PostgreSQL server: {outcome}{first_line(exc)}")
    if isinstance(exc, psycopg.InterfaceError):
        return Unavailable(f"the PostgreSQL connection is not usable: {outcome}{first_line(exc)}")
    if isinstance(exc, pgerr.SerializationFailure | pgerr.DeadlockDetected):
        return Unavailable(f"PostgreSQL aborted the transaction ({exc.sqlstate}); nothing written; retry")
    return Unavailable(f"PostgreSQL failed: {outcome}{first_line(exc)}")


def first_line(exc: BaseException) -> str:
    """The first line of a driver error's message, for an error text a client sees.

    Never the exception's class name (an internal detail): a message-less
    error is described by its SQLSTATE when it has one.
    """
    text = str(exc).strip().splitlines()
    if text:
        return text[0]
    sqlstate = getattr(exc, "sqlstate", None)
    return f"SQLSTATE {sqlstate}" if sqlstate else "the driver gave no reason"
