"""Online backup under concurrent appends from real processes, then a restore from the copy.

Writer processes append batches of random size to several conversations each
(small segments, so segments roll while the backup runs) and print every
acknowledged batch. ``convmem backup`` runs meanwhile. The copy must pass
``convmem fsck``, hold every batch acknowledged before the backup started,
and hold each conversation as a prefix of whole acknowledged batches, byte
for byte. The seed is printed; rerun with CONVMEM_TEST_SEED=N.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from convmem.logstore import FileStore, Range
from convmem.logstore.maintenance import check
from convmem.logstore.site_credentials import CredentialFile
from tests.logstore_helpers import write_at_data_end
from tests.tools_support import REPO, cli

SITE = "site-backup"
PASSWORD = "backup-site-password-1"

WRITER = """
import json, os, random, sys
from convmem.logstore import FileStore
root, stop, site, w, seed = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
rng = random.Random(seed)
with FileStore(root, segment_bytes=8192, lock_timeout=30) as store:
    b = 0
    while not os.path.exists(stop):
        cid = f"w{w}-conv-{rng.randrange(4):02d}"
        n = rng.randint(1, 6)
        items = [{"w": w, "b": b, "i": i, "pad": "x" * ((b * 7 + i) % 90)} for i in range(n)]
        r = store.append(site, cid, items)
        print(json.dumps([cid, b, n, r.first, r.last]), flush=True)
        b += 1
