"""Idempotent and optimistic appends on PostgreSQL, against the real session server.

A key is stored with its batch in one transaction and looked up under the
conversation row's lock, so a retry through another server (here: another
process with its own pool) gets the original range, and two processes racing
one key write it once. A schema made before the key table gets it on start-up.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from convmem.logstore import IdempotencyConflict, InvalidIdempotencyKey, Range, SeqConflict
from convmem.logstore.postgres import PgStore
from tests.pg_support import drop_schema, new_schema

SITE = "site-0001"
CONV = "conv-idem-0001"


@pytest.fixture
def pg(pg_server: str) -> Iterator[tuple[str, str]]:
    schema = new_schema(pg_server)
    yield pg_server, schema
    drop_schema(pg_server, schema)


def _retry_elsewhere(dsn: str, schema: str, out: Any) -> None:
    with PgStore(dsn, schema=schema, pool_max=2) as store:
        r = store.append(SITE, CONV, [{"a": 1}, {"a": 2}], idempotency_key="key-1")
        out.put((r.first, r.last))


def test_retry_through_a_second_server_returns_the_original_range(pg: tuple[str, str]) -> None:
    with PgStore(pg[0], schema=pg[1], pool_max=2) as store:
        store.append(SITE, CONV, [{"x": 0}])
        r = store.append(SITE, CONV, [{"a": 1}, {"a": 2}], idempotency_key="key-1")
        ctx = multiprocessing.get_context("spawn")
        out: Any = ctx.Queue()
        p = ctx.Process(target=_retry_elsewhere, args=(pg[0], pg[1], out))
        p.start()
        assert out.get(timeout=120) == (r.first, r.last) == (1, 2)
        p.join(60)
        assert p.exitcode == 0
        assert [i.payload for i in store.read(SITE, CONV, Range(0, 10))] == [{"x": 0}, {"a": 1}, {"a": 2}]
        with pytest.raises(IdempotencyConflict) as info:
            store.append(SITE, CONV, [{"a": 1}], idempotency_key="key-1")
        assert (info.value.first_seq, info.value.last_seq) == (1, 2)
        with pytest.raises(InvalidIdempotencyKey):
            store.append(SITE, CONV, [{"a": 1}], idempotency_key="no spaces")
        assert len(store.read(SITE, CONV, Range(0, 10))) == 3


def test_expected_next_seq(pg: tuple[str, str]) -> None:
    with PgStore(pg[0], schema=pg[1], pool_max=2) as store:
        assert store.append(SITE, CONV, [{"a": 1}], expected_next_seq=0).first == 0
        with pytest.raises(SeqConflict) as info:
            store.append(SITE, CONV, [{"a": 2}], expected_next_seq=0)
        assert info.value.actual_next_seq == 1
        assert store.append(SITE, CONV, [{"a": 2}], expected_next_seq=1).first == 1
        r = store.append(SITE, CONV, [{"k": 1}], idempotency_key="opt", expected_next_seq=2)
        assert store.append(SITE, CONV, [{"k": 1}], idempotency_key="opt", expected_next_seq=2) == r
        assert len(store.read(SITE, CONV, Range(0, 10))) == 3


def _race(dsn: str, schema: str, start: Any, out: Any) -> None:
    with PgStore(dsn, schema=schema, pool_max=2) as store:
        start.wait()
        out.put([(lambda r: (r.first, r.last))(store.append(SITE, CONV, [{"n": n}], idempotency_key=f"r-{n}"))
                 for n in range(25)])


def test_two_servers_racing_the_same_keys(pg: tuple[str, str]) -> None:
    ctx = multiprocessing.get_context("spawn")
    start, out = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_race, args=(pg[0], pg[1], start, out)) for _ in range(2)]
    for p in procs:
        p.start()
    start.set()
    a, b = out.get(timeout=120), out.get(timeout=120)
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    assert a == b
    with PgStore(pg[0], schema=pg[1], pool_max=2) as store:
        assert [i.payload["n"] for i in store.read(SITE, CONV, Range(0, 100))] == list(range(25))


def test_a_schema_made_before_keys_gets_them(pg: tuple[str, str]) -> None:
    with PgStore(pg[0], schema=pg[1], pool_max=2) as store:
        store.append(SITE, CONV, [{"old": 1}])
    with psycopg.connect(pg[0], autocommit=True) as conn:
        # What a schema made before idempotency keys lacks (its append_batch is replaced on start-up).
        conn.execute(f'DROP FUNCTION "{pg[1]}".append_batch_checked')
        conn.execute(f'DROP TABLE "{pg[1]}".append_keys, "{pg[1]}".followers')
    with PgStore(pg[0], schema=pg[1], pool_max=2) as store:
        r = store.append(SITE, CONV, [{"new": 1}], idempotency_key="k")
        assert store.append(SITE, CONV, [{"new": 1}], idempotency_key="k") == r
        assert r.first == 1


def _append_later(dsn: str, schema: str, delay: float) -> None:
    import time

    time.sleep(delay)
    with PgStore(dsn, schema=schema, pool_max=2) as store:
        store.append(SITE, CONV, [{"from": "another server"}])


def test_a_wait_wakes_for_an_append_through_another_server(pg: tuple[str, str]) -> None:
    with PgStore(pg[0], schema=pg[1], pool_max=2) as store:
        store.append(SITE, CONV, [{"n": 0}])
        assert not store.wait_for_items(SITE, CONV, 1, 0.3)
        ctx = multiprocessing.get_context("spawn")
        p = ctx.Process(target=_append_later, args=(pg[0], pg[1], 1.0))
        p.start()
        try:
            # Well within the backstop's first re-check would not prove the notification; the
            # listener's wake-up is what returns here (the backstop alone would also, later).
            assert store.wait_for_items(SITE, CONV, 1, 60.0)
        finally:
            p.join(60)
        assert p.exitcode == 0
        assert store.read(SITE, CONV, Range(1, 1))[0].payload == {"from": "another server"}
        with psycopg.connect(pg[0], autocommit=True) as conn:
            left = conn.execute(f'SELECT count(*) FROM "{pg[1]}".followers').fetchone()
        assert left is not None and left[0] == 0  # the registration is gone with the wait
