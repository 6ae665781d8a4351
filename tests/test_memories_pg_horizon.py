"""Erasure on PostgreSQL against holders of the removal horizon that the session views do not show.

The tests run their own cluster (``wal_level = logical``, for a replication
slot; a physical standby made with ``pg_basebackup``), so nothing they hold
reaches another test's erasures.

* A logical replication slot being created (``CREATE_REPLICATION_SLOT ...
  (SNAPSHOT 'export')`` waits for the transactions running when it started)
  holds the deleted row versions of every database, yet ``pg_replication_slots``
  shows no ``xmin`` for it and its walsender and the transaction it waits for
  are in another database. The rewrite keeps the bytes; the server's
  ``removable cutoff`` tells, and the call says the bytes may remain and that
  it could not name what holds them.
* A standby with ``hot_standby_feedback = on`` holding a snapshot: its
  walsender's ``backend_xmin`` holds the rows, and the call names the standby.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from hypothesis import given
from hypothesis import strategies as st
from memories_support import MemoryStores, delete
from test_mcp_error_texts import assert_says_one_thing
from test_memories_pg_erasure import SITE, _holding, _owed, _victim

from convmem.logstore.postgres._memscrub import UNNAMED, ScrubPending, precedes
from tests import pgcluster

pytestmark = pytest.mark.skipif(pgcluster.pg_bin() is None, reason="needs PostgreSQL server binaries")

SETTINGS = ("wal_level = logical", "max_wal_senders = 8", "max_replication_slots = 8", "hot_standby = on")


@pytest.fixture(scope="module")
def cluster() -> Iterator[pgcluster.Cluster]:
    base = pgcluster.make_base("convmem-horizon-")
    nodes: list[pgcluster.Cluster] = []
    try:
        primary = pgcluster.start_cluster(base, "primary", *SETTINGS)
        nodes.append(primary)
        with psycopg.connect(primary.dsn(), autocommit=True) as conn:
            conn.execute("CREATE DATABASE elsewhere")
        yield primary
    finally:
        for node in nodes:
            node.stop()
        pgcluster.remove(base)


@pytest.fixture
def servers(cluster: pgcluster.Cluster, tmp_path: Path) -> Iterator[MemoryStores]:
    if not os.access(cluster.data, os.R_OK | os.X_OK):
        pytest.skip("the test cluster's data directory is not readable here")
    stores = MemoryStores("postgres", tmp_path, cluster.dsn())
    yield stores
    stores.cleanup()


def _value(dsn: str, query: str, *args: object) -> Any:
    """The first column of the first row of ``query`` (None when no row)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(query.encode(), args or None).fetchone()
    return row[0] if row is not None else None


def _wait(what: str, check: Any, tries: int = 3000) -> Any:
    for _ in range(tries):
        got = check()
        if got:
            return got
        threading.Event().wait(0.02)
    raise AssertionError(f"never: {what}")


