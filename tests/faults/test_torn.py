"""Fault 2: torn writes at the end of the log.

The last segment is truncated at every byte offset of its final records, and
its tail is overwritten with zeros and with garbage. Every time, the
conversation must open, show exactly a prefix of whole batches (every record
whose checksummed bytes were untouched, up to the first that was damaged) and
take appends again, continuing at the next seq.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable

import pytest

from convmem.logstore import FileStore, frame

from ._common import (
    SITE,
    STATS,
    build_small_store,
    make_batch,
    read_all,
    record_spans,
    restore_dir,
    segments,
    snapshot_dir,
)

CONV = "torn-conv-0001"
OTHER = "torn-conv-0002"
LAST_RECORDS = 3


def _expected_prefix(
    items: list[object], spans: list[tuple[int, int, int]], first_seq: int, intact_to: int, *, whole: bool
) -> int:
    """How many items survive when the last segment's bytes from ``intact_to`` on are damaged.

    With ``whole`` (a truncation) a record survives when all of it lies
    before ``intact_to``: a record whose trailer is cut short was still being
    written, so never acknowledged. Otherwise (bytes overwritten in place) it
    survives when every byte its checksum covers (all but the 16-byte
    trailer) does. Either way every record before it must survive too.
    """
    n = first_seq
    for _start, end, kind in spans:
        if (end if whole else end - frame.TRAILER_SIZE) > intact_to:
            break
        if kind == frame.KIND_BATCH:
            n = _items_through(items, n)
    return n


def _items_through(items: list[object], n: int) -> int:
    """The item count after the batch that starts at seq ``n``."""
    batch_n = items[n].payload["n"]  # type: ignore[attr-defined]
    return n + batch_n


def _check_case(root: str, image: dict[str, bytes], items: list[object], keep: int, damage: Callable[[], None]) -> None:
    restore_dir(root, image)
    damage()
    store = FileStore(root, segment_bytes=1024, index_interval=256)
    try:
        got = read_all(store, SITE, CONV)
        assert got == items[:keep], f"expected exactly the first {keep} items, got {len(got)}"
        r = store.append(SITE, CONV, make_batch("after", 0, 2, 5))
        assert r.first == keep, f"append after a torn tail got seq {r.first}, expected {keep}"
        again = read_all(store, SITE, CONV)
        assert again[:keep] == items[:keep] and len(again) == keep + 2
        assert read_all(store, SITE, OTHER), "the other conversation must be untouched"
    finally:
        store.close()
    STATS["torn tails"] += 1


@pytest.fixture(scope="module")
def torn_store(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict[str, bytes], list[object]]:
    root = str(tmp_path_factory.mktemp("torn") / "data")
    logs = build_small_store(root, [CONV, OTHER], 20)
    return root, snapshot_dir(root), logs[CONV]


@pytest.mark.parametrize("sealed_last", [False, True], ids=["open-segment", "sealed-segment"])
def test_truncate_at_every_offset(torn_store: tuple[str, dict[str, bytes], list[object]], sealed_last: bool) -> None:
    root, image, items = torn_store
    image = _image_variant(root, image, sealed_last)
    seg = _last_segment(root, image)
    spans = _spans(root, image, seg)
    base_items = _base(seg)
    begin = spans[-LAST_RECORDS][0] if len(spans) >= LAST_RECORDS else frame.SEGMENT_HEADER_SIZE
    size = spans[-1][1]
    for cut in range(begin, size):
        keep = _expected_prefix(items, spans, base_items, cut, whole=True)

        def damage(cut: int = cut) -> None:
            os.truncate(seg, cut)

        _check_case(root, image, items, keep, damage)


@pytest.mark.parametrize("fill", ["zeros", "garbage"])
def test_tail_overwritten(torn_store: tuple[str, dict[str, bytes], list[object]], fill: str) -> None:
    root, image, items = torn_store
    seg = _last_segment(root, image)
    spans = _spans(root, image, seg)
    base_items = _base(seg)
    size = spans[-1][1]
    begin = spans[-LAST_RECORDS][0] if len(spans) >= LAST_RECORDS else frame.SEGMENT_HEADER_SIZE
    rng = random.Random(7)
    for length in range(1, size - begin + 1):
        keep = _expected_prefix(items, spans, base_items, size - length, whole=False)
        junk = bytes(length) if fill == "zeros" else rng.randbytes(length)

        def damage(junk: bytes = junk) -> None:
            with open(seg, "r+b") as f:
                f.seek(size - len(junk))
                f.write(junk)

        _check_case(root, image, items, keep, damage)


def _image_variant(root: str, image: dict[str, bytes], sealed_last: bool) -> dict[str, bytes]:
    """The image as is, or as a crash between sealing a segment and creating the next leaves it.

    For the sealed variant the last segment gets its seal record (written
    exactly as the engine writes one), and no next segment exists.
    """
    if not sealed_last:
        return image
    restore_dir(root, image)
    seg = segments(root, SITE, CONV)[-1]
    with open(seg, "rb") as f:
        data = f.read()
    header = frame.decode_segment_header(data)
    assert header is not None
    last_start, end, _kind = record_spans(seg)[-1]
    h = frame.decode_record_header(data, last_start)
    seal = frame.encode_record(header.salt, frame.KIND_SEAL, h.end_seq, 0, h.recorded_at_us, b"")
    with open(seg, "r+b") as f:
        f.seek(end)
        f.write(seal)
    return snapshot_dir(root)


def _last_segment(root: str, image: dict[str, bytes]) -> str:
    restore_dir(root, image)
    return segments(root, SITE, CONV)[-1]


def _spans(root: str, image: dict[str, bytes], seg: str) -> list[tuple[int, int, int]]:
    restore_dir(root, image)
    return record_spans(seg)


def _base(seg: str) -> int:
    return int(os.path.basename(seg)[:20])
