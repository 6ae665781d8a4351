"""Erasure on PostgreSQL leaves no bytes in the table's pages: the relation files are read after CHECKPOINT.

A forced delete, the retention sweep's purge and ``site remove`` each rewrite
the partition of ``memories`` holding the site (``VACUUM FULL``). The tests
search every relation file of the schema (heaps, TOAST tables, indexes) for a
marker in the memory's text, its dedupe_key, a long source URI that PostgreSQL
moves to the TOAST table, and a piece of the stored vector. Two tests keep the
rewrite from doing its work (a second session's REPEATABLE READ snapshot, a
lock that makes it time out) and check what the call says, the owed record in
``memory_scrubs``, and that the sweep's retry finishes the job; another runs
a throttled lazy VACUUM (which holds nothing, and must not be reported) and a
throttled ANALYZE (which holds the rows, and must be). One more test holds
the ACCESS EXCLUSIVE lock a rewrite takes on one partition and shows
that another site's calls, in another partition, go on meanwhile, with the
server's default plans and with generic plans forced.
"""

from __future__ import annotations

import os
import secrets
import string
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from memories_support import MemoryStores, create, delete, fields

from convmem.logstore.memories.errors import NotFound
from convmem.logstore.postgres._memories import drop_site_memories
from convmem.logstore.postgres._memscrub import ScrubPending, partition_of

SITE = "erase-site-01"


@pytest.fixture
def servers(pg_server: str, tmp_path: Path) -> Iterator[MemoryStores]:
    with psycopg.connect(pg_server, autocommit=True) as conn:
        datadir = str(conn.execute("SHOW data_directory").fetchone()[0])  # type: ignore[index]
    if not os.access(datadir, os.R_OK):
        pytest.skip("the test server's data directory is not readable here")
    stores = MemoryStores("postgres", tmp_path, pg_server)
    yield stores
    stores.cleanup()