"""


def _items(w: int, b: int, n: int) -> list[dict[str, Any]]:
    return [{"w": w, "b": b, "i": i, "pad": "x" * ((b * 7 + i) % 90)} for i in range(n)]


class Writer:
    def __init__(self, root: Path, stop: Path, w: int, seed: int) -> None:
        self.w = w
        self.proc = subprocess.Popen(
            [sys.executable, "-c", WRITER, str(root), str(stop), SITE, str(w), str(seed)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=dict(os.environ, PYTHONPATH=str(REPO)),
        )
        self.acks: list[tuple[str, int, int, int, int]] = []
        self.lock = threading.Lock()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            cid, b, n, first, last = json.loads(line)
            with self.lock:
                self.acks.append((cid, b, n, first, last))

    def snapshot(self) -> list[tuple[str, int, int, int, int]]:
        with self.lock:
            return list(self.acks)


def test_backup_under_concurrent_appends_then_restore(tmp_path: Path) -> None:
    seed = int(os.environ.get("CONVMEM_TEST_SEED", random.randrange(1 << 30)))
    print(f"seed={seed} (rerun with CONVMEM_TEST_SEED={seed})")
    root, stop, dest = tmp_path / "data", tmp_path / "stop", tmp_path / "backup"
    CredentialFile(root).ensure_dir()
    CredentialFile(root).add(SITE, PASSWORD)
    writers = [Writer(root, stop, w, seed + w) for w in range(3)]
    try:
        deadline = time.monotonic() + 60
        while min(len(wr.snapshot()) for wr in writers) < 40:
            assert time.monotonic() < deadline, [wr.proc.stderr.read() for wr in writers if wr.proc.poll() is not None]
            time.sleep(0.02)
        before = {wr.w: wr.snapshot() for wr in writers}
        res = cli("backup", str(root), str(dest), timeout=120)
        during = {wr.w: len(wr.snapshot()) for wr in writers}
        assert res.returncode == 0, res.stderr.decode()
        time.sleep(0.2)
    finally:
        stop.touch()
        for wr in writers:
            wr.proc.wait(timeout=60)
            wr.reader.join(timeout=10)
    for wr in writers:
        assert wr.proc.returncode == 0, wr.proc.stderr.read() if wr.proc.stderr else ""
        # Writers kept appending while the backup ran.
        assert during[wr.w] > len(before[wr.w]), (during, {k: len(v) for k, v in before.items()})

    assert cli("fsck", str(dest)).returncode == 0
    assert not check(dest).problems
    assert CredentialFile(dest).verify(SITE, PASSWORD)  # credentials came along

    with FileStore(str(dest)) as store:
        for wr in writers:
            acks = wr.snapshot()
            by_conv: dict[str, list[tuple[int, int, int, int]]] = {}
            for cid, b, n, first, last in acks:
                by_conv.setdefault(cid, []).append((b, n, first, last))
            acked_before = {cid for cid, *_ in before[wr.w]}
            for cid, batches in by_conv.items():
                got = []
                while True:
                    page = store.read(SITE, cid, Range(len(got), 1000))
                    if not page:
                        break
                    got.extend(page)
                assert [i.seq for i in got] == list(range(len(got)))
                ends = {0} | {last + 1 for _, _, _, last in batches}
                assert len(got) in ends, f"{cid}: {len(got)} items is not a whole number of batches {sorted(ends)}"
                expected = [item for b, n, _, _ in batches for item in _items(wr.w, b, n)]
                assert [i.payload for i in got] == expected[: len(got)]
                must_have = max((last + 1 for c, _, _, _, last in before[wr.w] if c == cid), default=0)
                assert len(got) >= must_have, f"{cid}: an acknowledged batch from before the backup is missing"
                if cid in acked_before:
                    assert got
        # The restored copy is a working data directory.
        r = store.append(SITE, "restored-conv", [{"after": "restore"}])
        assert store.read(SITE, "restored-conv", Range(r.first, 1))[0].payload == {"after": "restore"}
    assert cli("fsck", str(dest)).returncode == 0


def test_torn_tail_is_cut_from_the_copy_not_the_source(tmp_path: Path) -> None:
    root, dest = tmp_path / "data", tmp_path / "backup"
    with FileStore(str(root)) as store:
        for n in range(5):
            store.append(SITE, "torn-conv-1", [{"n": n}])
    (seg,) = (p for p in (root / "sites").rglob("*.seg") if "pool" not in p.parts)  # not the site's pool
    records_end = write_at_data_end(seg, b"\x17" * 30)  # a crashed writer's partial record
    size = seg.stat().st_size
    res = cli("backup", str(root), str(dest))
    assert res.returncode == 0, res.stderr.decode()
    assert seg.stat().st_size == size  # the source is never changed
    (copied,) = dest.rglob("*.seg")
    assert copied.stat().st_size == records_end
    assert cli("fsck", str(dest)).returncode == 0
    with FileStore(str(dest)) as store:
        assert [i.payload for i in store.read(SITE, "torn-conv-1", Range(0, 10))] == [{"n": n} for n in range(5)]


def test_backup_refuses_an_existing_or_nested_destination(tmp_path: Path) -> None:
    root = tmp_path / "data"
    with FileStore(str(root)) as store:
        store.append(SITE, "some-conv-1", [{"n": 1}])
    (tmp_path / "taken").mkdir()
    res = cli("backup", str(root), str(tmp_path / "taken"))
    assert res.returncode == 8 and b"already exists" in res.stderr
    res = cli("backup", str(root), str(root / "inside"))
    assert res.returncode == 8 and b"inside the data directory" in res.stderr
    res = cli("backup", str(tmp_path / "taken"), str(tmp_path / "b2"))
    assert res.returncode == 8 and b"not a logstore data directory" in res.stderr
    assert not (tmp_path / "b2").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data", "taken"]


def test_per_site_stores_are_copied_by_the_copiers_passed_in(tmp_path: Path) -> None:
    from convmem.logstore import layout
    from convmem.logstore.maintenance import BackupExtra, backup

    root, dest = tmp_path / "data", tmp_path / "backup"
    with FileStore(str(root)) as store:
        store.append(SITE, "extras-conv-1", [{"n": 1}])
    calls: list[tuple[str, str]] = []

    def copier(src_site: str, dst_site: str, lock_timeout: float) -> None:
        calls.append((src_site, dst_site))
        assert os.path.isdir(dst_site)

    roots: list[str] = []
    backup(root, dest, extras=(BackupExtra(site=copier, root=lambda src, dst, timeout: roots.append(src)),))
    assert roots == [str(root)]
    assert calls == [(layout.site_dir(str(root), SITE), layout.site_dir(str(dest) + f".partial-{os.getpid()}", SITE))]


MEMORY_WRITER = """
import json, os, random, sys
from convmem.logstore.memories import LongTermMemory
from convmem.logstore.memories.state import record_body
root, stop, site, seed = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
rng = random.Random(seed)

def snapshot(store):
    return sorted(json.dumps(record_body(m), sort_keys=True) for m in store.all(site))

