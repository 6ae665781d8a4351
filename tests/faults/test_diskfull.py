"""Fault 4: the disk fills up.

A size-limited tmpfs is mounted for the test (skipped, with the reason, where
the machine refuses: not root, no mount permission). Appends run until the
filesystem is full: they must fail with the retryable ``Io``, the
conversations stay readable and consistent (in this process and a fresh
one), and once space is freed appends succeed with no gap in seqs. Three
fill/free cycles, so the disk also runs out during segment rolls, new
conversations and manifest writes.
"""

from __future__ import annotations

import errno
import os
import random
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from convmem.logstore import FileStore, Io

from ._common import SITE, STATS, check_log, list_all, make_batch, make_payload, read_all, soak

OPTS = {"segment_bytes": 16384, "index_interval": 1024}
FILLER_BYTES = 96 * 1024


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    try:
        proc = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=640k,mode=0755", "tmpfs", str(mnt)],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        pytest.skip(f"cannot mount a small tmpfs for the disk-full test: {exc}")
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs for the disk-full test: {proc.stderr.strip() or proc.returncode}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True, timeout=30)


def _fill(
    store: FileStore,
    convs: list[str],
    rng: random.Random,
    acked: list[tuple[str, int, int, int, int]],
    failed: list[tuple[str, int]],
    tag: int,
) -> int:
    """Append until the disk is full (five failures in a row); return how many appends failed."""
    failures = streak = 0
    b = tag * 100_000
    while streak < 5:
        conv = rng.choice(convs)
        n, pad = rng.randint(1, 8), rng.choice([10, 300, 2000, 9000])
        try:
            r = store.append(SITE, conv, make_batch("d", b, n, pad))
        except Io as exc:
            assert exc.retryable
            assert exc.errno in (errno.ENOSPC, errno.EDQUOT, None), f"unexpected errno {exc.errno}"
            failures += 1
            streak += 1
            failed.append((conv, b))
            STATS["disk full appends"] += 1
        else:
            acked.append((conv, r.first, b, n, pad))
            streak = 0
        b += 1
        assert b < tag * 100_000 + 20_000, "the disk never filled up"
    return failures


def _check(
    store: FileStore,
    convs: list[str],
    acked: list[tuple[str, int, int, int, int]],
    failed: list[tuple[str, int]],
) -> dict[str, int]:
    ends = {}
    for conv in convs:
        items = read_all(store, SITE, conv)
        check_log(conv, items)
        ends[conv] = len(items)
    for conv, b in failed:
        batches = {(it.payload["w"], it.payload["b"]) for it in read_all(store, SITE, conv)}
        assert ("d", b) not in batches, f"{conv}: batch {b}, whose append failed, is in the log"
    for conv, first, b, n, pad in acked:
        items = read_all(store, SITE, conv)[first : first + n]
        assert [it.payload for it in items] == [make_payload("d", b, i, n, pad) for i in range(n)], (
            f"{conv}: acknowledged batch {b} at seq {first} is not intact"
        )
    return ends


@pytest.mark.parametrize("seed", range(3 if not soak() else 200))
def test_disk_full(small_fs: Path, seed: int) -> None:
    root = small_fs / "data"
    filler = [small_fs / f"filler-{i}" for i in range(3)]
    for f in filler:
        f.write_bytes(os.urandom(FILLER_BYTES))
    convs = ["full-conv-0001", "full-conv-0002"]
    rng = random.Random(seed)
    acked: list[tuple[str, int, int, int, int]] = []
    failed: list[tuple[str, int]] = []
    store = FileStore(root, **OPTS)  # type: ignore[arg-type]
    try:
        for cycle in range(3):
            if cycle == 1:
                convs.append("full-conv-0003")  # a new conversation on a full disk
            n_failed = _fill(store, convs, rng, acked, failed, cycle)
            assert n_failed >= 5
            ends = _check(store, convs, acked, failed)
            # A fresh store (another process) opens and reads the full disk consistently too.
            other = FileStore(root, **OPTS)  # type: ignore[arg-type]
            try:
                assert _check(other, convs, acked, failed) == ends
            finally:
                other.close()
            filler[cycle].unlink()
            for conv in convs:
                r = store.append(SITE, conv, make_batch("d", 900_000 + cycle, 1, 10))
                assert r.first == ends[conv], f"{conv}: after freeing space the append got {r.first}, not {ends[conv]}"
                acked.append((conv, r.first, 900_000 + cycle, 1, 10))
            _check(store, convs, acked, failed)
            listed = {s.conversation_id for s in list_all(store, SITE)}
            assert listed == set(convs)
    finally:
        store.close()
    store = FileStore(root, **OPTS)  # type: ignore[arg-type]
    try:
        _check(store, convs, acked, failed)
        assert {s.conversation_id for s in list_all(store, SITE)} == set(convs)
    finally:
        store.close()
