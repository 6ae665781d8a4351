"""The site manifest: crash between data sync and commit, rebuilds, compaction, tenants."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from logstore import FileStore, InvalidCursor, ListCursor, ListSelector, Range, Tail, convpool, fileio

SITE = "site-manifest"


def crash_append(root: Path, point: str, conv: str) -> int:
    """Append in a child process that exits at crash point ``point``; its exit status."""
    code = (
        "import sys\nfrom logstore import FileStore\n"
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
    from logstore import layout, manifest

    sdir = Path(layout.site_dir(str(root), SITE))
    log = max(p for p in sdir.iterdir() if p.suffix == ".log")
    data = log.read_bytes()
    salt = manifest.LOG_HEADER.unpack(data[: manifest.LOG_HEADER.size])[2]
    return log, list(manifest.iter_log_records(data, salt, manifest.LOG_HEADER.size))


def test_new_conversation_lost_from_the_log_is_found_after_a_reboot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A new conversation's intent is not synced: a power cut may lose every record of it.

    The first listing after a reboot walks the site's directories, probes the
    conversations the listing does not know, and logs a walked record; a
    restart in the same boot walks no more.
    """
    from logstore import manifest

    root = tmp_path / "data"
    store = FileStore(root)
    store.append(SITE, "conv-old-01", [{"k": 1}])
    assert listed(store) == ["conv-old-01"]
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
        FileStore, "_probe", lambda self, site, conv, wait=True: probed.append(conv) or real(self, site, conv, wait)
    )

    monkeypatch.setattr(manifest, "boot_id", "a-later-boot")
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
    walked = [rec[1] for _o, _e, rec in recs if rec is not None and rec[0] == manifest.WALKED]
    assert walked[-1] == "a-later-boot", walked  # after the epoch's first (its log was created with one)
    probed.clear()
    store = FileStore(root)  # a restart in the same boot: the walked record says there is nothing to find
    try:
        assert len(listed(store)) == 3
        assert probed == []
    finally:
        store.close()


def test_first_append_syncs_no_manifest_record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first batch of a conversation: one data sync and directory syncs, no sync of the manifest log."""
    root = tmp_path / "data"
    monkeypatch.setattr(convpool, "inline_fill", True)
    store = FileStore(root, conversation_pool=True)
    store.append(SITE, "conv-first-00", [{"k": 0}])  # the site's pool is filled after it
    monkeypatch.setattr(store._pools[SITE], "_request_fill", lambda pool, after: None)  # and not refilled meanwhile
    syncs: list[str] = []
    fileio.fault_hook = syncs.append
    try:
        store.append(SITE, "conv-first-01", [{"k": 1}])
    finally:
        fileio.fault_hook = None
    store.close()
    assert syncs.count("fdatasync") == 1, syncs  # the segment, created with its first record
    assert 2 <= syncs.count("fsync") <= 5, syncs  # its directory and the directories above it not yet synced
