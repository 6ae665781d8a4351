"""PostgreSQL for the tests: one server per session, one schema per store.

``session_dsn()`` starts a throwaway cluster the first time it is called
(``tests.pgcluster``; stopped and deleted at interpreter exit) unless
``CONVMEM_TEST_POSTGRES`` names an existing server. Every store a test opens
lives in a fresh schema, dropped afterwards, so tests never see each other's
data and can run against a shared server.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import itertools
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg

from convmem.logstore import FileStore, MemoryStore
from convmem.logstore.postgres import PgStore
from convmem.logstore.preallocation import wait_for_extensions
from tests import pgcluster
from tests.logstore_helpers import tree_digest

_lock = threading.Lock()
_state: dict[str, Any] = {}
_counter = itertools.count()


def missing_reason() -> str:
    return str(_state.get("error") or "no PostgreSQL server binaries and CONVMEM_TEST_POSTGRES is unset")


def session_dsn() -> str | None:
    """The test server's DSN, starting it on first use; None when it cannot be had."""
    with _lock:
        if "dsn" in _state:
            return _state["dsn"]  # type: ignore[no-any-return]
        dsn = os.environ.get("CONVMEM_TEST_POSTGRES") or None
        if dsn is None and pgcluster.pg_bin() is not None:
            base = pgcluster.make_base("convmem-test-pg-")
            try:
                cluster = pgcluster.start_cluster(base)
            except Exception as exc:
                _state["error"] = f"could not start a PostgreSQL test server: {exc}"
                pgcluster.remove(base)
            else:
                dsn = cluster.dsn()
                # Stops it even when the test run is killed; atexit below stops it on a normal exit.
                _state["reaper"] = pgcluster.reap_on_exit(cluster, base)

                def stop() -> None:
                    cluster.stop()
                    pgcluster.remove(base)

                atexit.register(stop)
        _state["dsn"] = dsn
        return dsn


def new_schema(dsn: str) -> str:
    """A fresh, unused schema name (the store creates it)."""
    return f"t_{os.getpid()}_{next(_counter)}_{os.urandom(3).hex()}"


def drop_schema(dsn: str, schema: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'.encode())


def content_digest(store: MemoryStore) -> dict[str, str]:
    """Everything the store holds, as a comparable snapshot (files, or table rows)."""
    if isinstance(store, FileStore):
        # An extend-ahead job of an earlier append may still be writing zeros into its segment.
        assert wait_for_extensions(60.0)
        return tree_digest(store.root)
    assert isinstance(store, PgStore)
    out: dict[str, str] = {}
    with psycopg.connect(store.dsn, autocommit=True) as conn:
        for table in ("conversations", "items", "site_credentials", "settings"):
            rows = conn.execute(f'SELECT * FROM "{store.schema}".{table} ORDER BY 1, 2'.encode()).fetchall()
            out[table] = hashlib.sha256(repr(rows).encode()).hexdigest()
    return out


class StoreFactory:
    """Opens stores of one kind that all see the same data (a directory, or a schema)."""

    def __init__(self, kind: str, tmp: Path, dsn: str | None) -> None:
        self.kind = kind
        self.dir = tmp / "data"
        self.dsn = dsn
        self.schema = new_schema(dsn) if dsn else ""
        self.opened: list[MemoryStore] = []

    def open(self, **options: Any) -> MemoryStore:
        store: MemoryStore
        if self.kind == "file":
            store = FileStore(self.dir, **options)
        else:
            assert self.dsn is not None
            pg_opts = {k: v for k, v in options.items() if k == "lock_timeout"}
            store = PgStore(self.dsn, schema=self.schema, pool_min=1, pool_max=4, **pg_opts)
        self.opened.append(store)
        return store

    def cleanup(self) -> None:
        for s in self.opened:
            s.close()
        if self.kind == "postgres" and self.dsn:
            drop_schema(self.dsn, self.schema)


@contextlib.contextmanager
def backend_credentials(request: Any, data_dir: Path) -> Iterator[tuple[Any, list[str]]]:
    """(credential source, extra ``convmem serve`` arguments) for the backend in ``request.param``.

    For PostgreSQL it opens a store in a fresh schema (dropped afterwards) and
    returns the ``--store``/``--pg-schema`` arguments pointing a server at it.
    """
    from convmem.logstore.postgres import PgCredentials
    from convmem.logstore.site_credentials import CredentialFile

    if request.param == "file":
        yield CredentialFile(data_dir), []
        return
    dsn = request.getfixturevalue("pg_server")
    schema = new_schema(dsn)
    store = PgStore(dsn, schema=schema, pool_min=1, pool_max=2)
    try:
        yield PgCredentials(store), ["--store", dsn, "--pg-schema", schema]
    finally:
        store.close()
        drop_schema(dsn, schema)
