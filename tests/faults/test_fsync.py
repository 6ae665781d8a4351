"""Fault 5: fsync/fdatasync (and writes) failing with EIO.

``logstore.fileio.fault_hook`` is the engine's I/O seam: it is called before
every write, data sync and directory sync and may raise. Checked here:

* the failing append raises the retryable ``Io`` and is not acknowledged;
* the failed batch never appears later, in this process or a fresh one
  (a sync that failed may still have left the bytes in the page cache);
* the engine does not trust that handle again: the next append re-opens the
  conversation and re-verifies its tail;
* appends after the fault continue with no gap in seqs;
* a directory whose sync failed is synced again before any later append is
  acknowledged (else a power cut could take a whole conversation with it).
"""

from __future__ import annotations

import errno
import os
import threading
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from convmem.logstore import FileStore, Io, convpool, fileio, preallocation
from convmem.logstore.conversation import Conversation, Tip
from convmem.logstore.manifest import SiteManifest
from tests.logstore_helpers import data_size

from ._common import SITE, STATS, check_log, list_all, make_batch, read_all

OPTS: dict[str, Any] = {"segment_bytes": 1024, "index_interval": 256}
CONVS = ["sync-conv-0001", "sync-conv-0002"]


class FailNth:
    """Fault hook: raise EIO at the ``n``-th call for one of ``ops`` (1-based), or from it on."""

    def __init__(self, n: int, ops: tuple[str, ...], sticky: bool = False) -> None:
        self.n = n
        self.ops = ops
        self.sticky = sticky
        self.calls = 0
        self.fired = 0
        #: The failing call created an index file with its first entries (derived data, written
        #: after the batch is durable: no append fails for it), or built entries of the site's
        #: pool of pre-created conversations (made ahead of need, best effort: neither).
        self.derived = False

    def __call__(self, op: str) -> None:
        if op not in self.ops:
            return
        self.calls += 1
        if self.calls == self.n or (self.sticky and self.calls >= self.n):
            self.fired += 1
            self.derived = any(
                f.name == "create_index_file" or (f.name == "fill" and f.filename.endswith("convpool.py"))
                for f in traceback.extract_stack()
            )
            raise OSError(errno.EIO, os.strerror(errno.EIO))


@pytest.fixture(autouse=True)
def _pool_filled_inline(monkeypatch: pytest.MonkeyPatch) -> None:
    """The site's pool is built on the appending thread: every call is counted in the same order each run."""
    monkeypatch.setattr(convpool, "inline_fill", True)


@pytest.fixture
def hook(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Any]]:
    """A slot for the active fault hook (the list holds at most one)."""
    slot: list[Any] = []

    def dispatch(op: str) -> None:
        if slot:
            slot[0](op)

    monkeypatch.setattr(fileio, "fault_hook", dispatch)
    # Extend-ahead jobs run on a thread of their own, at times of their own: here they never
    # run (every extension is an append's own), so that the N-th call is the same call in
    # every run. test_failing_extend_ahead puts faults into the jobs.
    monkeypatch.setattr(preallocation, "run_extension", lambda job: None)
    yield slot


def _workload(store: FileStore, start: int, count: int) -> Iterator[tuple[str, list[dict[str, Any]], int]]:
    """A fixed sequence of appends: new conversations, segment rolls, one big batch."""
    for b in range(start, start + count):
        conv = CONVS[b % len(CONVS)] if b < 6 else CONVS[0]
        n = 1 + b % 3
        yield conv, make_batch("f", b, n, 150 if b % 5 == 0 else 30), b
    del store


def _count_ops(tmp_path: Path, ops: tuple[str, ...], hook: list[Any]) -> int:
    counter = FailNth(0, ops)
    store = FileStore(tmp_path / "count", **OPTS)
    hook[:] = [counter]
    try:
        for conv, batch, _b in _workload(store, 0, 14):
            store.append(SITE, conv, batch)
    finally:
        store.close()
        hook.clear()
    return counter.calls


