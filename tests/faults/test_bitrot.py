"""Fault 3: bit rot. One byte flipped at every offset of a small log.

Segments: a flip in a record's header or body (or in a segment header) must be
reported as ``Corrupted`` naming that file and the record's offset (0 for
the segment header) by every read that reaches it, including when it is the
last record of the log (which has an intact trailer, so it is not a torn
tail). A flip in a trailer, or in the seal of a sealed segment (it holds no
items), changes nothing that can be read. Reads that stay clear of the
damage return correct data; no read ever returns wrong data.

Indexes and manifests are derived data: a flip in them changes nothing that
can be read or listed.

Exhaustive over a small store; a hypothesis-chosen sample over a larger one.
"""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from convmem.logstore import Corrupted, FileStore, Range, Tail, frame

from ._common import (
    SITE,
    STATS,
    build_small_store,
    list_all,
    make_batch,
    read_all,
    record_spans,
    restore_dir,
    snapshot_dir,
    soak,
)

CONVS = ["rot-conv-0001", "rot-conv-0002", "rot-conv-0003"]
OPTS: dict[str, Any] = {"segment_bytes": 1024, "index_interval": 256}


class Store:
    """A pristine image of a store and what it holds."""

    def __init__(self, root: str, logs: dict[str, list[Any]]) -> None:
        self.root = root
        self.logs = logs
        self.image = snapshot_dir(root)
        store = FileStore(root, **OPTS)
        try:
            self.listing = list_all(store, SITE)
        finally:
            store.close()
        self.image = snapshot_dir(root)
        # Which conversation each segment belongs to, and its records.
        self.seg_conv: dict[str, str] = {}
        self.spans: dict[str, list[tuple[int, int, int]]] = {}
        for rel in self.image:
            if rel.endswith(".seg"):
                path = os.path.join(root, rel)
                conv = bytes.fromhex(os.path.basename(os.path.dirname(path))).decode()
                self.seg_conv[rel] = conv
                self.spans[rel] = record_spans(path)

    def files(self, suffix: str) -> list[str]:
        return sorted(r for r in self.image if r.endswith(suffix))


def _build(root: Path, batches: int, segment_bytes: int) -> Store:
    opts = {"segment_bytes": segment_bytes, "index_interval": 256}
    logs = build_small_store(str(root), CONVS, batches, **opts)
    return Store(str(root), logs)


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Store:
    return _build(tmp_path_factory.mktemp("rot") / "data", 14, 1024)


@pytest.fixture(scope="module")
def large(tmp_path_factory: pytest.TempPathFactory) -> Store:
    return _build(tmp_path_factory.mktemp("rotlarge") / "data", 240, 1024)


def _flip(s: Store, rel: str, offset: int, mask: int) -> None:
    restore_dir(s.root, s.image)
    path = os.path.join(s.root, rel)
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ mask]))
    STATS["flipped bytes"] += 1


def _damaged_record(s: Store, rel: str, offset: int) -> int | None:
    """Offset of the record a flip at ``offset`` damages (0: the segment header); None for a trailer or seal."""
    if offset < frame.SEGMENT_HEADER_SIZE:
        return 0
    for start, end, kind in s.spans[rel]:
        if start <= offset < end:
            # A seal holds no items: the next segment's base seq says where the log goes on.
            return None if offset >= end - frame.TRAILER_SIZE or kind == frame.KIND_SEAL else start
    if s.spans[rel] and offset >= s.spans[rel][-1][1] and not any(s.image[rel][s.spans[rel][-1][1] :]):
        # The zero-filled space preallocated after the last records (FORMAT.md section 2): a
        # non-zero byte there reads as an unfinished write, never acknowledged; nothing is lost.
        return None
    raise AssertionError(f"offset {offset} lies outside every record of {rel}")


def _check_reads_exact(s: Store, store: FileStore, conv: str) -> None:
    want = s.logs[conv]
    assert read_all(store, SITE, conv) == want
    assert store.read(SITE, conv, Tail(5)) == want[-5:]
    mid = len(want) // 2
    assert store.read(SITE, conv, Range(mid, 3)) == want[mid : mid + 3]


