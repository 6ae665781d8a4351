"""Fault 6: another process holds a lock past the timeout.

A separate process takes the conversation's ``lock`` (or the site's
``manifest.lock``) exclusively and keeps it. Appenders must give up with the
retryable ``Timeout``, write nothing at all (the data directory stays
byte-for-byte the same), and succeed, with no gap in seqs, once it lets go.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from convmem.logstore import FileStore, Timeout, fileio, layout

from ._common import SITE, STATS, list_all, make_batch, read_all, snapshot_dir

HOLDER = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
fcntl.flock(fd, fcntl.LOCK_EX)
print("locked", flush=True)
sys.stdin.readline()
fcntl.flock(fd, fcntl.LOCK_UN)
print("released", flush=True)
"""

CONV = "locked-conv-0001"


def _hold(path: str) -> subprocess.Popen[str]:
    p = subprocess.Popen([sys.executable, "-c", HOLDER, path], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None
    assert p.stdout.readline() == "locked\n"
    return p


def _release(p: subprocess.Popen[str]) -> None:
    assert p.stdin is not None and p.stdout is not None
    p.stdin.write("go\n")
    p.stdin.flush()
    assert p.stdout.readline() == "released\n"
    p.wait(timeout=30)


@pytest.mark.parametrize("which", ["conversation", "manifest"])
def test_lock_held_past_timeout(tmp_path: Path, which: str) -> None:
    root = tmp_path / "data"
    store = FileStore(root, lock_timeout=0.3)
    try:
        for b in range(3):
            store.append(SITE, CONV, make_batch("l", b, 2, 20))
        before_items = read_all(store, SITE, CONV)
        if which == "conversation":
            lock_path = os.path.join(layout.conversation_dir(str(root), SITE, CONV), layout.LOCK_FILE)
        else:
            lock_path = os.path.join(layout.site_dir(str(root), SITE), "manifest.lock")
        assert os.path.exists(lock_path), f"no lock file at {lock_path}"
        image = snapshot_dir(str(root))
        holder = _hold(lock_path)
        try:
            for attempt in range(3):
                with pytest.raises(Timeout) as info:
                    store.append(SITE, CONV, make_batch("l", 100 + attempt, 2, 20))
                assert info.value.retryable
                STATS["lock timeouts"] += 1
                assert snapshot_dir(str(root)) == image, "an append that timed out changed the data directory"
        finally:
            _release(holder)
        r = store.append(SITE, CONV, make_batch("l", 200, 2, 20))
        assert r.first == len(before_items), f"after the lock was released the append got seq {r.first}"
        items = read_all(store, SITE, CONV)
        assert items[: len(before_items)] == before_items
        assert [it.payload["b"] for it in items[len(before_items) :]] == [200, 200]
    finally:
        store.close()


def test_other_conversations_are_not_blocked(tmp_path: Path) -> None:
    """Holding one conversation's lock blocks appends to it only."""
    root = tmp_path / "data"
    store = FileStore(root, lock_timeout=0.3)
    try:
        store.append(SITE, CONV, make_batch("l", 0, 1, 1))
        holder = _hold(os.path.join(layout.conversation_dir(str(root), SITE, CONV), layout.LOCK_FILE))
        try:
            r = store.append(SITE, "free-conv-0001", make_batch("l", 1, 1, 1))
            assert r.first == 0
            with pytest.raises(Timeout):
                store.append(SITE, CONV, make_batch("l", 2, 1, 1))
            STATS["lock timeouts"] += 1
        finally:
            _release(holder)
    finally:
        store.close()


def test_manifest_lock_taken_between_data_sync_and_commit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another process takes the manifest lock after the batch is durable, before its commit is logged.

    The append must not then report ``Timeout`` ("nothing was written") for a
    batch that is in the log: either it succeeds, or the batch is not there.
    """
    root = tmp_path / "data"
    store = FileStore(root, lock_timeout=0.3)
    holder: list[subprocess.Popen[str]] = []
    lock_path = os.path.join(layout.site_dir(str(root), SITE), "manifest.lock")
    real = fileio.crashpoint

    def crashpoint(name: str) -> None:
        real(name)
        if name == "after-data-sync" and not holder:
            holder.append(_hold(lock_path))

    try:
        store.append(SITE, CONV, make_batch("l", 0, 1, 1))
        monkeypatch.setattr(fileio, "crashpoint", crashpoint)
        try:
            r = store.append(SITE, CONV, make_batch("l", 1, 1, 1))
        except Timeout:
            outcome = "timeout"
            STATS["lock timeouts"] += 1
        else:
            outcome = "ok"
            assert r.first == 1
        finally:
            monkeypatch.setattr(fileio, "crashpoint", real)
            for p in holder:
                _release(p)
        # Without this the test passes untested when the hook never fires.
        assert len(holder) == 1, "the append never reached after-data-sync: no process took the manifest lock"
        batches = [it.payload["b"] for it in read_all(store, SITE, CONV)]
        if outcome == "timeout":
            assert batches == [0], f"the append reported Timeout but its batch is in the log: {batches}"
        else:
            assert batches == [0, 1]
    finally:
        store.close()
    # The listing catches up at once by resolving the intent whose commit was never logged
    # (nobody holds the conversation any more).
    store = FileStore(root, lock_timeout=0.3)
    try:
        listed = list_all(store, SITE)
        assert [s.conversation_id for s in listed] == [CONV]
        assert listed[0].last_appended_at == read_all(store, SITE, CONV)[-1].recorded_at
    finally:
        store.close()