@pytest.mark.parametrize("ops", [("fdatasync", "fsync"), ("write",)], ids=["sync", "write"])
def test_every_failing_call(tmp_path: Path, hook: list[Any], ops: tuple[str, ...]) -> None:
    """Fail the N-th sync (or write) of a fixed workload, for every N."""
    total = _count_ops(tmp_path, ops, hook)
    assert total > 20, "the workload makes too few calls to be a test"
    for n in range(1, total + 1):
        _one_failure(tmp_path / f"n{n}", hook, FailNth(n, ops))


def _one_failure(data: Path, hook: list[Any], fault: FailNth) -> None:
    acked: dict[str, list[tuple[int, int, int]]] = {c: [] for c in CONVS}
    failed: list[tuple[str, int]] = []
    store = FileStore(data, **OPTS)
    hook[:] = [fault]
    try:
        for conv, batch, b in _workload(store, 0, 14):
            try:
                r = store.append(SITE, conv, batch)
            except Io as exc:
                assert exc.retryable
                failed.append((conv, b))
                continue
            acked[conv].append((r.first, r.last, b))
        if fault.derived:
            # An index file's write failed: derived data, the append is durable and acknowledged.
            assert fault.fired == 1 and not failed, f"call {fault.n} (an index write) failed {len(failed)} appends"
            hook.clear()
            STATS["index write faults"] += 1
        else:
            assert fault.fired == 1 and len(failed) == 1, f"call {fault.n} failed {fault.fired}x, {len(failed)} appends"
            hook.clear()
            STATS["fsync faults"] += 1
            # Retry the failed batch (what a client does), then one more.
            conv, b = failed[0]
            r = store.append(SITE, conv, make_batch("retry", b, 2, 5))
            prev_end = max((last for _f, last, _b in acked[conv]), default=-1) + 1
            assert r.first == prev_end, f"after EIO at call {fault.n}: retry got seq {r.first}, expected {prev_end}"
        _check(store, acked, failed)
    finally:
        store.close()
        hook.clear()
    store = FileStore(data, **OPTS)
    try:
        _check(store, acked, failed)
    finally:
        store.close()


def _check(store: FileStore, acked: dict[str, list[tuple[int, int, int]]], failed: list[tuple[str, int]]) -> None:
    for conv in CONVS:
        items = read_all(store, SITE, conv)
        assert [it.seq for it in items] == list(range(len(items))), "seqs have a gap"
        check_log(conv, items)
        batches = {(it.payload["w"], it.payload["b"]) for it in items}
        for first, last, b in acked[conv]:
            assert [it.payload for it in items[first : last + 1]] == make_batch("f", b, last - first + 1, _pad(b))
        for fconv, b in failed:
            if fconv == conv:
                assert ("f", b) not in batches, f"batch {b}, whose append failed, appeared in {conv}"


def _pad(b: int) -> int:
    return 150 if b % 5 == 0 else 30


