"""Micro-benchmarks of the hot paths: encode, checksum, index lookup, frame scan.

Run with ``.venv/bin/python -m pytest bench/micro`` (the repository's
``testpaths`` keeps them out of ``make test``). Each asserts only that the
work was done, never how fast.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from convmem.logstore import codec, frame, index, segment
from convmem.logstore.frame import KIND_BATCH, SEGMENT_HEADER_SIZE

from ..util import payloads

SALT = 0x5EED_0123_4567_89AB


@pytest.fixture(scope="module")
def batch10() -> list[dict[str, Any]]:
    return payloads(10, 1024)


@pytest.fixture(scope="module")
def segment_file(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, int, int]]:
    """A 4 MiB-ish segment of 400 ten-item batches: ``(fd, size, records)``."""
    path = tmp_path_factory.mktemp("seg") / "00000000000000000000.seg"
    body, count = codec.encode_batch(payloads(10, 1024))
    parts = [frame.encode_segment_header(0, SALT)]
    parts += [frame.encode_record(SALT, KIND_BATCH, i * count, count, 1_700_000_000_000_000 + i, body)
              for i in range(400)]
    path.write_bytes(b"".join(parts))
    fd = os.open(path, os.O_RDONLY)
    yield fd, path.stat().st_size, 400
    os.close(fd)


def test_encode_batch(benchmark: Any, batch10: list[dict[str, Any]]) -> None:
    body, count = benchmark(codec.encode_batch, batch10)
    assert count == 10 and body.startswith(b"[")


def test_decode_batch(benchmark: Any, batch10: list[dict[str, Any]]) -> None:
    body, _ = codec.encode_batch(batch10)
    assert len(benchmark(codec.decode_batch, body)) == 10


def test_encode_record(benchmark: Any, batch10: list[dict[str, Any]]) -> None:
    body, count = codec.encode_batch(batch10)
    rec = benchmark(frame.encode_record, SALT, KIND_BATCH, 0, count, 1, body)
    assert len(rec) == len(body) + frame.RECORD_OVERHEAD


def test_checksum_10kib(benchmark: Any, batch10: list[dict[str, Any]]) -> None:
    body, count = codec.encode_batch(batch10)
    rec = frame.encode_record(SALT, KIND_BATCH, 0, count, 1, body)
    h = frame.decode_record_header(rec)
    assert benchmark(frame.checksum_ok, rec, 0, h, SALT)


def test_index_lookup(benchmark: Any) -> None:
    idx = index.SparseIndex(0, SALT)
    for i in range(1, 4001):  # a full 16 MiB segment at one entry per 4 KiB
        idx.add(i * 25, i * 4096)
    assert benchmark(idx.floor, 77_777) == (77_775, 3111 * 4096)


def test_frame_scan(benchmark: Any, segment_file: tuple[int, int, int]) -> None:
    fd, size, records = segment_file

    def scan() -> int:
        return sum(1 for _ in segment.iter_records(fd, SEGMENT_HEADER_SIZE, size, SALT))

    assert benchmark(scan) == records
