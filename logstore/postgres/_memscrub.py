"""Scrubbing erased memories out of the table's pages: ``VACUUM FULL`` of the site's partition.

A DELETE leaves the row's bytes in the heap page and its index entries, and a
plain ``VACUUM`` marks that space free without overwriting it (measured on the
test cluster: the dedupe_key stays in the b-tree). ``VACUUM FULL`` writes the
partition, its TOAST table and its indexes into new files holding the live
rows only and truncates the old ones. It takes an ACCESS EXCLUSIVE lock on the
one partition (of ``MEMORY_PARTITIONS``) holding the site, so calls of sites in
other partitions go on meanwhile. Scrubs are serialised across servers by an
advisory lock, and wait at most the store's ``lock_timeout`` for the partition.

``VACUUM FULL`` cannot run inside a transaction block, so it runs after the
erasing transaction committed, on an autocommit connection of the pool.
"""

from __future__ import annotations

import time
from typing import Any

import psycopg
from psycopg import sql

from ._schema import MEMORY_PARTITIONS, memory_partition

#: Advisory lock key held while a server rewrites a partition of ``memories`` (any fixed 64-bit number).
SCRUB_LOCK = 0x636D6D656D736372


def partition_of(conn: psycopg.Connection[Any], schema: str, site: str) -> str:
    """The table holding ``site``'s memories: its partition, or ``memories`` when the table is not partitioned."""
    table = sql.SQL("{}.memories").format(sql.Identifier(schema)).as_string(conn)
    row = conn.execute("SELECT relkind FROM pg_class WHERE oid = to_regclass(%s)", (table,)).fetchone()
    if row is None or row[0] != "p":
        return "memories"
    row = conn.execute(
        "SELECT r FROM generate_series(0, %s - 1) AS r WHERE satisfies_hash_partition(%s::regclass, %s, r, %s::text)",
        (MEMORY_PARTITIONS, table, MEMORY_PARTITIONS, site),
    ).fetchone()
    assert row is not None
    return memory_partition(int(row[0]))


def scrub(conn: psycopg.Connection[Any], schema: str, table: str, lock_timeout_s: float) -> float:
    """Rewrite ``schema.table`` without its dead rows (autocommit ``conn``); the seconds the rewrite took."""
    conn.execute("SELECT pg_advisory_lock(%s)", (SCRUB_LOCK,))
    try:
        conn.execute("SELECT set_config('lock_timeout', %s, false)", (str(max(1, round(lock_timeout_s * 1000))),))
        started = time.monotonic()
        try:
            conn.execute(sql.SQL("VACUUM FULL {}.{}").format(sql.Identifier(schema), sql.Identifier(table)))
        finally:
            conn.execute("SELECT set_config('lock_timeout', '0', false)")
        return time.monotonic() - started
    finally:
        conn.execute("SELECT pg_advisory_unlock(%s)", (SCRUB_LOCK,))
