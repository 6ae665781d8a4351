"""``convmem dump``, ``convmem stats`` and the progress bar."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from convmem.logstore import FileStore, convpool
from convmem.logstore.maintenance import Progress
from convmem.tools.progress import ProgressBar
from tests.tools_support import SITE, cli, flip_byte, populate, record_offsets, segments


def test_dump_prints_every_record(tmp_path: Path) -> None:
    root = tmp_path / "data"
    populate(root, conversations=1, batches=40)
    seg = segments(root, "conv-0000")[0]
    records = record_offsets(seg)
    proc = cli("dump", str(seg))
    assert proc.returncode == 0
    out = proc.stdout.decode()
    assert f"@40 len={records[0][1]} batch ok" in out
    assert "seqs 0..1 items=2" in out
    assert '    [0] {"i":0,"text":"' in out
    assert '    [1] {"k":[0,null,true]}' in out
    assert f"seal at seq {len([r for r in records if r[2] == 1]) * 2}" in out
    assert f"{len(records)} records, 0 damaged" in out

    quiet = cli("dump", str(seg), "--no-payloads").stdout.decode()
    assert "[0]" not in quiet and "@40" in quiet
    lines = [json.loads(line) for line in cli("dump", str(seg), "--json").stdout.splitlines()]
    assert [d["offset"] for d in lines] == [r[0] for r in records]
    assert lines[0]["payloads"][1] == {"k": [0, None, True]}


def test_dump_shows_damage_and_resumes(tmp_path: Path) -> None:
    root = tmp_path / "data"
    populate(root, conversations=1, batches=40)
    seg = segments(root, "conv-0000")[0]
    records = record_offsets(seg)
    flip_byte(seg, records[3][0] + 50)
    proc = cli("dump", str(seg))
    assert proc.returncode == 4
    out = proc.stdout.decode()
    assert f"@{records[3][0]} len={records[3][1]} damaged checksum mismatch" in out
    assert f"@{records[4][0]} len=" in out  # the dump resumes at the next valid record
    assert cli("dump", str(tmp_path / "missing.seg")).returncode == 8


def test_stats_counts_items_and_fill(tmp_path: Path) -> None:
    root = tmp_path / "data"
    populate(root, conversations=3, batches=40)
    proc = cli("stats", str(root), "--json")
    assert proc.returncode == 0
    [site] = json.loads(proc.stdout)
    assert (site["site"], site["conversations"], site["items"]) == (SITE, 3, 240)
    assert site["bytes_on_disk"] > sum(s.stat().st_size for s in segments(root, "conv-0000"))
    assert site["largest"][0]["items"] == 80
    assert site["largest"][0]["fill"] == 80 / 100_000
    text = cli("stats", str(root), "--site", SITE, "--top", "2").stdout.decode()
    assert f"site {SITE}: 3 conversations, 240 items" in text
    assert "0.08% of limit" in text
    assert text.count("items  ") == 2
    assert cli("stats", str(tmp_path / "nowhere")).returncode == 8


def test_progress_bar_draws_only_on_a_terminal() -> None:
    quiet = io.StringIO()
    bar = ProgressBar(quiet)
    bar(Progress(1, 2, 100, 200))
    bar.close()
    assert quiet.getvalue() == ""

    shown = io.StringIO()
    bar = ProgressBar(shown, force=True, interval=0)
    line = bar.render(Progress(5, 10, 50 * 2**20, 100 * 2**20), elapsed=2.0)
    assert "50%" in line and "5/10 conversations" in line
    assert "50.0 MiB/100.0 MiB" in line and "25.0 MiB/s" in line and "ETA 0:02" in line
    bar(Progress(10, 10, 100, 100))
    bar.close()
    assert shown.getvalue().startswith("\r[") and shown.getvalue().endswith("\r")


def test_dump_names_a_claimed_conversations_identity(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first segment of a conversation claimed from the pool starts with its identity record."""
    root = tmp_path / "data"
    monkeypatch.setattr(convpool, "inline_fill", True)  # the pool is filled before the second append
    with FileStore(root) as store:
        store.append(SITE, "conv-0001", [{"i": 1}])
        store.append(SITE, "conv-0002", [{"i": 2}, {"j": 3}])
        store.append(SITE, "conv-0002", [{"i": 4}])
    seg = segments(root, "conv-0002")[0]
    records = record_offsets(seg)
    assert records[0][0] == 40 and records[0][2] == 5, records
    out = cli("dump", str(seg)).stdout.decode()
    assert f"@40 len={records[0][1]} identity ok" in out and "conversation conv-0002" in out
    assert f"{len(records)} records, 0 damaged" in out
    lines = [json.loads(line) for line in cli("dump", str(seg), "--json").stdout.splitlines()]
    assert (lines[0]["kind"], lines[0]["conversation_id"], lines[0]["count"]) == ("identity", "conv-0002", 0)
    assert [d["kind"] for d in lines[1:]] == ["batch"] * (len(records) - 1)


