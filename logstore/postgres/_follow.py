"""Following a conversation on PostgreSQL: LISTEN/NOTIFY, only for conversations someone follows.

A follower registers a row in ``followers`` (with an expiry, so a server
that died leaves nothing that lasts); the append functions send
``pg_notify('convmem_follow', schema/site/conversation)`` only when such a
row exists, so appends nobody follows pay one index probe and never the
commit-time cost of NOTIFY. Each :class:`PgStore` keeps one listening
connection, read by one thread that wakes the waiters of the conversation
named; waiters of any number of servers on the database are woken alike.

The registration takes the conversation row ``FOR SHARE``: an append in
progress holds it ``FOR UPDATE`` (from its start to its commit), so the
registration waits for it and the check that follows sees its items, and
every later append sees the registration. As a backstop (a conversation
whose first append raced the registration, a listening connection that was
lost and reconnected) a waiter also re-checks every :data:`BACKSTOP` seconds.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg import sql

logger = logging.getLogger("logstore.postgres")

CHANNEL = "convmem_follow"
#: Seconds between a waiter's re-checks when no notification came.
BACKSTOP = 5.0


class Listener:
    """One LISTEN connection and the waiters it wakes, by (site, conversation id)."""

    def __init__(self, dsn: str, schema: str, connect_kwargs: dict[str, Any]) -> None:
        self._dsn = dsn
        self._schema = schema
        self._kwargs = connect_kwargs
        self._lock = threading.Lock()
        self._waiters: dict[tuple[str, str], set[threading.Event]] = {}
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._closed = False
        q = sql.Identifier(schema)
        # Two statements, one transaction (no INSERT with a CTE: Citus's router planner refuses it).
        self._share = sql.SQL(
            "SELECT 1 FROM {s}.conversations WHERE site = %s AND conversation_id = %s FOR SHARE"
        ).format(s=q)
        self._register = sql.SQL(
            "INSERT INTO {s}.followers (site, conversation_id, token, expires_at) VALUES (%s, %s, %s, %s)"
        ).format(s=q)
        self._unregister = sql.SQL(
            "DELETE FROM {s}.followers WHERE site = %s AND conversation_id = %s AND token = %s"
        ).format(s=q)
        self._sweep = sql.SQL("DELETE FROM {s}.followers WHERE expires_at < %s").format(s=q)

    def _start(self) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._listen, name="convmem-pg-follow", daemon=True)
                self._thread.start()
        self._ready.wait(10)

    def _listen(self) -> None:
        while not self._closed:
            try:
                with psycopg.connect(self._dsn, **self._kwargs) as conn:
                    conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(CHANNEL)))
                    self._ready.set()
                    self._wake_all()  # anything missed while (re)connecting is checked again
                    while not self._closed:
                        for note in conn.notifies(timeout=1.0):
                            self._wake(note.payload)
            except psycopg.Error as exc:
                self._ready.set()
                logger.warning("the follow listener lost PostgreSQL (%s); reconnecting", exc)
                time.sleep(1.0)

    def _wake(self, payload: str) -> None:
        schema, _, rest = payload.partition("/")
        site, _, conv = rest.partition("/")
        if schema != self._schema:
            return
        with self._lock:
            waiters = list(self._waiters.get((site, conv), ()))
        for ev in waiters:
            ev.set()

    def _wake_all(self) -> None:
        with self._lock:
            waiters = [ev for evs in self._waiters.values() for ev in evs]
        for ev in waiters:
            ev.set()

    def wait(
        self, conn_factory: Callable[[], Any], site: str, conv: str, ready: Callable[[], bool], timeout: float
    ) -> bool:
        """Wait until ``ready()`` (checked after each notification for the conversation), at most ``timeout`` s."""
        self._start()
        deadline = time.monotonic() + timeout
        ev = threading.Event()
        key = (site, conv)
        with self._lock:
            self._waiters.setdefault(key, set()).add(ev)
        token = os.urandom(8).hex()
        expires = int(time.time() * 1e6 + (timeout + 30) * 1e6)
        try:
            with conn_factory() as conn:
                with conn.transaction():
                    conn.execute(self._share, (site, conv))
                    conn.execute(self._register, (site, conv, token, expires))
            try:
                while True:
                    ev.clear()
                    if ready():
                        return True
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return False
                    ev.wait(min(left, BACKSTOP))
            finally:
                with conn_factory() as conn:
                    conn.execute(self._unregister, (site, conv, token))
                    conn.execute(self._sweep, (int(time.time() * 1e6),))
        finally:
            with self._lock:
                waiters = self._waiters.get(key)
                if waiters is not None:
                    waiters.discard(ev)
                    if not waiters:
                        del self._waiters[key]

    def close(self) -> None:
        self._closed = True
