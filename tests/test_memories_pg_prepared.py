"""Prepared statements on PostgreSQL: a connection serving every partition keeps every hot statement prepared.

The memory statements name the site's partition of ``memories``, so one
pooled connection serving sites in all 16 partitions runs a dozen texts per
partition. With psycopg's default ``prepared_max`` of 100 they evict each
other (or never reach the prepare threshold); a store sets ``prepared_max``
to cover every text it can run. The test runs calls round-robin over one
site per partition through a store with a single pooled connection and
reads ``pg_prepared_statements`` from that connection.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from memories_support import MemoryStores, create, delete, fields, update

from bench.probes.pg_prepared import one_site_per_partition
from convmem.logstore.postgres import PgLongTermMemory, PgStore
from convmem.logstore.postgres._memsql import MemoryStatements, memory_statement_texts
from convmem.logstore.postgres._schema import MEMORY_PARTITIONS
from convmem.logstore.postgres._store import PREPARED_SLACK, prepared_max_for

#: The statements of one partition that the round's calls run on every round.
HOT_PER_PARTITION = ("purge", "count", "insert", "update", "soft_delete", "rows_since", "touch")
#: The statements naming no partition that every write runs.
HOT_SHARED = ("lock_timeout", "use_token", "bump", "counters", "notify")
ROUNDS = 7  # psycopg prepares a text at its sixth execution on a connection (prepare_threshold 5)


def _as_sent(text: bytes) -> str:
    """A statement as PostgreSQL shows it: psycopg sends each ``%s`` as ``$1``, ``$2``, ..."""
    count = iter(range(1, 1000))
    return re.sub(r"%s", lambda _m: f"${next(count)}", text.decode())


@pytest.fixture
def one_connection(pg_server: str, tmp_path: Path) -> Iterator[tuple[MemoryStores, PgStore, PgLongTermMemory]]:
    stores = MemoryStores("postgres", tmp_path, pg_server)
    logs = PgStore(pg_server, schema=stores.schema, pool_min=1, pool_max=1)
    stores.opened.append(logs)
    mem = PgLongTermMemory(logs, listen=False)
    stores.opened.append(mem)
    yield stores, logs, mem
    stores.cleanup()


def _round_robin(stores: MemoryStores, mem: PgLongTermMemory, sites: dict[str, str]) -> None:
    """Every round, for each site in turn: create, update, get, search, soft delete; another server writes too."""
    other = stores.open(listen=False)
    n = 0
    for _ in range(ROUNDS):
        for site in sites.values():
            n += 1
            m = create(mem, fields(n), site)
            update(mem, m.memory_id, fields(n + 10_000), site)
            create(other, fields(n + 20_000), site)  # so this server's next read fetches changed rows
            mem.get(site, m.memory_id)
            mem.search(site, f"quokka{n}")
            delete(mem, m.memory_id, site=site)
        mem.flush_access()


def _prepared(logs: PgStore) -> dict[str, str]:
    """The statements prepared on the store's one pooled connection: {text as sent: name}."""
    with logs._conn() as conn:
        rows = conn.execute("SELECT name, statement FROM pg_prepared_statements").fetchall()
    return {str(text): str(name) for name, text in rows}


def _hot(schema: str, sites: dict[str, str]) -> set[str]:
    hot = {_as_sent(getattr(MemoryStatements(schema), name)) for name in HOT_SHARED}
    for table in sites:
        sql_ = MemoryStatements(schema, table)
        hot |= {_as_sent(getattr(sql_, name)) for name in HOT_PER_PARTITION}
    return hot


def test_a_round_robin_over_every_partition_keeps_every_hot_statement_prepared(
    one_connection: tuple[MemoryStores, PgStore, PgLongTermMemory],
) -> None:
    stores, logs, mem = one_connection
    with logs._conn() as conn:
        assert conn.prepared_max == prepared_max_for(logs.schema) == logs.prepared_max
    sites = one_site_per_partition(logs, "prep-site-")
    _round_robin(stores, mem, sites)
    prepared = _prepared(logs)
    hot = _hot(logs.schema, sites)
    assert len(hot) == len(HOT_SHARED) + MEMORY_PARTITIONS * len(HOT_PER_PARTITION) > 100
    assert sorted(hot - set(prepared)) == []
    # None was evicted and prepared again: psycopg names them _pg3_0, _pg3_1, ... in the order it prepares them.
    assert sorted(int(name.removeprefix("_pg3_")) for name in prepared.values()) == list(range(len(prepared)))


def test_psycopgs_default_bound_leaves_the_hot_statements_unprepared(
    one_connection: tuple[MemoryStores, PgStore, PgLongTermMemory],
) -> None:
    """What the store's bound fixes: with psycopg's default of 100 most hot statements are never prepared."""
    stores, logs, mem = one_connection
    with logs._conn() as conn:
        conn.prepared_max = 100
    sites = one_site_per_partition(logs, "prep-site-")
    _round_robin(stores, mem, sites)
    missing = _hot(logs.schema, sites) - set(_prepared(logs))
    assert len(missing) > len(HOT_SHARED) + MEMORY_PARTITIONS * len(HOT_PER_PARTITION) // 2, len(missing)


def test_the_bound_covers_every_statement_text_of_both_stores() -> None:
    from convmem.logstore.postgres._store import _Statements

    texts = _Statements("s").texts() | memory_statement_texts("s")
    assert prepared_max_for("s") == len(texts) + PREPARED_SLACK
    # Each partition's statements are texts of their own; the shared ones are one text for all partitions.
    per_table = MemoryStatements("s", "memories_p00").texts() - MemoryStatements("s", "memories_p01").texts()
    assert len(memory_statement_texts("s")) == len(MemoryStatements("s").texts()) + MEMORY_PARTITIONS * len(per_table)
