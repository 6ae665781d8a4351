"""Long-term memories on PostgreSQL shared by several servers: exactly once, and current everywhere.

Each "server" is a ``PgLongTermMemory`` over a ``PgStore`` of its own, all
on one schema of the test cluster: what holds between them holds between
server processes (they share nothing but the database).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import psycopg
import pytest
from memories_support import SITE, MemoryStores, create, delete, fields, update
from test_memories_retrieval_vectors import Counting

from convmem.logstore.memories import DuplicateMemory, NotFound, VerifyRequired, VersionConflict
from convmem.logstore.memories.encoder import default_encoder
from convmem.logstore.memories.retrieval import Retriever
from convmem.logstore.postgres import PgLongTermMemory, PgStore
from convmem.logstore.postgres._memsql import SWEEP_LOCK
from convmem.logstore.timefmt import now_us


@pytest.fixture
def servers(pg_server: str, tmp_path: Path) -> Iterator[MemoryStores]:
    stores = MemoryStores("postgres", tmp_path, pg_server)
    yield stores
    stores.cleanup()


def _race(calls: list[Callable[[], Any]]) -> list[Any]:
    """Run ``calls`` at once (released together); each one's result or exception."""
    barrier = threading.Barrier(len(calls))
    out: list[Any] = [None] * len(calls)

    def run(i: int) -> None:
        barrier.wait()
        try:
            out[i] = calls[i]()
        except Exception as exc:
            out[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return out


def test_two_servers_racing_one_dedupe_key_exactly_one_wins(servers: MemoryStores) -> None:
    a, b = servers.open(), servers.open()
    for round_ in range(5):
        raws = [fields(100 + round_, dedupe_key=f"race-{round_}"), fields(200 + round_, dedupe_key=f"race-{round_}")]
        tokens = [a.verify(SITE, "create", raws[0])[1], b.verify(SITE, "create", raws[1])[1]]
        got = _race([partial(a.upsert, SITE, raws[0], tokens[0]), partial(b.upsert, SITE, raws[1], tokens[1])])
        won = [g for g in got if not isinstance(g, Exception)]
        lost = [g for g in got if isinstance(g, Exception)]
        assert len(won) == 1 and len(lost) == 1, got
        assert isinstance(lost[0], DuplicateMemory) and lost[0].existing_id == won[0].memory_id
    for store in (a, b):
        keys = [m.fields.dedupe_key for m in store.all(SITE)]
        assert sorted(keys) == [f"race-{i}" for i in range(5)]


def test_one_token_through_two_servers_succeeds_once(servers: MemoryStores) -> None:
    a, b = servers.open(), servers.open()
    for n in range(5):
        raw = fields(n, dedupe_key=None)
        _, token, _ = a.verify(SITE, "create", raw)
        got = _race([partial(a.upsert, SITE, raw, token), partial(b.upsert, SITE, raw, token)])
        refused = [g for g in got if isinstance(g, VerifyRequired)]
        assert len(refused) == 1 and refused[0].reason == "used", got
    assert len(a.all(SITE)) == len(b.all(SITE)) == 5


def test_expected_version_is_checked_in_the_write_across_servers(servers: MemoryStores) -> None:
    a, b = servers.open(), servers.open()
    m = create(a, fields(1))
    raws = [fields(1, summary="from a"), fields(1, summary="from b")]
    toks = [a.verify(SITE, "update", raws[0], m.memory_id)[1], b.verify(SITE, "update", raws[1], m.memory_id)[1]]
    got = _race([
        lambda: a.upsert(SITE, raws[0], toks[0], memory_id=m.memory_id, expected_version=1),
        lambda: b.upsert(SITE, raws[1], toks[1], memory_id=m.memory_id, expected_version=1),
    ])
    conflicts = [g for g in got if isinstance(g, VersionConflict)]
    assert len(conflicts) == 1 and conflicts[0].current == 2, got
    assert a.get(SITE, m.memory_id).version == b.get(SITE, m.memory_id).version == 2


def test_a_change_through_one_server_is_seen_by_the_next_call_of_another(servers: MemoryStores) -> None:
    a, b = servers.open(listen=False), servers.open(listen=False)  # the counter alone, no notifications
    m = create(a, fields(1))
    assert [x.memory_id for x, _ in b.search(SITE, "quokka1")] == [m.memory_id]
    update(a, m.memory_id, fields(1, summary="now about capybara"))
    assert b.get(SITE, m.memory_id).fields.summary == "now about capybara"
    assert [x.memory_id for x, _ in b.search(SITE, "capybara")] == [m.memory_id]
    delete(a, m.memory_id)
    assert b.search(SITE, "capybara") == [] and b.get(SITE, m.memory_id).status == "deleted"


def test_after_an_erasure_returns_no_server_shows_the_memory(servers: MemoryStores) -> None:
    a, b, c = servers.open(), servers.open(), servers.open(listen=False)
    keep = create(a, fields(1))
    victim = create(a, fields(2, subject="the secret okapi-77 fact"))
    for s in (b, c):  # both hold it in their indexes
        assert victim.memory_id in [m.memory_id for m, _ in s.search(SITE, "okapi-77", include_deleted=True)]
        assert victim.memory_id in [m.memory_id for m in s.surface(SITE, "secret okapi-77 fact")]
    assert delete(b, victim.memory_id, force=True) is None
    for s in (a, b, c):
        with pytest.raises(NotFound):
            s.get(SITE, victim.memory_id)
        assert victim.memory_id not in [m.memory_id for m, _ in s.search(SITE, "okapi-77", include_deleted=True)]
        assert victim.memory_id not in [m.memory_id for m in s.surface(SITE, "secret okapi-77 fact")]
        assert [m.memory_id for m in s.all(SITE)] == [keep.memory_id]
        assert s.try_surface(SITE, "secret okapi-77 fact") is None  # never answers without the counter check
    assert servers.holding([b"okapi-77"]) == []


def test_notifications_refresh_another_server_before_its_next_call(servers: MemoryStores) -> None:
    a, b = servers.open(), servers.open()
    b.all(SITE)  # b holds the site (and listens)
    m = create(a, fields(1))
    view = b._sites[SITE]
    deadline = time.monotonic() + 20
    while m.memory_id not in view.state and time.monotonic() < deadline:
        time.sleep(0.02)
    assert m.memory_id in view.state


def test_stored_vectors_are_used_on_open(servers: MemoryStores) -> None:
    counting = Counting(default_encoder())
    factory = lambda d: Retriever(d, embedder=counting)  # noqa: E731
    a = servers.open(retriever_factory=factory)
    m = create(a, fields(1, summary="the user likes capybara facts"))
    counting.texts.clear()
    b = servers.open(retriever_factory=factory)
    assert [x.memory_id for x, _ in b.search(SITE, "capybara facts", limit=1)] == [m.memory_id]
    assert b._sites[SITE].retriever().recomputed == 0
    assert counting.texts == ["capybara facts"]  # the query only: no memory was encoded again


def test_the_retention_sweep_runs_on_one_server_at_a_time(servers: MemoryStores, pg_server: str) -> None:
    clock = [now_us()]
    a = servers.open(clock=lambda: clock[0], retention_seconds=60)
    b = servers.open(clock=lambda: clock[0], retention_seconds=60)
    m = create(a, fields(1, summary="swept-once-tapir-3"))
    delete(a, m.memory_id)
    clock[0] += 61 * 1_000_000
    with psycopg.connect(pg_server, autocommit=True) as other:  # another server is sweeping
        assert other.execute("SELECT pg_try_advisory_lock(%s)", (SWEEP_LOCK,)).fetchone() == (True,)
        assert a.sweep_once() is None and b.sweep_once() is None
        assert servers.holding([b"swept-once-tapir-3"])
        other.execute("SELECT pg_advisory_unlock(%s)", (SWEEP_LOCK,))
    assert a.sweep_once() == [SITE]
    assert servers.holding([b"swept-once-tapir-3"]) == []
    assert b.sweep_once() == []
    with pytest.raises(NotFound):
        b.get(SITE, m.memory_id)


def test_a_token_from_another_schema_is_refused(pg_server: str, tmp_path: Path) -> None:
    one, two = MemoryStores("postgres", tmp_path / "1", pg_server), MemoryStores("postgres", tmp_path / "2", pg_server)
    try:
        a, b = one.open(), two.open()
        _, token, _ = a.verify(SITE, "create", fields(1))
        with pytest.raises(VerifyRequired) as info:
            b.upsert(SITE, fields(1), token)
        assert info.value.reason == "mismatch"
    finally:
        one.cleanup()
        two.cleanup()


@pytest.mark.parametrize("older", [("memories", "memory_sites", "memory_tokens", "memory_scrubs"), ("memory_scrubs",)])
def test_a_schema_made_before_memories_gets_their_tables(
    pg_server: str, tmp_path: Path, older: tuple[str, ...]
) -> None:
    stores = MemoryStores("postgres", tmp_path, pg_server)
    try:
        PgStore(pg_server, schema=stores.schema, pool_max=1).close()
        with psycopg.connect(pg_server, autocommit=True) as conn:  # as an older convmem left it
            for table in older:
                conn.execute(f'DROP TABLE "{stores.schema}".{table}'.encode())
        store = stores.open()
        assert isinstance(store, PgLongTermMemory)
        assert create(store, fields(1)).version == 1
        assert delete(store, create(store, fields(2)).memory_id, force=True) is None  # owes, then does, a rewrite
    finally:
        stores.cleanup()


def test_site_indexes_are_released_least_recently_used_first(servers: MemoryStores) -> None:
    sites = [f"lru-site-{i:02d}" for i in range(3)]
    store = servers.open(index_budget=4)
    for s in sites:
        for i in range(2):
            create(store, fields(i, summary=f"the {s} user likes quokka{i} facts"), site=s)
        store.search(s, "quokka facts", limit=1)
    store.all(sites[-1])  # a use: the budget is checked
    assert {s: store._sites[s].indexed() for s in sites} == {sites[0]: 0, sites[1]: 2, sites[2]: 2}
    hits = store.search(sites[0], "quokka facts", limit=2)  # rebuilt on use, from the rows' stored vectors
    assert len(hits) == 2 and store._sites[sites[0]].indexed() == 2
    assert store._sites[sites[0]].retriever().recomputed == 0
    store.search(sites[0], "quokka facts", limit=2)  # the next call brings the total back under the budget
    assert [store._sites[s].indexed() for s in sites] == [2, 0, 2]


def test_records_read_without_an_index_count_against_the_budget(servers: MemoryStores) -> None:
    """A site only read (``get``, a listing) holds its records all the same: they count, and are released."""
    sites = [f"read-site-{i:02d}" for i in range(3)]
    writer = servers.open()
    made = {s: [create(writer, fields(i), site=s).memory_id for i in range(2)] for s in sites}
    store = servers.open(index_budget=4)
    for s in sites:
        assert store.get(s, made[s][0]).memory_id == made[s][0]
    assert store._sites[sites[0]]._retriever is None  # records only, no index
    store.get(sites[-1], made[sites[-1]][1])  # a use: the budget is checked
    assert {s: store._sites[s].indexed() for s in sites} == {sites[0]: 0, sites[1]: 2, sites[2]: 2}
    assert [m.memory_id for m in store.all(sites[0])] == made[sites[0]]  # read again from the rows
    store.all(sites[0])  # the next call brings the total back under the budget
    assert [store._sites[s].indexed() for s in sites] == [2, 0, 2]


def test_a_server_with_many_sites_forgets_the_idle_ones(servers: MemoryStores) -> None:
    """Past ``sites_kept`` the least recently used sites no call is using are forgotten, their access times
    written first: the map stops growing, and every site still answers (read again from its rows)."""
    sites = [f"many-{i:02d}" for i in range(9)]
    store = servers.open(sites_kept=3)
    made = {s: create(store, fields(i, summary=f"the {s} user likes zebra{i} facts"), site=s).memory_id
            for i, s in enumerate(sites)}
    for _ in range(2):
        for i, s in enumerate(sites):
            assert store.search(s, f"zebra{i} facts", limit=1)[0][0].memory_id == made[s]
            assert len(store._sites) <= 3
    before = store.get(sites[0], made[sites[0]]).last_accessed_us
    for s in sites[1:5]:  # the first site is forgotten meanwhile: its access time must reach the database
        store.all(s)
    assert sites[0] not in store._sites
    other = servers.open()
    assert [m.last_accessed_us for m in other.all(sites[0])] == [before]


def test_a_site_in_use_is_never_forgotten_for_the_others(servers: MemoryStores) -> None:
    """A search ranking on one site while calls on more than ``sites_kept`` other sites come and go: the site
    stays in the map under it, and the search answers from it."""
    entered, release = threading.Event(), threading.Event()

    class Gated(Retriever):
        def search(self, *args: Any, **kwargs: Any) -> Any:
            entered.set()
            assert release.wait(60)
            return super().search(*args, **kwargs)

    store = servers.open(sites_kept=2, retriever_factory=lambda d: Gated(d, embedder=None))
    mine = create(store, fields(1, summary="the user enjoys facts about otters"), site="busy-site").memory_id
    found: list[list[str]] = []
    t = threading.Thread(target=lambda: found.append(
        [m.memory_id for m, _ in store.search("busy-site", "otters facts", limit=5)]))
    t.start()
    assert entered.wait(60)
    for i in range(5):
        create(store, fields(i), site=f"other-{i}")
        assert "busy-site" in store._sites
    release.set()
    t.join(60)
    assert found == [[mine]]
    assert len(store._sites) <= 2


def test_a_write_waiting_too_long_for_the_site_times_out_and_writes_nothing(
    servers: MemoryStores, pg_server: str
) -> None:
    from convmem.logstore.errors import Timeout

    store = servers.open(lock_timeout=0.3)
    create(store, fields(1))
    raw = fields(2)
    _, token, _ = store.verify(SITE, "create", raw)
    with psycopg.connect(pg_server) as other:  # another server's write of the site, in progress
        other.execute(f'SELECT 1 FROM "{servers.schema}".memory_sites WHERE site = %s FOR UPDATE'.encode(), (SITE,))
        before = servers.snapshot()
        with pytest.raises(Timeout, match="another write of the site's memories"):
            store.upsert(SITE, raw, token)
        other.rollback()
    assert servers.snapshot() == before
    assert store.upsert(SITE, raw, token).version == 1  # the token was not used up


def test_memories_move_between_a_data_directory_and_postgres_by_export_and_import(
    servers: MemoryStores, pg_server: str, tmp_path: Path
) -> None:
    from mcp_helpers import run_convmem

    from convmem.logstore.memories import LongTermMemory

    data = tmp_path / "files"
    with LongTermMemory(data) as files:
        made = [create(files, fields(i)) for i in range(3)]
        update(files, made[0].memory_id, fields(0, summary="changed once"))
        delete(files, made[1].memory_id)
        originals = {m.memory_id: m.to_json() for m in files.all(SITE)}
    out, back = tmp_path / "export.json", tmp_path / "back.json"
    pg_args = (pg_server, "--pg-schema", servers.schema, "--site", SITE, "--memories")
    assert run_convmem("export", str(data), "--site", SITE, "--memories", "--output", str(out)).returncode == 0
    done = run_convmem("import", *pg_args, "--input", str(out))
    assert done.returncode == 0 and "imported 3 memories" in done.stderr, done.stderr
    store = servers.open()
    def same(rec: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in rec.items() if k != "last_accessed_at"}
    assert {m.memory_id: same(m.to_json()) for m in store.all(SITE)} == {k: same(v) for k, v in originals.items()}
    rows = servers.snapshot()["memories"]
    assert len(rows) == 3 and all(r[10] is not None for r in rows)  # each with its vector
    done = run_convmem("export", *pg_args, "--output", str(back))
    assert done.returncode == 0, done.stderr
    import json

    assert [same(m) for m in json.loads(back.read_text())["memories"]] == [same(v) for v in originals.values()]
    again = run_convmem("import", *pg_args, "--input", str(out))
    assert again.returncode == 0 and "0 memories; 3 already present" in again.stderr, again.stderr