def _relation_files(dsn: str, schema: str) -> dict[str, list[Path]]:
    """Every relation of ``schema`` (tables, their TOAST tables and indexes) and its files, after a CHECKPOINT."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CHECKPOINT")
        datadir = Path(str(conn.execute("SHOW data_directory").fetchone()[0]))  # type: ignore[index]
        rows = conn.execute(
            "SELECT c.relname, pg_relation_filepath(c.oid) FROM pg_class c JOIN pg_namespace n"
            " ON n.oid = c.relnamespace WHERE n.nspname = %s"
            " UNION ALL SELECT t.relname, pg_relation_filepath(t.oid) FROM pg_class c JOIN pg_namespace n"
            " ON n.oid = c.relnamespace JOIN pg_class t ON t.oid IN (c.reltoastrelid, (SELECT i.indexrelid"
            " FROM pg_index i WHERE i.indrelid = c.reltoastrelid LIMIT 1)) WHERE n.nspname = %s",
            (schema, schema),
        ).fetchall()
    out: dict[str, list[Path]] = {}
    for name, rel in rows:
        if rel is not None:
            base = datadir / rel
            out[str(name)] = [p for p in base.parent.glob(base.name + "*") if p.is_file()]
    return out


def _holding(dsn: str, schema: str, needles: list[bytes]) -> list[tuple[str, bytes]]:
    hits = []
    for name, paths in _relation_files(dsn, schema).items():
        for path in paths:
            data = path.read_bytes()
            hits += [(name, n) for n in needles if n in data]
    return hits


def _victim(store: Any, site: str = SITE) -> tuple[str, list[bytes]]:
    """A memory whose text, dedupe_key, TOASTed URI and vector are findable; its id and the needles."""
    marker = "okapi" + secrets.token_hex(6)
    noise = "".join(secrets.choice(string.ascii_letters + string.digits) for _ in range(1800))
    raw = fields(7, subject=f"the secret {marker} fact", dedupe_key=f"dk-{marker}",
                 source_uris=[f"https://example.org/{marker}/{noise}"])
    m = create(store, raw, site)
    for n in range(20):  # neighbours on the same pages
        create(store, fields(n), site)
    with psycopg.connect(store._store.dsn, autocommit=True) as conn:
        row = conn.execute(
            f'SELECT vec FROM "{store._store.schema}".memories WHERE site = %s AND memory_id = %s'.encode(),
            (site, m.memory_id),
        ).fetchone()
    assert row is not None and row[0] is not None
    vec = bytes(row[0])
    start = vec.index(b'"f16":"') + 7
    return m.memory_id, [marker.encode(), f"dk-{marker}".encode(), noise[:200].encode(), vec[start:start + 48]]


def _check_before(servers: MemoryStores, needles: list[bytes]) -> None:
    where = {n: {name for name, got in _holding(str(servers.dsn), servers.schema, needles) if got == n}
             for n in needles}
    assert all(where[n] for n in needles), where  # the search finds what is there
    assert any("toast" in name for name in where[needles[2]]), where


def test_a_forced_delete_leaves_no_bytes_in_any_relation(servers: MemoryStores) -> None:
    store = servers.open(listen=False)
    mid, needles = _victim(store)
    _check_before(servers, needles)
    assert delete(store, mid, force=True, site=SITE) is None
    assert _holding(str(servers.dsn), servers.schema, needles) == []
    assert len(store.all(SITE)) == 20


def test_the_sweeps_purge_leaves_no_bytes(servers: MemoryStores) -> None:
    store = servers.open(listen=False, retention_seconds=0)
    mid, needles = _victim(store)
    delete(store, mid, site=SITE)  # soft: the text stays until retention ends (here at once)
    assert _holding(str(servers.dsn), servers.schema, needles[:1])
    sweeper = servers.open(listen=False, retention_seconds=0)
    assert sweeper.sweep_once() == [SITE]
    assert _holding(str(servers.dsn), servers.schema, needles) == []


def test_site_remove_leaves_no_bytes(servers: MemoryStores) -> None:
    store = servers.open(listen=False)
    _mid, needles = _victim(store)
    assert drop_site_memories(store._store, SITE)
    assert _holding(str(servers.dsn), servers.schema, needles) == []


def _owed(servers: MemoryStores) -> list[tuple[str, str]]:
    """The rewrites recorded as owed: (site, erasing transaction id)."""
    with psycopg.connect(str(servers.dsn), autocommit=True) as conn:
        rows = conn.execute(f'SELECT site, erased_xid::text FROM "{servers.schema}".memory_scrubs'.encode())
        return [(str(a), str(b)) for a, b in rows.fetchall()]


@pytest.fixture
def own_database(pg_server: str, tmp_path: Path) -> Iterator[MemoryStores]:
    """Stores in a database of their own: a snapshot held there holds back no other test's erasures (a test
    server given by CONVMEM_TEST_POSTGRES may be shared by both workers of the suite)."""
    from psycopg.conninfo import make_conninfo

    name = "convmem_erasure_" + secrets.token_hex(4)
    with psycopg.connect(pg_server, autocommit=True) as conn:
        datadir = str(conn.execute("SHOW data_directory").fetchone()[0])  # type: ignore[index]
        if not os.access(datadir, os.R_OK):
            pytest.skip("the test server's data directory is not readable here")
        conn.execute(f"CREATE DATABASE {name}".encode())
    stores = MemoryStores("postgres", tmp_path, make_conninfo(pg_server, dbname=name))
    try:
        yield stores
    finally:
        stores.cleanup()
        with psycopg.connect(pg_server, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)".encode())


def test_an_open_snapshot_keeps_the_bytes_and_the_erasure_says_what_holds_them(own_database: MemoryStores) -> None:
    servers = own_database
    store = servers.open(listen=False, lock_timeout=0.5)  # how long the erasure waits for the snapshot to end
    mid, needles = _victim(store)
    with psycopg.connect(str(servers.dsn)) as holder:
        holder.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        holder.execute("SELECT 1")  # the snapshot is taken; no lock on any table
        pid = holder.info.backend_pid
        with pytest.raises(ScrubPending) as caught:
            delete(store, mid, force=True, site=SITE)
        assert f"session pid {pid}" in str(caught.value) and "may still be in the files" in str(caught.value)
        assert caught.value.table == partition_of(holder, servers.schema, SITE)
        assert [site for site, _xid in _owed(servers)] == [SITE]
        # The rewrite ran and kept the deleted row version (the holder may still read it): the bytes are there.
        assert {n for _name, n in _holding(str(servers.dsn), servers.schema, needles)} == set(needles)
        with pytest.raises(NotFound):
            store.get(SITE, mid)  # erased all the same
        assert store.sweep_once() == []  # still held: the sweep leaves it owed
        assert [site for site, _xid in _owed(servers)] == [SITE]
        holder.rollback()
    assert store.sweep_once() == []  # nothing to purge; the owed rewrite is retried, and now nothing holds it
    assert _owed(servers) == []
    assert _holding(str(servers.dsn), servers.schema, needles) == []
    # A snapshot that ends while the erasure waits for it (within lock_timeout): the call succeeds.
    patient = servers.open(listen=False, lock_timeout=30)
    mid, needles = _victim(patient, "erase-site-02")
    outcome: list[object] = []
    with psycopg.connect(str(servers.dsn)) as holder:
        holder.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        holder.execute("SELECT 1")
        t = threading.Thread(target=lambda: outcome.append(delete(patient, mid, force=True, site="erase-site-02")))
        t.start()
        while not _owed(servers) and t.is_alive():  # committed; now waiting for the snapshot
            threading.Event().wait(0.01)
        holder.rollback()
    t.join(60)
    assert outcome == [None] and _owed(servers) == []
    assert _holding(str(servers.dsn), servers.schema, needles) == []


def test_a_failed_rewrite_stays_owed_until_the_sweep_does_it(servers: MemoryStores) -> None:
    store = servers.open(listen=False, lock_timeout=0.2)
    mid, needles = _victim(store)
    with psycopg.connect(str(servers.dsn)) as holder:
        table = partition_of(holder, servers.schema, SITE)
        # ACCESS SHARE lets the DELETE through (ROW EXCLUSIVE) but not VACUUM FULL (ACCESS EXCLUSIVE).
        holder.execute(f'LOCK TABLE "{servers.schema}".{table} IN ACCESS SHARE MODE'.encode())
        with pytest.raises(ScrubPending) as caught:
            delete(store, mid, force=True, site=SITE)
        assert "failed" in str(caught.value) and caught.value.held == []
        assert [site for site, _xid in _owed(servers)] == [SITE]
        assert _holding(str(servers.dsn), servers.schema, needles[:1])
        holder.rollback()
    assert store.sweep_once() == []
    assert _owed(servers) == []
    assert _holding(str(servers.dsn), servers.schema, needles) == []


@pytest.mark.parametrize("plans", ["default", "force_generic_plan"])
def test_a_rewrite_of_one_partition_leaves_other_sites_calls_running(servers: MemoryStores, plans: str) -> None:
    """With ``force_generic_plan`` every statement runs a generic plan (as PostgreSQL may pick after five
    executions of a prepared one): PostgreSQL 15 locks every relation of a generic plan before run-time
    pruning, so a statement naming the parent table would wait for the lock on any partition."""
    from convmem.logstore.postgres import PgLongTermMemory, PgStore

    if plans == "default":
        store = servers.open(listen=False)
    else:
        dsn = str(servers.dsn)
        dsn += ("&" if "?" in dsn else "?") + "options=-c%20plan_cache_mode%3D" + plans
        logs = PgStore(dsn, schema=servers.schema, pool_min=1, pool_max=4)
        servers.opened.append(logs)
        store = PgLongTermMemory(logs, listen=False)
        servers.opened.append(store)
        with logs._conn() as conn:
            assert conn.execute("SHOW plan_cache_mode").fetchone() == (plans,)
    with psycopg.connect(str(servers.dsn), autocommit=True) as conn:
        create(store, fields(1), SITE)  # makes the tables
        mine = partition_of(conn, servers.schema, SITE)
        other = next(s for s in (f"erase-other-{i:02d}" for i in range(100))
                     if partition_of(conn, servers.schema, s) != mine)
    for n in range(12):  # past psycopg's prepare threshold: the statements are prepared on the server
        m = create(store, fields(n + 10), other)
        store.search(other, f"quokka{n + 10}")
        store.get(other, m.memory_id)
    done = threading.Event()
    with psycopg.connect(str(servers.dsn)) as holder:
        holder.execute(f'LOCK TABLE "{servers.schema}".{mine} IN ACCESS EXCLUSIVE MODE'.encode())
        held = holder.execute(
            "SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation"
            " WHERE c.relname = %s AND l.mode = 'AccessExclusiveLock' AND l.granted", (mine,),
        ).fetchone()
        assert held is not None and held[0] == 1

        def calls() -> None:
            m = create(store, fields(99), other)
            assert store.search(other, "quokka99")
            assert store.get(other, m.memory_id).memory_id == m.memory_id
            store.flush_access()
            done.set()

        t = threading.Thread(target=calls)
        t.start()
        t.join(10)
        finished = done.is_set()
        holder.rollback()
    t.join(30)
    assert finished, "another site's calls waited for the lock on a partition that does not hold it"


#: The memories table and its indexes as convmem made them before the partitions.
_OLD_MEMORIES = """
CREATE TABLE {schema}.memories (
    site text COLLATE "C" NOT NULL, memory_id text COLLATE "C" NOT NULL, status text NOT NULL,
    version bigint NOT NULL, created_at bigint NOT NULL, updated_at bigint NOT NULL,
    last_accessed_at bigint NOT NULL, deleted_at bigint, dedupe_key text COLLATE "C", record bytea NOT NULL,
    vec bytea, change bigint NOT NULL, PRIMARY KEY (site, memory_id));
