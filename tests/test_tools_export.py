"""``convmem export`` / ``convmem import``: a faithful backup and restore."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from convmem.logstore import FileStore, ListSelector, Tail
from tests.tools_support import SITE, cli, flip_byte, read_all, record_offsets, segments

OTHER = "site-restore"


def _build(root: Path) -> dict[str, int]:
    payloads: list[dict[str, Any]] = [
        {"role": "user", "text": "héllo wörld ✓", "n": 1.5e-7},
        {"nested": {"a": [1, 2, {"b": None}], "t": True}, "big": 2**62},
        {"quote": 'he said "hi"\n\ttab \\ slash \u0001', "emoji": "🙂"},
    ]
    counts = {}
    with FileStore(root, segment_bytes=4096) as store:
        for c in range(3):
            cid = f"conversation-{c}"
            for i in range(25 + c):
                store.append(SITE, cid, [*payloads[: 1 + (i + c) % 3], {"i": i}])
            counts[cid] = store.read(SITE, cid, Tail(1))[0].seq + 1
    return counts


def test_export_then_import_round_trips_byte_for_byte(tmp_path: Path) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    counts = _build(src)
    first = tmp_path / "first.jsonl"
    proc = cli("export", str(src), "--site", SITE, "--output", str(first))
    assert proc.returncode == 0, proc.stderr
    lines = first.read_bytes().splitlines()
    assert len(lines) == sum(counts.values())
    doc = json.loads(lines[0])
    assert set(doc) == {"conversation_id", "seq", "recorded_at", "payload"}

    proc = cli("import", str(dst), "--site", OTHER, "--input", str(first))
    assert proc.returncode == 0, proc.stderr
    second = cli("export", str(dst), "--site", OTHER)
    assert second.returncode == 0
    assert second.stdout == first.read_bytes()  # payloads, seqs and recorded_at identical, byte for byte

    for cid in counts:
        assert read_all(dst, cid, OTHER) == read_all(src, cid, SITE)
    with FileStore(dst) as store:
        restored = store.list_conversations(OTHER, ListSelector(None, 10)).summaries
    with FileStore(src) as store:
        original = store.list_conversations(SITE, ListSelector(None, 10)).summaries
    assert restored == original
    assert cli("fsck", str(dst)).returncode == 0
    # The restored log takes new appends after the restored seqs.
    with FileStore(dst) as store:
        assert store.append(OTHER, "conversation-0", [{"new": 1}]).first == counts["conversation-0"]


def test_import_from_stdin_and_one_conversation(tmp_path: Path) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    counts = _build(src)
    out = cli("export", str(src), "--site", SITE, "--conversation", "conversation-1")
    assert out.returncode == 0
    assert len(out.stdout.splitlines()) == counts["conversation-1"]
    proc = cli("import", str(dst), "--site", OTHER, stdin=out.stdout)
    assert proc.returncode == 0, proc.stderr
    assert read_all(dst, "conversation-1", OTHER) == read_all(src, "conversation-1", SITE)


def test_import_refuses_a_non_empty_site_and_bad_input(tmp_path: Path) -> None:
    src = tmp_path / "src"
    _build(src)
    dump = cli("export", str(src), "--site", SITE).stdout
    refused = cli("import", str(src), "--site", SITE, stdin=dump)
    assert refused.returncode == 8
    assert b"already holds conversations" in refused.stderr
    gap = b'{"conversation_id":"conv-gap-1","seq":3,"recorded_at":"2026-01-01T00:00:00.000000Z","payload":{}}\n'
    bad = cli("import", str(tmp_path / "empty"), "--site", OTHER, stdin=gap)
    assert bad.returncode == 1 and b"line 1" in bad.stderr
    junk = cli("import", str(tmp_path / "empty2"), "--site", OTHER, stdin=b"not json\n")
    assert junk.returncode == 1 and b"line 1" in junk.stderr


def test_export_stops_at_damage_and_leaves_no_partial_file(tmp_path: Path) -> None:
    src = tmp_path / "src"
    _build(src)
    seg = segments(src, "conversation-2")[0]
    offset = record_offsets(seg)[1][0]
    flip_byte(seg, offset + 40)
    target = tmp_path / "out.jsonl"
    proc = cli("export", str(src), "--site", SITE, "--output", str(target))
    assert proc.returncode == 4
    assert str(offset).encode() in proc.stderr
    assert not target.exists()
    assert list(tmp_path.glob("out.jsonl*")) == []
    assert cli("export", str(src), "--site", "no-such-site").returncode == 8
