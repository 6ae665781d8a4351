"""Idempotent and optimistic appends on the file engine.

A keyed retry returns the original range and writes nothing; a key reused
with other items is refused naming the original range; the key survives a
restart and is seen by another process; ``expected_next_seq`` refuses a
stale writer without writing. Old (unkeyed) records read as before and fsck,
export and the record dump understand keyed batch records.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
from pathlib import Path

import pytest

from convmem.logstore import (
    FileStore,
    IdempotencyConflict,
    InvalidIdempotencyKey,
    Range,
    SeqConflict,
    frame,
    idempotency,
    maintenance,
)
from convmem.logstore.segment import iter_records

SITE = "idem"
CONV = "conv-idem-0001"


def _store(root: Path, **opts: object) -> FileStore:
    return FileStore(root, **opts)  # type: ignore[arg-type]


def _records(root: Path) -> list[tuple[int, int, int]]:
    """(kind, first_seq, count) of every record of every segment under ``root``."""
    out = []
    for dirpath, _dirs, files in os.walk(root):
        for name in sorted(files):
            if not name.endswith(".seg") or "pool" in dirpath:
                continue
            path = os.path.join(dirpath, name)
            fd = os.open(path, os.O_RDONLY)
            try:
                header = frame.decode_segment_header(os.pread(fd, frame.SEGMENT_HEADER_SIZE, 0))
                if header is None:
                    continue
                size = os.fstat(fd).st_size
                try:
                    for _off, h, _body in iter_records(fd, frame.SEGMENT_HEADER_SIZE, size, header.salt):
                        out.append((h.kind, h.first_seq, h.count))
                except Exception:
                    pass  # the zeros of preallocated space end the walk
            finally:
                os.close(fd)
    return out


def test_retry_returns_the_original_range_and_writes_nothing(tmp_path: Path) -> None:
    with _store(tmp_path) as store:
        first = store.append(SITE, CONV, [{"a": 1}, {"a": 2}], idempotency_key="k-1")
        store.append(SITE, CONV, [{"b": 1}])
        again = store.append(SITE, CONV, [{"a": 1}, {"a": 2}], idempotency_key="k-1")
        assert (again.first, again.last) == (first.first, first.last) == (0, 1)
        items = store.read(SITE, CONV, Range(0, 10))
        assert [i.payload for i in items] == [{"a": 1}, {"a": 2}, {"b": 1}]
    kinds = [r[0] for r in _records(tmp_path)]
    assert kinds == [frame.KIND_KEYED, frame.KIND_BATCH]


def test_same_key_other_items_is_a_conflict_naming_the_original(tmp_path: Path) -> None:
    with _store(tmp_path) as store:
        store.append(SITE, CONV, [{"x": 0}])
        store.append(SITE, CONV, [{"a": 1}, {"a": 2}], idempotency_key="k-2")
        with pytest.raises(IdempotencyConflict) as info:
            store.append(SITE, CONV, [{"a": 1}, {"a": 3}], idempotency_key="k-2")
        assert (info.value.first_seq, info.value.last_seq) == (1, 2)
        assert not info.value.retryable
        assert info.value.details() == {"first_seq": 1, "last_seq": 2}
        assert len(store.read(SITE, CONV, Range(0, 10))) == 3
        # Keys are per conversation: the same key elsewhere is a new batch.
        other = store.append(SITE, "conv-idem-0002", [{"a": 1}, {"a": 3}], idempotency_key="k-2")
        assert other.first == 0


@pytest.mark.parametrize("key", ["", "a" * 129, "has space", "ünï", "a/b"])
def test_malformed_keys_are_refused_before_anything_is_written(tmp_path: Path, key: str) -> None:
    with _store(tmp_path) as store:
        with pytest.raises(InvalidIdempotencyKey):
            store.append(SITE, CONV, [{"a": 1}], idempotency_key=key)
        assert store.read(SITE, CONV, Range(0, 10)) == []
        assert store.append(SITE, CONV, [{"a": 1}], idempotency_key="a" * 128).first == 0


def test_the_key_survives_a_restart(tmp_path: Path) -> None:
    with _store(tmp_path, segment_bytes=2048, index_interval=256) as store:
        ranges = [store.append(SITE, CONV, [{"n": n, "t": "x" * 100}], idempotency_key=f"key-{n}") for n in range(40)]
    with _store(tmp_path, segment_bytes=2048, index_interval=256) as store:
        for n in range(40):
            assert store.append(SITE, CONV, [{"n": n, "t": "x" * 100}], idempotency_key=f"key-{n}") == ranges[n]
        assert len(store.read(SITE, CONV, Range(0, 100))) == 40  # across several segments, all found
        report = maintenance.check(str(tmp_path))
        assert not report.problems, [p.detail for p in report.problems]


def test_threads_racing_one_key_append_it_once(tmp_path: Path) -> None:
    with _store(tmp_path) as store:
        store.append(SITE, CONV, [{"warm": 1}])
        results: list[object] = []
        barrier = threading.Barrier(8)

        def go() -> None:
            barrier.wait()
            results.append(store.append(SITE, CONV, [{"same": True}], idempotency_key="raced"))

        threads = [threading.Thread(target=go) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(set(map(repr, results))) == 1, results
        assert len(store.read(SITE, CONV, Range(0, 10))) == 2


def _race(root: str, start: multiprocessing.synchronize.Event, out: multiprocessing.Queue[object]) -> None:
    store = FileStore(root)
    start.wait()
    got = [store.append(SITE, CONV, [{"n": n}], idempotency_key=f"race-{n}") for n in range(30)]
    out.put([(r.first, r.last) for r in got])
    store.close()


def test_two_processes_racing_the_same_keys_append_each_batch_once(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    start = ctx.Event()
    out: multiprocessing.Queue[object] = ctx.Queue()
    procs = [ctx.Process(target=_race, args=(str(tmp_path), start, out)) for _ in range(2)]
    for p in procs:
        p.start()
    start.set()
    a, b = out.get(timeout=120), out.get(timeout=120)
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    assert a == b  # each key got one range, whichever process wrote it
    with _store(tmp_path) as store:
        items = store.read(SITE, CONV, Range(0, 100))
    assert [i.payload["n"] for i in items] == list(range(30))


def test_expected_next_seq(tmp_path: Path) -> None:
    with _store(tmp_path) as store:
        assert store.append(SITE, CONV, [{"a": 1}], expected_next_seq=0).first == 0
        with pytest.raises(SeqConflict) as info:
            store.append(SITE, CONV, [{"a": 2}], expected_next_seq=0)
        assert info.value.actual_next_seq == 1 and not info.value.retryable
        assert info.value.details() == {"expected_next_seq": 0, "actual_next_seq": 1}
        assert store.append(SITE, CONV, [{"a": 2}], expected_next_seq=1).first == 1
        # A keyed retry of a committed batch is answered from its key, not refused as stale.
        r = store.append(SITE, CONV, [{"k": 1}], idempotency_key="opt", expected_next_seq=2)
        assert store.append(SITE, CONV, [{"k": 1}], idempotency_key="opt", expected_next_seq=2) == r
        with pytest.raises(ValueError):
            store.append(SITE, CONV, [{"a": 3}], expected_next_seq=-1)
        assert len(store.read(SITE, CONV, Range(0, 10))) == 3


def test_retention_keeps_recent_batches_and_prunes_old_ones() -> None:
    table = idempotency.KeyTable()
    old = 1_000_000
    table.note("old", 0, 0, b"d", old)
    for n in range(1, idempotency.KEEP_BATCHES + 1):
        table.note(None, n, n, b"", old)
    table.prune(old + idempotency.KEEP_US - 1)
    assert table.get("old") is not None  # past 10,000 batches but inside 24 hours: kept
    table.prune(old + idempotency.KEEP_US + 1)
    assert table.get("old") is None  # past both bounds: gone
    young = idempotency.KeyTable()
    young.note("young", 0, 0, b"d", old)
    young.prune(old + 10 * idempotency.KEEP_US)
    assert young.get("young") is not None  # old, but within the last 10,000 batches: kept


def test_fsck_export_and_dump_read_keyed_batches(tmp_path: Path) -> None:
    with _store(tmp_path) as store:
        store.append(SITE, CONV, [{"a": 1}], idempotency_key="k")
        store.append(SITE, CONV, [{"b": 2}])
    report = maintenance.check(str(tmp_path))
    assert not report.problems, [p.detail for p in report.problems]
    exported = list(maintenance.export_items(str(tmp_path), SITE))
    assert [e.payload for e in exported] == [b'{"a":1}', b'{"b":2}']
