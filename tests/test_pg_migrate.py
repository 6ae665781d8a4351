"""``convmem migrate``: a data directory into PostgreSQL and back, killed mid-copy and resumed, verified."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from mcp_helpers import convmem_cmd, run_convmem, subprocess_env
from memories_support import create, fields

from convmem.logstore import FileStore, Range
from convmem.logstore.maintenance import iter_conversation_items
from convmem.logstore.memories import LongTermMemory
from convmem.logstore.memories.drop import memories_held
from convmem.logstore.memories.retrieval import Retriever
from convmem.logstore.memories.site import memories_dir
from convmem.logstore.postgres import PgStore
from convmem.mcp_adapter.credentials import CredentialFile
from tests.pg_support import drop_schema, new_schema

SITES = ["site-mig-a", "site-mig-b"]


@pytest.fixture
def pg(pg_server: str) -> Iterator[tuple[str, str]]:
    schema = new_schema(pg_server)
    yield pg_server, schema
    drop_schema(pg_server, schema)


def _fill(path: Path, seed: int) -> int:
    rng = random.Random(seed)
    total = 0
    with FileStore(path, segment_bytes=4096) as store:
        for c in range(12):
            site = SITES[c % 2]
            for b in range(25):
                n = rng.randint(1, 6)
                items = [
                    {"c": c, "b": b, "i": i, "x": rng.random(), "s": "é\u0000" * rng.randint(0, 3)} for i in range(n)
                ]
                store.append(site, f"conv-{c:04d}", items)
                total += n
    CredentialFile(path).add(SITES[0], "site-a-password-123456")
    return total


def _pg_items(dsn: str, schema: str) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(f'SELECT count(*) FROM "{schema}".items'.encode()).fetchone()
    return int(row[0]) if row else 0


def _raw(path: Path, site: str, conv: str) -> list[tuple[int, int, bytes]]:
    return [(i.seq, i.recorded_at_us, i.payload) for i in iter_conversation_items(path, site, conv)]


def test_migrate_killed_midway_resumes_and_round_trips_exactly(tmp_path: Path, pg: tuple[str, str]) -> None:
    seed = int(os.environ.get("CONVMEM_TEST_SEED") or random.randrange(2**32))
    print(f"seed={seed} (rerun with CONVMEM_TEST_SEED={seed})")
    src = tmp_path / "src"
    total = _fill(src, seed)
    dsn, schema = pg
    argv = convmem_cmd("migrate", str(src), dsn, "--dst-schema", schema)
    proc = subprocess.Popen(argv, env=subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    killed_at = None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        n = _pg_items(dsn, schema) if _schema_exists(dsn, schema) else 0
        if n >= total // 4:
            proc.send_signal(signal.SIGKILL)
            killed_at = n
            break
        time.sleep(0.005)
    proc.wait(30)
    assert killed_at is not None, "the migration finished before it could be interrupted"
    print(f"killed the migration after {killed_at} of {total} items")
    assert _pg_items(dsn, schema) < total

    done = run_convmem("migrate", str(src), dsn, "--dst-schema", schema)
    assert done.returncode == 0, done.stderr
    assert "verified" in done.stdout
    assert _pg_items(dsn, schema) == total

    with FileStore(src) as a, PgStore(dsn, schema=schema) as b:
        for site in SITES:
            for conv in (f"conv-{c:04d}" for c in range(12)):
                assert a.read(site, conv, Range(0, 1000)) == b.read(site, conv, Range(0, 1000))
    back = tmp_path / "back"
    again = run_convmem("migrate", dsn, str(back), "--src-schema", schema)
    assert again.returncode == 0, again.stderr
    for c in range(12):
        site, conv = SITES[c % 2], f"conv-{c:04d}"
        assert _raw(src, site, conv) == _raw(back, site, conv)
    assert CredentialFile(back).verify(SITES[0], "site-a-password-123456")


def test_migrate_refuses_a_destination_that_is_ahead(tmp_path: Path, pg: tuple[str, str]) -> None:
    src = tmp_path / "src"
    with FileStore(src) as store:
        store.append(SITES[0], "conv-0001", [{"a": 1}])
    with PgStore(pg[0], schema=pg[1]) as store:
        store.append(SITES[0], "conv-0001", [{"a": 1}, {"b": 2}])
    out = run_convmem("migrate", str(src), pg[0], "--dst-schema", pg[1])
    assert out.returncode != 0
    assert "the destination holds 2 items, the source only 1" in out.stderr


def _schema_exists(dsn: str, schema: str) -> bool:
    with psycopg.connect(dsn) as conn:
        return conn.execute("SELECT to_regclass(%s) IS NOT NULL", (f'"{schema}".items',)).fetchone() == (True,)


def _remember(path: Path, counts: dict[str, int]) -> None:
    """Give each site of ``counts`` that many long-term memories in the data directory ``path``."""
    with LongTermMemory(path, retriever_factory=lambda d: Retriever(d, embedder=None)) as store:
        for site, n in counts.items():
            for i in range(n):
                create(store, fields(i), site=site)


def test_migrate_says_which_memories_it_leaves_behind(tmp_path: Path, pg: tuple[str, str]) -> None:
    """Long-term memories are not copied yet: the summary counts them and names SRC; the exit status is 1."""
    src = tmp_path / "src"
    with FileStore(src) as store:
        store.append(SITES[0], "conv-0001", [{"a": 1}])
    only_memories = "site-mig-memories-only"  # a site with memories and no conversation
    _remember(src, {SITES[0]: 2, only_memories: 1})
    dsn, schema = pg
    out = run_convmem("migrate", str(src), dsn, "--dst-schema", schema)
    assert out.returncode == 1, (out.stdout, out.stderr)
    assert "verified" in out.stdout
    assert f"NOT copied: 3 long-term memories of 2 sites; they stay in {src}" in out.stdout, out.stdout
    assert "convmem export SRC --site S --memories" in out.stdout
    for site in (SITES[0], only_memories):
        assert f"not copied: {site}: " in out.stderr and memories_dir(str(src), site) in out.stderr, out.stderr
    assert memories_held(str(src), SITES[0]) == 2 and memories_held(str(src), only_memories) == 1

    quiet = run_convmem("migrate", str(src), dsn, "--dst-schema", schema, "--quiet", "--site", SITES[1])
    assert quiet.returncode == 0 and "NOT copied" not in quiet.stdout, (quiet.stdout, quiet.stderr)
    one = run_convmem("migrate", str(src), dsn, "--dst-schema", schema, "--quiet", "--site", only_memories)
    assert one.returncode == 1, (one.stdout, one.stderr)
    assert f"NOT copied: 1 long-term memory of 1 site; it stays in {src}" in one.stdout, one.stdout
    assert one.stderr == ""

    back = run_convmem("migrate", dsn, str(tmp_path / "back"), "--src-schema", schema)
    assert back.returncode == 0 and "NOT copied" not in back.stdout, (back.stdout, back.stderr)


def test_migrate_help_documents_memories_and_exit_statuses() -> None:
    out = run_convmem("migrate", "--help")
    assert out.returncode == 0
    text = " ".join(out.stdout.split())
    assert "Long-term memories (the memory_* tools) are NOT copied" in text
    assert "1 conversations and passwords copied and verified, but SRC holds long-term memories" in text
    assert "4 verification found a difference" in text and "8 could not start" in text
