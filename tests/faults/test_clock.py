"""Fault 7: the wall clock steps backwards (and stands still) between appends.

``recorded_at`` must never decrease within a conversation, in this process
or a fresh one that only has the files to go by (also across segment
rolls), and the listing must stay in order: most recently appended first,
ties by ascending id, each conversation exactly once across pages, with
timestamps that match the items.
"""

from __future__ import annotations

import random
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from convmem.logstore import FileStore, fileio, frame, writer
from convmem.logstore.timefmt import parse_rfc3339
from tests.logstore_helpers import data_size

from ._common import (
    SITE,
    STATS,
    check_listing_order,
    list_all,
    make_batch,
    read_all,
    segments,
    subprocess_env,
    writer_cmd,
)

OPTS = {"segment_bytes": 1024, "index_interval": 256}
T0 = 1_800_000_000_000_000  # 2027-01-15, microseconds


class Clock:
    def __init__(self, now: int) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now

    def step(self, delta_us: int) -> None:
        self.now += delta_us
        STATS["clock steps"] += 1


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    c = Clock(T0)
    fake: Callable[[], int] = c
    monkeypatch.setattr(writer, "now_us", fake)
    return c


def _check_store(store: FileStore, convs: list[str]) -> None:
    logs = {c: read_all(store, SITE, c) for c in convs}
    for conv, items in logs.items():
        stamps = [parse_rfc3339(it.recorded_at) for it in items]
        assert stamps == sorted(stamps), f"{conv}: recorded_at decreased: {stamps}"
    for page in (1, 2, 3, 50):
        listing = list_all(store, SITE, page=page)
        check_listing_order(listing)
        ids = [s.conversation_id for s in listing]
        assert sorted(ids) == sorted(c for c in convs if logs[c]), f"page size {page}: listing {ids}"
        for s in listing:
            items = logs[s.conversation_id]
            assert s.created_at == items[0].recorded_at
            assert s.last_appended_at == items[-1].recorded_at


def test_clock_steps_back(tmp_path: Path, clock: Clock) -> None:
    root = tmp_path / "data"
    convs = [f"clock-conv-{i:04d}" for i in range(6)]
    rng = random.Random(3)
    store = FileStore(root, **OPTS)  # type: ignore[arg-type]
    try:
        for b in range(300):
            clock.step(rng.choice([1, 1000, 0, -5_000_000, -3_600_000_000, 7_000_000, -1]))
            conv = rng.choice(convs)
            store.append(SITE, conv, make_batch("c", b, rng.randint(1, 3), rng.randint(0, 120)))
            if b % 50 == 49:
                # A fresh store: the clamp must come from the files, not from memory.
                store.close()
                _check_store_fresh(root, convs)
                store = FileStore(root, **OPTS)  # type: ignore[arg-type]
        _check_store(store, convs)
    finally:
        store.close()


def _check_store_fresh(root: Path, convs: list[str]) -> None:
    store = FileStore(root, **OPTS)  # type: ignore[arg-type]
    try:
        _check_store(store, convs)
    finally:
        store.close()


def test_clock_back_right_after_a_segment_roll(tmp_path: Path, clock: Clock) -> None:
    """A crash right after a segment roll leaves an active segment with no batch: the clamp comes from before it."""
    root = tmp_path / "data"
    conv = "clock-roll-0001"
    proc = subprocess.run(
        writer_cmd(
            *("--data-dir", str(root), "--id", "w", "--convs", conv, "--acks", str(tmp_path / "acks")),
            *("--batches", "500", "--segment-bytes", "1024", "--max-pad", "200"),
        ),
        env=subprocess_env(CONVMEM_CRASH_AT="segment-roll-created:2"),
        capture_output=True,
        timeout=120,
    )
    assert proc.returncode == fileio.CRASH_EXIT_STATUS, proc.stderr.decode()
    last = segments(str(root), SITE, conv)[-1]
    assert data_size(last) == frame.SEGMENT_HEADER_SIZE, "the crash did not leave an empty active segment"
    clock.now = time.time_ns() // 1000
    for back in (1, 1_000_000, 86_400_000_000):
        clock.step(-back)
        store = FileStore(root, **OPTS)  # type: ignore[arg-type]
        try:
            before = read_all(store, SITE, conv)
            r = store.append(SITE, conv, make_batch("c", back, 1, 200))
            assert r.first == len(before)
            _check_store(store, [conv])
        finally:
            store.close()


def test_frozen_clock_ties_paginate(tmp_path: Path, clock: Clock) -> None:
    """Many conversations with the same last_appended_at: ties by id, every one listed once."""
    root = tmp_path / "data"
    convs = [f"tie-conv-{i:04d}" for i in range(23)]
    store = FileStore(root, **OPTS)  # type: ignore[arg-type]
    try:
        for i, conv in enumerate(reversed(convs)):
            store.append(SITE, conv, make_batch("t", i, 1, 1))
        STATS["clock steps"] += 1
        _check_store(store, convs)
        clock.step(-10_000_000)
        store.append(SITE, convs[5], make_batch("t", 99, 1, 1))
        _check_store(store, convs)
    finally:
        store.close()
