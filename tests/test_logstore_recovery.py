"""Recovery from real damage on disk: torn tails and flipped bytes.

A small log is written, then damaged copies are opened: truncated at every
byte offset of its records, with zeros or garbage after the cut, and with one
byte flipped at every offset. Torn tails must read as exactly a prefix of
whole batches and take appends again; damage to a written record must raise
``Corrupted`` at that record's offset, and wrong data is never returned.
"""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path

import pytest

from convmem.logstore import Corrupted, FileStore, ListSelector, Range, Tail, frame
from tests.logstore_helpers import data_size, segment_files

SITE = "site-recover"
CONV = "conv-recover"
HEADER = 40
TRAILER = 16

BATCHES = [
    [{"n": 0, "text": "first"}],
    [{"n": 1}, {"n": 2, "nested": {"a": [1, 2, 3]}}],
    [{"n": 3, "big": 2**70}],
    [{"n": 4, "s": "é" * 5}, {"n": 5}, {"n": 6}],
    [{"n": 7, "last": True}],
]


def build(root: Path, segment_bytes: int = 1 << 20) -> tuple[list[int], list[tuple[int, int]]]:
    """Write BATCHES; return the record boundaries (start, end) of each batch in the single segment."""
    store = FileStore(root, segment_bytes=segment_bytes, index_interval=64)
    bounds = []
    try:
        for batch in BATCHES:
            segs = segment_files(str(root))
            start = data_size(segs[-1]) if segs else HEADER
            store.append(SITE, CONV, batch)
            bounds.append((start, data_size(segment_files(str(root))[-1])))
    finally:
        store.close()
    counts = [len(b) for b in BATCHES]
    return counts, bounds


def all_payloads() -> list[dict]:
    return [p for b in BATCHES for p in b]


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> tuple[Path, list[int], list[tuple[int, int]]]:
    root = tmp_path_factory.mktemp("pristine") / "data"
    counts, bounds = build(root)
    assert len(segment_files(str(root))) == 1
    return root, counts, bounds


def damaged_copy(src: Path, dst: Path) -> str:
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(src, dst)
    [seg] = segment_files(str(dst))
    return seg


def whole_batches_before(bounds: list[tuple[int, int]], counts: list[int], cut: int) -> int:
    return sum(c for c, (_s, e) in zip(counts, bounds, strict=True) if e <= cut)


def test_truncation_at_every_offset_reads_a_prefix_of_whole_batches(pristine, tmp_path) -> None:
    src, counts, bounds = pristine
    size = bounds[-1][1]
    for cut in range(HEADER, size + 1):
        seg = damaged_copy(src, tmp_path / "d")
        os.truncate(seg, cut)
        expect = whole_batches_before(bounds, counts, cut)
        store = FileStore(tmp_path / "d")
        try:
            got = store.read(SITE, CONV, Range(0, 100))
            assert [i.payload for i in got] == all_payloads()[:expect], f"cut at {cut}"
            assert [i.seq for i in got] == list(range(expect))
            rng = store.append(SITE, CONV, [{"after": cut}])
            assert rng.first == expect
            assert store.read(SITE, CONV, Tail(1))[0].payload == {"after": cut}
        finally:
            store.close()
        # The torn bytes were cut away: the file holds whole records only.
        reopened = FileStore(tmp_path / "d")
        try:
            assert len(reopened.read(SITE, CONV, Range(0, 100))) == expect + 1
        finally:
            reopened.close()


