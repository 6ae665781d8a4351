"""Idempotent appends across crashes: a retry after a kill never duplicates a batch.

A writer appends batch ``b`` under the key ``W-b`` and records each
acknowledgement; it is killed (SIGKILL at a random moment, or at a named
crash point: mid-write, before or after the data sync, after the manifest
commit, i.e. between the write and the acknowledgement). A second writer then
replays the same sequence of batches with the same keys, as a client retrying
everything it did not see acknowledged (and more) would. Checked: every
batch the first writer saw acknowledged gets back the very same range, every
batch is in the log exactly once (no duplicate, no gap, no partial batch),
and fsck is clean. Two writers racing the same keys from separate processes
end with each batch once, and agree on every range.
"""

from __future__ import annotations

import random
import subprocess
import time
from pathlib import Path

import pytest

from convmem.logstore import FileStore, fileio, maintenance

from ._common import SITE, STATS, Ack, read_acks, subprocess_env, verify, writer_cmd

CONVS = [f"idem-conv-{i:04d}" for i in range(3)]
OPTS = {"segment_bytes": 2048, "index_interval": 256}


def _args(root: Path, acks: Path, batches: int, seed: int) -> list[str]:
    return writer_cmd(
        *("--data-dir", str(root), "--id", "k", "--convs", ",".join(CONVS), "--acks", str(acks)),
        *("--batches", str(batches), "--seed", str(seed), "--segment-bytes", "2048", "--index-interval", "256"),
        "--idempotent",
    )


def _retry_all(root: Path, first: list[Ack], attempted: int, seed: int) -> None:
    """Replay batches 0..attempted-1 under their keys; check ranges and that each batch is there once."""
    again = root.parent / "retry.jsonl"
    proc = subprocess.run(_args(root, again, attempted, seed), env=subprocess_env(), capture_output=True, timeout=300)
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")[-2000:]
    retried = {a.b: a for a in read_acks(str(again))}
    assert sorted(retried) == list(range(attempted))
    for a in first:
        assert retried[a.b] == a, f"batch {a.b}: acknowledged as {a}, its retry returned {retried[a.b]}"
    store = FileStore(root, **OPTS)  # type: ignore[arg-type]
    try:
        logs = verify(store, SITE, list(retried.values()), CONVS)  # check_log: no batch appears twice
    finally:
        store.close()
    assert sum(len(v) for v in logs.values()) == sum(a.n for a in retried.values())
    report = maintenance.check(str(root))
    assert not report.unrepaired, [p.detail for p in report.unrepaired]


@pytest.mark.parametrize("point", ["record-mid-write", "before-data-sync", "after-data-sync", "manifest-commit"])
@pytest.mark.parametrize("hit", [1, 4, 11])
def test_retry_after_a_crash_point_appends_each_batch_once(tmp_path: Path, point: str, hit: int) -> None:
    root, acks = tmp_path / "data", tmp_path / "acks.jsonl"
    proc = subprocess.run(
        _args(root, acks, 40, hit), env=subprocess_env(CONVMEM_CRASH_AT=f"{point}:{hit}"), capture_output=True,
        timeout=300,
    )
    assert proc.returncode == fileio.CRASH_EXIT_STATUS, proc.stderr.decode(errors="replace")[-2000:]
    first = read_acks(str(acks))
    STATS["crash points"] += 1
    # The batch in flight was number len(first): retry it and two more never tried.
    _retry_all(root, first, len(first) + 3, hit)


def test_retry_after_sigkill_appends_each_batch_once(tmp_path: Path) -> None:
    rng = random.Random()
    for round_ in range(3):
        root, acks = tmp_path / f"r{round_}" / "data", tmp_path / f"r{round_}" / "acks.jsonl"
        root.parent.mkdir(parents=True)
        proc = subprocess.Popen(_args(root, acks, 0, round_), env=subprocess_env(), stdout=subprocess.PIPE)
        try:
            assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
            time.sleep(rng.uniform(0.05, 0.4))
        finally:
            proc.kill()
            proc.wait(30)
        STATS["crash rounds"] += 1
        first = read_acks(str(acks))
        _retry_all(root, first, len(first) + 2, round_)


def test_two_processes_racing_the_same_keys(tmp_path: Path) -> None:
    root = tmp_path / "data"
    files = [tmp_path / "a.jsonl", tmp_path / "b.jsonl"]
    procs = [
        subprocess.Popen(_args(root, f, 60, 7), env=subprocess_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        for f in files
    ]
    for p in procs:
        _out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err.decode(errors="replace")[-2000:]
    a, b = (read_acks(str(f)) for f in files)
    assert a == b  # the same keys, the same items: one range each, whichever process wrote it
    store = FileStore(root, **OPTS)  # type: ignore[arg-type]
    try:
        logs = verify(store, SITE, a, CONVS)
    finally:
        store.close()
    assert sum(len(v) for v in logs.values()) == sum(x.n for x in a)
