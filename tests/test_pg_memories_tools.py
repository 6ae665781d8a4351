"""``convmem stats`` and ``convmem fsck`` on the long-term memories of a PostgreSQL store."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from mcp_helpers import run_convmem
from memories_support import create, delete, fields

from convmem.logstore.memories.retrieval import Retriever
from convmem.logstore.postgres import PgLongTermMemory, PgStore
from tests.pg_support import drop_schema, new_schema

SITE, BARE = "site-pgtools-a", "site-pgtools-novec"


@pytest.fixture
def pg(pg_server: str) -> Iterator[tuple[str, str]]:
    schema = new_schema(pg_server)
    yield pg_server, schema
    drop_schema(pg_server, schema)


def _fill(dsn: str, schema: str) -> list[str]:
    """Three memories with vectors in SITE (one soft-deleted) beside a conversation; one without in BARE."""
    with PgStore(dsn, schema=schema) as store:
        store.append(SITE, "conv-0001", [{"a": 1}])
        with PgLongTermMemory(store, listen=False) as mem:
            ids = [create(mem, fields(i), site=SITE).memory_id for i in range(3)]
            delete(mem, ids[2], site=SITE)
        with PgLongTermMemory(store, listen=False, retriever_factory=lambda d: Retriever(d, embedder=None)) as mem:
            create(mem, fields(7), site=BARE)
    return ids


def _sql(dsn: str, schema: str, text: str, *params: Any) -> list[Any]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        cur = conn.execute(text.replace("S.", f'"{schema}".').encode(), params)
        return cur.fetchall() if cur.description else []


def test_stats_counts_memories_bytes_and_vectors_per_site(pg: tuple[str, str]) -> None:
    dsn, schema = pg
    _fill(dsn, schema)
    (want_bytes,) = _sql(dsn, schema, "SELECT sum(octet_length(record) + octet_length(vec)) FROM S.memories "
                         "WHERE site = %s", SITE)[0]
    out = run_convmem("stats", dsn, "--pg-schema", schema, "--json")
    assert out.returncode == 0, out.stderr
    doc = {d["site"]: d for d in json.loads(out.stdout)}
    a, bare = doc[SITE], doc[BARE]
    assert a["conversations"] == 1 and bare["conversations"] == 0
    m = a["memories"]
    assert (m["active"], m["deleted"], m["vectors"], m["vectors_missing"]) == (2, 1, 3, 0)
    assert m["bytes"] == want_bytes and m["oldest_deleted_at"] is not None
    assert (bare["memories"]["active"], bare["memories"]["vectors"], bare["memories"]["vectors_missing"]) == (1, 0, 1)
    text = run_convmem("stats", dsn, "--pg-schema", schema, "--site", SITE)
    assert text.returncode == 0, text.stderr
    assert "memories: 2 active, 1 soft-deleted" in text.stdout and "3 vectors stored, 0 missing" in text.stdout
    assert BARE not in text.stdout


def _fsck(dsn: str, schema: str, *extra: str) -> tuple[int, dict[str, Any]]:
    out = run_convmem("fsck", dsn, "--pg-schema", schema, "--json", *extra)
    return out.returncode, json.loads(out.stdout)


def test_fsck_reports_what_is_wrong_in_the_memory_tables(pg: tuple[str, str]) -> None:
    dsn, schema = pg
    ids = _fill(dsn, schema)
    status, doc = _fsck(dsn, schema, "--site", SITE)
    assert (status, doc["memory_problems"], doc["memories"]) == (0, [], 3), doc
    text = run_convmem("fsck", dsn, "--pg-schema", schema)
    assert text.returncode == 4 and "vector-missing: site site-pgtools-novec" in text.stdout, text.stdout

    a, b, c = ids
    _sql(dsn, schema, "UPDATE S.memories SET vec = convert_to(replace(convert_from(vec, 'UTF8'), "
         "'all-MiniLM', 'other-model'), 'UTF8') WHERE memory_id = %s", a)
    _sql(dsn, schema, "UPDATE S.memories SET dedupe_key = 'not-the-records', deleted_at = 5 WHERE memory_id = %s", b)
    _sql(dsn, schema, "UPDATE S.memories SET record = 'not json'::bytea WHERE memory_id = %s", c)
    _sql(dsn, schema, "UPDATE S.memory_sites SET changes = 1 WHERE site = %s", SITE)
    status, doc = _fsck(dsn, schema, "--site", SITE)
    kinds = sorted((p["kind"], p["file"]) for p in doc["memory_problems"])
    assert status == 4, doc
    assert kinds == sorted([
        ("vector-wrong-model", f"memories row {a}"),
        ("bad-record", f"memories row {b}"),
        ("dedupe-mismatch", f"memories row {b}"),
        ("record-undecodable", f"memories row {c}"),
        ("counter-behind", "memory_sites"),
    ]), kinds

    # A vector of another dimension (and a record that decodes again), and one made from another text.
    _sql(dsn, schema, "UPDATE S.memories SET vec = convert_to(regexp_replace(convert_from(vec, 'UTF8'), "
         "'\"f16\":\"....', '\"f16\":\"'), 'UTF8'), record = (SELECT record FROM S.memories WHERE memory_id = %s) "
         "WHERE memory_id = %s", a, c)
    _sql(dsn, schema, "UPDATE S.memories SET record = convert_to(replace(convert_from(record, 'UTF8'), "
         "'zebra1', 'okapi1'), 'UTF8') WHERE memory_id = %s", b)
    status, doc = _fsck(dsn, schema, "--site", SITE)
    vec_kinds = {(p["kind"], p["file"]) for p in doc["memory_problems"] if p["kind"].startswith("vector-")}
    assert vec_kinds == {
        ("vector-wrong-model", f"memories row {a}"),
        ("vector-stale", f"memories row {b}"),
        ("vector-wrong-dimension", f"memories row {c}"),
    }, vec_kinds
    assert status == 4


def test_fsck_repairs_the_site_counters_and_servers_read_the_site_again(pg: tuple[str, str]) -> None:
    dsn, schema = pg
    ids = _fill(dsn, schema)
    with PgStore(dsn, schema=schema) as store, PgLongTermMemory(store, listen=False) as server:
        assert len(server.all(SITE)) == 3  # a server holding the site at its current change
        _sql(dsn, schema, "DELETE FROM S.memory_sites WHERE site = %s", SITE)
        status, doc = _fsck(dsn, schema, "--site", SITE)
        assert status == 4 and [p["kind"] for p in doc["memory_problems"]] == ["counter-missing"], doc
        # A row changed behind the servers' back; the repaired counter makes them read the site again.
        _sql(dsn, schema, "UPDATE S.memories SET version = 9 WHERE memory_id = %s", ids[0])
        status, doc = _fsck(dsn, schema, "--site", SITE, "--repair")
        assert status == 1 and doc["memory_problems"][0]["repaired"] is True, doc
        assert _fsck(dsn, schema, "--site", SITE)[0] == 0
        assert {m.memory_id: m.version for m in server.all(SITE)}[ids[0]] == 9