def test_failed_sync_is_not_trusted_afterwards(
    tmp_path: Path, hook: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a failed fdatasync the next append re-opens the log and re-verifies its tail."""
    loads: list[str] = []
    real_load = Conversation._load

    def spy(self: Conversation, writable: bool) -> None:
        loads.append(self.conversation_id)
        real_load(self, writable)

    monkeypatch.setattr(Conversation, "_load", spy)
    store = FileStore(tmp_path / "data", **OPTS)
    try:
        conv = CONVS[0]
        for b in range(3):
            store.append(SITE, conv, make_batch("f", b, 2, 30))
        seg_dir = os.path.dirname(store._conversation(SITE, conv)._seg_path(0))
        size_before = _total_size(seg_dir)
        loads.clear()
        hook[:] = [FailNth(1, ("fdatasync",))]
        with pytest.raises(Io):
            store.append(SITE, conv, make_batch("f", 3, 2, 30))
        hook.clear()
        STATS["fsync faults"] += 1
        assert _total_size(seg_dir) == size_before, "the batch whose sync failed was left in the file"
        assert loads == [], "nothing reloads before the next call"
        r = store.append(SITE, conv, make_batch("f", 4, 2, 30))
        assert loads == [conv], "the append after a failed sync must re-open and re-verify the conversation"
        assert r.first == 6
        items = read_all(store, SITE, conv)
        assert [it.payload["b"] for it in items] == [0, 0, 1, 1, 2, 2, 4, 4]
    finally:
        store.close()


def test_persistent_eio_then_recovery(tmp_path: Path, hook: list[Any]) -> None:
    """A disk that fails every sync for a while: appends fail, reads work, then all is well again."""
    store = FileStore(tmp_path / "data", **OPTS)
    try:
        conv = CONVS[0]
        for b in range(4):
            store.append(SITE, conv, make_batch("f", b, 2, 30))
        before = read_all(store, SITE, conv)
        hook[:] = [FailNth(1, ("fdatasync", "fsync"), sticky=True)]
        for b in range(4, 10):
            with pytest.raises(Io):
                store.append(SITE, conv, make_batch("f", b, 2, 30))
            with pytest.raises(Io):
                store.append(SITE, f"new-conv-{b:04d}", make_batch("f", b, 1, 1))
            assert read_all(store, SITE, conv) == before
            STATS["fsync faults"] += 2
        hook.clear()
        r = store.append(SITE, conv, make_batch("f", 10, 2, 30))
        assert r.first == len(before)
        assert read_all(store, SITE, conv)[: len(before)] == before
    finally:
        store.close()
    store = FileStore(tmp_path / "data", **OPTS)
    try:
        items = read_all(store, SITE, conv)
        assert [it.payload["b"] for it in items][-2:] == [10, 10] and len(items) == len(before) + 2
    finally:
        store.close()


@pytest.mark.parametrize("ops", [("fdatasync",), ("write",), ("write", "fdatasync")], ids=["sync", "write", "both"])
def test_failing_extend_ahead(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ops: tuple[str, ...]) -> None:
    """Extend-ahead jobs whose writes or syncs fail (every one, or every other one) change no acknowledged batch.

    Each job runs on a thread of its own right after the append that handed
    it over; the failed zeros (past every record, some written and never
    synced) are space the next append that needs it writes and syncs itself.
    Every append succeeds, seqs stay gapless, and a fresh store reads the same.
    """
    jobs: list[Any] = []
    monkeypatch.setattr(preallocation, "run_extension", jobs.append)
    calls = [0]

    def fail(op: str) -> None:
        if threading.current_thread().name == "extend-test" and op in ops:
            calls[0] += 1
            if len(ops) == 1 or calls[0] % 2:
                raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(fileio, "fault_hook", fail)
    acked: dict[str, list[tuple[int, int, int]]] = {c: [] for c in CONVS}
    ran = 0
    store = FileStore(tmp_path / "data", **OPTS)
    try:
        for conv, batch, b in _workload(store, 0, 40):
            r = store.append(SITE, conv, batch)
            acked[conv].append((r.first, r.last, b))
            while jobs:
                t = threading.Thread(target=jobs.pop(0), name="extend-test")
                t.start()
                t.join()
                ran += 1
        assert ran and calls[0], "no extend-ahead job met a fault"
        STATS["extend-ahead faults"] += calls[0]
        _check(store, acked, [])
    finally:
        store.close()
    monkeypatch.setattr(fileio, "fault_hook", None)
    store = FileStore(tmp_path / "data", **OPTS)
    try:
        _check(store, acked, [])
    finally:
        store.close()


def _dir_sync_spy(monkeypatch: pytest.MonkeyPatch) -> tuple[list[tuple[str, bool]], list[int]]:
    """Record every directory sync as ``(path, ok)``; fail the one whose number is in ``fail``."""
    log: list[tuple[str, bool]] = []
    fail: list[int] = []
    real = fileio.fsync_dir
    current: list[str] = []

    def hook(op: str) -> None:
        if current and op == "fsync":
            if fail and len(log) + 1 == fail[0]:
                raise OSError(errno.EIO, os.strerror(errno.EIO))

    def fsync_dir(path: str) -> None:
        current.append(path)
        try:
            real(path)
        except OSError:
            log.append((path, False))
            raise
        finally:
            current.pop()
        log.append((path, True))

    def fsync_dirs(paths: list[str], data_fd: int | None = None) -> None:
        # One at a time, through the spy (test_directory_syncs_run_together checks the real one).
        if data_fd is not None:
            fileio.fdatasync(data_fd)
        for p in paths:
            fsync_dir(p)

    monkeypatch.setattr(fileio, "fault_hook", hook)
    monkeypatch.setattr(fileio, "fsync_dir", fsync_dir)
    monkeypatch.setattr(fileio, "fsync_dirs", fsync_dirs)
    return log, fail


def _dir_syncs_of_first_append(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> int:
    with monkeypatch.context() as m:
        log, _fail = _dir_sync_spy(m)
        # Created in place (a site's first conversation); no pool built after it to count
        # (a claim's failed syncs: tests/test_logstore_convpool.py).
        store = FileStore(tmp_path / "count", conversation_pool=False, **OPTS)
        log.clear()
        try:
            store.append(SITE, CONVS[0], make_batch("f", 0, 1, 1))
        finally:
            store.close()
        return len(log)


def test_failed_directory_sync_is_redone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A directory sync that failed is redone before a later append to that conversation is acknowledged.

    Otherwise the retried append is acknowledged while the new conversation's
    directory (or its first segment) may exist only in memory: a power cut
    would take acknowledged items with it. Every directory sync of a first
    append (new site and conversation directories, the first segment) is
    failed in turn.
    """
    total = _dir_syncs_of_first_append(tmp_path, monkeypatch)
    assert total >= 6, f"only {total} directory syncs in a first append"
    for k in range(1, total + 1):
        root = tmp_path / f"k{k}"
        with monkeypatch.context() as m:
            log, fail = _dir_sync_spy(m)
            store = FileStore(root, conversation_pool=False, **OPTS)
            try:
                log.clear()
                fail[:] = [k]
                conv = CONVS[0]
                with pytest.raises(Io):
                    store.append(SITE, conv, make_batch("f", 0, 1, 1))
                STATS["fsync faults"] += 1
                failed_path = next(p for p, ok in log if not ok)
                mark = len(log)
                fail.clear()
                r = store.append(SITE, conv, make_batch("f", 1, 1, 1))
                assert r.first == 0
                conv_dir = os.path.dirname(store._conversation(SITE, conv)._seg_path(0))
                if conv_dir == failed_path or conv_dir.startswith(failed_path + os.sep):
                    assert (failed_path, True) in log[mark:], (
                        f"the sync of {failed_path} failed and was never redone before the retry was acknowledged"
                    )
            finally:
                store.close()


def _total_size(d: str) -> int:
    """Bytes of records in the conversation's segments (preallocated zeros left out)."""
    return sum(data_size(os.path.join(d, n)) for n in os.listdir(d) if n.endswith(".seg"))


def test_nothing_after_the_data_sync_can_fail_an_append(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """After the data sync, an append does no I/O: the listing's commit record is only owed.

    The batch is in the log once its sync returned, so nothing between the sync
    and the acknowledgement may fail (an ``Io`` would make the client retry and
    duplicate it, and claim that nothing was written). The commit record is
    therefore never written there: :meth:`SiteManifest.commit` only notes it as
    owed, and the conversation's next intent (or a flush) carries it. This checks
    that ``commit`` makes no file operation on the appending thread, and that the
    listing catches up from the intent when the owed commit was never logged.
    """
    root = tmp_path / "data"
    store = FileStore(root, lock_timeout=0.3, **OPTS)
    ops: list[tuple[int, str]] = []
    inside: set[int] = set()
    original = SiteManifest.commit

    def record(kind: str, *args: Any) -> None:
        if threading.get_ident() in inside:
            ops.append((threading.get_ident(), kind))

    def watched_commit(self: SiteManifest, conversation_id: str, tip: Tip) -> None:
        inside.add(threading.get_ident())
        try:
            original(self, conversation_id, tip)
        finally:
            inside.discard(threading.get_ident())

    try:
        store.append(SITE, CONVS[0], make_batch("f", 0, 1, 1))
        with monkeypatch.context() as m:
            m.setattr(SiteManifest, "commit", watched_commit)
            m.setattr(fileio, "recorder", record)
            r1 = store.append(SITE, CONVS[0], make_batch("f", 1, 2, 1))
            r2 = store.append(SITE, CONVS[1], make_batch("f", 2, 1, 1))  # a new conversation
            # The owed commits are never logged: drop them, as a crash before the next intent would.
            for manifest in store._manifests.values():  # type: ignore[attr-defined]
                manifest._owed.clear()
        assert ops == [], f"file operations inside SiteManifest.commit: {ops}"
        assert (r1.first, r2.first) == (1, 0)
        assert [it.payload["b"] for it in read_all(store, SITE, CONVS[0])] == [0, 1, 1]
    finally:
        store.close()
    # No waiting: an intent whose conversation nobody holds is probed by the next listing.
    store = FileStore(root, lock_timeout=0.3, **OPTS)
    try:
        listing = {s.conversation_id: s for s in list_all(store, SITE)}
        assert set(listing) == set(CONVS)
        for conv in CONVS:
            assert listing[conv].last_appended_at == read_all(store, SITE, conv)[-1].recorded_at
    finally:
        store.close()


@pytest.mark.parametrize("k", [1, 2, 3])
def test_directory_syncs_run_together(tmp_path: Path, hook: list[Any], k: int) -> None:
    """``fileio.fsync_dirs``: the k-th of three directory syncs fails; every one is redone before it is trusted."""
    dirs = [str(tmp_path / name) for name in ("a", "b", "c")]
    for d in dirs:
        os.mkdir(d)
    hook[:] = [FailNth(k, ("fsync",))]
    with pytest.raises(OSError):
        fileio.fsync_dirs(dirs)
    hook.clear()
    assert set(dirs) <= fileio._unsynced_dirs  # none of them may be taken as synced
    synced: list[str] = []
    hook[:] = [lambda op: synced.append(op)]
    for d in dirs:
        fileio.resync_failed_dirs(d)
    assert synced == ["fsync"] * 3 and not set(dirs) & fileio._unsynced_dirs
    hook.clear()
    fileio.fsync_dirs(dirs)  # and without a fault, all three at once
    assert not set(dirs) & fileio._unsynced_dirs
    # With a file's data sync among them: its fault fails the call once the directory syncs that ran
    # meanwhile are done; they succeeded, so they are not taken as failed.
    fd = os.open(tmp_path / "a" / "f", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        hook[:] = [FailNth(1, ("fdatasync",))]
        with pytest.raises(OSError):
            fileio.fsync_dirs(dirs, fd)
        hook.clear()
        assert not set(dirs) & fileio._unsynced_dirs
        hook[:] = [FailNth(k, ("fsync",))]  # a directory's fault beside the data sync: fails before any starts
        with pytest.raises(OSError):
            fileio.fsync_dirs(dirs, fd)
        hook.clear()
        assert set(dirs) <= fileio._unsynced_dirs
        fileio.fsync_dirs(dirs, fd)
        assert not set(dirs) & fileio._unsynced_dirs
    finally:
        os.close(fd)
        fileio._unsynced_dirs.difference_update(dirs)


def test_directory_sync_failing_in_a_worker(tmp_path: Path) -> None:
    """A sync that fails on a worker thread (here: the directory is gone) is raised and left to redo."""
    dirs = [str(tmp_path / name) for name in ("a", "b", "c")]
    os.mkdir(dirs[0])
    os.mkdir(dirs[2])
    try:
        with pytest.raises(FileNotFoundError):
            fileio.fsync_dirs(dirs)
        assert dirs[1] in fileio._unsynced_dirs
        assert dirs[0] not in fileio._unsynced_dirs and dirs[2] not in fileio._unsynced_dirs
    finally:
        fileio._unsynced_dirs.difference_update(dirs)
