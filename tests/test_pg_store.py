"""PostgreSQL-specific behaviour of ``PgStore``: concurrency, durability checks, failures, verbatim bytes.

The behaviour shared with the file store is proven by the parametrised engine
tests (limits, the stateful model test); these cover what only a database
backend has. Every test runs against the real session server in its own schema.
"""

from __future__ import annotations

import logging
import multiprocessing
import threading
import time
from collections.abc import Iterator
from typing import Any

import msgspec
import psycopg
import pytest

from convmem.logstore import ListSelector, Range, Tail, Timeout, Unavailable
from convmem.logstore.postgres import AsyncCommitRefused, PgStore
from tests.pg_support import drop_schema, new_schema

SITE = "site-0001"
CONV = "conv-0001"


@pytest.fixture
def pg(pg_server: str) -> Iterator[tuple[str, str]]:
    schema = new_schema(pg_server)
    yield pg_server, schema
    drop_schema(pg_server, schema)


@pytest.fixture
def store(pg: tuple[str, str]) -> Iterator[PgStore]:
    s = PgStore(pg[0], schema=pg[1], pool_max=4)
    yield s
    s.close()


def _appender(dsn: str, schema: str, worker: int, batches: int, out: Any) -> None:
    results = []
    with PgStore(dsn, schema=schema, pool_max=4) as store:

        def run(t: int) -> None:
            for b in range(batches):
                items = [{"w": worker, "t": t, "b": b, "i": i} for i in range(1 + (b + t) % 3)]
                rng = store.append(SITE, CONV, items)
                results.append((rng.first, rng.last, worker, t, b))

        threads = [threading.Thread(target=run, args=(t,)) for t in range(3)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    out.put(results)


def test_concurrent_appenders_in_several_processes_get_gapless_ranges(pg: tuple[str, str]) -> None:
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_appender, args=(pg[0], pg[1], w, 15, out)) for w in range(2)]
    for p in procs:
        p.start()
    acked = [r for _ in procs for r in out.get(timeout=120)]
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    acked.sort()
    # The acknowledged ranges tile [0, total) exactly: no gap, no overlap.
    expect = 0
    for first, last, *_ in acked:
        assert first == expect
        expect = last + 1
    with PgStore(pg[0], schema=pg[1]) as store:
        items = store.read(SITE, CONV, Range(0, 1000))
    assert [i.seq for i in items] == list(range(expect))
    for first, last, w, t, b in acked:
        batch = items[first : last + 1]
        assert [i.payload for i in batch] == [{"w": w, "t": t, "b": b, "i": i} for i in range(last - first + 1)]
        assert len({i.recorded_at for i in batch}) == 1
    stamps = [i.recorded_at for i in items]
    assert stamps == sorted(stamps), "recorded_at went backwards along the seqs"


def test_payload_bytes_are_stored_verbatim(store: PgStore) -> None:
    items = [{"z": 1, "a": [2, 1], "\u0000key": "nul\u0000here"}, {"big": 2**80, "f": 1.5e300, "u": "é😀"}]
    store.append(SITE, CONV, items)
    raw = store.raw_items(SITE, CONV, 0, 10)
    assert [r[2] for r in raw] == [msgspec.json.encode(i) for i in items]
    assert [i.payload for i in store.read(SITE, CONV, Tail(5))] == items
    with psycopg.connect(store.dsn) as conn:
        kind = conn.execute(
            "SELECT data_type FROM information_schema.columns WHERE table_schema = %s AND table_name = 'items' "
            "AND column_name = 'payload'",
            (store.schema,),
        ).fetchone()
    assert kind == ("bytea",)


def test_recorded_at_never_goes_backwards_past_a_later_stamp(store: PgStore) -> None:
    store.append(SITE, CONV, [{"a": 1}])
    future = (int(time.time()) + 3600) * 1_000_000 + 123_456
    with psycopg.connect(store.dsn, autocommit=True) as conn:
        conn.execute(f'UPDATE "{store.schema}".conversations SET last_appended_at = %s'.encode(), (future,))
    store.append(SITE, CONV, [{"a": 2}])
    last = store.read(SITE, CONV, Tail(1))[0]
    assert (
        last.recorded_at.endswith(".123456Z") and last.recorded_at > store.read(SITE, CONV, Range(0, 1))[0].recorded_at
    )


def test_a_held_row_lock_is_a_timeout_and_nothing_is_written(pg: tuple[str, str]) -> None:
    with PgStore(pg[0], schema=pg[1], lock_timeout=0.2) as store:
        store.append(SITE, CONV, [{"a": 1}])
        with psycopg.connect(pg[0]) as holder:
            holder.execute(f'SELECT 1 FROM "{pg[1]}".conversations WHERE site = %s FOR UPDATE'.encode(), (SITE,))
            with pytest.raises(Timeout) as info:
                store.append(SITE, CONV, [{"a": 2}])
            holder.rollback()
        assert info.value.retryable and info.value.code == "Timeout"
        assert [i.payload for i in store.read(SITE, CONV, Tail(10))] == [{"a": 1}]


