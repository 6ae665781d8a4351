"""The site manifest: crash between data sync and commit, rebuilds, compaction, tenants."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from convmem.logstore import (
    FileStore,
    InvalidCursor,
    ListCursor,
    ListSelector,
    Range,
    Tail,
    background,
    convpool,
    fileio,
)

SITE = "site-manifest"


def crash_append(root: Path, point: str, conv: str) -> int:
    """Append in a child process that exits at crash point ``point``; its exit status."""
    code = (
        "import sys\nfrom convmem.logstore import FileStore\n"
        f"s = FileStore({str(root)!r}, lock_timeout=0.2)\n"
        f"s.append({SITE!r}, {conv!r}, [{{'crashed': True}}])\n"
    )
    env = {**os.environ, "CONVMEM_CRASH_AT": point}
    return subprocess.run([sys.executable, "-c", code], env=env, timeout=60).returncode


def listed(store: FileStore, site: str = SITE) -> list[str]:
    out, cursor = [], None
    while True:
        page = store.list_conversations(site, ListSelector(cursor, 2))
        out.extend(s.conversation_id for s in page.summaries)
        cursor = page.next_cursor
        if cursor is None:
            return out


def test_crash_after_data_sync_before_commit_is_resolved_by_probing(tmp_path: Path) -> None:
    root = tmp_path / "data"
    store = FileStore(root, lock_timeout=0.2)
    store.append(SITE, "conv-before", [{"ok": 1}])
    assert crash_append(root, "after-data-sync", "conv-crashed") == fileio.CRASH_EXIT_STATUS
    # The batch is on disk although it was never acknowledged: reads see it ...
    assert [i.payload for i in store.read(SITE, "conv-crashed", Tail(5))] == [{"crashed": True}]
    # ... and the listing resolves the dead writer's intent at once (nobody holds the conversation).
    fresh = FileStore(root, lock_timeout=0.2)
    assert sorted(listed(fresh)) == ["conv-before", "conv-crashed"]
    assert fresh.append(SITE, "conv-crashed", [{"next": 1}]).first == 1
    fresh.close()
    store.close()


def test_crash_before_data_write_leaves_nothing_listed(tmp_path: Path) -> None:
    root = tmp_path / "data"
    store = FileStore(root, lock_timeout=0.2)
    store.append(SITE, "conv-before", [{"ok": 1}])
    assert crash_append(root, "manifest-intent", "conv-never") == fileio.CRASH_EXIT_STATUS
    fresh = FileStore(root, lock_timeout=0.2)
    assert listed(fresh) == ["conv-before"]
    assert fresh.read(SITE, "conv-never", Range(0, 10)) == []
    assert fresh.append(SITE, "conv-never", [{"first": 1}]).first == 0
    assert sorted(listed(fresh)) == ["conv-before", "conv-never"]
    fresh.close()
    store.close()


def test_listing_rebuilds_from_segments_and_survives_compaction(tmp_path: Path) -> None:
    root = tmp_path / "data"
    store = FileStore(root)
    convs = [f"conv-{i:05d}" for i in range(30)]
    for rnd in range(3):
        for c in convs[rnd:]:
            store.append(SITE, c, [{"r": rnd}])
    want = listed(store)
    assert sorted(want) == convs
    # Force compactions: a tiny threshold, then more appends from another store object.
    m = store._manifest(SITE)
    m._compact_bytes = 1
    m._writes = 511
    store.append(SITE, convs[0], [{"r": "late"}])
    want = listed(store)
    assert want[0] == convs[0]
    snaps = [n for n in os.listdir(m.site_dir) if n.endswith(".snap")]
    assert len(snaps) == 1 and snaps[0] != "manifest-0000000001.snap"
    other = FileStore(root)
    assert listed(other) == want
    # Lose the manifest entirely: the next listing is rebuilt from the segments.
    other.close()
    store.close()
    for name in os.listdir(m.site_dir):
        if name.startswith("manifest-"):
            os.unlink(os.path.join(m.site_dir, name))
    rebuilt = FileStore(root)
    assert listed(rebuilt) == want
    rebuilt.close()


def test_sites_are_isolated_and_cursors_are_bound_to_their_site(tmp_path: Path) -> None:
    store = FileStore(tmp_path / "data")
    store.append("site-alpha", "conv-shared-name", [{"site": "alpha"}])
    store.append("site-beta0", "conv-shared-name", [{"site": "beta"}])
    store.append("site-alpha", "conv-alpha-only", [{"site": "alpha"}])
    assert sorted(listed(store, "site-alpha")) == ["conv-alpha-only", "conv-shared-name"]
    assert listed(store, "site-beta0") == ["conv-shared-name"]
    assert store.read("site-beta0", "conv-alpha-only", Tail(10)) == []
    assert store.read("site-beta0", "conv-shared-name", Tail(10))[0].payload == {"site": "beta"}
    assert listed(store, "site-gamma") == []
    page = store.list_conversations("site-alpha", ListSelector(None, 1))
    assert page.next_cursor is not None
    token = page.next_cursor.to_token("site-alpha")
    assert ListCursor.from_token(token, "site-alpha") == page.next_cursor
    with pytest.raises(InvalidCursor):
        ListCursor.from_token(token, "site-beta0")
    for bad in ["", "x", "not base64!", "e30", token[:-2], "A" * 300]:
        with pytest.raises(InvalidCursor):
            ListCursor.from_token(bad, "site-alpha")
    assert store.sites() == ["site-alpha", "site-beta0"]
    store.drop_site("site-alpha")
    assert store.sites() == ["site-beta0"]
    assert listed(store, "site-alpha") == []
    assert store.read("site-alpha", "conv-shared-name", Tail(10)) == []
    store.close()


def _log_records(root: Path) -> tuple[Path, list[tuple[int, int, list | None]]]:
    from convmem.logstore import layout, manifestcodec

    sdir = Path(layout.site_dir(str(root), SITE))
    log = max(p for p in sdir.iterdir() if p.suffix == ".log")
    data = log.read_bytes()
    salt = manifestcodec.LOG_HEADER.unpack(data[: manifestcodec.LOG_HEADER.size])[2]
    return log, list(manifestcodec.iter_log_records(data, salt, manifestcodec.LOG_HEADER.size))


def test_new_conversation_lost_from_the_log_is_found_after_a_reboot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A new conversation's intent is not synced: a power cut may lose every record of it.

    The first listing after a reboot walks the site's directories, probes the
    conversations the listing does not know, and logs a walked record; a
    restart in the same boot walks no more.
    """
    from convmem.logstore import bootid, manifestcodec

    root = tmp_path / "data"
    store = FileStore(root)
    store.append(SITE, "conv-old-01", [{"k": 1}])
    assert listed(store) == ["conv-old-01"]
    store.close()  # logs its commit (owed until then), before the new conversations' records
    store = FileStore(root)
    store.append(SITE, "conv-new-01", [{"k": 1}, {"k": 2}])
    store.append(SITE, "conv-new-02", [{"k": 1}])
    store.close()
    # What a power cut can leave: the new conversations' records (never synced) gone from the log.
    log, recs = _log_records(root)
    first_new = next(off for off, _end, rec in recs if rec is not None and rec[1] == "conv-new-01")
    os.truncate(log, first_new)
    probed: list[str] = []
    real = FileStore._probe
    monkeypatch.setattr(
        FileStore,
        "_probe",
        lambda self, site, conv, wait=True, settle=None: probed.append(conv) or real(self, site, conv, wait, settle),
    )

    monkeypatch.setattr(bootid, "boot_id", "a-later-boot")
    store = FileStore(root)
    try:
        assert listed(store) == ["conv-new-02", "conv-new-01", "conv-old-01"]
        assert sorted(probed) == ["conv-new-01", "conv-new-02"]  # only the conversations it did not know
        items = store.read(SITE, "conv-new-01", Range(0, 10))
        page = store.list_conversations(SITE, ListSelector(None, 10)).summaries
        by_id = {s.conversation_id: s for s in page}
        assert by_id["conv-new-01"].last_appended_at == items[-1].recorded_at
    finally:
        store.close()
    _log, recs = _log_records(root)
    walked = [rec[1] for _o, _e, rec in recs if rec is not None and rec[0] == manifestcodec.WALKED]
    assert walked[-1] == "a-later-boot", walked  # after the epoch's first (its log was created with one)
    probed.clear()
    store = FileStore(root)  # a restart in the same boot: the walked record says there is nothing to find
    try:
        assert len(listed(store)) == 3
        assert probed == []
    finally:
        store.close()


