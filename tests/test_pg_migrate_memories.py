"""``convmem migrate`` carries long-term memories both ways: records, versions, status and stored vectors,
resumably (no duplicates) and verified (a difference exits 4)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from mcp_helpers import run_convmem
from memories_support import create, delete, fields, update

from convmem.logstore import FileStore
from convmem.logstore.memories import LongTermMemory, LongTermStore, StoredMemory, parse_fields
from convmem.logstore.memories.encoder import Encoder, default_encoder
from convmem.logstore.memories.retrieval import Retriever
from convmem.logstore.postgres import PgLongTermMemory, PgStore
from convmem.tools.migrate_memories import migrate_memories
from tests.pg_support import drop_schema, new_schema

SITE = "site-migmem-a"
ONLY = "site-migmem-only"  # memories and no conversation


@pytest.fixture
def pg(pg_server: str) -> Iterator[tuple[str, str]]:
    schema = new_schema(pg_server)
    yield pg_server, schema
    drop_schema(pg_server, schema)


class CountingEncoder:
    """The shipped encoder, counting the texts it encodes (to show that copies encode nothing)."""

    def __init__(self, inner: Encoder) -> None:
        self.inner = inner
        self.dim = inner.dim
        self.model_id = inner.model_id
        self.texts = 0

    def embed_one(self, text: str) -> Any:
        self.texts += 1
        return self.inner.embed_one(text)

    def embed(self, texts: Sequence[str]) -> Any:
        self.texts += len(texts)
        return self.inner.embed(texts)


def _counting() -> tuple[CountingEncoder, Any]:
    enc = CountingEncoder(default_encoder())
    return enc, lambda d: Retriever(d, embedder=enc)


def _fill(store: LongTermStore) -> None:
    """Active, updated (version 2) and soft-deleted memories, with dedupe keys, in two sites."""
    for i in range(4):
        create(store, fields(i), site=SITE)
    ms = store.all(SITE)
    update(store, ms[1].memory_id, fields(1, summary="the user now prefers quokka facts"), site=SITE)
    delete(store, ms[2].memory_id, site=SITE)
    create(store, fields(9), site=ONLY)


def _held(store: LongTermStore, site: str) -> list[tuple[dict[str, Any], Any, int]]:
    return [(s.memory.to_json(), s.vector, s.memory.last_accessed_us) for s in store.export_stored(site)]


def test_migrate_carries_memories_to_postgresql_and_back(tmp_path: Path, pg: tuple[str, str]) -> None:
    dsn, schema = pg
    src = tmp_path / "src"
    with FileStore(src) as store:
        store.append(SITE, "conv-0001", [{"a": 1}])
    with LongTermMemory(src) as mem:
        _fill(mem)
        want = {site: _held(mem, site) for site in (SITE, ONLY)}
    assert [m["status"] for m, _, _ in want[SITE]] == ["active", "active", "deleted", "active"]
    assert all(vec is not None for rows in want.values() for _, vec, _ in rows)

    out = run_convmem("migrate", str(src), dsn, "--dst-schema", schema)
    assert out.returncode == 0, (out.stdout, out.stderr)
    assert "5 long-term memories of 2 sites (5 copied in this run)" in out.stdout, out.stdout
    assert "every long-term memory the same record and stored vector" in out.stdout
    assert f"copied {SITE}: 4 long-term memories" in out.stderr
    with PgStore(dsn, schema=schema) as pgs, PgLongTermMemory(pgs, listen=False) as mem:
        assert {site: _held(mem, site) for site in (SITE, ONLY)} == want
        assert mem.all(SITE)[1].version == 2

    again = run_convmem("migrate", str(src), dsn, "--dst-schema", schema, "--quiet")
    assert again.returncode == 0 and "(0 copied in this run)" in again.stdout, (again.stdout, again.stderr)

    back = tmp_path / "back"
    home = run_convmem("migrate", dsn, str(back), "--src-schema", schema)
    assert home.returncode == 0, (home.stdout, home.stderr)
    with LongTermMemory(back) as mem:
        assert {site: _held(mem, site) for site in (SITE, ONLY)} == want
        # the dedupe key came along: a second active memory with it is refused
        with pytest.raises(Exception, match="dedupe"):
            create(mem, fields(0, subject="another"), site=SITE)


@pytest.mark.parametrize("direction", ["dir-to-pg", "pg-to-dir"])
def test_copied_memories_are_not_encoded_again(tmp_path: Path, pg: tuple[str, str], direction: str) -> None:
    """The destination keeps the source's vectors: its encoder encodes no copied memory, and search uses them."""
    dsn, schema = pg
    s_enc, s_factory = _counting()
    d_enc, d_factory = _counting()
    with PgStore(dsn, schema=schema) as pgs:
        def on_pg(factory: Any) -> LongTermStore:
            return PgLongTermMemory(pgs, listen=False, retriever_factory=factory)

        def on_dir(factory: Any) -> LongTermStore:
            return LongTermMemory(tmp_path / "dir", retriever_factory=factory)

        make_src, make_dst = (on_dir, on_pg) if direction == "dir-to-pg" else (on_pg, on_dir)
        with make_src(s_factory) as src:
            _fill(src)
            assert s_enc.texts > 0
            with make_dst(d_factory) as dst:
                done = migrate_memories(src, dst, None, quiet=True)
                assert (done.sites, done.memories, done.copied, done.problems) == (2, 5, 5, [])
                assert d_enc.texts == 0, "the destination encoded a copied memory"
                assert _held(dst, SITE) == _held(src, SITE)
                hits = dst.search(SITE, "quokka facts", limit=3)
                assert hits and d_enc.texts == 1  # the query only: every memory's vector was carried


