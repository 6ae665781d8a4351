"""``convmem redact``: items replaced by tombstones that keep their seqs, the payloads gone from every file.

The range is checked before anything changes; tombstones read through the
public store API on both backends with the items' own ``recorded_at``; fsck
is clean afterwards; a writer in another process keeps appending through a
redaction, and a running server serves the tombstones afterwards.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from memories_support import files_holding, tree_bytes

from convmem.client import MemoryClient
from convmem.logstore import FileStore, IdempotencyConflict, IdempotencyRedacted, Range, SeqRange, maintenance
from convmem.logstore.idempotency import digest
from convmem.logstore.maintenance import TOMBSTONE, MaintenanceError
from convmem.logstore.postgres import PgStore
from convmem.logstore.redaction import RedactionError
from convmem.logstore.site_credentials import CredentialFile
from tests.mcp_helpers import ServerProcess, run_convmem, subprocess_env
from tests.pg_support import drop_schema, new_schema

SITE, CONV, OTHER = "redact-site", "conv-redact-0001", "conv-redact-keep"
PASSWORD = "redact-password-0123456789"
SECRET = "the-redacted-secret-7c1"
GONE = msgspec.json.decode(TOMBSTONE)


def _fill(root: Path, n: int = 40) -> None:
    with FileStore(root, segment_bytes=2048, index_interval=256) as store:
        for i in range(n):  # several segments and index files; batches of two, one keyed
            secret = SECRET if 10 <= 2 * i <= 25 else "plain"
            store.append(
                SITE, CONV, [{"n": 2 * i, "s": secret}, {"n": 2 * i + 1, "s": secret}], idempotency_key=f"k{i}"
            )
        store.append(SITE, OTHER, [{"s": "neighbour"}])


def _clean(root: Path) -> None:
    report = maintenance.check(str(root))
    assert not report.problems, [p.detail for p in report.problems]


def test_range_validation_changes_nothing(tmp_path: Path) -> None:
    _fill(tmp_path, 5)  # seqs 0..9
    before = tree_bytes(tmp_path)
    for seqs, why in [("3-2", "after the last"), ("5-10", "0-9"), ("-1-2", "give A-B")]:
        proc = run_convmem("redact", SITE, CONV, f"--seqs={seqs}", "--data-dir", str(tmp_path))
        assert proc.returncode == 8 and why in proc.stderr, (seqs, proc.stderr)
    proc = run_convmem("redact", SITE, "conv-never-was", "--seqs", "0-0", "--data-dir", str(tmp_path))
    assert proc.returncode == 8 and "does not exist" in proc.stderr
    with pytest.raises(MaintenanceError, match="0 <= A <= B"):
        maintenance.redact_items(tmp_path, SITE, CONV, 4, 3)
    after = tree_bytes(tmp_path)
    assert before == after


def test_redact_leaves_tombstones_that_keep_seqs_and_recorded_at(tmp_path: Path) -> None:
    # That no file holds a byte of the payloads is the shared erasure byte search's (test_tools_forget.py).
    _fill(tmp_path)
    with FileStore(tmp_path) as store:
        before = store.read(SITE, CONV, Range(0, 100))
    maintenance.set_aside_conversation(str(tmp_path), SITE, OTHER)  # a quarantined copy (of another conversation)
    with FileStore(tmp_path) as store:
        store.append(SITE, OTHER, [{"s": "neighbour"}])
    proc = run_convmem("redact", SITE, CONV, "--seqs", "10-25", "--data-dir", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    _clean(tmp_path)
    with FileStore(tmp_path) as store:
        after = store.read(SITE, CONV, Range(0, 100))
        assert [i.seq for i in after] == list(range(80))
        for b, a in zip(before, after, strict=True):
            assert a.recorded_at == b.recorded_at
            assert a.payload == (GONE if 10 <= a.seq <= 25 else b.payload)
        # The keys stay with their batches: a retried append of a kept batch is still answered.
        assert (
            store.append(SITE, CONV, [{"n": 78, "s": "plain"}, {"n": 79, "s": "plain"}], idempotency_key="k39").first
            == 78
        )
        assert store.append(SITE, CONV, [{"n": 80}]).first == 80
        assert [i.payload for i in store.read(SITE, OTHER, Range(0, 10))] == [{"s": "neighbour"}]
    # Redacting again is harmless; one seq alone is a range.
    assert run_convmem("redact", SITE, CONV, "--seqs", "25", "--data-dir", str(tmp_path)).returncode == 0
    _clean(tmp_path)


@pytest.fixture
def pg(pg_server: str) -> Iterator[tuple[str, str]]:
    schema = new_schema(pg_server)
    yield pg_server, schema
    drop_schema(pg_server, schema)


def test_redact_on_postgresql(pg: tuple[str, str]) -> None:
    with PgStore(pg[0], schema=pg[1], pool_max=2) as store:
        for i in range(5):
            store.append(SITE, CONV, [{"n": i, "s": SECRET}])
        before = store.read(SITE, CONV, Range(0, 10))
        assert store.redact_items(SITE, CONV, 1, 3) == 3
        with pytest.raises(RedactionError, match="0-4"):
            store.redact_items(SITE, CONV, 3, 5)
        with pytest.raises(RedactionError, match="does not exist"):
            store.redact_items(SITE, "conv-never-was", 0, 0)
        after = store.read(SITE, CONV, Range(0, 10))
    assert [a.recorded_at for a in after] == [b.recorded_at for b in before]
    assert [a.payload for a in after] == [before[0].payload, GONE, GONE, GONE, before[4].payload]


_APPENDER = """
import os, sys
from convmem.logstore import FileStore
with FileStore(sys.argv[1], segment_bytes=2048) as store:
    n = 0
    while not os.path.exists(sys.argv[4]):
        store.append(sys.argv[2], sys.argv[3], [{"w": n, "pad": "z" * 60}])
        n += 1
        print(n, flush=True)
