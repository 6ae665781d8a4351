"""Hearing of memory changes made by other servers early: LISTEN on ``convmem_memories``.

Every memory write sends ``pg_notify('convmem_memories', schema/site)`` in its
transaction (delivered at commit). One thread per memory store listens and
hands the site to a callback, which brings that site's in-process state and
ranking index up to date before the next call needs it. Correctness never
depends on it: every call still checks the site's change counter.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg import sql

from ._memsql import CHANNEL

logger = logging.getLogger("logstore.postgres")


class ChangeListener:
    """A daemon thread LISTENing for memory changes of ``schema``; ``on_change(site)`` per notification."""

    def __init__(self, dsn: str, schema: str, kwargs: dict[str, Any], on_change: Callable[[str], None]) -> None:
        self._dsn = dsn
        self._schema = schema
        self._kwargs = kwargs
        self._on_change = on_change
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._listen, name="convmem-pg-memories", daemon=True)
        self._thread.start()

    def _listen(self) -> None:
        while not self._closed.is_set():
            try:
                with psycopg.connect(self._dsn, **self._kwargs) as conn:
                    conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(CHANNEL)))
                    while not self._closed.is_set():
                        for note in conn.notifies(timeout=0.5):
                            schema, _, site = note.payload.partition("/")
                            if schema == self._schema:
                                self._hand_over(site)
            except psycopg.Error as exc:
                if self._closed.is_set():
                    return
                logger.warning("the memory change listener lost PostgreSQL (%s); reconnecting", exc)
                self._closed.wait(1.0)

    def _hand_over(self, site: str) -> None:
        try:
            self._on_change(site)
        except Exception:  # a refresh that failed is done again by the next call's counter check
            logger.warning("refreshing site %s after a notification failed", site, exc_info=True)

    def close(self) -> None:
        self._closed.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