def test_first_append_syncs_no_manifest_record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first batch of a conversation claimed from the pool: one data sync, its segment's (identity included).

    No sync of the manifest log, and no directory sync before the acknowledgement
    (the rename's directories are synced by the next fill, FORMAT.md 6).
    """
    root = tmp_path / "data"
    monkeypatch.setattr(convpool, "inline_fill", True)
    store = FileStore(root, conversation_pool=True)
    store.append(SITE, "conv-first-00", [{"k": 0}])  # the site's pool is filled after it
    monkeypatch.setattr(store._pools[SITE], "_request_fill", lambda pool: None)  # and not refilled meanwhile
    syncs: list[str] = []
    fileio.fault_hook = syncs.append
    try:
        store.append(SITE, "conv-first-01", [{"k": 1}])
    finally:
        fileio.fault_hook = None
    store.close()
    assert syncs.count("fdatasync") == 1, syncs  # the segment: its header, identity record and first record
    assert syncs.count("fsync") == 0, syncs


def test_commits_owed_by_a_killed_writer_are_probed_by_the_next_listing(tmp_path: Path) -> None:
    """A writer's commit records go out with its next log record: a kill leaves the last ones unwritten.

    The child appends round-robin to three conversations (each intent carries
    its conversation's previous commit) and is then SIGKILLed while idle, each
    conversation's last commit owed. The log must not hold those, and a fresh
    listing must still give every conversation its last item's time, in order.
    """
    root = tmp_path / "data"
    convs = [f"conv-owed-{i}" for i in range(3)]
    code = (
        "import os, signal, sys\nfrom convmem.logstore import FileStore\n"
        f"s = FileStore({str(root)!r}, lock_timeout=0.2)\n"
        "for k in range(7):\n"
        f"    s.append({SITE!r}, {convs!r}[k % 3], [{{'k': k}}])\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], timeout=60)
    assert proc.returncode == -9
    from convmem.logstore import manifestcodec

    site_dir = next((root / "sites").iterdir())
    log = max(site_dir.glob("manifest-*.log"))
    data = log.read_bytes()
    salt = manifestcodec.LOG_HEADER.unpack_from(data)[2]
    start = manifestcodec.LOG_HEADER.size
    recs = [r for _o, _e, r in manifestcodec.iter_log_records(data, salt, start) if r is not None]
    committed = {(r[1], r[4]) for r in recs if r[0] == manifestcodec.COMMIT}
    committed |= {(r[1], r[7]) for r in recs if r[0] == manifestcodec.INTENT and len(r) >= 8}  # carried by an intent
    # conv 0 got batches k = 0, 3, 6 (next_seq 1, 2, 3); conv 1 k = 1, 4 (1, 2); conv 2 k = 2, 5 (1, 2).
    # Each intent carried its conversation's previous commit; each conversation's last one was owed.
    assert committed == {(convs[0], 1), (convs[0], 2), (convs[1], 1), (convs[2], 1)}, recs
    fresh = FileStore(root, lock_timeout=0.2)
    try:
        assert listed(fresh) == [convs[0], convs[2], convs[1]]  # most recently active first
        for s in fresh.list_conversations(SITE, ListSelector(None, 10)).summaries:
            assert s.last_appended_at == fresh.read(SITE, s.conversation_id, Tail(1))[0].recorded_at
        assert fresh.append(SITE, convs[1], [{"next": 1}]).first == 2
        assert listed(fresh)[0] == convs[1]
    finally:
        fresh.close()


def test_a_listing_in_another_store_sees_an_idle_writers_owed_commits(tmp_path: Path) -> None:
    """Two stores on one directory: the writer's last commit is owed; the other's listing probes it."""
    root = tmp_path / "data"
    writer = FileStore(root, lock_timeout=0.2)
    other = FileStore(root, lock_timeout=0.2)
    try:
        for k in range(3):
            writer.append(SITE, "conv-live-a", [{"k": k}])
        writer.append(SITE, "conv-live-b", [{"k": 0}])
        assert listed(other) == ["conv-live-b", "conv-live-a"]
        writer.append(SITE, "conv-live-a", [{"k": 3}])  # after the other's resolve records
        assert listed(other) == ["conv-live-a", "conv-live-b"]
        assert listed(writer) == ["conv-live-a", "conv-live-b"]
        for s in other.list_conversations(SITE, ListSelector(None, 10)).summaries:
            assert s.last_appended_at == other.read(SITE, s.conversation_id, Tail(1))[0].recorded_at
    finally:
        writer.close()
        other.close()


def test_closing_with_commits_owed_does_not_bring_a_dropped_site_back(tmp_path: Path) -> None:
    root = tmp_path / "data"
    writer = FileStore(root, lock_timeout=0.2)
    other = FileStore(root, lock_timeout=0.2)
    writer.append(SITE, "conv-dropped", [{"k": 1}])  # its commit is owed
    other.drop_site(SITE)
    writer.close()
    assert other.sites() == []
    other.close()


def test_a_probe_never_settles_an_intent_whose_batch_is_being_written(tmp_path: Path) -> None:
    """Another store lists while a writer is between its intent and its data; then the writer dies.

    The listing must not take the extent from before the batch as settling the
    batch's intent (it waits for no lock-holding writer: it leaves the intent
    pending), so once the writer is gone with its commit owed, the next
    listing still probes the conversation and lists the acknowledged batch.
    """
    root = tmp_path / "data"
    writer = FileStore(root, lock_timeout=0.2)
    other = FileStore(root, lock_timeout=0.2)
    conv = "conv-racing-01"
    writer.append(SITE, conv, [{"k": 0}])
    assert listed(other) == [conv]
    assert len(other.read(SITE, conv, Range(0, 10))) == 1  # the other store holds the conversation open
    seen: list[list[str]] = []
    assert background.wait(10)  # the pool's refill after the first append writes too, on its own thread
    writer_thread = threading.current_thread()

    def between_intent_and_data(op: str) -> None:
        if op == "write" and not seen and threading.current_thread() is writer_thread:
            seen.append(listed(other))  # the writer holds the conversation: the listing must not settle it

    fileio.fault_hook = between_intent_and_data
    try:
        r = writer.append(SITE, conv, [{"k": 1}])
    finally:
        fileio.fault_hook = None
    assert seen == [[conv]] and r.first == 1
    writer._manifest(SITE)._owed.clear()  # the writer dies with the batch's commit owed (no close)
    other.close()
    fresh = FileStore(root, lock_timeout=0.2)
    try:
        page = fresh.list_conversations(SITE, ListSelector(None, 10)).summaries
        assert [s.conversation_id for s in page] == [conv]
        assert page[0].last_appended_at == fresh.read(SITE, conv, Tail(1))[0].recorded_at
    finally:
        fresh.close()
        writer.close()


CHILD_APPENDS = """
import os, sys
from convmem.logstore import FileStore
root, site, conv = sys.argv[1:4]
batches, items, size = map(int, sys.argv[4:7])
s = FileStore(root, lock_timeout=2.0, segment_bytes=4096, index_interval=512)
for _ in range(batches):
    s.append(site, conv, [{"t": "x" * size} for _ in range(items)])
os._exit(0)  # as a kill after the acknowledgement: the last batch's commit is still owed
"""


def _append_in_child(root: Path, conv: str, batches: int, items: int, size: int = 10, crash_at: str = "") -> int:
    """Append in a child process that ends without logging its owed commit; its exit status."""
    env = {**os.environ, "CONVMEM_CRASH_AT": crash_at} if crash_at else None
    args = [sys.executable, "-c", CHILD_APPENDS, str(root), SITE, conv, str(batches), str(items), str(size)]
    return subprocess.run(args, env=env, timeout=120).returncode


def _last_time_listed(store: FileStore, conv: str) -> str:
    (s,) = [s for s in store.list_conversations(SITE, ListSelector(None, 10)).summaries if s.conversation_id == conv]
    return s.last_appended_at


def test_a_probe_past_skipped_segments_lists_the_last_batchs_time(tmp_path: Path) -> None:
    """A store whose cached state is two segments behind probes a conversation whose newest segment is empty.

    Another process appends until the log has rolled (and ends with its last
    commit owed); a third appends a batch too large for what is left of the
    active segment and is killed just after creating the next one (no record
    in it; its intent pending). The refresh behind this store's probe finds
    its segment sealed and opens the newest one, past the segments between
    them: the extent it logs must carry the time of the last batch (in a
    segment it skipped), not the time its cached state last saw.
    """
    root = tmp_path / "data"
    conv = "conv-rolled-01"
    store = FileStore(root, lock_timeout=2.0, segment_bytes=4096, index_interval=512)
    try:
        store.append(SITE, conv, [{"t": "first"}])
        assert store.read(SITE, conv, Tail(1))  # the state this store keeps: one batch, in the first segment
        assert _append_in_child(root, conv, 20, 2, 200) == 0
        assert _append_in_child(root, conv, 1, 1, 2500, crash_at="segment-roll-created") == fileio.CRASH_EXIT_STATUS
        last = FileStore(root, segment_bytes=4096, index_interval=512)
        try:
            truth = last.read(SITE, conv, Tail(1))[0].recorded_at
        finally:
            last.close()
        assert _last_time_listed(store, conv) == truth
    finally:
        store.close()


def test_a_resolve_is_logged_before_any_later_intent_of_its_conversation(tmp_path: Path) -> None:
    """A listing resolves a dead writer's intent; another writer appends between its probe and its record.

    A writer dies after logging the intent for a 5-item batch (nothing of it
    written). This store's listing probes the conversation; right after the
    probe, another process appends a 2-item batch (its intent ends below the
    dead one's, so the pending intent stays the dead one's) and ends with its
    commit owed. The resolve must be in the log before that process's intent
    (logged under the conversation's lock, inside the probe), or it would
    clear the intent of the acknowledged batch, which would never be listed.
    """
    root = tmp_path / "data"
    conv = "conv-resolve-01"
    store = FileStore(root, lock_timeout=2.0)
    try:
        store.append(SITE, conv, [{"k": 0}])
        assert listed(store) == [conv]
        assert _append_in_child(root, conv, 1, 5, crash_at="manifest-intent") == fileio.CRASH_EXIT_STATUS
        m = store._manifest(SITE)
        real = m._probe
        raced: list[int] = []

        def probe_then_append_elsewhere(*args: object) -> object:
            tip = real(*args)  # type: ignore[arg-type]
            if not raced:
                raced.append(_append_in_child(root, conv, 1, 2))
            return tip

        m._probe = probe_then_append_elsewhere  # type: ignore[assignment]
        try:
            listed(store)
        finally:
            m._probe = real
        assert raced == [0]
        items = store.read(SITE, conv, Range(0, 10))
        assert [i.seq for i in items] == [0, 1, 2]
        assert _last_time_listed(store, conv) == items[-1].recorded_at
        fresh = FileStore(root, lock_timeout=2.0)
        try:
            assert _last_time_listed(fresh, conv) == items[-1].recorded_at
        finally:
            fresh.close()
    finally:
        store.close()


def test_a_repair_keeps_an_intent_logged_after_its_check(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """fsck --repair checks a dead writer's intent under the lock; another writer appends before the rewrite.

    As in the test above, the other writer's intent ends below the dead one's,
    so the pending intent looks as it did when checked; the rewrite must still
    see that an intent was logged since and keep the conversation pending (the
    engine's next listing probes it), not drop it as settled by the check.
    """
    from convmem.logstore import maintenance
    from convmem.logstore.maintenance import _check

    root = tmp_path / "data"
    conv = "conv-repair-01"
    store = FileStore(root, lock_timeout=2.0)
    store.append(SITE, conv, [{"k": 0}])
    store.close()
    assert _append_in_child(root, conv, 1, 5, crash_at="manifest-intent") == fileio.CRASH_EXIT_STATUS
    real = _check._write_manifest
    raced: list[int] = []

    def append_elsewhere_then_rewrite(*args: object, **kwargs: object) -> None:
        raced.append(_append_in_child(root, conv, 1, 2))
        real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(_check, "_write_manifest", append_elsewhere_then_rewrite)
    maintenance.check(str(root), repair=True, lock_timeout=2.0)
    assert raced == [0]
    fresh = FileStore(root, lock_timeout=2.0)
    try:
        items = fresh.read(SITE, conv, Range(0, 10))
        assert [i.seq for i in items] == [0, 1, 2]
        assert _last_time_listed(fresh, conv) == items[-1].recorded_at
    finally:
        fresh.close()


HOLD_LOCK = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR)
fcntl.flock(fd, fcntl.LOCK_EX)
print("held", flush=True)
time.sleep(float(sys.argv[2]))
"""


def test_a_listing_waits_for_a_held_conversation_whose_writer_owes_its_commit(tmp_path: Path) -> None:
    """Another process holds the conversation (as an idle writer's extend-ahead job, or its next append before
    its intent, does) while the writer owes the commit of its acknowledged batch: the listing waits, then lists it."""
    from convmem.logstore import layout

    root = tmp_path / "data"
    conv = "conv-held-01"
    writer = FileStore(root, lock_timeout=5.0)
    other = FileStore(root, lock_timeout=5.0)
    try:
        writer.append(SITE, conv, [{"k": 0}])  # acknowledged; its commit owed
        lock = os.path.join(layout.conversation_dir(str(root), SITE, conv), layout.LOCK_FILE)
        holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, lock, "0.5"], stdout=subprocess.PIPE, text=True)
        try:
            assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
            assert _last_time_listed(other, conv) == other.read(SITE, conv, Tail(1))[0].recorded_at
        finally:
            holder.wait(timeout=60)
    finally:
        writer.close()
        other.close()


def test_a_probe_waits_for_a_group_in_flight_in_its_own_process(tmp_path: Path) -> None:
    """A listing thread probes while another thread of the same store writes a group (intent logged, not synced).

    The probe shares the writer's file lock in-process, so it must wait for the
    group: settling the group's intent with the extent before it would leave
    the acknowledged batch unlisted once the process died with its commit owed.
    """
    import threading

    root = tmp_path / "data"
    conv = "conv-inflight-01"
    store = FileStore(root, lock_timeout=5.0)
    store.append(SITE, conv, [{"k": 0}])
    store._manifest(SITE).flush()  # the first batch's commit is logged: only the second one's intent is pending
    paused, go = threading.Event(), threading.Event()

    def pause_before_sync(op: str) -> None:
        if op == "fdatasync" and threading.current_thread().name == "appender" and not paused.is_set():
            paused.set()
            go.wait(10)

    fileio.fault_hook = pause_before_sync
    try:
        appender = threading.Thread(target=store.append, args=(SITE, conv, [{"k": 1}]), name="appender")
        appender.start()
        assert paused.wait(10)
        lister = threading.Thread(target=listed, args=(store,))
        lister.start()
        lister.join(0.3)  # it probes now; with the fix it waits for the group
        go.set()
        appender.join(10)
        lister.join(10)
    finally:
        fileio.fault_hook = None
        go.set()
    store._manifest(SITE)._owed.clear()  # the process dies with the second batch's commit owed
    fresh = FileStore(root, lock_timeout=5.0)
    try:
        assert _last_time_listed(fresh, conv) == fresh.read(SITE, conv, Tail(1))[0].recorded_at
    finally:
        fresh.close()
        store.close()