def test_statement_timeout_is_a_timeout(pg: tuple[str, str]) -> None:
    with PgStore(pg[0], schema=pg[1], lock_timeout=30, statement_timeout=0.3) as store:
        store.append(SITE, CONV, [{"a": 1}])
        with psycopg.connect(pg[0]) as holder:
            holder.execute(f'SELECT 1 FROM "{pg[1]}".conversations FOR UPDATE'.encode())
            with pytest.raises(Timeout, match="statement timeout"):
                store.append(SITE, CONV, [{"a": 2}])


def test_a_lost_connection_is_unavailable_then_the_pool_recovers(store: PgStore) -> None:
    store.append(SITE, CONV, [{"a": 1}])
    with psycopg.connect(store.dsn, autocommit=True) as admin:
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = '' "
            "AND pid <> pg_backend_pid() AND datname = current_database() AND backend_type = 'client backend'"
        )
    failures = 0
    for attempt in range(5):
        try:
            store.append(SITE, CONV, [{"a": 2 + attempt}])
            break
        except Unavailable as exc:
            assert exc.retryable
            failures += 1
    assert failures >= 1, "killing the server side of the pooled connection went unnoticed"
    assert store.read(SITE, CONV, Tail(1))[0].payload["a"] >= 2


def test_asynchronous_commit_is_refused_unless_overridden(pg: tuple[str, str], caplog: Any) -> None:
    dsn = pg[0] + ("&" if "?" in pg[0] else "?") + "options=-csynchronous_commit%3Doff"
    with pytest.raises(AsyncCommitRefused, match="synchronous_commit = off"):
        PgStore(dsn, schema=pg[1])
    with caplog.at_level(logging.WARNING), PgStore(dsn, schema=pg[1], allow_async_commit=True) as s:
        s.append(SITE, CONV, [{"a": 1}])
    assert "can be LOST" in caplog.text


def test_unreachable_server_is_a_clear_unavailable() -> None:
    from tests.pgcluster import free_port

    with pytest.raises(Unavailable, match="cannot use PostgreSQL at"):
        PgStore(f"postgresql://postgres:secret-pw@127.0.0.1:{free_port()}/postgres", connect_timeout=2)


def test_prepared_statements_can_be_turned_off(pg: tuple[str, str]) -> None:
    for prepare, expect_some in ((True, True), (False, False)):
        with PgStore(pg[0], schema=pg[1], pool_min=1, pool_max=1, prepare=prepare) as store:
            for i in range(8):
                store.append(SITE, CONV, [{"i": i}])
            with store._conn() as conn:
                n = conn.execute("SELECT count(*) FROM pg_prepared_statements").fetchone()[0]
        assert (n > 0) == expect_some, (prepare, n)


def test_listing_pages_come_from_the_listing_index(store: PgStore) -> None:
    for i in range(30):
        store.append(SITE, f"conv-{i:04d}", [{"i": i}])
    page = store.list_conversations(SITE, ListSelector(limit=10))
    assert page.next_cursor is not None
    with psycopg.connect(store.dsn, autocommit=True) as conn:
        conn.execute("SET enable_seqscan = off")
        plan = "\n".join(
            r[0]
            for r in conn.execute(
                f'EXPLAIN SELECT conversation_id FROM "{store.schema}".conversations WHERE site = %s '
                "AND last_appended_at <= 5 AND (last_appended_at < 5 OR (last_appended_at = 5 AND "
                "conversation_id > 'x')) ORDER BY last_appended_at DESC, conversation_id LIMIT 11".encode(),
                (SITE,),
            ).fetchall()
        )
    assert "conversations_listing" in plan, plan


def test_a_later_server_wide_async_commit_does_not_reach_open_connections(store: PgStore) -> None:
    store.append(SITE, CONV, [{"a": 1}])
    with psycopg.connect(store.dsn, autocommit=True) as admin:
        admin.execute("ALTER SYSTEM SET synchronous_commit = off")
        admin.execute("SELECT pg_reload_conf()")
        try:
            time.sleep(0.3)  # let the reload reach the backends
            with admin.cursor() as cur:
                cur.execute("SHOW synchronous_commit")
                assert cur.fetchone() == ("off",), "the reload did not take effect; the test proves nothing"
            with store._conn() as conn:
                assert conn.execute("SHOW synchronous_commit").fetchone() == ("on",)
            store.append(SITE, CONV, [{"a": 2}])
        finally:
            admin.execute("ALTER SYSTEM RESET synchronous_commit")
            admin.execute("SELECT pg_reload_conf()")