@pytest.mark.parametrize("fill", ["zeros", "garbage"])
def test_torn_tail_followed_by_zeros_or_garbage(pristine, tmp_path, fill: str) -> None:
    src, counts, bounds = pristine
    size = bounds[-1][1]
    rnd = random.Random(7)
    for cut in range(bounds[-2][0], size):
        seg = damaged_copy(src, tmp_path / "d")
        os.truncate(seg, cut)
        extra = bytes(300) if fill == "zeros" else rnd.randbytes(300)
        with open(seg, "ab") as f:
            f.write(extra)
        # A record whose trailer alone was lost is still whole: its checksum covers everything else.
        expect = whole_batches_before(bounds, counts, cut + TRAILER)
        store = FileStore(tmp_path / "d")
        try:
            got = store.read(SITE, CONV, Range(0, 100))
            assert [i.payload for i in got] == all_payloads()[:expect], f"cut at {cut}"
            assert store.append(SITE, CONV, [{"x": 1}]).first == expect
        finally:
            store.close()


def test_tail_overwritten_in_place_with_garbage(pristine, tmp_path) -> None:
    src, counts, bounds = pristine
    size = bounds[-1][1]
    rnd = random.Random(11)
    for n in range(1, bounds[-1][1] - bounds[-1][0] + 1):
        seg = damaged_copy(src, tmp_path / "d")
        with open(seg, "r+b") as f:
            f.seek(size - n)
            f.write(rnd.randbytes(n))
        store = FileStore(tmp_path / "d")
        try:
            got = store.read(SITE, CONV, Range(0, 100))
            expect = all_payloads() if n <= TRAILER else all_payloads()[: sum(counts[:-1])]
            assert [i.payload for i in got] == expect, f"last {n} bytes overwritten"
        finally:
            store.close()


def record_at(bounds: list[tuple[int, int]], offset: int) -> tuple[int, int]:
    for start, end in bounds:
        if start <= offset < end:
            return start, end
    raise AssertionError(offset)


def test_flipped_byte_at_every_offset_is_corrupted_at_its_record(pristine, tmp_path) -> None:
    src, counts, bounds = pristine
    size = bounds[-1][1]
    payloads = all_payloads()
    for off in range(size):
        seg = damaged_copy(src, tmp_path / "d")
        with open(seg, "r+b") as f:
            f.seek(off)
            b = f.read(1)[0]
            f.seek(off)
            f.write(bytes([b ^ 0x5A]))
        store = FileStore(tmp_path / "d")
        try:
            if off < HEADER:
                with pytest.raises(Corrupted) as info:
                    store.read(SITE, CONV, Range(0, 100))
                assert info.value.offset == 0 and info.value.file == seg
                continue
            start, end = record_at(bounds, off)
            if off >= end - TRAILER:
                # The trailer is not part of what a record's validity rests on.
                assert [i.payload for i in store.read(SITE, CONV, Range(0, 100))] == payloads
                continue
            with pytest.raises(Corrupted) as info:
                store.read(SITE, CONV, Range(0, 100))
            assert (info.value.file, info.value.offset) == (seg, start), f"flip at {off}"
            # Reads that stop before the damaged record still work and are right.
            before = whole_batches_before(bounds, counts, start)
            got = store.read(SITE, CONV, Range(0, before)) if before else []
            assert [i.payload for i in got] == payloads[:before]
            # Reads after the damaged record still work and are right.
            after = whole_batches_before(bounds, counts, end)
            if after < len(payloads):
                got = store.read(SITE, CONV, Range(after, 100))
                assert [i.payload for i in got] == payloads[after:]
            # Appends go on while the record they follow is intact; damage to that record stops them.
            if start == bounds[-1][0]:
                with pytest.raises(Corrupted) as exc:
                    store.append(SITE, CONV, [{"x": 1}])
                assert (exc.value.file, exc.value.offset) == (seg, start)
            else:
                assert store.append(SITE, CONV, [{"x": 1}]).first == len(payloads)
            # The damage is still reported at the same offset afterwards.
            with pytest.raises(Corrupted) as again:
                store.read(SITE, CONV, Range(0, 100))
            assert again.value.offset == start
        finally:
            store.close()
        # Nothing was cut away: the damage is still there for an operator to see.
        with open(seg, "rb") as f:
            now = f.read(size)
        with open(str(src / os.path.relpath(seg, tmp_path / "d")), "rb") as f:
            orig = f.read(size)
        assert len(now) == size and sum(a != b for a, b in zip(now, orig, strict=True)) == 1


