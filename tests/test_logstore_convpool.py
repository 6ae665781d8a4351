"""The site's pool of pre-created conversation directories (logstore.convpool).

A first append claims an entry by renaming it into place; the pool is never
seen by anything that lists a site; leftovers (unfinished entries, entries
holding data a lost rename left behind) are discarded; an existing directory
is never replaced; processes racing to create the same conversations lose
nothing.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from convmem.logstore import FileStore, Io, ListSelector, Range, background, convpool, fileio, layout
from convmem.logstore.maintenance import check, stats

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from faults._common import SITE, make_batch, read_acks, subprocess_env, verify, writer_cmd

pytestmark = pytest.mark.skipif(not fileio.can_rename_noreplace(), reason="needs renameat2(RENAME_NOREPLACE)")


@pytest.fixture
def inline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(convpool, "inline_fill", True)


def _pool(root: Path) -> Path:
    return Path(layout.pool_dir(layout.site_dir(str(root), SITE)))


def _entries(root: Path) -> dict[str, int]:
    """Pool entry name -> inode of its segment file."""
    out = {}
    pool = _pool(root)
    for name in sorted(os.listdir(pool)) if pool.is_dir() else ():
        seg = pool / name / layout.segment_name(0)
        out[name] = os.stat(seg).st_ino if seg.exists() else -1
    return out


def _seg_inode(root: Path, conv: str) -> int:
    return os.stat(os.path.join(layout.conversation_dir(str(root), SITE, conv), layout.segment_name(0))).st_ino


def test_first_appends_claim_pool_entries(tmp_path: Path, inline: None) -> None:
    root = tmp_path / "data"
    store = FileStore(root, conversation_pool=True)
    try:
        store.append(SITE, "conv-first-0", [{"n": 0}])  # no pool yet: created in place, then the pool is filled
        before = _entries(root)
        assert len(before) == convpool.TARGET and all(n.startswith(layout.POOL_READY_PREFIX) for n in before)
        for i in range(1, 2 * convpool.TARGET + 1):
            pooled = _entries(root)
            r = store.append(SITE, f"conv-first-{i}", [{"n": i}, {"n": i, "k": 2}])
            assert (r.first, r.last) == (0, 1)
            # It took a pre-created segment, whose entry left the pool.
            assert _seg_inode(root, f"conv-first-{i}") in pooled.values()
            gone = set(pooled) - set(_entries(root))
            assert len(gone) == 1 and pooled[gone.pop()] == _seg_inode(root, f"conv-first-{i}")
        assert store.append(SITE, "conv-first-1", [{"n": "again"}]).first == 2
        listed = {s.conversation_id for s in store.list_conversations(SITE, ListSelector(limit=100)).summaries}
        assert listed == {f"conv-first-{i}" for i in range(2 * convpool.TARGET + 1)}
        assert [it.payload for it in store.read(SITE, "conv-first-1", _all())] == [
            {"n": 1},
            {"n": 1, "k": 2},
            {"n": "again"},
        ]
    finally:
        store.close()
    assert _entries(root), "the pool was refilled"
    report = check(root)
    assert not report.problems, [f"{p.kind}: {p.file}" for p in report.problems]
    [site_stats] = stats(root, SITE)
    assert site_stats.conversations == 2 * convpool.TARGET + 1
    pool_bytes = sum(f.stat().st_size for f in _pool(root).rglob("*") if f.is_file())
    all_bytes = sum(f.stat().st_size for f in Path(layout.site_dir(str(root), SITE)).rglob("*") if f.is_file())
    assert pool_bytes and site_stats.bytes_on_disk == all_bytes - pool_bytes


def _all() -> Any:
    return Range(0, 100)


def test_dirty_and_unfinished_entries_are_discarded(tmp_path: Path, inline: None) -> None:
    """An entry holding data (a claim whose rename a power cut undid) and one whose builder died are removed."""
    root = tmp_path / "data"
    store = FileStore(root, conversation_pool=True)
    store.append(SITE, "conv-dirty-0", [{"n": 0}])
    store.close()
    pool = _pool(root)
    names = sorted(os.listdir(pool))
    # What a lost claim leaves: data written into the entry's segment (never acknowledged).
    seg = pool / names[0] / layout.segment_name(0)
    seg.write_bytes(b"\x07" * seg.stat().st_size)
    # What a builder killed mid-way leaves (its lock free).
    (pool / (layout.POOL_BUILDING_PREFIX + "00000000deadbeef")).mkdir()
    (pool / (layout.POOL_BUILDING_PREFIX + "00000000deadbeef") / layout.LOCK_FILE).write_bytes(b"")
    store = FileStore(root, conversation_pool=True)
    try:
        for i in range(1, len(names) + 2):
            r = store.append(SITE, f"conv-dirty-{i}", [{"n": i}])
            assert r.first == 0
            assert [it.payload for it in store.read(SITE, f"conv-dirty-{i}", _all())] == [{"n": i}]
    finally:
        store.close()
    left = os.listdir(pool)
    assert names[0] not in left, "the entry holding data was not discarded"
    assert not [n for n in left if n.startswith(layout.POOL_BUILDING_PREFIX)], left
    assert not check(root).problems


def test_an_existing_directory_is_never_replaced(tmp_path: Path, inline: None) -> None:
    """rename(2) would replace an empty directory: one another process just made must stay."""
    root = tmp_path / "data"
    store = FileStore(root, conversation_pool=True)
    try:
        store.append(SITE, "conv-exist-0", [{"n": 0}])
        entries = _entries(root)
        path = layout.conversation_dir(str(root), SITE, "conv-exist-1")
        os.makedirs(path)  # as another process's in-place creation leaves it before its lock file
        marker = os.stat(path).st_ino
        # This store's object for it was made before the directory existed.
        conv = store._conversation(SITE, "conv-exist-1")
        assert conv.pool is not None
        assert conv.pool.claim(path) is None
        assert os.stat(path).st_ino == marker
        assert store.append(SITE, "conv-exist-1", [{"n": 1}]).first == 0
        assert os.stat(path).st_ino == marker
        assert set(entries) <= set(_entries(root)) | set(entries)
    finally:
        store.close()


def test_failed_first_append_after_a_claim_syncs_the_pool_on_retry(tmp_path: Path, inline: None) -> None:
    root = tmp_path / "data"
    store = FileStore(root, conversation_pool=True)
    synced: list[str] = []
    try:
        store.append(SITE, "conv-retry-0", [{"n": 0}])
        assert _entries(root)
        fails = iter([True])

        def hook(op: str) -> None:
            if op == "fdatasync" and next(fails, False):
                raise OSError(5, "injected")

        fileio.fault_hook = hook
        with pytest.raises(Io):
            store.append(SITE, "conv-retry-1", [{"n": 1}])
        fileio.fault_hook = None
        path = layout.conversation_dir(str(root), SITE, "conv-retry-1")
        assert os.path.isdir(path), "the claim stays: its directory is the conversation's now"
        assert convpool.unsettled(path), "its directories are still owed a sync"

        def rec(kind: str, *args: Any) -> None:
            if kind == "dirsync":
                synced.append(args[0])

        fileio.recorder = rec
        assert store.append(SITE, "conv-retry-1", [{"n": 2}]).first == 0
        fileio.recorder = None
        assert str(_pool(root)) in synced and os.path.dirname(path) in synced
        assert not convpool.unsettled(path)
        assert [it.payload for it in store.read(SITE, "conv-retry-1", _all())] == [{"n": 2}]
    finally:
        fileio.fault_hook = None
        fileio.recorder = None
        store.close()


def test_drop_site_takes_the_pool(tmp_path: Path) -> None:
    root = tmp_path / "data"
    store = FileStore(root, conversation_pool=True)
    try:
        for i in range(3):
            store.append(SITE, f"conv-drop-{i}", [{"n": i}])
        assert background.wait(10)  # the pool is filled by a background job
        assert _entries(root)
        store.drop_site(SITE)
        time.sleep(0.05)
        assert not os.path.exists(layout.site_dir(str(root), SITE)), "the site (or its pool) came back"
        assert store.sites() == []
    finally:
        store.close()


def test_processes_racing_to_create_the_same_conversations(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Writers in several processes append to the same new conversations at once: exactly one creates each."""
    seed = int(os.environ.get("CONVMEM_POOL_SEED", "0")) or random.SystemRandom().randrange(1, 2**31)
    print(f"pool race seed {seed} (rerun with CONVMEM_POOL_SEED={seed})")
    rng = random.Random(seed)
    root = tmp_path / "data"
    monkeypatch.setattr(convpool, "inline_fill", True)
    store = FileStore(root, conversation_pool=True)
    store.append(SITE, "race-warm-000", make_batch("warm", 0, 1, 1))  # the site and its pool exist
    store.close()
    pooled = set(_entries(root))
    assert pooled
    convs = [f"race-conv-{i:03d}" for i in range(24)]
    acks = tmp_path / "acks.jsonl"
    procs = [
        subprocess.Popen(
            writer_cmd(
                *("--data-dir", str(root), "--id", f"w{k}", "--convs", ",".join(convs), "--acks", str(acks)),
                *("--batches", "30", "--seed", str(rng.randrange(2**31)), "--max-pad", "50", "--conversation-pool"),
            ),
            env=subprocess_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for k in range(4)
    ]
    for p in procs:
        _out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err.decode(errors="replace")[-2000:]
    acked = read_acks(str(acks))
    assert len(acked) == 4 * 30
    store = FileStore(root, conversation_pool=True)
    try:
        logs = verify(store, SITE, acked, [*convs, "race-warm-000"])
    finally:
        store.close()
    assert pooled - set(_entries(root)), "no writer claimed a pool entry"
    assert sum(len(v) for v in logs.values()) == 1 + sum(a.n for a in acked), "items that no writer acknowledged"
    assert not check(root).problems


def test_a_claim_makes_no_file_or_directory_on_the_appends_path(tmp_path: Path, inline: None) -> None:
    """With the pool and the spares filled, a first append only renames: new <aa> and <bb> come from spares."""
    root = tmp_path / "data"
    store = FileStore(root, conversation_pool=True)
    ops: list[tuple[str, str]] = []

    def rec(kind: str, *args: Any) -> None:
        ops.append((kind, str(args[0]) if args else ""))

    try:
        store.append(SITE, "conv-spare-000", [{"n": 0}])
        new_aa = 0
        fileio.recorder = rec
        for i in range(1, 41):
            conv = f"conv-spare-{i:03d}"
            bb_dir = os.path.dirname(layout.conversation_dir(str(root), SITE, conv))
            new_aa += not os.path.isdir(os.path.dirname(bb_dir))
            ops.clear()
            assert store.append(SITE, conv, [{"n": i}]).first == 0
            # Inline fills run after the append is durable: look at what came before its data sync.
            path = [k for k, _ in ops[: next(j for j, (k, _) in enumerate(ops) if k == "sync")]]
            assert "mkdir" not in path and "create" not in path, (conv, ops)
            assert path.count("rename") >= 2, (conv, ops)  # a <bb> spare (this site is small) and the entry
        assert new_aa >= 5, "the conversations should include new <aa> directories"
    finally:
        fileio.recorder = None
        store.close()
    assert not check(root).problems


def test_a_first_batch_of_ten_kib_items_fits_the_claimed_entry(tmp_path: Path, inline: None) -> None:
    """A first batch of ten 1 KiB items goes into the entry's zeros: the claim commits no new size."""
    root = tmp_path / "data"
    store = FileStore(root, conversation_pool=True)
    try:
        store.append(SITE, "conv-size-000", [{"n": 0}])
        items = [{"n": i, "text": "x" * 1000} for i in range(10)]
        pooled = _entries(root)
        assert {os.stat(_pool(root) / n / layout.segment_name(0)).st_size for n in pooled} == {convpool.ENTRY_BYTES}
        assert store.append(SITE, "conv-size-001", items).first == 0
        assert _seg_inode(root, "conv-size-001") in pooled.values()
        seg = os.path.join(layout.conversation_dir(str(root), SITE, "conv-size-001"), layout.segment_name(0))
        assert os.stat(seg).st_size == convpool.ENTRY_BYTES, "the write stayed inside the entry's synced zeros"
        assert [it.payload for it in store.read(SITE, "conv-size-001", _all())] == items
    finally:
        store.close()
    assert not check(root).problems


def test_the_refill_is_asked_for_with_every_lock_of_the_append_let_go(tmp_path: Path) -> None:
    """A first append asks for the pool's refill after it let go of the conversation and of the site."""
    root = tmp_path / "data"
    store = FileStore(root, conversation_pool=True)
    held: list[bool] = []
    try:
        store.append(SITE, "conv-refill-00", [{"n": 0}])
        background.wait()
        pool = store._pools[SITE]
        real = pool._request_fill

        def request(p: convpool.SitePool) -> None:
            conv = store._convs[(SITE, "conv-refill-01")]
            held.append(conv.mutex.locked())
            real(p)

        pool._request_fill = request  # type: ignore[method-assign]
        assert store.append(SITE, "conv-refill-01", [{"n": 1}]).first == 0
        background.wait()
    finally:
        store.close()
    assert held == [False], held
    assert not check(root).problems


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_leaves_its_parents_entries_alone(tmp_path: Path) -> None:
    """Entries a process built stay locked for it; a forked child closes its copies and goes its own way."""
    root = tmp_path / "data"
    store = FileStore(root, conversation_pool=True)
    try:
        store.append(SITE, "conv-fork-parent-0", [{"p": 0}])
        assert background.wait(10)
        held = set(store._pools[SITE]._held)
        assert held and held <= set(_entries(root))
        pid = os.fork()
        if pid == 0:  # pragma: no cover (the child reports by its exit status)
            status = 1
            try:
                child = FileStore(root, conversation_pool=True)
                ok = child.append(SITE, "conv-fork-child-1", [{"c": 1}]).first == 0
                ok = ok and store.append(SITE, "conv-fork-child-2", [{"c": 2}]).first == 0
                ok = ok and not store._pools[SITE]._held.keys() & held  # let go of the parent's in the child
                background.wait(10)
                child.close()
                status = 0 if ok else 2
            finally:
                os._exit(status)
        _, wstatus = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(wstatus) == 0
        assert store.append(SITE, "conv-fork-parent-1", [{"p": 1}]).first == 0
        # The child could not lock the parent's entries: all but the one the parent's claim took are there.
        assert len(held - set(_entries(root))) == 1
        for conv, payload in (
            ("conv-fork-parent-0", {"p": 0}),
            ("conv-fork-parent-1", {"p": 1}),
            ("conv-fork-child-1", {"c": 1}),
            ("conv-fork-child-2", {"c": 2}),
        ):
            assert [it.payload for it in store.read(SITE, conv, _all())] == [payload], conv
        # The child exited without closing the parent's store it appended through, owing that
        # append's commit record: the listing settles it from the log (FORMAT.md 5).
        listed = {s.conversation_id for s in store.list_conversations(SITE, ListSelector(limit=100)).summaries}
        assert "conv-fork-child-2" in listed
    finally:
        store.close()
    assert not check(root).problems


def test_entries_kept_open_stay_within_the_process_budget(
    tmp_path: Path, inline: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past convpool.MAX_HELD, built entries are closed and claimed the ordinary way (open, lock, check)."""
    monkeypatch.setattr(convpool, "MAX_HELD", 3)
    monkeypatch.setattr(convpool, "_held_count", [0])
    root = tmp_path / "data"
    store = FileStore(root, conversation_pool=True)
    sites = ["site-budget-a", "site-budget-b"]
    try:
        for i in range(12):
            for site in sites:
                assert store.append(site, f"conv-budget-{i:03d}", [{"n": i}]).first == 0
                assert sum(len(p._held) for p in store._pools.values()) == convpool._held_count[0] <= 3
        left = [c for site in sites for c in os.listdir(layout.pool_dir(layout.site_dir(str(root), site)))]
        assert left, "the pools were refilled"
        for site in sites:
            for i in range(12):
                assert [it.payload for it in store.read(site, f"conv-budget-{i:03d}", _all())] == [{"n": i}]
    finally:
        store.close()
    assert convpool._held_count[0] == 0
    assert not check(root).problems


def test_a_process_that_only_reads_never_looks_for_renameat2(tmp_path: Path) -> None:
    """The pool's check for ``renameat2`` loads ctypes; a cold reader must not pay for it.

    A fresh interpreter that opens a store and reads a conversation imports
    neither ctypes nor subprocess (the C library lookup once pulled both in and
    tripled a cold open of a long conversation); the first append still finds
    renameat2 and claims from the pool.
    """
    store = FileStore(str(tmp_path))
    store.append(SITE, "conv-one", [{"n": 1}])
    store.close()
    code = (
        "import sys\n"
        "from convmem.logstore import FileStore, Tail\n"
        f"s = FileStore({str(tmp_path)!r})\n"
        f"assert [i.payload for i in s.read({SITE!r}, 'conv-one', Tail(5))] == [{{'n': 1}}]\n"
        "print(sorted(m for m in ('ctypes', 'subprocess') if m in sys.modules))\n"
        f"s.append({SITE!r}, 'conv-two', [{{'n': 2}}])\n"
        "print('ctypes' in sys.modules)\n"
        "s.close()\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=subprocess_env(),
                         check=True, timeout=60).stdout.split()
    assert out == ["[]", "True"], out


def test_a_spare_known_clean_but_taken_by_another_store(tmp_path: Path, inline: None) -> None:
    """A pool remembers the spares it saw clean; one another store took (or made again) meanwhile is handled.

    Two stores on one data directory (two pools, as two processes): store B
    takes the spare of ``c/`` that store A knows clean, so A's next new
    ``<aa>`` finds none and makes the directory; B's refill makes a new spare,
    which A then renames without listing it. Nothing is lost, nothing is left
    that fsck would report.
    """
    root = tmp_path / "data"
    a = FileStore(root, conversation_pool=True)
    b = FileStore(root, conversation_pool=True)
    conversations_dir = os.path.join(layout.site_dir(str(root), SITE), layout.CONVERSATIONS_DIR)
    top_spare = os.path.join(conversations_dir, layout.SPARE_DIR)
    seen_aa: set[str] = set()

    def new_aa_conv(prefix: str) -> str:
        """A conversation id whose <aa> directory does not exist yet."""
        for i in range(100000):
            conv = f"{prefix}-{i:05d}"
            aa = os.path.dirname(os.path.dirname(layout.conversation_dir(str(root), SITE, conv)))
            if not os.path.isdir(aa) and aa not in seen_aa:
                seen_aa.add(aa)
                return conv
        raise AssertionError("no conversation id with a new <aa>")

    written: dict[str, list[dict[str, int]]] = {}
    try:
        for store, conv in ((a, "conv-a-warm"), (b, "conv-b-warm")):
            store.append(SITE, conv, [{"w": 1}])
            written[conv] = [{"w": 1}]
        conv = new_aa_conv("conv-a")
        a.append(SITE, conv, [{"a": 0}])  # A renames c/.spare (it listed it) and its refill makes a new one
        written[conv] = [{"a": 0}]
        assert os.path.isdir(top_spare) and top_spare in a._pools[SITE]._clean_spares

        renames: list[tuple[str, str]] = []

        def rec(kind: str, *args: Any) -> None:
            if kind == "rename":
                renames.append((str(args[0]), str(args[1])))

        fileio.recorder = rec
        b._pools[SITE]._request_fill = lambda pool: None  # no refill by B for now: c/ keeps no spare
        a._pools[SITE]._request_fill = lambda pool: None  # nor by A: its next claim must find none
        a._pools[SITE]._let_go()  # the entries A built and keeps: for B's claims too (as when A exits)
        conv = new_aa_conv("conv-b")
        b.append(SITE, conv, [{"b": 0}])  # B takes the spare A knows clean
        written[conv] = [{"b": 0}]
        assert (top_spare, os.path.dirname(os.path.dirname(layout.conversation_dir(str(root), SITE, conv)))) in renames
        assert not os.path.exists(top_spare)
        conv = new_aa_conv("conv-a")
        assert a.append(SITE, conv, [{"a": 1}]).first == 0  # made by mkdir: no spare there
        written[conv] = [{"a": 1}]
        assert os.path.isdir(os.path.dirname(layout.conversation_dir(str(root), SITE, conv)))
        # B fills again (a new spare of c/); A renames it, known clean, without listing it.
        b._pools[SITE]._spares_wanted.add(conversations_dir)
        b._pools[SITE].fill()
        assert os.path.isdir(top_spare)
        renames.clear()
        conv = new_aa_conv("conv-a")
        listed: list[str] = []
        real_listdir = os.listdir

        def listdir(path: str) -> list[str]:
            listed.append(str(path))
            return real_listdir(path)

        os.listdir = listdir  # type: ignore[assignment]
        try:
            assert a.append(SITE, conv, [{"a": 2}]).first == 0
        finally:
            os.listdir = real_listdir  # type: ignore[assignment]
        written[conv] = [{"a": 2}]
        aa = os.path.dirname(os.path.dirname(layout.conversation_dir(str(root), SITE, conv)))
        assert (top_spare, aa) in renames and top_spare not in listed
    finally:
        fileio.recorder = None
        a.close()
        b.close()
    store = FileStore(root, conversation_pool=True)
    try:
        for conv, items in written.items():
            assert [it.payload for it in store.read(SITE, conv, _all())] == items, conv
    finally:
        store.close()
    assert not check(root).problems


def test_a_stale_missing_hint_never_replaces_a_conversation_made_since(tmp_path: Path, inline: None) -> None:
    """The directory a store found missing when it opened a conversation may be made by another store since.

    Store A opens the conversation object (its directories missing, c/<aa>
    included: the hint its first append uses instead of looking again); store
    B then creates the conversation; A's append must find B's batch and add
    to it, never rename an entry over it.
    """
    root = tmp_path / "data"
    a = FileStore(root, conversation_pool=True)
    b = FileStore(root, conversation_pool=True)
    try:
        a.append(SITE, "conv-hint-warm", [{"w": 1}])
        b.append(SITE, "conv-hint-warmb", [{"w": 2}])
        conv = next(
            c
            for c in (f"conv-hint-{i:05d}" for i in range(100000))
            if not os.path.isdir(os.path.dirname(os.path.dirname(layout.conversation_dir(str(root), SITE, c))))
        )
        path = layout.conversation_dir(str(root), SITE, conv)
        opened = a._conversation(SITE, conv)
        assert opened._missing == os.path.dirname(os.path.dirname(path))  # c/<aa>
        assert b.append(SITE, conv, [{"by": "b"}]).first == 0
        seg_ino = os.stat(os.path.join(path, layout.segment_name(0))).st_ino
        assert a.append(SITE, conv, [{"by": "a"}]).first == 1
        assert os.stat(os.path.join(path, layout.segment_name(0))).st_ino == seg_ino
        for store in (a, b):
            assert [it.payload for it in store.read(SITE, conv, _all())] == [{"by": "b"}, {"by": "a"}]
    finally:
        a.close()
        b.close()
    assert not check(root).problems
