"""A first append in one sync: the window between its acknowledgement and the sync of its rename.

A claim renames a pool entry into place, writes the first segment and the
conversation's identity (in the entry's lock file), syncs those two files and
acknowledges; the directories the rename changed are synced afterwards (FORMAT.md
6, "A first append in one sync"). These tests hold that window open and check,
with real processes and real files:

* another process reads and lists the conversation during the window;
* the states a power cut there can leave, made on disk as that cut leaves
  them (the recorded simulation of ``test_powercut.py`` explores every cut
  point; here each state is built by hand, then opened by fresh processes):
  the entry back in ``pool/`` (a claimed entry not moved: ``convmem fsck``
  calls it a note, and the first process to use the site, a reader included,
  moves it into place before it looks), below a spare whose own rename was
  undone, both names kept (the old one removed), and a conflict (left alone,
  reported as an error, never claimed).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from convmem.logstore import FileStore, convpool, layout, poolclaims
from convmem.logstore.maintenance import CLAIM_NOT_MOVED, check

from ._common import SITE, subprocess_env

CONV = "claimed-conversation-01"
OTHER = "claimed-conversation-02"

#: Reads one conversation and the listing in a fresh process; prints them as JSON.
_READER = """
import json, sys
from convmem.logstore import FileStore, ListSelector, Range
store = FileStore(sys.argv[1])
items = [it.payload for it in store.read(sys.argv[2], sys.argv[3], Range(0, 1000))]
listed = [s.conversation_id for s in store.list_conversations(sys.argv[2], ListSelector(limit=100)).summaries]
store.close()
print(json.dumps({"items": items, "listed": listed}))
"""


def _read_elsewhere(root: Path, conv: str) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, "-c", _READER, str(root), SITE, conv],
        capture_output=True, env=subprocess_env(), timeout=60, check=False,
    )
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")[-2000:]
    out: dict[str, Any] = json.loads(proc.stdout)
    return out


@pytest.fixture
def held_fills(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Pool fills (which sync a claim's directories) are queued, never run: the window stays open."""
    queued: list[Any] = []
    monkeypatch.setattr(convpool, "request_fill", lambda pool, after=None, fill=None: queued.append(fill))
    return queued


def _claim(root: Path, batches: list[list[dict[str, Any]]]) -> Path:
    """First-append ``CONV`` from a filled pool, then more batches; the window held open. Its directory."""
    store = FileStore(root)
    try:
        store.append(SITE, "warm-up-conversation", [{"warm": True}])
        pool = store._pools[SITE]
        pool.fill()  # (queued, not run, by held_fills)
        pool._let_go()  # the entries are any process's, as after this process ends
        for b in batches:
            store.append(SITE, CONV, b)
        assert pool._unsynced, "the claim's directories were synced before the window could be seen"
        path = Path(layout.conversation_dir(str(root), SITE, CONV))
        assert poolclaims.read_identity(str(path)) == CONV, "the claim wrote no identity"
        return path
    finally:
        store._pools[SITE]._unsynced.clear()  # closing must not sync them either
        store.close()


BATCHES = [[{"n": 0, "text": "first"}, {"n": 1}], [{"n": 2, "text": "second"}]]
PAYLOADS = [p for b in BATCHES for p in b]


def test_read_by_another_process_in_the_window(tmp_path: Path, held_fills: list[Any]) -> None:
    root = tmp_path / "data"
    store = FileStore(root)
    try:
        store.append(SITE, "warm-up-conversation", [{"warm": True}])
        pool = store._pools[SITE]
        pool.fill()
        store.append(SITE, CONV, BATCHES[0])
        assert pool._unsynced, "the claim's directories were synced before the acknowledgement"
        seen = _read_elsewhere(root, CONV)
        assert seen["items"] == BATCHES[0]
        assert CONV in seen["listed"]
        store.append(SITE, CONV, BATCHES[1])  # a second batch in the window: one data sync
        assert _read_elsewhere(root, CONV)["items"] == PAYLOADS
    finally:
        store._pools[SITE]._unsynced.clear()
        store.close()


def _undo_rename(root: Path, path: Path) -> Path:
    """What a power cut that undid the claim's rename leaves: the entry back in ``pool/``; a new boot."""
    site = Path(layout.site_dir(str(root), SITE))
    back = site / layout.POOL_DIR / (layout.POOL_READY_PREFIX + "0123456789abcdef")
    os.rename(path, back)
    (site / layout.POOL_DIR / poolclaims.SETTLED_FILE).unlink(missing_ok=True)  # written in the old boot
    return back


def _kinds(root: Path) -> list[tuple[str, bool]]:
    return [(p.kind, p.resolves_itself) for p in check(str(root)).problems if p.kind == CLAIM_NOT_MOVED]


