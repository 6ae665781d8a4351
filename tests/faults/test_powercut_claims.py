"""A first append in one sync: the window between its acknowledgement and the sync of its rename.

A claim renames a pool entry into place, writes the first segment (its
header, the conversation's identity record and the batch, in one write),
syncs that one file and acknowledges; the directories the rename changed are
synced afterwards (FORMAT.md 6, "A first append in one sync"). These tests
hold that window open and check, with real processes and real files:

* the first append syncs one file and no directory;
* another process reads and lists the conversation during the window;
* the states a power cut there can leave, made on disk as that cut leaves
  them (the recorded simulation of ``test_powercut.py`` explores every cut
  point; here each state is built by hand, then opened by fresh processes):
  the entry back in ``pool/`` (a claimed entry not moved: ``convmem fsck``
  calls it a note, and the first process to use the site, a reader included,
  moves it into place before it looks), below a spare whose own rename was
  undone, both names kept (the old one removed), and a conflict (left alone,
  reported as an error, never claimed);
* ``convmem export``, ``backup`` and ``locate`` of a copy no engine opened
  since the cut see the conversation in the entry;
* an entry claimed by an engine that wrote the identity into the lock file
  (and a segment without an identity record) is found and moved the same way;
  an entry whose identity record is torn held nothing acknowledged and is
  removed, never claimed.
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

from convmem.logstore import FileStore, Range, convpool, fileio, frame, layout, poolclaims
from convmem.logstore.maintenance import CLAIM_NOT_MOVED, backup, check, export_items, locate_conversation, scan_segment

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
    monkeypatch.setattr(convpool, "request_fill", lambda pool, fill=None: queued.append(fill))
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
    _drop_identity(path)  # the conversation's own directory loses its identity
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


def _identity_end(seg: bytes) -> int:
    h = frame.decode_record_header(seg, frame.SEGMENT_HEADER_SIZE)
    assert h.kind == frame.KIND_IDENTITY, h
    return frame.SEGMENT_HEADER_SIZE + h.size


def _drop_identity(path: Path) -> None:
    """Rewrite a claimed conversation's first segment without its identity record (as created in place)."""
    seg = path / layout.segment_name(0)
    data = seg.read_bytes()
    end = _identity_end(data)
    seg.write_bytes(data[: frame.SEGMENT_HEADER_SIZE] + data[end:] + bytes(end - frame.SEGMENT_HEADER_SIZE))
    for idx in path.glob("*.idx"):
        idx.unlink()  # its offsets moved


def test_first_append_syncs_one_file_and_no_directory(tmp_path: Path, held_fills: list[Any]) -> None:
    root = tmp_path / "data"
    store = FileStore(root)
    ops: list[tuple[Any, ...]] = []
    try:
        store.append(SITE, "warm-up-conversation", [{"warm": True}])
        pool = store._pools[SITE]
        pool.fill()
        fileio.recorder = lambda *op: ops.append(op)
        try:
            store.append(SITE, CONV, BATCHES[0])
        finally:
            fileio.recorder = None
        assert pool._unsynced, "the first append did not claim a pool entry"
    finally:
        store._pools[SITE]._unsynced.clear()
        store.close()
    syncs = [op[0] for op in ops if op[0] in ("sync", "dirsync")]
    assert syncs == ["sync"], ops
    info, records = scan_segment(Path(layout.conversation_dir(str(root), SITE, CONV)) / layout.segment_name(0))
    assert [(r.kind, r.conversation_id) for r in records] == [("identity", CONV), ("batch", None)]
    assert records[0].offset == frame.SEGMENT_HEADER_SIZE and info.base_seq == 0