def _claimed(root: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, list[tuple[int, int, int]], int]:
    """A conversation claimed from the pool (identity record at 40, then two batches): its first segment,
    records and salt."""
    from tests.tools_support import salt_of

    monkeypatch.setattr(convpool, "inline_fill", True)
    with FileStore(root) as store:
        store.append(SITE, "conv-0001", [{"i": 1}])
        store.append(SITE, "conv-0002", [{"i": 2}])
        store.append(SITE, "conv-0002", [{"i": 3}])
    seg = segments(root, "conv-0002")[0]
    records = record_offsets(seg)
    assert [kind for _, _, kind in records] == [5, 1, 1], records
    return seg, records, salt_of(seg)


def test_fsck_agrees_with_the_reader_on_an_identity_record_out_of_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An identity record after the first (valid, checksummed with the segment's salt) is damage to the reader,
    and so to fsck, at the same offset; one naming another conversation is reported, reads unaffected."""
    from convmem.logstore import Corrupted, Range, frame
    from convmem.logstore.maintenance import BAD_BATCH, IDENTITY_MISMATCH, check

    root = tmp_path / "data"
    seg, records, salt = _claimed(root, monkeypatch)
    end = records[-1][0] + records[-1][1]
    stamp = frame.decode_record_header(seg.read_bytes(), records[-1][0]).recorded_at_us
    with open(seg, "r+b") as f:  # a second identity where the next batch would go, seq 2
        f.seek(end)
        f.write(frame.encode_record(salt, frame.KIND_IDENTITY, 2, 0, stamp, b"conv-0002"))
    with FileStore(root) as store:
        assert store.append(SITE, "conv-0002", [{"i": 4}]).first == 2
        with pytest.raises(Corrupted) as read_err:
            store.read(SITE, "conv-0002", Range(0, 10))
    found = [p for p in check(str(root)).problems if p.conversation_id == "conv-0002"]
    assert [(p.kind, p.offset) for p in found] == [(BAD_BATCH, end)] == [(BAD_BATCH, read_err.value.offset)]
    assert f"@{end} len=" in (out := cli("dump", str(seg)).stdout.decode()) and "belongs only at the start" in out

    other = tmp_path / "other"
    seg, records, salt = _claimed(other, monkeypatch)
    stamp = frame.decode_record_header(seg.read_bytes(), 40).recorded_at_us
    with open(seg, "r+b") as f:  # the first record names another conversation (same length)
        f.seek(40)
        f.write(frame.encode_identity(salt, stamp, "conv-0009"))
    found = [p for p in check(str(other)).problems if p.conversation_id == "conv-0002"]
    assert [(p.kind, p.offset) for p in found] == [(IDENTITY_MISMATCH, 40)], found
    assert "'conv-0009'" in found[0].detail
    with FileStore(other) as store:
        assert [i.payload for i in store.read(SITE, "conv-0002", Range(0, 10))] == [{"i": 2}, {"i": 3}]
