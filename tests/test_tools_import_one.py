"""``convmem import --conversation``: restoring one conversation from an export into a site that holds others."""

from __future__ import annotations

import os
from pathlib import Path

from convmem.logstore import FileStore, ListSelector, frame
from tests.tools_support import SITE, cli, flip_byte, fsck, populate, read_all, record_offsets, segments

CID = "conv-0001"


def _backup(root: Path, tmp_path: Path) -> Path:
    out = tmp_path / "backup.jsonl"
    proc = cli("export", str(root), "--site", SITE, "--output", str(out))
    assert proc.returncode == 0, proc.stderr
    return out


def _restore(root: Path, backup: Path, *extra: str) -> tuple[int, str]:
    proc = cli("import", str(root), "--site", SITE, "--conversation", CID, "--input", str(backup), *extra)
    return proc.returncode, proc.stderr.decode()


def test_a_deleted_conversation_is_restored_from_a_whole_site_export(tmp_path: Path) -> None:
    root = tmp_path / "data"
    populate(root)
    backup = _backup(root, tmp_path)
    before = read_all(root, CID)
    for seg in segments(root, CID):
        seg.unlink()
        seg.with_suffix(".idx").unlink()
    status, err = _restore(root, backup)
    assert status == 0, err
    assert f"imported {len(before)} items" in err
    assert read_all(root, CID) == before
    assert read_all(root, "conv-0000") and fsck(root)[0] == 0


def test_an_intact_conversation_is_never_overwritten(tmp_path: Path) -> None:
    root = tmp_path / "data"
    populate(root)
    backup = _backup(root, tmp_path)
    before = read_all(root, CID)
    # Equal: nothing to do.
    status, err = _restore(root, backup)
    assert status == 0 and f"kept {len(before)} items" in err and "imported 0 items" in err
    assert read_all(root, CID) == before
    # Newer than the backup, same history: kept as it is.
    with FileStore(root, segment_bytes=4096) as store:
        store.append(SITE, CID, [{"newer": True}])
    status, err = _restore(root, backup)
    assert status == 0 and "imported 0 items" in err
    assert len(read_all(root, CID)) == len(before) + 1
    # A different history: refused, nothing changed.
    other = tmp_path / "other"
    populate(other, conversations=2, batches=3)
    with FileStore(other, segment_bytes=4096) as store:
        store.append(SITE, CID, [{"different": 1}])
    different = _backup(other, tmp_path)
    snapshot = {p: p.read_bytes() for p in segments(root, CID)}
    status, err = _restore(root, different)
    assert status == 1 and "never overwrites an intact conversation" in err
    assert {p: p.read_bytes() for p in segments(root, CID)} == snapshot


def test_a_log_that_lost_its_newest_items_gets_them_back(tmp_path: Path) -> None:
    root = tmp_path / "data"
    populate(root)
    backup = _backup(root, tmp_path)
    before = read_all(root, CID)
    last = segments(root, CID)[-1]
    offset, _size, _kind = record_offsets(last)[-1]
    first = frame.decode_record_header(last.read_bytes(), offset).first_seq
    os.truncate(last, offset)  # acknowledged items gone
    status, report = fsck(root)
    assert status == 4 and report["problems"][0]["lost_seqs"] == [first, len(before) - 1]
    status, err = _restore(root, backup)
    assert status == 0, err
    assert f"kept {first} items" in err and f"imported {len(before) - first} items" in err
    assert read_all(root, CID) == before
    assert fsck(root)[0] == 0


def test_a_damaged_conversation_is_replaced_only_when_asked(tmp_path: Path) -> None:
    root = tmp_path / "data"
    populate(root)
    backup = _backup(root, tmp_path)
    before = read_all(root, CID)
    seg = segments(root, CID)[0]
    flip_byte(seg, record_offsets(seg)[2][0] + 40)
    status, err = _restore(root, backup)
    assert status == 8 and "is damaged" in err and "--replace-damaged" in err
    status, err = _restore(root, backup, "--replace-damaged")
    assert status == 0, err
    assert "moved the damaged log" in err
    assert read_all(root, CID) == before
    [qdir] = (root / "quarantine").iterdir()
    assert (qdir / seg.name).exists() and (qdir / "replaced.json").exists()
    assert fsck(root)[0] == 0
    with FileStore(root) as store:
        listed = {s.conversation_id for s in store.list_conversations(SITE, ListSelector(None, 10)).summaries}
    assert listed == {"conv-0000", CID, "conv-0002"}


def test_bad_uses(tmp_path: Path) -> None:
    root = tmp_path / "data"
    populate(root)
    backup = _backup(root, tmp_path)
    proc = cli("import", str(root), "--site", SITE, "--conversation", "conv-9999", "--input", str(backup))
    assert proc.returncode == 1 and b"no items of conversation" in proc.stderr
    proc = cli("import", str(root), "--site", SITE, "--replace-damaged", "--input", str(backup))
    assert proc.returncode == 8
    proc = cli("import", str(root), "--site", SITE, "--input", str(backup))
    assert proc.returncode == 8 and b"--conversation" in proc.stderr
