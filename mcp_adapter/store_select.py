"""Choosing the storage backend: a local data directory or a PostgreSQL database.

``--store`` (env ``CONVMEM_STORE``) takes either a directory or a
``postgresql://`` URI; ``--data-dir`` (env ``CONVMEM_DATA_DIR``) names a
directory. With a PostgreSQL store the sites and their passwords, and the
long-term memories, are in the database too, so every server process sharing
it sees the same sites and memories.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from convmem.logstore.postgres import DEFAULT_SCHEMA, is_dsn  # no driver: psycopg loads with a PostgreSQL store
from convmem.options import env, env_flag, env_float, env_int

if TYPE_CHECKING:
    from convmem.logstore import MemoryStore
    from convmem.logstore.memories import LongTermStore

class StoreConfigError(Exception):
    """Neither a data directory nor a store was given (or both, differently)."""


@dataclass(frozen=True)
class StoreChoice:
    """Where the conversations and credentials live."""

    kind: str  # "file" or "postgres"
    target: str  # the directory, or the DSN
    schema: str = DEFAULT_SCHEMA

    @property
    def is_postgres(self) -> bool:
        return self.kind == "postgres"

    def describe(self) -> str:
        if self.is_postgres:
            from convmem.logstore.postgres import redact_dsn

            return f"PostgreSQL {redact_dsn(self.target)} (schema {self.schema})"
        return f"data directory {os.path.abspath(self.target)}"


def add_store_arguments(parser: argparse.ArgumentParser, *, server: bool = False) -> None:
    """``--data-dir``/``--store`` and the PostgreSQL options (all also from ``CONVMEM_*``)."""
    parser.add_argument(
        "--data-dir",
        default=env("DATA_DIR"),
        help="local data directory (conversations and credentials; env CONVMEM_DATA_DIR)",
    )
    parser.add_argument(
        "--store",
        default=env("STORE"),
        help="where the data lives: a directory, or postgresql://... to use PostgreSQL (env CONVMEM_STORE)",
    )
    parser.add_argument(
        "--pg-schema", default=env("PG_SCHEMA", DEFAULT_SCHEMA), help="PostgreSQL schema (env CONVMEM_PG_SCHEMA)"
    )
    if not server:
        return
    parser.add_argument(
        "--pg-pool-max",
        type=int,
        default=env_int("PG_POOL_MAX", 16),
        help="most PostgreSQL connections per server process (env CONVMEM_PG_POOL_MAX)",
    )
    parser.add_argument(
        "--pg-statement-timeout",
        type=float,
        default=env_float("PG_STATEMENT_TIMEOUT", 30.0),
        help="seconds before PostgreSQL cancels a statement (Timeout) (env CONVMEM_PG_STATEMENT_TIMEOUT)",
    )
    parser.add_argument(
        "--pg-connect-timeout",
        type=float,
        default=env_float("PG_CONNECT_TIMEOUT", 10.0),
        help="seconds to wait for a PostgreSQL connection (env CONVMEM_PG_CONNECT_TIMEOUT)",
    )
    parser.add_argument(
        "--pg-no-prepare",
        action="store_true",
        default=env_flag("PG_NO_PREPARE"),
        help="never use server-side prepared statements (for PgBouncer in transaction pooling) "
        "(env CONVMEM_PG_NO_PREPARE)",
    )
    parser.add_argument(
        "--pg-allow-async-commit",
        action="store_true",
        default=env_flag("PG_ALLOW_ASYNC_COMMIT"),
        help="DANGEROUS: serve even when PostgreSQL runs with synchronous_commit = off, "
        "so acknowledged appends can be lost in a crash (env CONVMEM_PG_ALLOW_ASYNC_COMMIT)",
    )


def choose(args: argparse.Namespace) -> StoreChoice:
    """The store named by ``--store``/``--data-dir``. Raises StoreConfigError when unusable."""
    store = getattr(args, "store", None)
    data_dir = getattr(args, "data_dir", None)
    if store and is_dsn(store):
        return StoreChoice("postgres", store, getattr(args, "pg_schema", DEFAULT_SCHEMA) or DEFAULT_SCHEMA)
    if store and data_dir and os.path.abspath(store) != os.path.abspath(data_dir):
        raise StoreConfigError(f"--store {store} and --data-dir {data_dir} name different directories; give one")
    target = store or data_dir
    if not target:
        raise StoreConfigError("give the data with --data-dir DIR or --store (a directory or postgresql://...)")
    return StoreChoice("file", target)


def open_chosen(choice: StoreChoice, args: argparse.Namespace) -> MemoryStore:
    """Open the chosen store (raises StoreError/OSError when it cannot)."""
    lock_timeout = float(getattr(args, "lock_timeout", 5.0))
    if choice.is_postgres:
        from convmem.logstore.postgres import PgStore

        return PgStore(
            choice.target,
            schema=choice.schema,
            lock_timeout=lock_timeout,
            statement_timeout=float(getattr(args, "pg_statement_timeout", 30.0)),
            connect_timeout=float(getattr(args, "pg_connect_timeout", 10.0)),
            pool_max=max(int(getattr(args, "pg_pool_max", 16)), 1),
            prepare=not getattr(args, "pg_no_prepare", False),
            allow_async_commit=bool(getattr(args, "pg_allow_async_commit", False)),
        )
    from convmem.logstore import open_store

    Path(choice.target).mkdir(parents=True, exist_ok=True)
    return open_store(choice.target, lock_timeout=lock_timeout)


def memory_opener(
    choice: StoreChoice, store: MemoryStore | None, retention_seconds: float
) -> Callable[[], LongTermStore] | None:
    """How to open the long-term memory store when it lives in the database; None for a data directory."""
    if not choice.is_postgres:
        return None
    from convmem.logstore.postgres import PgLongTermMemory, PgStore

    assert isinstance(store, PgStore)
    pg: PgStore = store
    return lambda: PgLongTermMemory(pg, retention_seconds=retention_seconds)


def credentials_for(choice: StoreChoice, store: MemoryStore | None) -> Any:
    """The credential source matching the store (a CredentialFile or a PgCredentials)."""
    if choice.is_postgres:
        from convmem.logstore.postgres import PgCredentials, PgStore

        assert isinstance(store, PgStore)
        return PgCredentials(store)
    from convmem.logstore.site_credentials import CredentialFile

    return CredentialFile(choice.target)