CREATE UNIQUE INDEX memories_dedupe
    ON {schema}.memories (site, dedupe_key) WHERE status = 'active' AND dedupe_key IS NOT NULL;
CREATE INDEX memories_by_change ON {schema}.memories (site, change);
CREATE INDEX memories_deleted ON {schema}.memories (deleted_at) WHERE status = 'deleted';
"""


def test_an_unpartitioned_table_of_an_older_convmem_is_converted_at_start_up(servers: MemoryStores) -> None:
    from convmem.logstore.postgres import PgStore

    store = servers.open(listen=False)
    kept = [create(store, fields(100 + n), SITE) for n in range(3)]
    schema, dsn = servers.schema, str(servers.dsn)
    old = _OLD_MEMORIES
    with psycopg.connect(dsn, autocommit=True) as conn, conn.transaction():
        conn.execute(f'ALTER TABLE "{schema}".memories RENAME TO saved'.encode())
        for index in ("memories_pkey", "memories_dedupe", "memories_by_change", "memories_deleted"):
            conn.execute(f'ALTER INDEX "{schema}".{index} RENAME TO saved_{index}'.encode())
        conn.execute(old.replace("{schema}", f'"{schema}"').encode())
        conn.execute(f'INSERT INTO "{schema}".memories SELECT * FROM "{schema}".saved'.encode())
        conn.execute(f'DROP TABLE "{schema}".saved'.encode())
        kind = conn.execute(f"SELECT relkind FROM pg_class WHERE oid = '\"{schema}\".memories'::regclass".encode())
        assert kind.fetchone() == ("r",)
    PgStore(dsn, schema=schema, pool_min=1, pool_max=1).close()
    with psycopg.connect(dsn, autocommit=True) as conn:
        kind = conn.execute(f"SELECT relkind FROM pg_class WHERE oid = '\"{schema}\".memories'::regclass".encode())
        assert kind.fetchone() == ("p",)
    again = servers.open(listen=False)
    assert sorted(m.memory_id for m in again.all(SITE)) == sorted(m.memory_id for m in kept)
    assert len(kept) == 3
    mid, needles = _victim(again)
    assert delete(again, mid, force=True, site=SITE) is None
    assert _holding(dsn, schema, needles) == []


def _slow_maintenance(dsn: str, command: str, progress_view: str) -> tuple[threading.Thread, int, list[BaseException]]:
    """Run ``command`` on table ``filler``, throttled to a page per 100 ms, in a thread; its thread, backend pid
    and errors, once ``progress_view`` lists it with a snapshot (its ``backend_xmin``) taken."""
    conn = psycopg.connect(dsn, autocommit=True)
    conn.execute("SET vacuum_cost_delay = 100")
    conn.execute("SET vacuum_cost_limit = 1")
    pid = conn.info.backend_pid
    errors: list[BaseException] = []

    def run() -> None:
        try:
            conn.execute(command.encode())
        except psycopg.errors.QueryCanceled:
            pass  # the test cancels it when done
        except BaseException as exc:
            errors.append(exc)
        finally:
            conn.close()

    t = threading.Thread(target=run)
    t.start()
    with psycopg.connect(dsn, autocommit=True) as watch:
        for _ in range(3000):
            row = watch.execute(
                f"SELECT a.backend_xmin IS NOT NULL FROM pg_stat_activity a JOIN {progress_view} p USING (pid)"
                " WHERE pid = %s".encode(), (pid,),
            ).fetchone()
            if row is not None and row[0]:
                return t, pid, errors
            threading.Event().wait(0.01)
    raise AssertionError(f"{command} never showed up in {progress_view}")


def _running(dsn: str, view: str, pid: int) -> bool:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(f"SELECT 1 FROM {view} WHERE pid = %s".encode(), (pid,)).fetchone() is not None


def _cancel(dsn: str, pid: int, t: threading.Thread) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_cancel_backend(%s)", (pid,))
    t.join(60)


def test_a_running_vacuum_holds_nothing_and_a_running_analyze_holds_the_bytes(own_database: MemoryStores) -> None:
    """A lazy VACUUM runs with PROC_IN_VACUUM, which the removal horizon skips: its ``backend_xmin`` (older than
    the erasure) must not be reported, and the rewrite removes the bytes while it runs. An ANALYZE has no such
    flag: its snapshot holds the deleted row versions, and the erasure says so."""
    from convmem.logstore.postgres._memscrub import holders

    servers = own_database
    dsn = str(servers.dsn)
    store = servers.open(listen=False, lock_timeout=2)
    mid, needles = _victim(store)
    with psycopg.connect(dsn, autocommit=True) as conn:  # 50,000 rows: some 500 pages, 50 s at 100 ms a page
        conn.execute("CREATE TABLE filler (n int, pad text) WITH (autovacuum_enabled = off)")
        conn.execute("INSERT INTO filler SELECT g, repeat('x', 60) FROM generate_series(1, 50000) AS g")
    t, vacuum_pid, errors = _slow_maintenance(dsn, "VACUUM (DISABLE_PAGE_SKIPPING) filler", "pg_stat_progress_vacuum")
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            xid = str(conn.execute("SELECT pg_current_xact_id()::text").fetchone()[0])  # type: ignore[index]
            older = conn.execute(
                "SELECT age(backend_xmin) >= age(%s::xid8::xid) FROM pg_stat_activity WHERE pid = %s", (xid, vacuum_pid)
            ).fetchone()
            assert older == (True,)  # the vacuum's snapshot predates a transaction started now
            assert holders(conn, xid) == []
        assert delete(store, mid, force=True, site=SITE) is None
        assert _owed(servers) == []
        assert _holding(dsn, servers.schema, needles) == []
        assert _running(dsn, "pg_stat_progress_vacuum", vacuum_pid)  # it ran all along
    finally:
        _cancel(dsn, vacuum_pid, t)
    assert errors == []
    t, analyze_pid, errors = _slow_maintenance(dsn, "ANALYZE filler", "pg_stat_progress_analyze")
    try:
        store = servers.open(listen=False, lock_timeout=0.5)
        mid, needles = _victim(store, "erase-site-02")
        with pytest.raises(ScrubPending) as caught:
            delete(store, mid, force=True, site="erase-site-02")
        assert f"session pid {analyze_pid}" in str(caught.value) and "may still be in the files" in str(caught.value)
        assert [site for site, _xid in _owed(servers)] == ["erase-site-02"]
        # The report is right: the rewrite kept the deleted row versions the ANALYZE's snapshot may read.
        assert {n for _name, n in _holding(dsn, servers.schema, needles)} == set(needles)
        assert _running(dsn, "pg_stat_progress_analyze", analyze_pid)
    finally:
        _cancel(dsn, analyze_pid, t)
    assert errors == []
    assert store.sweep_once() == []
    assert _owed(servers) == []
    assert _holding(dsn, servers.schema, needles) == []


def test_a_running_transaction_without_a_snapshot_holds_the_bytes_and_is_named(own_database: MemoryStores) -> None:
    """A READ COMMITTED transaction idle between statements has no snapshot (no ``backend_xmin``), but its
    transaction id (``backend_xid``), older than the erasure, holds the horizon all the same."""
    servers = own_database
    dsn = str(servers.dsn)
    store = servers.open(listen=False, lock_timeout=0.5)
    mid, needles = _victim(store)
    with psycopg.connect(dsn) as holder:
        holder.execute("SELECT pg_current_xact_id()")  # a transaction id, taken before the erasure
        pid = holder.info.backend_pid
        with psycopg.connect(dsn, autocommit=True) as conn:
            row = conn.execute("SELECT backend_xmin IS NULL, backend_xid IS NOT NULL FROM pg_stat_activity"
                               " WHERE pid = %s", (pid,)).fetchone()
        assert row == (True, True)
        with pytest.raises(ScrubPending) as caught:
            delete(store, mid, force=True, site=SITE)
        assert f"session pid {pid}" in str(caught.value)
        assert {n for _name, n in _holding(dsn, servers.schema, needles)} == set(needles)
        holder.rollback()
    assert store.sweep_once() == []
    assert _owed(servers) == [] and _holding(dsn, servers.schema, needles) == []
