"""``convmem forget``: a conversation erased with every copy of its items, durably.

Afterwards no file under the data directory holds any byte string of its
payloads (searched in every file, the quarantine included), the listing no
longer names it, fsck is clean, a read returns nothing, and a new append
starts it again at seq 0; its neighbours are untouched. On PostgreSQL its
rows go, the other conversations stay.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from convmem.logstore import FileStore, ListSelector, Range, maintenance
from convmem.logstore.postgres import PgStore
from tests.mcp_helpers import run_convmem
from tests.pg_support import drop_schema, new_schema

SITE = "forget-site"
GONE = "conv-forget-me"
KEPT = "conv-keep-mine"
SECRET = "the-secret-0f-issue-23"


def _files_holding(root: Path, needle: bytes) -> list[str]:
    hits = []
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            path = os.path.join(dirpath, name)
            with open(path, "rb") as f:
                if needle in f.read():
                    hits.append(path)
    return hits


def test_forget_leaves_no_byte_of_the_conversation(tmp_path: Path) -> None:
    with FileStore(tmp_path, segment_bytes=2048, index_interval=256) as store:
        for n in range(30):  # several segments, index files
            store.append(SITE, GONE, [{"secret": SECRET, "n": n, "pad": "x" * 100}], idempotency_key=f"k{n}")
        store.append(SITE, KEPT, [{"mine": True}])
    # A repair's quarantined copy of one of its segments (as fsck --repair or an import leaves).
    conv_dir = Path(maintenance.locate_conversation(str(tmp_path), SITE, GONE).directory)
    maintenance.set_aside_conversation(str(tmp_path), SITE, GONE)
    assert _files_holding(tmp_path, SECRET.encode())  # in the quarantine now
    with FileStore(tmp_path) as store:
        store.append(SITE, GONE, [{"secret": SECRET, "again": True}])
    assert any(p.startswith(str(conv_dir)) for p in _files_holding(tmp_path, SECRET.encode()))

    proc = run_convmem("forget", SITE, GONE, "--data-dir", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert "1 quarantined copies" in proc.stdout

    assert _files_holding(tmp_path, SECRET.encode()) == []
    report = maintenance.check(str(tmp_path))
    assert not report.problems, [p.detail for p in report.problems]
    with FileStore(tmp_path) as store:
        assert store.read(SITE, GONE, Range(0, 100)) == []
        listed = [s.conversation_id for s in store.list_conversations(SITE, ListSelector()).summaries]
        assert listed == [KEPT]
        assert [i.payload for i in store.read(SITE, KEPT, Range(0, 10))] == [{"mine": True}]
        r = store.append(SITE, GONE, [{"fresh": 1}], idempotency_key="k0")  # keys went with it
        assert r.first == 0
    # Nothing to forget is not an error.
    assert run_convmem("forget", SITE, "conv-never-was", "--data-dir", str(tmp_path)).returncode == 0


@pytest.fixture
def pg(pg_server: str) -> Iterator[tuple[str, str]]:
    schema = new_schema(pg_server)
    yield pg_server, schema
    drop_schema(pg_server, schema)


def test_forget_on_postgresql(pg: tuple[str, str]) -> None:
    with PgStore(pg[0], schema=pg[1], pool_max=2) as store:
        store.append(SITE, GONE, [{"secret": SECRET}], idempotency_key="k")
        store.append(SITE, KEPT, [{"mine": True}])
    store = PgStore(pg[0], schema=pg[1], pool_max=2)
    try:
        assert store.forget_conversation(SITE, GONE) == 1
        assert store.read(SITE, GONE, Range(0, 10)) == []
        listed = [s.conversation_id for s in store.list_conversations(SITE, ListSelector()).summaries]
        assert listed == [KEPT]
        assert store.append(SITE, GONE, [{"fresh": 1}], idempotency_key="k").first == 0
    finally:
        store.close()


def test_forget_killed_part_way_and_run_again_finishes(tmp_path: Path) -> None:
    import random
    import subprocess
    import time

    from tests.mcp_helpers import convmem_cmd, subprocess_env

    rng = random.Random()
    for round_ in range(3):
        root = tmp_path / f"r{round_}"
        with FileStore(root, segment_bytes=1024, index_interval=128) as store:
            for n in range(60):
                store.append(SITE, GONE, [{"secret": SECRET, "n": n, "pad": "y" * 80}])
            store.append(SITE, KEPT, [{"mine": True}])
        proc = subprocess.Popen(
            convmem_cmd("forget", SITE, GONE, "--data-dir", str(root)),
            env=subprocess_env(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(rng.uniform(0.0, 0.6))
        proc.kill()
        proc.wait(30)
        with FileStore(root) as store:  # whatever is left reads as a prefix, never with a hole
            left = store.read(SITE, GONE, Range(0, 1000))
            assert [i.seq for i in left] == list(range(len(left)))
        assert run_convmem("forget", SITE, GONE, "--data-dir", str(root)).returncode == 0
        assert _files_holding(root, SECRET.encode()) == []
        report = maintenance.check(str(root))
        assert not report.problems, [p.detail for p in report.problems]
        with FileStore(root) as store:
            listed = [s.conversation_id for s in store.list_conversations(SITE, ListSelector()).summaries]
            assert listed == [KEPT]