def test_flips_in_sealed_segments_and_indexes(tmp_path) -> None:
    root = tmp_path / "multi"
    store = FileStore(root, segment_bytes=400, index_interval=64)
    expected = []
    try:
        for i in range(40):
            batch = [{"i": i, "pad": "p" * (i % 7 * 10)}]
            store.append(SITE, CONV, batch)
            expected.extend(batch)
    finally:
        store.close()
    segs = segment_files(str(root))
    assert len(segs) > 3
    idx_files = [s[:-4] + ".idx" for s in segs]
    rnd = random.Random(3)
    # Damage to derived index files never changes what is read.
    for _ in range(60):
        victim = rnd.choice([p for p in idx_files if os.path.exists(p)])
        work = tmp_path / "w"
        if work.exists():
            shutil.rmtree(work)
        shutil.copytree(root, work)
        path = str(work / os.path.relpath(victim, root))
        data = bytearray(open(path, "rb").read())
        if not data:
            continue
        pos = rnd.randrange(len(data))
        data[pos] ^= 1 << rnd.randrange(8)
        open(path, "wb").write(bytes(data))
        s = FileStore(work, segment_bytes=400, index_interval=64)
        try:
            for start in range(0, 40, 7):
                got = s.read(SITE, CONV, Range(start, 9))
                assert [i.payload for i in got] == expected[start : start + 9]
            assert [i.payload for i in s.read(SITE, CONV, Tail(40))] == expected
        finally:
            s.close()
    # Damage to a sealed segment is reported at the damaged record's offset.
    first = segs[0]
    with open(first, "rb") as f:
        data = f.read()
    rec_end = HEADER + int.from_bytes(data[HEADER + 8 : HEADER + 12], "little") + 48
    work = tmp_path / "sealed"
    shutil.copytree(root, work)
    path = str(work / os.path.relpath(first, root))
    with open(path, "r+b") as f:
        f.seek(rec_end + 35)
        b = f.read(1)[0]
        f.seek(rec_end + 35)
        f.write(bytes([b ^ 1]))
    s = FileStore(work, segment_bytes=400, index_interval=64)
    try:
        with pytest.raises(Corrupted) as info:
            s.read(SITE, CONV, Range(0, 40))
        assert (info.value.file, info.value.offset) == (path, rec_end)
        # The tail, in a later segment, is still readable and right.
        assert [i.payload for i in s.read(SITE, CONV, Tail(3))] == expected[-3:]
        # Appends go to the active segment and still work.
        assert s.append(SITE, CONV, [{"more": 1}]).first == 40
    finally:
        s.close()


def test_deleted_indexes_and_manifest_are_rebuilt(tmp_path) -> None:
    root = tmp_path / "d"
    store = FileStore(root, segment_bytes=500, index_interval=64)
    convs = [f"conv-{i:04d}" for i in range(5)]
    try:
        for r in range(6):
            for c in convs:
                store.append(SITE, c, [{"r": r, "c": c}])
        before_list = store.list_conversations(SITE, ListSelector(None, 10))
        before = {c: store.read(SITE, c, Range(0, 100)) for c in convs}
    finally:
        store.close()
    for dirpath, _d, files in os.walk(root):
        for f in files:
            if f.endswith(".idx") or f.startswith("manifest-"):
                os.unlink(os.path.join(dirpath, f))
    store = FileStore(root, segment_bytes=500, index_interval=64)
    try:
        assert {c: store.read(SITE, c, Range(0, 100)) for c in convs} == before
        assert store.list_conversations(SITE, ListSelector(None, 10)) == before_list
    finally:
        store.close()


# ------------------------------------------------------- preallocated space