def test_export_backup_and_locate_see_a_claimed_entry_not_moved(tmp_path: Path, held_fills: list[Any]) -> None:
    """A copy of the data directory no engine opened since the cut: the tools read the entry where it is."""
    root = tmp_path / "data"
    path = _claim(root, BATCHES)
    back = _undo_rename(root, path)
    exported = [(e.conversation_id, e.seq, json.loads(e.payload)) for e in export_items(str(root), SITE)]
    assert [(c, s, p) for c, s, p in exported if c == CONV] == [(CONV, i, p) for i, p in enumerate(PAYLOADS)]
    one = [json.loads(e.payload) for e in export_items(str(root), SITE, CONV)]
    assert one == PAYLOADS
    assert Path(locate_conversation(str(root), SITE, CONV).directory) == back
    assert back.is_dir() and not path.exists(), "a tool moved the entry (only engines and --repair do)"
    dest = tmp_path / "copy"
    report = backup(str(root), str(dest), extras=[])
    assert report.conversations == 2
    assert not report.check.unrepaired, [(p.kind, p.detail) for p in report.check.unrepaired]
    assert (Path(layout.conversation_dir(str(dest), SITE, CONV)) / layout.segment_name(0)).is_file()
    assert [json.loads(e.payload) for e in export_items(str(dest), SITE, CONV)] == PAYLOADS
    assert _read_elsewhere(dest, CONV)["items"] == PAYLOADS


def test_entry_claimed_with_the_identity_in_its_lock_file(tmp_path: Path, held_fills: list[Any]) -> None:
    """As an older engine leaves it: no identity record, the identity in the lock file's first sector."""
    root = tmp_path / "data"
    path = _claim(root, BATCHES)
    _drop_identity(path)
    with open(path / layout.LOCK_FILE, "r+b") as f:
        raw = poolclaims.encode(CONV)
        f.write(raw + bytes(poolclaims.LOCK_BYTES - len(raw)))
    back = _undo_rename(root, path)
    assert [(u.path, u.conversation_id) for u in poolclaims.unmoved(layout.site_dir(str(root), SITE))] == [
        (str(back), CONV)
    ]
    assert [json.loads(e.payload) for e in export_items(str(root), SITE, CONV)] == PAYLOADS
    seen = _read_elsewhere(root, CONV)
    assert seen["items"] == PAYLOADS and CONV in seen["listed"]
    assert path.is_dir() and not back.exists()


def test_torn_identity_is_removed_never_claimed(tmp_path: Path, held_fills: list[Any]) -> None:
    """The identity record not whole: the sync that acknowledges never returned, so nothing there counts."""
    root = tmp_path / "data"
    path = _claim(root, BATCHES[:1])
    seg = path / layout.segment_name(0)
    data = bytearray(seg.read_bytes())
    data[frame.SEGMENT_HEADER_SIZE + frame.RECORD_HEADER_SIZE] ^= 0x01  # a byte of the id
    seg.write_bytes(bytes(data))
    back = _undo_rename(root, path)
    assert poolclaims.read_identity(str(back)) is None
    assert not poolclaims.unmoved(layout.site_dir(str(root), SITE))
    with FileStore(root) as store:
        for i in range(convpool.TARGET + 2):  # more first appends than the pool holds: none takes it
            assert store.append(SITE, f"{OTHER}-{i}", [{"i": i}]).first == 0
        assert [it.payload for it in store.read(SITE, CONV, Range(0, 10))] == []
    assert not back.exists()


def test_segment_identity_round_trip_and_rejects() -> None:
    salt = frame.new_salt()
    head = frame.encode_segment_header(0, salt) + frame.encode_identity(salt, 1, CONV)
    assert poolclaims.segment_identity(head) == CONV
    assert poolclaims.segment_identity(bytes(len(head))) is None
    for i in range(len(head) - frame.TRAILER_SIZE):  # (the trailer decides nothing, FORMAT.md 3)
        torn = bytearray(head)
        torn[i] ^= 0x40
        assert poolclaims.segment_identity(bytes(torn)) is None, i
    assert poolclaims.segment_identity(head[: -frame.TRAILER_SIZE - 1]) is None
    other = frame.encode_segment_header(0, salt + 1 if salt + 1 < 1 << 64 else 1) + head[frame.SEGMENT_HEADER_SIZE :]
    assert poolclaims.segment_identity(other) is None, "an identity of another salt"
    later = frame.encode_segment_header(5, salt) + head[frame.SEGMENT_HEADER_SIZE :]
    assert poolclaims.segment_identity(later) is None, "an identity in a segment after the first"
