"""Group commit: several threads' batches on one conversation in one write and one sync.

Threads append to one conversation (and to others beside it) at random; every
acknowledged batch must then read back at exactly the seqs it was given, the
seqs gapless and in order, each batch its own record. A group whose sync
fails fails every batch in it, and none of them is ever readable. Groups are
also formed deterministically (batches queued, then one leader) to check that
they really share one write and one sync.

``CONVMEM_GROUP_SEED`` reruns the random test with a given seed.
"""

from __future__ import annotations

import errno
import os
import random
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from convmem.logstore import FileStore, Io, Range, fileio
from convmem.logstore.codec import encode_batch
from convmem.logstore.groupcommit import Batch
from convmem.logstore.maintenance import scan_segment
from convmem.logstore.preallocation import wait_for_extensions
from tests.logstore_helpers import segment_files

SITE = "site-group"
SEED = int(os.environ.get("CONVMEM_GROUP_SEED", "0")) or random.SystemRandom().randrange(1, 2**31)


def _payloads(t: int, b: int, n: int, pad: int) -> list[dict[str, Any]]:
    return [{"t": t, "b": b, "i": i, "pad": "x" * pad} for i in range(n)]


@pytest.mark.parametrize("threads", [4, 8])
def test_threads_on_one_conversation_read_back_gapless(tmp_path: Path, threads: int) -> None:
    print(f"group seed {SEED} (rerun with CONVMEM_GROUP_SEED={SEED})")
    rng = random.Random(f"{SEED}:{threads}")
    plans = [[(rng.randint(1, 12), rng.choice([0, 10, 200, 3000])) for _ in range(25)] for _ in range(threads)]
    convs = ["conv-shared", "conv-other"]
    store = FileStore(tmp_path / "d", segment_bytes=16 * 1024, index_interval=512)
    acks: list[tuple[str, int, int, int, int, int, int]] = []
    errors: list[BaseException] = []
    lock = threading.Lock()
    start = threading.Barrier(threads)

    def work(t: int) -> None:
        try:
            start.wait()
            for b, (n, pad) in enumerate(plans[t]):
                conv = convs[0] if t or b % 5 else convs[1]
                r = store.append(SITE, conv, _payloads(t, b, n, pad))
                with lock:
                    acks.append((conv, r.first, r.last, t, b, n, pad))
        except BaseException as exc:  # reported below, with the seed
            errors.append(exc)

    try:
        workers = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        assert not errors, f"seed {SEED}: {errors[0]!r}"
        for conv in convs:
            items: list[Any] = []
            while page := store.read(SITE, conv, Range(len(items), 1000)):
                items.extend(page)
            mine = sorted(a for a in acks if a[0] == conv)
            assert [i.seq for i in items] == list(range(len(items))), f"seed {SEED}: seqs of {conv} have a gap"
            assert sum(a[5] for a in mine) == len(items), f"seed {SEED}: {conv} holds items never acknowledged"
            pos = 0
            for _conv, first, last, t, b, n, pad in mine:
                assert first == pos and last == first + n - 1, f"seed {SEED}: batch {t}/{b} at {first}..{last}"
                assert [it.payload for it in items[first : last + 1]] == _payloads(t, b, n, pad)
                assert len({it.recorded_at for it in items[first : last + 1]}) == 1
                pos = last + 1
            # Each batch is its own record.
            cdir = os.path.dirname(store._conversation(SITE, conv)._seg_path(0))
            records = [
                r for seg in segment_files(cdir) for r in scan_segment(seg, payloads=False)[1] if r.kind == "batch"
            ]
            assert len(records) == len(mine)
            assert all(r.verdict == "ok" for r in records)
    finally:
        store.close()


def _queue_and_lead(store: FileStore, conv_id: str, batches: list[list[dict[str, Any]]]) -> list[Batch]:
    """Queue ``batches`` on the conversation, then let the first lead: one group, as threads would form it."""
    started = time.monotonic()
    conv = store._acquire(SITE, conv_id, started + 5, started)
    try:
        queued = [Batch(*encode_batch(b)) for b in batches]
        conv._queue.extend(queued)
        while conv._queue and conv._queue[0] in queued:
            conv._lead(started + 5, started)
        return queued
    finally:
        conv.mutex.release()


def test_a_group_shares_one_write_and_one_sync(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = FileStore(tmp_path / "d")
    ops: list[str] = []
    try:
        store.append(SITE, "conv-group", [{"n": 0}])  # the conversation exists: only the group's I/O is counted
        wait_for_extensions()  # and the site's pool of conversation directories is filled (in the background)
        monkeypatch.setattr(fileio, "fault_hook", ops.append)
        done = _queue_and_lead(store, "conv-group", [[{"n": 1}], [{"n": 2}, {"n": 3}], [{"n": 4}]])
        monkeypatch.setattr(fileio, "fault_hook", None)
        assert [b.error for b in done] == [None, None, None]
        assert [b.result[:2] for b in done] == [(1, 1), (2, 3), (4, 4)]
        assert ops.count("fdatasync") == 1 and ops.count("write") == 1, ops
        assert [i.payload["n"] for i in store.read(SITE, "conv-group", Range(0, 10))] == [0, 1, 2, 3, 4]
        [seg] = segment_files(str(tmp_path / "d"))
        assert [r.first_seq for r in scan_segment(seg)[1]] == [0, 1, 2, 4]
    finally:
        store.close()


def test_a_failed_group_acknowledges_none_of_its_batches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = FileStore(tmp_path / "d")
    try:
        store.append(SITE, "conv-failed", [{"n": 0}])

        def fail(op: str) -> None:
            if op == "fdatasync":
                raise OSError(errno.EIO, "injected")

        monkeypatch.setattr(fileio, "fault_hook", fail)
        done = _queue_and_lead(store, "conv-failed", [[{"n": 1}], [{"n": 2}], [{"n": 3}]])
        monkeypatch.setattr(fileio, "fault_hook", None)
        assert all(isinstance(b.error, Io) for b in done), [b.error for b in done]
        assert [i.payload["n"] for i in store.read(SITE, "conv-failed", Range(0, 10))] == [0]
        assert store.append(SITE, "conv-failed", [{"n": 9}]).first == 1
    finally:
        store.close()
    with FileStore(tmp_path / "d") as again:
        assert [i.payload["n"] for i in again.read(SITE, "conv-failed", Range(0, 10))] == [0, 9]


def test_a_group_that_does_not_fit_the_segment_leaves_the_rest_queued(tmp_path: Path) -> None:
    store = FileStore(tmp_path / "d", segment_bytes=1024, index_interval=64)
    try:
        batches = [[{"n": n, "pad": "p" * 300}] for n in range(6)]
        done = _queue_and_lead(store, "conv-rolled", batches)
        assert [b.error for b in done] == [None] * 6
        assert [b.result[0] for b in done] == list(range(6))
        assert [i.payload["n"] for i in store.read(SITE, "conv-rolled", Range(0, 10))] == list(range(6))
        assert len(segment_files(str(tmp_path / "d"))) >= 3
    finally:
        store.close()