def test_pristine_log_lies_in_preallocated_space(pristine) -> None:
    """The fixture's records sit in zero-filled space the segment was created with (FORMAT.md section 2)."""
    src, _counts, bounds = pristine
    [seg] = segment_files(str(src))
    data = open(seg, "rb").read()
    assert len(data) == 4096 and bounds[-1][1] < len(data)
    assert data[bounds[-1][1] :] == bytes(len(data) - bounds[-1][1])


def test_zeros_after_the_log_are_its_clean_end(pristine, tmp_path) -> None:
    """Preallocated zeros (more of them, or none) never change what is read, and nothing is cut."""
    src, _counts, bounds = pristine
    for extra in (0, 1, 4096, 3 << 20):
        seg = damaged_copy(src, tmp_path / "d")
        os.truncate(seg, bounds[-1][1] + extra)
        store = FileStore(tmp_path / "d")
        try:
            assert [i.payload for i in store.read(SITE, CONV, Range(0, 100))] == all_payloads()
            assert os.path.getsize(seg) == bounds[-1][1] + extra, "a read cut the file"
            assert store.append(SITE, CONV, [{"x": extra}]).first == len(all_payloads())
        finally:
            store.close()
        assert data_size(seg) > bounds[-1][1]


def test_a_valid_record_after_zeros_makes_the_zeros_damage(pristine, tmp_path) -> None:
    """Zeros are the end of the log only when nothing but zeros follows: a valid record after them is kept."""
    src, counts, bounds = pristine
    seg = damaged_copy(src, tmp_path / "d")
    last_start, last_end = bounds[-1]
    data = bytearray(open(seg, "rb").read())
    record = bytes(data[last_start:last_end])
    data[last_start:last_end] = bytes(last_end - last_start)  # the last record zeroed ...
    # ... and a copy of it (valid: same salt and seq) written further on, after zeros.
    data[last_end + 200 : last_end + 200 + len(record)] = record
    open(seg, "wb").write(bytes(data))
    store = FileStore(tmp_path / "d")
    try:
        with pytest.raises(Corrupted) as info:
            store.read(SITE, CONV, Range(0, 100))
        assert info.value.offset == last_start
        before = sum(counts[:-1])
        assert [i.payload for i in store.read(SITE, CONV, Range(0, before))] == all_payloads()[:before]
        with pytest.raises(Corrupted):
            store.append(SITE, CONV, [{"x": 1}])
    finally:
        store.close()
    assert open(seg, "rb").read() == bytes(data), "damage was cut away"


def test_a_torn_group_write_is_cut_with_the_valid_records_after_it(pristine, tmp_path) -> None:
    """A power cut before a group commit's sync kept its later sectors and lost one of its first record.

    The first record then fails (zeros where a sector never arrived) and valid
    records follow it, up to the zeros of preallocated space. None of them was
    acknowledged (their one sync never completed), so this is a torn tail:
    recovery cuts it, and every tool agrees.
    """
    from convmem.logstore.maintenance import CORRUPT_RECORD, TORN_TAIL, check

    src, counts, bounds = pristine
    seg = damaged_copy(src, tmp_path / "d")
    torn_start = bounds[-2][0]
    data = bytearray(open(seg, "rb").read())
    data[torn_start : torn_start + 16] = bytes(16)  # an unwritten sector reads as zeros
    open(seg, "wb").write(bytes(data))
    # The index is written after the sync, so it never points into an unsynced write: drop it.
    for idx in Path(seg).parent.glob("*.idx"):
        idx.unlink()
    kept = sum(counts[:-2])
    report = check(str(tmp_path / "d"))
    kinds = [p.kind for p in report.problems]
    assert TORN_TAIL in kinds and CORRUPT_RECORD not in kinds, report.problems
    store = FileStore(tmp_path / "d")
    try:
        assert [i.payload for i in store.read(SITE, CONV, Range(0, 100))] == all_payloads()[:kept]
        assert store.append(SITE, CONV, [{"after": True}]).first == kept
    finally:
        store.close()
    assert data_size(seg) < bounds[-1][1], "the torn write was not cut"


