"""FORMAT.md describes what the engine writes: checked with a reader built from the document alone.

``tests/format_reader.py`` knows only FORMAT.md's sections 2 and 3 (and reads
its bounds out of the document's validity rule). It must read every record
the engine writes, the largest body included, and, after damage, resume
where the engine and the maintenance tools (dump, fsck) resume: by the
header and checksum of the next record, never by a trailer.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from convmem.logstore import MAX_BATCH_BYTES, MAX_BATCH_ITEMS, Corrupted, FileStore, Range, frame, layout
from convmem.logstore.maintenance import check, scan_segment
from tests import format_reader
from tests.logstore_helpers import segment_files

SITE = "site-format"
CONV = "conv-format"


def largest_batch() -> list[dict[str, str]]:
    """MAX_BATCH_ITEMS items whose compact encodings add up to exactly MAX_BATCH_BYTES."""
    overhead = len('{"t":""}')
    each = MAX_BATCH_BYTES // MAX_BATCH_ITEMS
    items = [{"t": "x" * (each - overhead)} for _ in range(MAX_BATCH_ITEMS - 1)]
    items.append({"t": "y" * (MAX_BATCH_BYTES - each * (MAX_BATCH_ITEMS - 1) - overhead)})
    return items


def test_the_documents_bounds_are_the_engines() -> None:
    bounds = format_reader.doc_bounds()
    assert bounds == format_reader.Bounds(
        MAX_BATCH_ITEMS, frame.MAX_BODY, frame.MAX_LOSS_BODY, (frame.MIN_IDENTITY_BODY, frame.MAX_IDENTITY_BODY)
    )
    # The batch body's own sentence states the same number as the validity rule.
    text = " ".join(format_reader.FORMAT_MD.read_text().split())
    stated = re.search(r"so `n` is at most [^=]*= \*\*([\d,]+)\*\*", text)
    assert stated is not None and int(stated.group(1).replace(",", "")) == bounds.max_batch_body


def test_the_largest_body_is_written_and_read_back_by_an_independent_reader(tmp_path: Path) -> None:
    items = largest_batch()
    store = FileStore(tmp_path, segment_bytes=4 << 20)
    try:
        assert store.append(SITE, CONV, [{"before": 1}]).first == 0
        store.append(SITE, CONV, items)
        store.append(SITE, CONV, [{"after": 1}])
        assert [it.payload for it in store.read(SITE, CONV, Range(1, MAX_BATCH_ITEMS))] == items
    finally:
        store.close()
    [seg] = segment_files(str(tmp_path))
    _base, recs = format_reader.read_segment(seg)
    assert all(isinstance(r, format_reader.Record) for r in recs), recs
    batches = [r for r in recs if isinstance(r, format_reader.Record)]
    assert [(r.first_seq, r.count) for r in batches] == [(0, 1), (1, MAX_BATCH_ITEMS), (1 + MAX_BATCH_ITEMS, 1)]
    assert len(batches[1].body) == frame.MAX_BODY == format_reader.doc_bounds().max_batch_body
    assert format_reader.batch_items(batches[1]) == items


def _flip(path: str, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([b ^ 0x41]))


def test_after_damage_every_reader_resumes_at_the_next_header_even_when_its_trailer_is_damaged(
    tmp_path: Path,
) -> None:
    """Record 1 damaged and record 2's trailer damaged: the engine, dump, fsck and the document agree on record 2."""
    batches = [[{"b": b, "i": i, "pad": "p" * 40} for i in range(3)] for b in range(4)]
    store = FileStore(tmp_path)
    try:
        for batch in batches:
            store.append(SITE, CONV, batch)
    finally:
        store.close()
    [seg] = segment_files(str(tmp_path))
    _info, recs = scan_segment(seg)
    r1, r2 = recs[1], recs[2]
    assert (r1.first_seq, r2.first_seq) == (3, 6)
    _flip(seg, r1.offset + frame.RECORD_HEADER_SIZE + 5)  # a byte of record 1's body
    _flip(seg, r2.offset + r2.size - 2)  # record 2's trailer magic

    # The engine serves record 2 and reports record 1 with its exact seqs.
    store = FileStore(tmp_path)
    try:
        assert [it.payload for it in store.read(SITE, CONV, Range(6, 3))] == batches[2]
        with pytest.raises(Corrupted) as info:
            store.read(SITE, CONV, Range(3, 3))
        assert (info.value.offset, info.value.first_seq, info.value.last_seq) == (r1.offset, 3, 5)
    finally:
        store.close()

    # dump's scan: one damaged stretch, exactly record 1, then record 2 intact.
    _info, after = scan_segment(seg)
    assert [(r.kind, r.offset, r.size) for r in after] == [
        ("batch", recs[0].offset, recs[0].size),
        ("damaged", r1.offset, r1.size),
        ("batch", r2.offset, r2.size),
        ("batch", recs[3].offset, recs[3].size),
    ]
    assert after[2].payloads == tuple(
        p.encode()
        for p in (
            '{"b":2,"i":0,"pad":"' + "p" * 40 + '"}',
            '{"b":2,"i":1,"pad":"' + "p" * 40 + '"}',
            '{"b":2,"i":2,"pad":"' + "p" * 40 + '"}',
        )
    )

    # fsck's scan: three valid records, one damaged record at record 1's offset.
    report = check(tmp_path)
    assert report.records == 3
    assert [(p.kind, os.path.realpath(p.file), p.offset) for p in report.unrepaired] == [
        ("corrupt-record", os.path.realpath(seg), r1.offset)
    ]

    # The reader built from FORMAT.md alone.
    _base, doc = format_reader.read_segment(seg)
    assert [type(r).__name__ for r in doc] == ["Record", "Damage", "Record", "Record"]
    damage = doc[1]
    assert isinstance(damage, format_reader.Damage) and (damage.offset, damage.resume) == (r1.offset, r2.offset)


