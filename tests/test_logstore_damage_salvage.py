"""The operator repair of damage: ``convmem fsck --repair`` replaces a damaged record by a loss record.

Every intact record keeps its bytes and its seq; the damaged record's exact
seq range reads as ``ItemsLost`` (naming the range, the file and the offset)
instead of ``Corrupted``; the original segment is kept in ``quarantine/``;
appends go on; a plain ``fsck`` afterwards is clean.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path
from typing import Any

import pytest

from convmem.logstore import Corrupted, FileStore, ItemsLost, Range, Tail, frame
from convmem.logstore.maintenance import iter_conversation_items, salvage, scan_segment
from convmem.mcp_adapter.errors import ERROR_META_KEY, from_store_error
from tests.logstore_helpers import segment_files
from tests.test_logstore_damage import CONV, OPTS, SITE, Rec, flip, read_everything, records, write_log
from tests.tools_support import fsck


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Any]]:
    root = tmp_path_factory.mktemp("salvage") / "data"
    truth = write_log(root, random.Random(99), 70)
    assert len(segment_files(str(root))) >= 4
    return root, truth


def copy(src: Path, tmp_path: Path) -> tuple[Path, list[Rec]]:
    root = tmp_path / "data"
    shutil.copytree(src, root)
    return root, records(root)


def expect_lost(store: FileStore, truth: list[Any], recs: list[Rec], lost: list[Rec]) -> None:
    """Intact records read exactly; each lost record's seqs answer ItemsLost naming them."""
    lost_seqs = {s for r in lost for s in range(r.first, r.first + r.count)}
    for r in recs:
        if r.first in lost_seqs:
            continue
        assert store.read(SITE, CONV, Range(r.first, r.count)) == truth[r.first : r.first + r.count]
    for r in lost:
        with pytest.raises(ItemsLost) as info:
            store.read(SITE, CONV, Range(max(0, r.first - 2), r.count + 4))
        spans = [(x.first_seq, x.last_seq) for x in info.value.losses]
        assert (r.first, r.first + r.count - 1) in spans
        loss = next(x for x in info.value.losses if x.first_seq == r.first)
        assert os.path.realpath(loss.file) == os.path.realpath(r.path)
        assert loss.offset == r.offset  # the loss record sits where the damaged record began
        assert loss.quarantine is not None and loss.quarantine.startswith("quarantine/")


@pytest.mark.parametrize(
    "victims",
    [
        [("first-sealed", "middle")],
        [("first-sealed", "last")],  # the batch before the seal
        [("middle-sealed", "first"), ("active", "first")],
        [("active", "last")],  # the last record of the log
    ],
)
def test_fsck_repair_replaces_damaged_records_and_keeps_every_seq(
    pristine: tuple[Path, list[Any]], tmp_path: Path, victims: list[tuple[str, str]]
) -> None:
    from tests.test_logstore_damage import _where

    src, truth0 = pristine
    root, recs = copy(src, tmp_path)
    truth = list(truth0)
    bad = [_where(recs, seg, pos) for seg, pos in victims]
    for r in bad:
        flip(r.path, r.offset + 45)
    status, report = fsck(root)
    assert status == 4
    status, report = fsck(root, "--repair")
    assert status == 1, report
    damaged = [p for p in report["problems"] if p["kind"] == "corrupt-record"]
    assert sorted((p["file"], p["offset"]) for p in damaged) == sorted((r.path, r.offset) for r in bad)
    assert all(p["repaired"] and "loss record" in p["action"] for p in damaged)
    status, report = fsck(root)
    assert status == 0, report["problems"]
    # The originals are kept.
    qdirs = sorted((root / "quarantine").iterdir())
    assert qdirs
    losses = [x for q in qdirs for x in json.loads((q / "lost.json").read_text())["losses"]]
    assert sorted((x["first_seq"], x["last_seq"]) for x in losses) == sorted(
        (r.first, r.first + r.count - 1) for r in bad
    )
    # Every intact record reads exactly, before and after a restart; the losses are explicit.
    for _ in range(2):
        store = FileStore(root, **OPTS)
        try:
            expect_lost(store, truth, recs, bad)
            if bad[-1] is not recs[-1]:
                assert store.read(SITE, CONV, Tail(2)) == truth[-2:]
            r = store.append(SITE, CONV, [{"after": "repair"}])
            assert r.first == len(truth)
            truth.append(store.read(SITE, CONV, Tail(1))[0])
        finally:
            store.close()
    status, report = fsck(root)
    assert status == 0, report["problems"]