def test_claimed_entry_not_moved_is_read_and_moved_by_the_next_process(tmp_path: Path, held_fills: list[Any]) -> None:
    root = tmp_path / "data"
    path = _claim(root, BATCHES)
    back = _undo_rename(root, path)
    report = check(str(root))
    assert not report.unrepaired, [(p.kind, p.detail) for p in report.unrepaired]
    assert [p.kind for p in report.notes if p.kind == CLAIM_NOT_MOVED] == [CLAIM_NOT_MOVED]
    seen = _read_elsewhere(root, CONV)  # a reader is the first process to use the site
    assert seen["items"] == PAYLOADS
    assert CONV in seen["listed"]
    assert path.is_dir() and not back.exists()
    assert not _kinds(root)
    settled = Path(layout.pool_dir(layout.site_dir(str(root), SITE))) / poolclaims.SETTLED_FILE
    assert settled.is_file(), "the process that moved every claim did not note it"
    with FileStore(root) as store:  # appends continue at the next seq
        assert store.append(SITE, CONV, [{"n": 3}]).first == 3


def test_fsck_repair_moves_a_claimed_entry(tmp_path: Path, held_fills: list[Any]) -> None:
    root = tmp_path / "data"
    path = _claim(root, BATCHES)
    _undo_rename(root, path)
    report = check(str(root), repair=True)
    moved = [p for p in report.problems if p.kind == CLAIM_NOT_MOVED]
    assert [p.repaired for p in moved] == [True]
    assert path.is_dir()
    assert not check(str(root)).problems
    assert _read_elsewhere(root, CONV)["items"] == PAYLOADS


def test_claimed_entry_below_an_undone_spare(tmp_path: Path, held_fills: list[Any]) -> None:
    """The claim's rename kept, the rename of the spare it went into undone: the entry below ``c/<aa>/.spare``."""
    root = tmp_path / "data"
    path = _claim(root, BATCHES)
    bb = path.parent
    aa = bb.parent
    assert layout.fanout("warm-up-conversation") != layout.fanout(CONV)
    shutil.rmtree(aa / layout.SPARE_DIR, ignore_errors=True)
    os.rename(bb, aa / layout.SPARE_DIR)  # bb was that spare before the claim renamed it into place
    settled = Path(layout.pool_dir(layout.site_dir(str(root), SITE))) / poolclaims.SETTLED_FILE
    settled.unlink(missing_ok=True)
    assert [(u.conversation_id, poolclaims.fate(layout.site_dir(str(root), SITE), u))
            for u in poolclaims.unmoved(layout.site_dir(str(root), SITE))] == [(CONV, poolclaims.MOVE)]
    assert not check(str(root)).unrepaired
    assert _read_elsewhere(root, CONV)["items"] == PAYLOADS
    assert path.is_dir()


def test_old_name_kept_beside_the_new_one_is_removed(tmp_path: Path, held_fills: list[Any]) -> None:
    """Both names durable (the new parent synced, the pool not): the pool's copy is the old name."""
    root = tmp_path / "data"
    path = _claim(root, BATCHES)
    old = Path(layout.pool_dir(layout.site_dir(str(root), SITE))) / (layout.POOL_READY_PREFIX + "00000000000000aa")
    shutil.copytree(path, old)
    assert _kinds(root) == [(CLAIM_NOT_MOVED, True)]
    assert _read_elsewhere(root, CONV)["items"] == PAYLOADS
    assert not old.exists()


def test_conflicting_entry_is_left_and_reported(tmp_path: Path, held_fills: list[Any]) -> None:
    """An entry naming a conversation whose directory holds no such identity: never used, moved or removed."""
    root = tmp_path / "data"
    path = _claim(root, BATCHES)
    odd = Path(layout.pool_dir(layout.site_dir(str(root), SITE))) / (layout.POOL_READY_PREFIX + "00000000000000bb")
    shutil.copytree(path, odd)
    with open(path / layout.LOCK_FILE, "r+b") as f:  # the conversation's own directory loses its identity
        f.write(bytes(poolclaims.LOCK_BYTES))
    assert _kinds(root) == [(CLAIM_NOT_MOVED, False)]
    with FileStore(root) as store:
        for i in range(convpool.TARGET + 2):  # more first appends than the pool holds: none takes it
            store.append(SITE, f"{OTHER}-{i}", [{"i": i}])
    assert odd.is_dir() and poolclaims.read_identity(str(odd)) == CONV
    assert _read_elsewhere(root, CONV)["items"] == PAYLOADS


def test_identity_round_trip_and_rejects() -> None:
    raw = poolclaims.encode(CONV)
    assert poolclaims.decode(raw + bytes(poolclaims.LOCK_BYTES - len(raw))) == CONV
    assert poolclaims.decode(bytes(poolclaims.LOCK_BYTES)) is None
    for i in range(len(raw)):
        torn = bytearray(raw)
        torn[i] ^= 0x40
        assert poolclaims.decode(bytes(torn)) is None, i
    assert poolclaims.decode(raw[:-1]) is None