def test_a_claimed_conversation_names_itself_in_its_first_segment(tmp_path: Path) -> None:
    """A first append that claimed a pool entry: the reader built from FORMAT.md finds its identity, then its items."""
    store = FileStore(tmp_path)
    try:
        store.append(SITE, "conv-format-warm-up", [{"warm": True}])
        store._pools[SITE].fill()
        store.append(SITE, CONV, [{"a": 1}, {"b": 2}])
        store.append(SITE, CONV, [{"c": 3}])
    finally:
        store.close()
    seg = Path(layout.conversation_dir(str(tmp_path), SITE, CONV)) / layout.segment_name(0)
    assert format_reader.entry_conversation(seg) == CONV
    _base, doc = format_reader.read_segment(seg)
    assert [(type(r).__name__, getattr(r, "kind", None)) for r in doc] == [("Record", 5), ("Record", 1), ("Record", 1)]
    items = [i for r in doc[1:] if isinstance(r, format_reader.Record) for i in format_reader.batch_items(r)]
    assert items == [{"a": 1}, {"b": 2}, {"c": 3}]
    assert [r.first_seq for r in doc if isinstance(r, format_reader.Record)] == [0, 0, 2]


def test_a_version_1_directory_is_raised_to_version_2_when_opened_and_an_unknown_version_is_refused(
    tmp_path: Path,
) -> None:
    """The marker names what an engine may write: a v1 directory opens and is raised to v2 before any write."""
    from convmem.logstore import Unavailable
    root = tmp_path / "data"
    FileStore(str(root)).close()
    marker = root / layout.MARKER_FILE
    assert marker.read_bytes() == b'{"format":"convmem-logstore","version":2}\n'
    assert layout.FORMAT_VERSION == 2

    marker.write_bytes(b'{"format":"convmem-logstore","version":1}\n')  # as a version-1 engine left it
    store = FileStore(str(root))
    try:
        assert marker.read_bytes() == b'{"format":"convmem-logstore","version":2}\n'
        store.append("team-alpha", "conv-after-upgrade", [{"n": 1}])
        assert [i.seq for i in store.read("team-alpha", "conv-after-upgrade", Range(0, 10))] == [0]
    finally:
        store.close()

    before = sorted(os.listdir(root))
    for bad in (b'{"format":"convmem-logstore","version":3}\n', b'{"format":"convmem-logstore","version":true}\n',
                b'{"format":"convmem-logstore","version":"2"}\n', b'{"format":"other","version":2}\n'):
        marker.write_bytes(bad)
        with pytest.raises(Unavailable, match=r"unknown format .*reads convmem-logstore v1, v2"):
            FileStore(str(root))
        assert marker.read_bytes() == bad  # refused, nothing rewritten
        assert sorted(os.listdir(root)) == before
