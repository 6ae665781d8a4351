"""The library side of the tools: ``logstore.maintenance`` called directly."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from convmem.logstore import FileStore, manifestcodec
from convmem.logstore.maintenance import (
    MaintenanceError,
    Progress,
    RestoreConflict,
    Restorer,
    check,
    export_items,
    scan_segment,
)
from convmem.logstore.maintenance._manifest import _iter_log
from tests.tools_support import SITE, conv_dir, populate, segments


def test_fast_log_reader_matches_the_engines_on_damaged_logs(tmp_path: Path) -> None:
    root = tmp_path / "data"
    populate(root, conversations=4, batches=10)
    [log] = conv_dir(root, "conv-0000").parents[3].glob("manifest-*.log")
    data = log.read_bytes()
    salt = manifestcodec.LOG_HEADER.unpack_from(data)[2]
    body = data[manifestcodec.LOG_HEADER.size :]
    rng = random.Random(7)
    for _ in range(200):
        damaged = bytearray(body)
        for _ in range(rng.randint(0, 3)):
            damaged[rng.randrange(len(damaged))] ^= 1 << rng.randrange(8)
        cut = bytes(damaged[: rng.randint(len(damaged) // 2, len(damaged))])
        assert list(_iter_log(cut, salt)) == list(manifestcodec.iter_log_records(cut, salt, 0))


def test_progress_callback_sees_every_conversation_and_byte(tmp_path: Path) -> None:
    root = tmp_path / "data"
    populate(root, conversations=5, batches=10)
    seen: list[Progress] = []
    report = check(root, progress=seen.append)
    assert not report.problems
    assert [p.conversations_done for p in seen] == [1, 2, 3, 4, 5]
    assert seen[-1].conversations_total == 5
    assert seen[-1].bytes_done == seen[-1].bytes_total == report.bytes_scanned > 0


def test_operational_errors(tmp_path: Path) -> None:
    with pytest.raises(MaintenanceError, match="not a logstore data directory"):
        check(tmp_path)
    populate(tmp_path / "data", conversations=1, batches=1)
    with pytest.raises(MaintenanceError, match="does not exist"):
        check(tmp_path / "data", site="site-other")
    with pytest.raises(MaintenanceError, match="not a valid site name"):
        check(tmp_path / "data", site="bad site!")


def test_scan_segment_reports_an_invalid_header(tmp_path: Path) -> None:
    root = tmp_path / "data"
    populate(root, conversations=1, batches=5)
    seg = segments(root, "conv-0000")[0]
    data = bytearray(seg.read_bytes())
    data[0] ^= 1
    seg.write_bytes(bytes(data))
    info, records = scan_segment(seg)
    assert not info.header_ok and info.base_seq is None
    assert [(r.offset, r.size, r.kind) for r in records] == [(0, len(data), "damaged")]
    report = check(root)
    assert [(p.kind, p.offset) for p in report.problems] == [("bad-segment-header", 0)]


def test_restorer_keeps_seqs_and_times_and_refuses_conflicts(tmp_path: Path) -> None:
    root = tmp_path / "data"
    with Restorer(root) as r:
        assert r.site_is_empty(SITE)
        assert r.restore_batch(SITE, "conv-r001", 0, 1_000_000, [{"a": 1}, {"b": 2}]).last == 1
        r.restore_batch(SITE, "conv-r001", 2, 1_000_000, [{"c": 3}])
        with pytest.raises(RestoreConflict):
            r.restore_batch(SITE, "conv-r001", 5, 2_000_000, [{"gap": 1}])
        with pytest.raises(RestoreConflict):
            r.restore_batch(SITE, "conv-r001", 3, 999_999, [{"earlier": 1}])
        assert not r.site_is_empty(SITE)
    items = list(export_items(root, SITE))
    assert [(i.seq, i.recorded_at_us, i.payload) for i in items] == [
        (0, 1_000_000, b'{"a":1}'),
        (1, 1_000_000, b'{"b":2}'),
        (2, 1_000_000, b'{"c":3}'),
    ]
    with FileStore(root) as store:
        assert store.append(SITE, "conv-r001", [{"d": 4}]).first == 3
    assert not check(root).problems