def test_salvage_reaches_a_store_that_has_the_log_open(pristine: tuple[Path, list[Any]], tmp_path: Path) -> None:
    from tests.test_logstore_damage import _where

    src, truth = pristine
    root, recs = copy(src, tmp_path)
    bad = _where(recs, "active", "first")
    store = FileStore(root, **OPTS)
    try:
        assert store.read(SITE, CONV, Tail(1)) == truth[-1:]
        flip(bad.path, bad.offset + 50)
        with pytest.raises(Corrupted):
            store.read(SITE, CONV, Range(bad.first, 1))
        res = salvage(root, SITE, CONV)
        assert [(x.first_seq, x.last_seq) for x in res.salvaged] == [(bad.first, bad.first + bad.count - 1)]
        assert not res.refused
        # The open store notices the segment was replaced.
        expect_lost(store, truth, recs, [bad])
        assert store.append(SITE, CONV, [{"x": 1}]).first == len(truth)
    finally:
        store.close()


def test_damaged_seal_is_rewritten_and_nothing_is_lost(pristine: tuple[Path, list[Any]], tmp_path: Path) -> None:
    src, truth = pristine
    root, _recs = copy(src, tmp_path)
    seg = segment_files(str(root))[0]
    [seal] = [r for r in scan_segment(seg)[1] if r.kind == "seal"]
    flip(seg, seal.offset + 20)
    res = salvage(root, SITE, CONV)
    assert [(x.offset, x.last_seq - x.first_seq) for x in res.salvaged] == [(seal.offset, -1)]
    assert scan_segment(seg)[1][-1].kind == "seal" and scan_segment(seg)[1][-1].verdict == "ok"
    store = FileStore(root, **OPTS)
    try:
        assert read_everything(store) == truth
    finally:
        store.close()
    assert fsck(root)[0] == 0


def test_last_record_with_an_inconsistent_header_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "data"
    store = FileStore(root, **OPTS)
    try:
        store.append(SITE, CONV, [{"a": 1}])
        store.append(SITE, CONV, [{"b": 1}, {"b": 2}])
    finally:
        store.close()
    [seg] = segment_files(str(root))
    last = scan_segment(seg)[1][-1]
    flip(seg, last.offset + 12)  # the count: 2 becomes 0x42
    before = Path(seg).read_bytes()
    res = salvage(root, SITE, CONV)
    assert not res.salvaged
    assert [(r.offset, "cannot be established" in r.why) for r in res.refused] == [(last.offset, True)]
    assert Path(seg).read_bytes() == before  # nothing changed
    status, report = fsck(root, "--repair")
    assert status == 4
    [p] = [p for p in report["problems"] if p["kind"] == "corrupt-record"]
    assert not p["repaired"] and "not replaced" in p["action"]


def test_items_lost_reaches_mcp_clients_and_export(pristine: tuple[Path, list[Any]], tmp_path: Path) -> None:
    from tests.test_logstore_damage import _where

    src, _truth = pristine
    root, recs = copy(src, tmp_path)
    bad = _where(recs, "middle-sealed", "middle")
    flip(bad.path, bad.offset + 45)
    salvage(root, SITE, CONV)
    store = FileStore(root, **OPTS)
    try:
        with pytest.raises(ItemsLost) as info:
            store.read(SITE, CONV, Range(0, 1000))
    finally:
        store.close()
    failure = from_store_error(info.value, str(root))
    error = failure.to_result().meta[ERROR_META_KEY]  # type: ignore[index]
    assert error["code"] == "ItemsLost" and error["retryable"] is False
    assert error["lost"] == [{"first_seq": bad.first, "last_seq": bad.first + bad.count - 1}]
    assert error["file"] == os.path.relpath(bad.path, root) and error["offset"] == bad.offset
    assert f"{bad.first}..{bad.first + bad.count - 1}" in failure.text()
    with pytest.raises(ItemsLost):
        list(iter_conversation_items(root, SITE, CONV))


def test_loss_record_layout(pristine: tuple[Path, list[Any]], tmp_path: Path) -> None:
    """The loss record is a valid record of kind 3 whose count is the seqs it stands for."""
    from tests.test_logstore_damage import _where

    src, _truth = pristine
    root, recs = copy(src, tmp_path)
    bad = _where(recs, "first-sealed", "middle")
    flip(bad.path, bad.offset + 45)
    salvage(root, SITE, CONV)
    data = Path(bad.path).read_bytes()
    h = frame.decode_record_header(data, bad.offset)
    header = frame.decode_segment_header(data[: frame.SEGMENT_HEADER_SIZE])
    assert header is not None
    assert (h.kind, h.first_seq, h.count) == (frame.KIND_LOSS, bad.first, bad.count)
    assert frame.plausible(h) and frame.checksum_ok(data, bad.offset, h, header.salt)
    body = json.loads(data[bad.offset + 32 : bad.offset + 32 + h.body_len])
    assert body["lost"] == [bad.first, bad.first + bad.count - 1]
    assert body["quarantine"].startswith("quarantine/")