def test_an_interrupted_memory_copy_resumes_without_duplicates(tmp_path: Path, pg: tuple[str, str]) -> None:
    """A run stopped after some memories (each batch commits whole) is finished by running migrate again."""
    dsn, schema = pg
    src = tmp_path / "src"
    with LongTermMemory(src) as mem:
        _fill(mem)
        stored = mem.export_stored(SITE)
    with PgStore(dsn, schema=schema) as pgs, PgLongTermMemory(pgs, listen=False) as dst:
        assert dst.import_stored(SITE, stored[:2]) == (2, 0)  # what the stopped run had committed
    out = run_convmem("migrate", str(src), dsn, "--dst-schema", schema, "--quiet")
    assert out.returncode == 0, (out.stdout, out.stderr)
    assert "5 long-term memories of 2 sites (3 copied in this run)" in out.stdout, out.stdout
    with PgStore(dsn, schema=schema) as pgs, PgLongTermMemory(pgs, listen=False) as dst:
        assert [s.memory.memory_id for s in dst.export_stored(SITE)] == [s.memory.memory_id for s in stored]


def test_a_memory_that_differs_at_the_destination_fails_verification(tmp_path: Path, pg: tuple[str, str]) -> None:
    """A memory only the destination holds, or one it holds under the same id with other content, is a
    difference (exit 4); the destination's memory is not overwritten."""
    dsn, schema = pg
    src = tmp_path / "src"
    with LongTermMemory(src) as mem:
        create(mem, fields(1), site=SITE)
        create(mem, fields(2), site=ONLY)
        mine = mem.export_stored(ONLY)[0]
    theirs = StoredMemory(replace(mine.memory, fields=parse_fields(fields(7))), None)
    with PgStore(dsn, schema=schema) as pgs, PgLongTermMemory(pgs, listen=False) as dst:
        create(dst, fields(5), site=SITE)
        dst.import_stored(ONLY, [theirs])
    out = run_convmem("migrate", str(src), dsn, "--dst-schema", schema, "--quiet")
    assert out.returncode == 4, (out.stdout, out.stderr)
    assert f"MISMATCH {SITE}: memory " in out.stderr and "is at the destination only" in out.stderr, out.stderr
    assert f"MISMATCH {ONLY}: memories not copied: " in out.stderr, out.stderr
    assert f"MISMATCH {ONLY}: memory {mine.memory.memory_id} differs (record)" in out.stderr, out.stderr
    assert "verification FAILED for 3 memory differences" in out.stderr, out.stderr
    with PgStore(dsn, schema=schema) as pgs, PgLongTermMemory(pgs, listen=False) as dst:
        assert dst.export_stored(ONLY) == [theirs]