def test_a_horizon_no_view_shows_keeps_the_bytes_and_the_call_says_it_cannot_name_it(
    cluster: pgcluster.Cluster, servers: MemoryStores
) -> None:
    store = servers.open(listen=False, lock_timeout=0.5)
    mid, needles = _victim(store)
    other_db = f"host=127.0.0.1 port={cluster.port} user=postgres dbname=elsewhere"
    waited_for = psycopg.connect(other_db)  # a transaction in another database: holds nothing here by itself
    waited_for.execute("SELECT pg_current_xact_id()")
    replication = psycopg.connect(other_db + " replication=database", autocommit=True)
    created: list[Any] = []

    def create_slot() -> None:  # a replication command: simple query protocol, so libpq directly
        command = b"CREATE_REPLICATION_SLOT convmem_t TEMPORARY LOGICAL pgoutput (SNAPSHOT 'export')"
        res = replication.pgconn.exec_(command)
        created.append((res.status, res.error_message))

    t = threading.Thread(target=create_slot)
    t.start()
    try:
        slot = "FROM pg_replication_slots WHERE slot_name = 'convmem_t'"
        _wait("the slot to wait for its consistent point", lambda: _value(
            cluster.dsn(), f"SELECT catalog_xmin IS NOT NULL {slot}"))
        assert _value(cluster.dsn(), f"SELECT xmin IS NULL {slot}") is True  # no xmin shown, yet it holds
        with pytest.raises(ScrubPending) as caught:
            delete(store, mid, force=True, site=SITE)
        text = str(caught.value)
        assert "may still be in the files" in text and "could not name what holds it" in text, text
        assert "removable cutoff xid" in text and caught.value.held == [UNNAMED]
        assert_says_one_thing(text, True, "memory_delete")
        assert [site for site, _xid in _owed(servers)] == [SITE]
        # The rewrite ran and kept the deleted row versions: the bytes are there, and the record says so.
        assert {n for _name, n in _holding(cluster.dsn(), servers.schema, needles)} == set(needles)
        assert store.sweep_once() == []  # still held: the sweep leaves it owed
        assert [site for site, _xid in _owed(servers)] == [SITE]
    finally:
        waited_for.rollback()  # the slot reaches its consistent point; its creation ends
        t.join(60)
        waited_for.close()
    assert created and created[0][1] == b"", created
    replication.close()  # the temporary slot goes with its connection
    _wait("the slot to be dropped", lambda: _value(
        cluster.dsn(), "SELECT count(*) = 0 FROM pg_replication_slots WHERE slot_name = 'convmem_t'"))
    assert store.sweep_once() == []
    assert _owed(servers) == []
    assert _holding(cluster.dsn(), servers.schema, needles) == []


def test_a_standbys_hot_standby_feedback_keeps_the_bytes_and_the_call_names_the_standby(
    cluster: pgcluster.Cluster, servers: MemoryStores
) -> None:
    bindir = pgcluster.pg_bin()
    assert bindir is not None
    standby = pgcluster.Cluster(cluster.base, "standby", pgcluster.free_port(), bindir)
    standby.basebackup_from(cluster, "convmem_standby")
    standby.configure(f"port = {standby.port}", "hot_standby_feedback = on", "wal_receiver_status_interval = 1")
    standby.start()
    try:
        store = servers.open(listen=False, lock_timeout=0.5)
        mid, needles = _victim(store)
        with psycopg.connect(standby.dsn()) as reader:
            reader.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            row = reader.execute("SELECT backend_xmin::text FROM pg_stat_activity WHERE pid = pg_backend_pid()")
            snapshot = row.fetchone()  # a snapshot on the standby, taken before the erasure
            assert snapshot is not None and snapshot[0] is not None
            # From the first feedback carrying it (or an older xmin), the primary's walsender holds it back.
            _wait("the feedback to reach the primary", lambda: _value(
                cluster.dsn(), "SELECT age(backend_xmin) >= age(%s::xid) FROM pg_stat_replication"
                " WHERE application_name = 'convmem_standby'", snapshot[0]))
            with pytest.raises(ScrubPending) as caught:
                delete(store, mid, force=True, site=SITE)
            text = str(caught.value)
            assert "the hot_standby_feedback of standby convmem_standby (walsender pid" in text, text
            assert_says_one_thing(text, True, "memory_delete")
            assert [site for site, _xid in _owed(servers)] == [SITE]
            reader.rollback()
        # The standby's next feedback (every second here) lets the horizon pass: the sweep finishes the rewrite.
        _wait("the sweep to finish the rewrite", lambda: store.sweep_once() == [] and _owed(servers) == [], 300)
        assert _holding(cluster.dsn(), servers.schema, needles) == []
    finally:
        standby.stop()


@given(st.integers(min_value=3, max_value=2**40), st.integers(min_value=-(2**31) + 1, max_value=2**31 - 1))
def test_an_erasure_precedes_the_cutoff_exactly_when_its_xid_is_older(xid: int, distance: int) -> None:
    """The 32-bit ``removable cutoff`` against a 64-bit xid: modulo 2**32, as PostgreSQL compares xids near each
    other (within 2**31, which the freeze limits guarantee for every xid still in a table)."""
    cutoff = (xid + distance) % 2**32
    assert precedes(str(xid), cutoff) is (distance > 0)