def _check_segment_flip(s: Store, rel: str, offset: int) -> None:
    conv = s.seg_conv[rel]
    bad = _damaged_record(s, rel, offset)
    path = os.path.join(s.root, rel)
    store = FileStore(s.root, **OPTS)
    try:
        for other in CONVS:
            if other != conv:
                assert read_all(store, SITE, other) == s.logs[other]
        want = s.logs[conv]
        if bad is None:
            # A flipped trailer or seal byte, or a byte of preallocated space: every item reads,
            # nothing changes, appends carry on.
            _check_reads_exact(s, store, conv)
            r = store.append(SITE, conv, make_batch("rot", 0, 1, 1))
            assert r.first == len(want)
            assert read_all(store, SITE, conv)[:-1] == want
            return
        # Every read either returns exactly the right items or reports this record.
        probes: list[Any] = [Tail(len(want) + 1), Tail(1), Range(0, 1000)]
        probes += [Range(seq, 2) for seq in range(len(want))]
        reported = False
        for sel in probes:
            try:
                got = store.read(SITE, conv, sel)
            except Corrupted as exc:
                assert os.path.realpath(exc.file) == os.path.realpath(path) and exc.offset == bad, (
                    f"flip at {rel}:{offset} reported as {exc.file}:{exc.offset}, expected offset {bad}"
                )
                reported = True
                continue
            if isinstance(sel, Tail):
                expect = want[-sel.count :]
            else:
                expect = want[sel.start : sel.start + sel.limit]
            assert got == expect, f"flip at {rel}:{offset}: {sel} returned wrong data"
        assert reported, f"flip at {rel}:{offset} (record at {bad}) was never reported by a full read"
        # The last record of the log is not a torn tail: its trailer is intact. Appends must refuse.
        last_seg = max(r for r in s.seg_conv if s.seg_conv[r] == conv)
        if rel == last_seg and bad == s.spans[rel][-1][0]:
            with pytest.raises(Corrupted) as info:
                store.append(SITE, conv, make_batch("rot", 0, 1, 1))
            assert info.value.offset == bad
            assert os.path.getsize(path) == len(s.image[rel]), "a damaged last record was cut away"
    finally:
        store.close()


def _check_derived_flip(s: Store, rel: str, offset: int) -> None:
    store = FileStore(s.root, **OPTS)
    try:
        for conv in CONVS:
            _check_reads_exact(s, store, conv)
        assert list_all(store, SITE) == s.listing, f"flip at {rel}:{offset} changed the listing"
        conv = CONVS[offset % len(CONVS)]
        r = store.append(SITE, conv, make_batch("rot", 0, 1, 1))
        assert r.first == len(s.logs[conv])
        assert read_all(store, SITE, conv)[:-1] == s.logs[conv]
        assert list_all(store, SITE)[0].conversation_id == conv
    finally:
        store.close()


def _masks(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.choice([0xFF, 1 << rng.randrange(8), rng.randrange(1, 256)]) for _ in range(n)]


def test_flip_every_byte_of_segments(small: Store) -> None:
    for rel in small.files(".seg"):
        size = len(small.image[rel])
        for offset, mask in zip(range(size), _masks(size, offset_seed(rel)), strict=True):
            _flip(small, rel, offset, mask)
            _check_segment_flip(small, rel, offset)


@pytest.mark.parametrize("suffix", [".idx", ".snap", ".log"])
def test_flip_every_byte_of_derived_files(small: Store, suffix: str) -> None:
    files = small.files(suffix)
    assert files, f"the small store has no {suffix} file to damage"
    for rel in files:
        size = len(small.image[rel])
        for offset, mask in zip(range(size), _masks(size, offset_seed(rel)), strict=True):
            _flip(small, rel, offset, mask)
            _check_derived_flip(small, rel, offset)


def offset_seed(rel: str) -> int:
    return sum(rel.encode())


@settings(
    max_examples=4000 if soak() else 150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    database=None,
)
@given(data=st.data())
def test_flip_sampled_bytes_of_a_larger_log(large: Store, data: st.DataObject) -> None:
    rel = data.draw(st.sampled_from(sorted(large.image)), label="file")
    if rel.endswith((".lock", ".json")) or not large.image[rel]:
        return
    offset = data.draw(st.integers(0, len(large.image[rel]) - 1), label="offset")
    mask = data.draw(st.integers(1, 255), label="mask")
    _flip(large, rel, offset, mask)
    if rel.endswith(".seg"):
        _check_segment_flip(large, rel, offset)
    else:
        _check_derived_flip(large, rel, offset)