"""


def test_redact_while_another_process_appends(tmp_path: Path) -> None:
    _fill(tmp_path)
    stop = tmp_path.parent / "stop-writer"
    writer = subprocess.Popen(
        [sys.executable, "-c", _APPENDER, str(tmp_path), SITE, CONV, str(stop)],
        env=subprocess_env(),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert writer.stdout is not None
        for _ in range(20):
            writer.stdout.readline()
        for lo in (16, 10, 22):
            assert maintenance.redact_items(tmp_path, SITE, CONV, lo, lo + 5).segments >= 1
        for _ in range(20):  # it went on appending after the redactions
            writer.stdout.readline()
    finally:
        stop.touch()
        assert writer.wait(30) == 0
    assert files_holding(tmp_path, [SECRET.encode()]) == []
    _clean(tmp_path)
    with FileStore(tmp_path) as store:
        items = store.read(SITE, CONV, Range(0, 1000))
    assert [i.seq for i in items] == list(range(len(items)))
    redacted = {s for lo in (16, 10, 22) for s in range(lo, lo + 6)}
    assert {i.seq for i in items if i.payload == GONE} == redacted
    ws = [i.payload["w"] for i in items[80:]]
    assert ws == list(range(len(ws)))  # every acknowledged append of the writer, in order


def _tool_payloads(items: list[dict[str, Any]]) -> list[Any]:
    return [i["payload"] for i in items]


def test_a_running_server_serves_the_tombstones(tmp_path: Path) -> None:
    root = tmp_path / "data"
    CredentialFile(root).add(SITE, PASSWORD)
    _fill(root)
    server = ServerProcess(root)
    client = MemoryClient(server.url, SITE, PASSWORD, timeout=10)
    try:
        assert SECRET in str(_tool_payloads(list(client.replay(CONV, page=30))))  # the server has read it all
        proc = run_convmem("redact", SITE, CONV, "--seqs", "0-79", "--data-dir", str(root))
        assert proc.returncode == 0, proc.stderr
        replayed = list(client.replay(CONV, page=30))
        assert [i["seq"] for i in replayed] == list(range(80))
        assert _tool_payloads(replayed) == [GONE] * 80
        assert _tool_payloads(client.recall(CONV, 3)) == [GONE] * 3
        assert client.append(CONV, [{"after": True}]) == (80, 80)
        assert _tool_payloads(client.recall(CONV, 1)) == [{"after": True}]
    finally:
        client.close()
        assert server.stop() == 0, server.log()
    assert files_holding(root, [SECRET.encode()]) == []
    _clean(root)


# A keyed retry of a batch that a redaction rewrote since: the same answer on both backends.
BATCH = [{"n": 0, "s": "kept"}, {"n": 1, "s": SECRET}, {"n": 2, "s": "kept"}]


def _retries_after_redaction(store: Any) -> None:
    """``store`` holds BATCH (key "kb", seqs 1-3) after one plain item and before a keyed one ("kc", seq 4);
    seq 2 (BATCH's middle item) is redacted. Every retry is judged by the batch as stored now."""
    for items in (BATCH, [BATCH[0], {"n": 1, "s": "a guess"}, BATCH[2]]):
        with pytest.raises(IdempotencyRedacted) as info:
            store.append(SITE, CONV, items, idempotency_key="kb")
        err = info.value
        assert err.code == "IdempotencyConflict"
        assert err.details() == {"first_seq": 1, "last_seq": 3, "redacted_seqs": [2]}
        assert "redacted since (seqs 2 are tombstones): the retried items match every item it kept" in str(err)
    # Different where nothing was redacted, or another count: a plain conflict.
    for items in ([{"n": 9}, BATCH[1], BATCH[2]], BATCH[:2]):
        with pytest.raises(IdempotencyConflict) as plain:
            store.append(SITE, CONV, items, idempotency_key="kb")
        assert type(plain.value) is IdempotencyConflict and plain.value.details() == {"first_seq": 1, "last_seq": 3}
    # The batch as stored now (its tombstone included) is the same items: answered with its range.
    assert store.append(SITE, CONV, [BATCH[0], GONE, BATCH[2]], idempotency_key="kb") == SeqRange(1, 3)
    assert store.append(SITE, CONV, [{"n": 4}], idempotency_key="kc") == SeqRange(4, 4)  # untouched batch
    assert [i.seq for i in store.read(SITE, CONV, Range(0, 10))] == [0, 1, 2, 3, 4]  # nothing was written


def test_a_retry_of_a_redacted_batch_names_the_redaction(tmp_path: Path) -> None:
    with FileStore(tmp_path) as store:
        store.append(SITE, CONV, [{"n": "plain"}])
        store.append(SITE, CONV, BATCH, idempotency_key="kb")
        store.append(SITE, CONV, [{"n": 4}], idempotency_key="kc")
        # This store keeps the keys it saw (digests of the items as appended) while another process redacts.
        assert store.append(SITE, CONV, BATCH, idempotency_key="kb") == SeqRange(1, 3)
        proc = run_convmem("redact", SITE, CONV, "--seqs", "2", "--data-dir", str(tmp_path))
        assert proc.returncode == 0, proc.stderr
        _retries_after_redaction(store)
    with FileStore(tmp_path) as store:  # and a store that reads the keys from the log afresh
        _retries_after_redaction(store)


def test_a_retry_of_a_redacted_batch_names_the_redaction_on_postgresql(pg: tuple[str, str]) -> None:
    with PgStore(pg[0], schema=pg[1], pool_max=2) as store:
        store.append(SITE, CONV, [{"n": "plain"}])
        store.append(SITE, CONV, BATCH, idempotency_key="kb")
        store.append(SITE, CONV, [{"n": 4}], idempotency_key="kc")
        assert store.redact_items(SITE, CONV, 2, 2) == 1
        _retries_after_redaction(store)
        # The key's digest was of the items as appended; it is now of the batch as stored.
        import psycopg

        with psycopg.connect(pg[0], autocommit=True) as conn:
            (dig,) = conn.execute(
                f'SELECT digest FROM "{pg[1]}".append_keys WHERE key = %s'.encode(), ("kb",)
            ).fetchone()  # type: ignore[misc]
        assert bytes(dig) == digest(msgspec.json.encode([BATCH[0], GONE, BATCH[2]]))
        assert bytes(dig) != digest(msgspec.json.encode(BATCH))


def test_the_worked_example_in_the_docs_runs_as_shown(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """docs/working-memory.md's forget and redact example: each ``convmem`` command, run in-process on the
    example's items, prints what the page shows (timestamps aside) and exits as shown."""
    import re
    import shlex

    from convmem.tools.cli import main

    doc = (Path(__file__).parent.parent / "docs" / "working-memory.md").read_text()
    block = doc.split("## Erasing what was stored", 1)[1].split("```console\n", 1)[1].split("```", 1)[0]
    steps: list[tuple[str, list[str]]] = []
    for line in block.splitlines():
        if line.startswith("$ "):
            steps.append((line[2:], []))
        else:
            steps[-1][1].append(line)
    monkeypatch.chdir(tmp_path)
    with FileStore(tmp_path / "data") as store:
        store.append("team-alpha", "trip-planning-01", [{"role": "user", "text": "book the 9:40 train"}])
        store.append("team-alpha", "trip-planning-01", [{"role": "user", "text": "my card is 4111 1111 1111 1111"},
                                                       {"role": "assistant", "text": "card noted"}],
                     idempotency_key="turn-2")
        store.append("team-alpha", "trip-planning-01", [{"role": "assistant", "text": "booked: coach 7, seat 42"}])
    stamp = re.compile(r'"recorded_at":"[^"]+"')
    status = 0
    ran = 0
    for command, shown in steps:
        if command.startswith("grep "):
            assert files_holding(tmp_path / "data", [b"4111"]) == [] and shown == ["no file holds it"], command
            continue
        if command == "echo $?":
            assert shown == [str(status)]
            continue
        argv = shlex.split(command)
        assert argv[0] == "convmem", command
        capsys.readouterr()
        status = main(argv[1:])
        out, err = capsys.readouterr()
        if command.startswith("convmem export"):  # the count is on stderr, after the lines
            out += err
            err = ""
        assert [stamp.sub("", s) for s in (out + err).splitlines()] == [stamp.sub("", s) for s in shown], command
        assert status == (8 if "--seqs 3-4" in command else 0), command
        ran += 1
    assert ran == 6