with LongTermMemory(root, lock_timeout=30) as store:
    print(json.dumps(snapshot(store)), flush=True)
    n = 0
    while not os.path.exists(stop):
        live = [m for m in store.all(site) if m.active]
        roll = rng.random()
        if not live or roll < 0.45 or len(live) < 4:
            raw = {"category": "fact", "subject": f"backup subject {n}", "summary": f"summary {n} pelican{n}",
                   "details": "d" * (n % 50), "tags": [f"t{n % 3}"], "dedupe_key": f"bk-{n}"}
            _, tok, _ = store.verify(site, "create", raw)
            store.upsert(site, raw, tok)
        elif roll < 0.75:
            m = rng.choice(live)
            raw = {**m.fields.to_json(), "summary": f"summary {n} updated"}
            _, tok, _ = store.verify(site, "update", raw, m.memory_id)
            store.upsert(site, raw, tok, memory_id=m.memory_id)
        else:
            m = rng.choice(live)
            force = rng.random() < 0.5
            _, tok, _ = store.verify(site, "delete", None, m.memory_id, force=force)
            store.delete(site, m.memory_id, tok, force=force)
        n += 1
        print(json.dumps(snapshot(store)), flush=True)
"""


def test_backup_copies_memories_written_meanwhile(tmp_path: Path) -> None:
    """Memories written by another process during the backup: the copy holds the store as it was at one moment."""
    import pytest

    from convmem.logstore.memories import LongTermMemory, VerifyRequired
    from convmem.logstore.memories.state import record_body

    seed = int(os.environ.get("CONVMEM_TEST_SEED", random.randrange(1 << 30)))
    print(f"seed={seed} (rerun with CONVMEM_TEST_SEED={seed})")
    root, stop, dest = tmp_path / "data", tmp_path / "stop", tmp_path / "backup"
    with FileStore(str(root)) as store:
        store.append(SITE, "mem-conv-1", [{"n": 1}])
    raw_unused = {"category": "fact", "subject": "minted before the backup", "summary": "kept for later"}
    raw_used = {"category": "fact", "subject": "written before the backup", "summary": "its token is spent"}
    with LongTermMemory(root) as mem:
        _, unused_token, _ = mem.verify(SITE, "create", raw_unused)
        _, used_token, _ = mem.verify(SITE, "create", raw_used)
        mem.upsert(SITE, raw_used, used_token)
    proc = subprocess.Popen(
        [sys.executable, "-c", MEMORY_WRITER, str(root), str(stop), SITE, str(seed)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
    )
    states: list[list[str]] = []
    lock = threading.Lock()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            with lock:
                states.append(json.loads(line))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 60
        while len(states) < 20:
            assert time.monotonic() < deadline and proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            time.sleep(0.02)
        seen_before = len(states)
        res = cli("backup", str(root), str(dest), timeout=120)
        assert res.returncode == 0, res.stderr.decode()
        with lock:
            seen_during = len(states)
    finally:
        stop.touch()
        proc.wait(timeout=60)
        reader.join(timeout=10)
    assert proc.returncode == 0, proc.stderr.read() if proc.stderr else ""
    with LongTermMemory(dest) as mem:
        copied = sorted(json.dumps(record_body(m), sort_keys=True) for m in mem.all(SITE))
        # The writer's states include the memory written before it started (all() lists every memory).
        # A state printed before the backup started was on disk then; the writer may run ahead of its prints.
        candidates = states[seen_before - 1 :]
        assert seen_during > seen_before  # the writer kept writing while the backup ran
        assert copied in candidates, f"the copy's memories match no state the source held during the backup ({seed})"
    fsck = cli("fsck", str(dest))
    assert fsck.returncode == 0, fsck.stdout.decode() + fsck.stderr.decode()
    assert b"memories: 1 site" in fsck.stdout, fsck.stdout.decode()
    # The memory tools work on the copy: a token minted by the source is accepted, a used one stays used.
    with LongTermMemory(dest) as mem:
        with pytest.raises(VerifyRequired):
            mem.upsert(SITE, raw_used, used_token)
        fresh = mem.upsert(SITE, raw_unused, unused_token)
        assert mem.get(SITE, fresh.memory_id).fields.subject == "minted before the backup"
        hits = mem.search(SITE, "minted before the backup", limit=3)
        assert hits and hits[0][0].memory_id == fresh.memory_id
        _, tok, _ = mem.verify(SITE, "delete", None, fresh.memory_id, force=True)
        assert mem.delete(SITE, fresh.memory_id, tok, force=True) is None
    assert cli("fsck", str(dest)).returncode == 0
