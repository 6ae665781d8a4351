"""``convmem forget``: a conversation erased with every copy of its items, durably; and the erasures' byte search.

The byte search, shared by ``forget`` and ``redact``: afterwards no file
under the data directory holds any byte of what was erased (every file is
read: segments, indexes, the listing, the quarantine, a leftover ``.tmp``).
After a forget the listing no longer names the conversation, fsck is clean,
a read returns nothing, and a new append starts it again at seq 0; its
neighbours are untouched. On PostgreSQL its rows go, the other
conversations stay.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from memories_support import files_holding

from convmem.logstore import FileStore, ListSelector, Range, maintenance
from convmem.logstore.postgres import PgStore
from tests.mcp_helpers import run_convmem
from tests.pg_support import drop_schema, new_schema

SITE = "forget-site"
GONE = "conv-forget-me"
KEPT = "conv-keep-mine"
SECRET = "the-secret-0f-forget-23"
STAYS = "what-redact-keeps-4e1"


def _plant_interrupted_rewrite(root: Path, conv: str) -> None:
    """A ``<segment>.tmp`` copy of the active segment, as a rewrite killed before its rename leaves."""
    cdir = Path(maintenance.locate_conversation(str(root), SITE, conv).directory)
    seg = max(p for p in cdir.iterdir() if p.suffix == ".seg")
    (cdir / (seg.name + ".tmp")).write_bytes(seg.read_bytes())


@pytest.mark.parametrize("erasure", ["forget", "redact"])
def test_erasure_leaves_no_byte_of_what_it_erased(tmp_path: Path, erasure: str) -> None:
    """After ``forget`` (the conversation) or ``redact`` (seqs 0-5), no file under DATA holds the erased bytes.

    The search reads every file: segments, indexes, the listing, the quarantine,
    and a leftover ``.tmp`` copy of a segment. The secret is planted in each of
    the places an item's bytes can be: the live log, a repair's quarantined copy
    of the conversation's earlier log, and the copy an interrupted rewrite left.
    """
    with FileStore(tmp_path, segment_bytes=2048, index_interval=256) as store:
        for n in range(30):  # several segments, index files
            store.append(SITE, GONE, [{"secret": SECRET, "n": n, "pad": "x" * 100}], idempotency_key=f"k{n}")
        store.append(SITE, KEPT, [{"mine": True}])
    # A repair's quarantined copy of its segments (as fsck --repair or an import leaves).
    maintenance.set_aside_conversation(str(tmp_path), SITE, GONE)
    assert files_holding(tmp_path, [SECRET.encode()])  # in the quarantine now
    with FileStore(tmp_path, segment_bytes=2048) as store:
        for n in range(3):  # seqs 0-5 hold the secret; 6-7 a text redact keeps
            store.append(SITE, GONE, [{"secret": SECRET, "again": n}, {"secret": SECRET, "pad": "y" * 50}])
        store.append(SITE, GONE, [{"kept": STAYS}, {"kept": STAYS}])
    _plant_interrupted_rewrite(tmp_path, GONE)
    conv_dir = Path(maintenance.locate_conversation(str(tmp_path), SITE, GONE).directory)
    holding = [p for p, _ in files_holding(tmp_path, [SECRET.encode()])]
    assert any(p.endswith(".seg.tmp") for p in holding) and any(p.startswith(str(conv_dir)) for p in holding)

    args = ["--seqs", "0-5"] if erasure == "redact" else []
    proc = run_convmem(erasure, SITE, GONE, *args, "--data-dir", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert "1 quarantined copies" in proc.stdout

    assert files_holding(tmp_path, [SECRET.encode()]) == []
    report = maintenance.check(str(tmp_path))
    assert not report.problems, [p.detail for p in report.problems]
    with FileStore(tmp_path) as store:
        assert [i.payload for i in store.read(SITE, KEPT, Range(0, 10))] == [{"mine": True}]
        left = store.read(SITE, GONE, Range(0, 100))
        if erasure == "redact":  # what it did not erase is still there, in the files and in reads
            assert [i.payload for i in left] == [{"redacted": True}] * 6 + [{"kept": STAYS}] * 2
            assert files_holding(tmp_path, [STAYS.encode()])
            return
        assert left == []
        listed = [s.conversation_id for s in store.list_conversations(SITE, ListSelector()).summaries]
        assert listed == [KEPT]
        r = store.append(SITE, GONE, [{"fresh": 1}], idempotency_key="k0")  # keys went with it
        assert r.first == 0
    # Nothing to forget is not an error.
    assert run_convmem("forget", SITE, "conv-never-was", "--data-dir", str(tmp_path)).returncode == 0


def test_an_engine_holding_a_forgotten_conversation_logs_no_stale_commit(tmp_path: Path) -> None:
    """A running engine (a server) appended, the conversation is forgotten, the engine appends again and closes.

    The engine still owed the listing the commit of its last batch before the
    forget (next_seq 3). Logged with its next intent, entries only moving
    forward, the listing would keep next_seq 3 and fsck report seqs 1-2 as
    acknowledged and lost: the engine drops it when it finds the log shorter.
    The listing then holds the new extent, and fsck finds nothing.
    """
    store = FileStore(tmp_path)
    try:
        for n in range(3):
            store.append(SITE, GONE, [{"n": n}])
        maintenance.forget_conversation(str(tmp_path), SITE, GONE)
        assert store.append(SITE, GONE, [{"fresh": True}]).first == 0
    finally:
        store.close()
    report = maintenance.check(str(tmp_path))
    assert not report.problems, [(p.kind, p.detail) for p in report.problems]
    with FileStore(tmp_path) as store:
        (entry,) = store.list_conversations(SITE, ListSelector()).summaries
        (item,) = store.read(SITE, GONE, Range(0, 10))
        assert (entry.conversation_id, entry.last_appended_at) == (GONE, item.recorded_at)


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
        assert files_holding(root, [SECRET.encode()]) == []
        report = maintenance.check(str(root))
        assert not report.problems, [p.detail for p in report.problems]
        with FileStore(root) as store:
            listed = [s.conversation_id for s in store.list_conversations(SITE, ListSelector()).summaries]
            assert listed == [KEPT]
