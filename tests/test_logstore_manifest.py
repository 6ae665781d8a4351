"""The site manifest: crash between data sync and commit, rebuilds, compaction, tenants."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from logstore import FileStore, InvalidCursor, ListCursor, ListSelector, Range, Tail, fileio

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
