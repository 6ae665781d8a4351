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

from convmem.logstore import FileStore, Range
from convmem.logstore.maintenance import iter_conversation_items
from convmem.logstore.postgres import PgStore
from convmem.logstore.site_credentials import CredentialFile
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


def test_migrate_help_documents_memories_and_exit_statuses() -> None:
    out = run_convmem("migrate", "--help")
    assert out.returncode == 0
    text = " ".join(out.stdout.split())
    assert "Long-term memories (the memory_* tools) are copied too" in text
    assert "NOT copied" not in text and "1 conversations and passwords" not in text
    assert "4 verification found a difference" in text and "8 could not start" in text