def test_a_failed_record_without_a_lost_sector_before_valid_ones_is_damage(pristine, tmp_path) -> None:
    """The same shape with a flipped byte instead of zeros: damage to acknowledged data, never cut."""
    src, _counts, bounds = pristine
    seg = damaged_copy(src, tmp_path / "d")
    start, end = bounds[-2]
    data = bytearray(open(seg, "rb").read())
    data[(start + end) // 2] ^= 0x40
    open(seg, "wb").write(bytes(data))
    store = FileStore(tmp_path / "d")
    try:
        with pytest.raises(Corrupted) as info:
            store.read(SITE, CONV, Range(0, 100))
        assert info.value.offset == start
    finally:
        store.close()
    assert open(seg, "rb").read() == bytes(data), "damage was cut away"


def test_garbage_in_preallocated_space_is_a_torn_tail(pristine, tmp_path) -> None:
    """Non-zero bytes after the zeros that follow the log: an unfinished write, cut by the next append."""
    src, _counts, bounds = pristine
    for at in (0, 1, 500, 4000):
        seg = damaged_copy(src, tmp_path / "d")
        with open(seg, "r+b") as f:
            f.seek(bounds[-1][1] + at)
            f.write(b"\x17")
        store = FileStore(tmp_path / "d")
        try:
            assert [i.payload for i in store.read(SITE, CONV, Range(0, 100))] == all_payloads()
            assert store.append(SITE, CONV, [{"x": at}]).first == len(all_payloads())
        finally:
            store.close()
        data = open(seg, "rb").read()
        # The new record starts where the log ended; after it, only zeros (its own bytes may hold 0x17).
        new_end = bounds[-1][1] + frame.decode_record_header(data, bounds[-1][1]).size
        assert not any(data[new_end:]), f"the stray byte at +{at} is still there"


def test_another_store_sees_appends_into_preallocated_space(tmp_path) -> None:
    """An append that changes no file size is still seen by another open store (its staleness check)."""
    a = FileStore(tmp_path / "d")
    b = FileStore(tmp_path / "d")
    try:
        a.append(SITE, CONV, [{"n": 0}])
        assert [i.payload for i in b.read(SITE, CONV, Range(0, 10))] == [{"n": 0}]
        [seg] = segment_files(str(tmp_path / "d"))
        size = os.path.getsize(seg)
        for n in range(1, 6):
            (a if n % 2 else b).append(SITE, CONV, [{"n": n}])
            for s in (a, b):
                assert [i.payload["n"] for i in s.read(SITE, CONV, Range(0, 10))] == list(range(n + 1))
        assert os.path.getsize(seg) == size, "the appends were expected to fit the preallocated space"
    finally:
        a.close()
        b.close()

# ------------------------------------------------- a conversation's torn creation


def _append_crashing(root: Path, point: str, batch: list[dict]) -> None:
    """Append ``batch`` to CONV in a child process that exits at crash point ``point``."""
    import subprocess
    import sys

    from convmem.logstore import fileio

    code = f"from convmem.logstore import FileStore\nFileStore({str(root)!r}).append({SITE!r}, {CONV!r}, {batch!r})\n"
    env = {**os.environ, "CONVMEM_CRASH_AT": point}
    assert subprocess.run([sys.executable, "-c", code], env=env, timeout=60).returncode == fileio.CRASH_EXIT_STATUS


def _first_segment(root: Path, conv: str) -> Path:
    from convmem.logstore import layout

    return Path(layout.conversation_dir(str(root), SITE, conv)) / layout.segment_name(0)


@pytest.mark.parametrize("shape", ["first-sector-zeroed", "all-zeros", "empty", "short-zeros"])
def test_torn_creation_reads_empty_and_is_rewritten(tmp_path: Path, shape: str) -> None:
    """A first segment whose first sector never reached the disk: the conversation is empty, not damaged."""
    from convmem.logstore import maintenance

    root = tmp_path / "data"
    store = FileStore(root)
    store.append(SITE, "conv-other", [{"k": 1}])
    store.close()
    # The first append stops before its data sync (never acknowledged); the first record runs
    # past the first sector. Then what a power cut could have left of the unsynced file.
    _append_crashing(root, "before-data-sync", [{"text": "x" * 900}])
    seg = _first_segment(root, CONV)
    data = seg.read_bytes()
    assert len(data) > 512
    torn = {
        "first-sector-zeroed": bytes(512) + data[512:],  # the later sectors reached the disk, the first did not
        "all-zeros": bytes(len(data)),
        "empty": b"",
        "short-zeros": bytes(17),
    }[shape]
    seg.write_bytes(torn)
    report = maintenance.check(str(root))
    kinds = [p.kind for p in report.problems]
    assert maintenance.TORN_CREATION in kinds, kinds
    assert not report.unrepaired, [(p.kind, p.detail) for p in report.unrepaired]
    # The tools see an empty conversation too, not damage.
    assert list(maintenance.iter_conversation_items(str(root), SITE, CONV)) == []
    assert not [c for s in maintenance.stats(str(root)) for c in s.damaged]
    store = FileStore(root)
    try:
        assert store.read(SITE, CONV, Range(0, 10)) == []
        assert store.read(SITE, CONV, Tail(5)) == []
        assert store.append(SITE, CONV, [{"again": 1}]).first == 0
        assert [i.payload for i in store.read(SITE, CONV, Range(0, 10))] == [{"again": 1}]
        assert store.append(SITE, CONV, [{"again": 2}]).first == 1
    finally:
        store.close()
    assert not maintenance.check(str(root)).problems


def test_torn_creation_repaired_by_fsck(tmp_path: Path) -> None:
    from convmem.logstore import maintenance

    root = tmp_path / "data"
    FileStore(root).close()
    _append_crashing(root, "after-file-create", [{"k": 1}])
    seg = _first_segment(root, CONV)
    seg.write_bytes(bytes(seg.stat().st_size))
    report = maintenance.check(str(root), repair=True)
    assert maintenance.TORN_CREATION in [p.kind for p in report.problems if p.repaired]
    assert not report.unrepaired
    assert not seg.exists()
    with FileStore(root) as store:
        assert store.read(SITE, CONV, Tail(5)) == []
        assert store.append(SITE, CONV, [{"k": 2}]).first == 0


@pytest.mark.parametrize("where", ["non-zero-header", "later-segment", "first-of-two"])
def test_invalid_headers_that_are_not_torn_creations_are_damage(tmp_path: Path, where: str) -> None:
    """Only a conversation's one segment with an all-zero first sector is a torn creation; the rest is damage."""
    root = tmp_path / "data"
    store = FileStore(root, segment_bytes=256)
    for i in range(6 if where != "non-zero-header" else 1):
        store.append(SITE, CONV, [{"n": i, "pad": "p" * 150}])
    store.close()
    segs = segment_files(str(root))
    target = {"non-zero-header": segs[0], "later-segment": segs[-1], "first-of-two": segs[0]}[where]
    if where != "non-zero-header":
        assert len(segs) >= 2
    data = bytearray(Path(target).read_bytes())
    if where == "non-zero-header":
        data[0:8] = b"\x00" * 7 + b"\x01"  # one byte of the magic left: damage, not a creation cut short
    else:
        data[0:512] = bytes(min(512, len(data)))
    Path(target).write_bytes(bytes(data))
    store = FileStore(root, segment_bytes=256)
    try:
        with pytest.raises(Corrupted) as info:
            if where == "first-of-two":
                store.read(SITE, CONV, Range(0, 1))
            else:
                store.append(SITE, CONV, [{"more": 1}])
        assert info.value.offset == 0
    finally:
        store.close()
