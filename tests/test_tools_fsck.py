"""``convmem fsck`` against real damage on disk: detection, exit statuses, repair, truncation."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from convmem.logstore import Corrupted, FileStore, ItemsLost, ListSelector, Range, Tail, frame
from tests.logstore_helpers import data_size, write_at_data_end
from tests.tools_support import (
    SITE,
    TOOLS_CMD,
    cli,
    conv_dir,
    flip_byte,
    fsck,
    kinds,
    populate,
    read_all,
    record_offsets,
    salt_of,
    segments,
)

CID = "conv-0001"


@pytest.fixture
def data(tmp_path: Path) -> Path:
    root = tmp_path / "data"
    populate(root)
    return root


def only(report: dict, kind: str) -> dict:
    found = [p for p in report["problems"] if p["kind"] == kind]
    assert len(found) == 1, report["problems"]
    return found[0]


def test_clean_data_exits_0(data: Path) -> None:
    status, report = fsck(data)
    assert status == 0
    assert report["problems"] == []
    assert report["conversations"] == 3
    assert report["segments"] > 3  # small segments: the logs rolled
    assert report["records"] >= 90


def test_torn_tail_is_truncated_by_repair(data: Path) -> None:
    last = segments(data, CID)[-1]
    size = data_size(str(last))
    record = frame.encode_record(salt_of(last), frame.KIND_BATCH, 80, 1, 1, b'[{"a":1}]')
    write_at_data_end(last, record[: len(record) // 2])  # a write cut short by a crash
    status, report = fsck(data)
    assert status == 0  # never acknowledged: the engine cuts it at the next append, so it is a note
    p = only(report, "torn-tail")
    assert (p["site"], p["conversation_id"], p["file"], p["offset"], p["repaired"], p["resolves_itself"]) == (
        SITE,
        CID,
        str(last),
        size,
        False,
        True,
    )
    assert "never acknowledged" in p["detail"] and "next append" in p["action"]
    assert data_size(str(last)) > size  # a check alone writes nothing
    proc = cli("fsck", str(data))
    assert proc.returncode == 0 and "NOTE: none needed" in proc.stdout.decode()

    status, report = fsck(data, "--repair")
    assert status == 1
    assert only(report, "torn-tail")["repaired"] is True
    assert last.stat().st_size == size
    assert fsck(data)[0] == 0
    assert len(read_all(data, CID)) == 80


def test_zero_filled_tail_is_preallocated_space_not_a_problem(data: Path) -> None:
    last = segments(data, CID)[-1]
    with open(last, "ab") as f:
        f.write(b"\0" * 300)
    size = last.stat().st_size
    status, report = fsck(data, "--repair")
    assert status == 0 and report["problems"] == []
    assert last.stat().st_size == size  # nothing cut
    # Bytes after the zeros are not: a torn write there is cut, with the zeros before it.
    end = data_size(str(last))
    with open(last, "ab") as f:
        f.write(b"\x17" * 30)
    status, report = fsck(data, "--repair")
    assert status == 1 and kinds(report) == ["torn-tail"] and only(report, "torn-tail")["offset"] == end
    assert last.stat().st_size == end
    assert fsck(data)[0] == 0


def test_flipped_byte_in_sealed_segment_is_reported_then_replaced_by_a_loss_record(data: Path) -> None:
    seg = segments(data, CID)[0]
    offset, _size, _kind = record_offsets(seg)[2]
    flip_byte(seg, offset + 40)  # inside the body
    before = seg.read_bytes()
    status, report = fsck(data)
    assert status == 4
    p = only(report, "corrupt-record")
    assert (p["file"], p["offset"], p["conversation_id"]) == (str(seg), offset, CID)
    assert seg.read_bytes() == before  # a plain fsck changes nothing
    status, report = fsck(data, "--repair")
    assert status == 1
    p = only(report, "corrupt-record")
    assert p["repaired"] is True and "loss record" in p["action"]
    # The original bytes are kept in quarantine; every other item still reads.
    [qdir] = (data / "quarantine").iterdir()
    assert (qdir / seg.name).read_bytes() == before
    assert len(read_all_but_lost(data)) == 78
    assert fsck(data)[0] == 0


def read_all_but_lost(root: Path) -> list[object]:
    """Every item that reads, walking around the seqs a repair recorded as lost."""
    out: list[object] = []
    with FileStore(root) as store:
        seq = 0
        while True:
            try:
                page = store.read(SITE, CID, Range(seq, 1000))
            except ItemsLost as exc:
                lost = exc.losses[0]
                if lost.first_seq > seq:
                    out.extend(store.read(SITE, CID, Range(seq, lost.first_seq - seq)))
                seq = lost.last_seq + 1
                continue
            out.extend(page)
            if len(page) < 1000:
                return out
            seq += len(page)


def test_damaged_last_record_is_not_mistaken_for_a_torn_tail(data: Path) -> None:
    last = segments(data, CID)[-1]
    offset, size, _kind = record_offsets(last)[-1]
    flip_byte(last, offset + 35)
    status, report = fsck(data)
    assert status == 4
    p = only(report, "corrupt-record")
    assert p["offset"] == offset and not p["repaired"]
    assert data_size(str(last)) == offset + size  # not truncated
    # --repair keeps its seqs (78, 79) as a loss record: nothing is cut, appends go on after it.
    status, report = fsck(data, "--repair")
    assert status == 1 and only(report, "corrupt-record")["repaired"]
    with FileStore(data) as store:
        with pytest.raises(ItemsLost) as info:
            store.read(SITE, CID, Tail(2))
        assert [(x.first_seq, x.last_seq) for x in info.value.losses] == [(78, 79)]
        assert store.append(SITE, CID, [{"after": 1}]).first == 80


def test_truncate_at_corruption_quarantines_and_reports_lost_seqs(data: Path) -> None:
    segs = segments(data, CID)
    seg = segs[1]
    records = record_offsets(seg)
    offset = records[1][0]
    first_lost = frame.decode_record_header(seg.read_bytes(), offset).first_seq
    originals = {s.name: s.read_bytes() for s in segs[1:]}
    flip_byte(seg, offset + 20)  # the record's first_seq field: only the checksum can tell

    status, report = fsck(data, "--truncate-at-corruption")
    assert status == 1, report
    p = only(report, "corrupt-record")
    assert p["repaired"] is True
    assert f"dropped seqs {first_lost}..79" in p["action"]
    assert p["lost_seqs"] == [first_lost, 79]
    qdirs = list((data / "quarantine").iterdir())
    assert len(qdirs) == 1
    for name, content in originals.items():
        expected = content if name != seg.name else None
        copy = (qdirs[0] / name).read_bytes()
        if expected is not None:
            assert copy == expected
    assert (qdirs[0] / seg.name).read_bytes() != originals[seg.name]  # the damaged original, as it was
    lost = json.loads((qdirs[0] / "lost.json").read_bytes())
    assert (lost["first_lost_seq"], lost["last_lost_seq_seen"]) == (first_lost, 79)

    assert fsck(data)[0] == 0
    items = read_all(data, CID)
    assert [i.seq for i in items] == list(range(first_lost))
    with FileStore(data) as store:
        assert store.append(SITE, CID, [{"after": "repair"}]).first == first_lost
    assert fsck(data)[0] == 0


def test_deleted_index_is_rebuilt(data: Path) -> None:
    idx = segments(data, CID)[0].with_suffix(".idx")
    original = idx.read_bytes()
    idx.unlink()
    status, report = fsck(data)
    # Derived data a crash can lose (indexes are never synced), which the engine rebuilds: a note.
    assert status == 0 and kinds(report) == ["index-missing"]
    assert only(report, "index-missing")["file"] == str(idx)
    assert only(report, "index-missing")["resolves_itself"]
    status, report = fsck(data, "--repair")
    assert status == 1
    assert idx.read_bytes() == original
    assert fsck(data)[0] == 0


def test_stale_and_wrong_indexes_are_rebuilt(tmp_path: Path) -> None:
    root = tmp_path / "data"
    populate(root, conversations=2, batches=150, segment_bytes=64 * 1024)
    a, b = segments(root, "conv-0000")[0], segments(root, "conv-0001")[0]
    shutil.copyfile(b.with_suffix(".idx"), a.with_suffix(".idx"))  # another segment's index: wrong salt
    raw = bytearray(b.with_suffix(".idx").read_bytes())
    assert len(raw) >= 48, "the segment should have index entries"
    raw[36:40] = (int.from_bytes(raw[36:40], "little") + 3).to_bytes(4, "little")  # entry 0 points mid-record
    b.with_suffix(".idx").write_bytes(bytes(raw))
    status, report = fsck(root)
    assert status == 4
    assert kinds(report) == ["index-mismatch", "index-stale"]
    assert only(report, "index-mismatch")["offset"] == 32
    status, _ = fsck(root, "--repair")
    assert status == 1
    assert fsck(root)[0] == 0


def test_stale_manifest_is_rewritten(data: Path) -> None:
    site_dir = conv_dir(data, CID).parents[3]
    saved = {p.name: p.read_bytes() for p in site_dir.glob("manifest-*")}
    with FileStore(data, segment_bytes=4096) as store:
        store.append(SITE, CID, [{"later": 1}])
        store.append(SITE, "conv-new1", [{"new": 1}])
    for p in site_dir.glob("manifest-*"):
        p.unlink()
    for name, content in saved.items():
        (site_dir / name).write_bytes(content)  # an old manifest copied back
    status, report = fsck(data)
    assert status == 4
    assert kinds(report) == ["manifest-stale", "manifest-stale"]
    assert {p["conversation_id"] for p in report["problems"]} == {CID, "conv-new1"}
    status, report = fsck(data, "--repair")
    assert status == 1
    assert fsck(data)[0] == 0
    with FileStore(data) as store:
        listing = store.list_conversations(SITE, ListSelector(None, 10))
    assert {s.conversation_id for s in listing.summaries} == {"conv-0000", "conv-0001", "conv-0002", "conv-new1"}


def test_missing_manifest_is_rebuilt(data: Path) -> None:
    site_dir = conv_dir(data, CID).parents[3]
    for p in site_dir.glob("manifest-*"):
        p.unlink()
    status, report = fsck(data, "--repair")
    assert status == 1 and kinds(report) == ["manifest-missing"]
    assert fsck(data)[0] == 0


def test_gap_from_a_deleted_segment(data: Path) -> None:
    segs = segments(data, CID)
    gone = segs[1]
    first_missing = int(gone.name[:20])
    gone.unlink()  # its .idx stays behind: an orphan
    status, report = fsck(data)
    assert status == 4
    assert kinds(report) == ["orphan-index", "seq-gap"]
    gap = only(report, "seq-gap")
    assert (gap["file"], gap["offset"]) == (str(segs[2]), 0)
    assert f"seqs {first_missing}.." in gap["detail"]

    status, report = fsck(data, "--repair")
    assert status == 4
    assert only(report, "orphan-index")["repaired"] is True
    assert only(report, "seq-gap")["repaired"] is False
    assert segs[2].exists()

    status, report = fsck(data, "--truncate-at-corruption")
    assert status == 1
    assert [i.seq for i in read_all(data, CID)] == list(range(first_missing))
    assert fsck(data)[0] == 0


def _append_record(seg: Path, first_seq: int, count: int, recorded_at_us: int, body: bytes) -> int:
    record = frame.encode_record(salt_of(seg), frame.KIND_BATCH, first_seq, count, recorded_at_us, body)
    return write_at_data_end(seg, record)


def test_records_that_checksum_but_break_the_rules(tmp_path: Path) -> None:
    root = tmp_path / "data"
    populate(root, conversations=3, batches=3)
    last = {c: segments(root, c)[-1] for c in ("conv-0000", "conv-0001", "conv-0002")}
    off_ts = _append_record(last["conv-0000"], 6, 1, 1_000, b'[{"old":1}]')  # recorded_at goes back in time
    off_seq = _append_record(last["conv-0001"], 9, 1, 2**62, b'[{"x":1}]')  # seqs 6..8 skipped
    off_batch = _append_record(last["conv-0002"], 6, 2, 2**62, b'[{"x":1},2]')  # not two objects
    status, report = fsck(root, "--repair")
    assert status == 4
    assert kinds(report) == ["bad-batch", "recorded-at-decreasing", "seq-mismatch"]
    assert only(report, "recorded-at-decreasing")["offset"] == off_ts
    assert only(report, "seq-mismatch")["offset"] == off_seq
    assert only(report, "bad-batch")["offset"] == off_batch


def test_stray_files_and_operational_errors(data: Path, tmp_path: Path) -> None:
    (conv_dir(data, CID) / "notes.txt").write_text("hello")
    (data / "auth").mkdir()  # the MCP server's directory is expected
    status, report = fsck(data, "--repair")
    assert status == 4
    p = only(report, "stray-file")
    assert p["file"] == str(conv_dir(data, CID) / "notes.txt") and not p["repaired"]

    assert cli("fsck", str(tmp_path / "nowhere")).returncode == 8
    assert cli("fsck", str(data), "--site", "no-such-site").returncode == 8
    assert cli("fsck", str(data), "--conversation", "bad id!").returncode == 8
    assert cli("fsck", str(data), "--conversation", "conv-9999").returncode == 8
    assert cli("fsck", "--no-such-flag").returncode == 8


def test_scope_to_one_conversation(data: Path) -> None:
    flip_byte(segments(data, "conv-0002")[0], 100)
    status, report = fsck(data, "--site", SITE, "--conversation", CID)
    assert status == 0 and report["conversations"] == 1
    status, report = fsck(data, "--site", SITE, "--conversation", "conv-0002")
    assert status == 4 and kinds(report) == ["corrupt-record"]


def test_human_output_names_file_offset_and_action(data: Path) -> None:
    seg = segments(data, CID)[0]
    offset = record_offsets(seg)[1][0]
    flip_byte(seg, offset + 33)
    proc = cli("fsck", str(data))
    out = proc.stdout.decode()
    assert proc.returncode == 4
    assert f"corrupt-record: site {SITE} conversation {CID}: {seg} at byte {offset}" in out
    assert "--truncate-at-corruption" in out
    assert proc.stderr == b""  # no progress bar when stderr is not a terminal
    assert os.path.getsize(seg) > offset


def test_damaged_manifest_snapshot_is_rewritten(data: Path) -> None:
    site_dir = conv_dir(data, CID).parents[3]
    [snap] = site_dir.glob("manifest-*.snap")
    flip_byte(snap, snap.stat().st_size - 1)
    status, report = fsck(data)
    assert status == 4
    p = only(report, "manifest-damaged")
    assert (p["site"], p["file"], p["offset"]) == (SITE, str(snap), 0)
    assert fsck(data, "--repair")[0] == 1
    assert fsck(data)[0] == 0


def test_progress_bar_on_a_terminal(data: Path) -> None:
    import pty
    import subprocess

    from tests.tools_support import REPO

    master, slave = pty.openpty()
    env = dict(os.environ, PYTHONPATH=str(REPO), COLUMNS="100")
    proc = subprocess.run(
        [*TOOLS_CMD, "fsck", str(data)], stderr=slave, stdout=subprocess.PIPE, env=env, timeout=60
    )
    os.close(slave)
    drawn = b""
    try:
        while chunk := os.read(master, 65536):
            drawn += chunk
    except OSError:
        pass  # EIO once the terminal's other end is closed
    os.close(master)
    assert proc.returncode == 0
    assert b"\r[" in drawn and b"3/3 conversations" in drawn and b"ETA" in drawn
    assert b"conversations" in proc.stdout and b"\r" not in proc.stdout


def test_truncation_reaches_a_store_that_has_the_log_open(data: Path) -> None:
    last = segments(data, CID)[-1]
    offset, _size, _kind = record_offsets(last)[-1]
    flip_byte(last, offset + 40)
    with FileStore(data, segment_bytes=4096) as store:  # as a running server would
        with pytest.raises(Corrupted):  # the record an append would follow is damaged
            store.append(SITE, CID, [{"refused": True}])
        status, report = fsck(data, "--truncate-at-corruption")
        assert status == 1
        lost = only(report, "corrupt-record")["lost_seqs"]
        assert lost == [lost[0], 79]
        # The open store notices the cut log (no restart needed) and continues after it.
        assert store.append(SITE, CID, [{"after": 1}]).first == lost[0]
    assert fsck(data)[0] == 0


def test_truncating_at_a_bad_first_header_empties_the_log(data: Path) -> None:
    segs = segments(data, CID)
    flip_byte(segs[0], 3)  # the magic: the whole segment is unreadable
    status, report = fsck(data, "--repair")
    assert status == 4 and only(report, "bad-segment-header")["offset"] == 0
    status, report = fsck(data, "--truncate-at-corruption")
    assert status == 1
    assert only(report, "bad-segment-header")["lost_seqs"] == [0, 79]
    assert segments(data, CID) == []
    [qdir] = (data / "quarantine").iterdir()
    assert sorted(p.name for p in qdir.glob("*.seg")) == [s.name for s in segs]
    assert fsck(data)[0] == 0
    with FileStore(data) as store:
        listing = store.list_conversations(SITE, ListSelector(None, 10))
    assert CID not in {s.conversation_id for s in listing.summaries}
