"""Fault 9: derived data lost while the store is closed.

Index files and the site manifest (snapshot, activity log, or both) are
deleted between two runs: everything must read and list exactly as before,
and appends must carry on (and show up in the listing).
"""

from __future__ import annotations

import os
from pathlib import Path

import httpx2
import pytest

from convmem.logstore import FileStore, Tail

from . import _server
from ._common import SITE, STATS, build_small_store, list_all, make_batch, read_all, restore_dir, snapshot_dir

CONVS = ["derived-0001", "derived-0002", "derived-0003", "derived-0004"]
OPTS = {"segment_bytes": 1024, "index_interval": 256}

VARIANTS = {
    "indexes": lambda rel: rel.endswith(".idx"),
    "snapshot": lambda rel: rel.endswith(".snap"),
    "activity-log": lambda rel: rel.endswith(".log"),
    "manifest": lambda rel: "/manifest" in rel,
    "everything-derived": lambda rel: rel.endswith((".idx", ".snap", ".log")) or rel.endswith("manifest.lock"),
    "locks-too": lambda rel: rel.endswith((".idx", ".snap", ".log", "lock")),
}


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict[str, bytes]]:
    root = str(tmp_path_factory.mktemp("derived") / "data")
    build_small_store(root, CONVS, 40, **OPTS)  # type: ignore[arg-type]
    # Appends after the mid-run compaction live only in the activity log.
    store = FileStore(root, **OPTS)  # type: ignore[arg-type]
    try:
        store.append(SITE, "derived-0005", make_batch("late", 0, 3, 10))
    finally:
        store.close()
    return root, snapshot_dir(root)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_derived_data_deleted(image: tuple[str, dict[str, bytes]], variant: str) -> None:
    root, img = image
    convs = [*CONVS, "derived-0005"]
    restore_dir(root, img)
    store = FileStore(root, **OPTS)  # type: ignore[arg-type]
    try:
        before = {c: read_all(store, SITE, c) for c in convs}
        listing = list_all(store, SITE)
    finally:
        store.close()
    assert len(listing) == len(convs)

    doomed = [rel for rel in snapshot_dir(root) if VARIANTS[variant](rel)]
    assert doomed, f"nothing to delete for {variant}"
    for rel in doomed:
        os.unlink(os.path.join(root, rel))
    STATS["derived deletions"] += 1

    store = FileStore(root, **OPTS)  # type: ignore[arg-type]
    try:
        assert list_all(store, SITE) == listing, f"listing changed after deleting the {variant}"
        for c in convs:
            assert read_all(store, SITE, c) == before[c], f"{c} reads differently after deleting the {variant}"
            assert store.read(SITE, c, Tail(3)) == before[c][-3:]
        r = store.append(SITE, CONVS[0], make_batch("after", 0, 1, 5))
        assert r.first == len(before[CONVS[0]])
        top = list_all(store, SITE)[0]
        assert top.conversation_id == CONVS[0], "the conversation just appended to must list first"
    finally:
        store.close()

    # And a second, fresh process sees the same (the repaired derived data is consistent).
    store = FileStore(root, **OPTS)  # type: ignore[arg-type]
    try:
        again = list_all(store, SITE)
        assert again[0].conversation_id == CONVS[0]
        assert {s.conversation_id for s in again} == set(convs)
        assert read_all(store, SITE, CONVS[0])[: len(before[CONVS[0]])] == before[CONVS[0]]
    finally:
        store.close()


def test_listing_survives_log_deletion_with_only_log_entries(tmp_path: Path) -> None:
    """The case that found the defect: a conversation recorded only in the deleted activity log."""
    root = str(tmp_path / "data")
    store = FileStore(root)
    try:
        store.append(SITE, "in-snapshot", make_batch("a", 0, 1, 1))
        store.rebuild_manifest(SITE)  # compacts: the snapshot holds "in-snapshot"
        store.append(SITE, "only-in-log", make_batch("a", 1, 1, 1))
    finally:
        store.close()
    site_dir = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(_conv_dir(root, "only-in-log")))))
    logs = [n for n in os.listdir(site_dir) if n.endswith(".log")]
    assert len(logs) == 1
    os.unlink(os.path.join(site_dir, logs[0]))
    store = FileStore(root)
    try:
        ids = {s.conversation_id for s in list_all(store, SITE)}
        assert ids == {"in-snapshot", "only-in-log"}
    finally:
        store.close()


def _conv_dir(root: str, conv: str) -> str:
    from convmem.logstore import layout

    return layout.conversation_dir(root, SITE, conv)


def test_derived_data_deleted_while_the_server_is_stopped(tmp_path: Path) -> None:
    """The same through the MCP server: stop it, delete every index and manifest file, start it again."""
    data = tmp_path / "data"
    server = _server.start(data)
    convs = [f"srv-derived-{i:04d}" for i in range(5)]
    try:
        with httpx2.Client(timeout=60) as http:
            for b in range(30):
                args = {"conversation_id": convs[b % 5], "items": make_batch("s", b, 1 + b % 3, 200)}
                assert not _server.call(http, server.url, "append_memory", args).get("isError")
            before = _server_view(http, server.url, convs)
    finally:
        assert server.stop() == 0, server.log()
    doomed = [rel for rel in snapshot_dir(str(data)) if rel.endswith((".idx", ".snap", ".log"))]
    # Index files too when a conversation's segment called for entries (they are created with the first).
    assert any(r.endswith(".snap") for r in doomed) and any(r.endswith(".log") for r in doomed)
    for rel in doomed:
        os.unlink(os.path.join(data, rel))
    STATS["derived deletions"] += 1
    server = _server.start(data)
    try:
        with httpx2.Client(timeout=60) as http:
            assert _server_view(http, server.url, convs) == before
    finally:
        assert server.stop() == 0, server.log()


def _server_view(http: httpx2.Client, url: str, convs: list[str]) -> tuple[object, ...]:
    listing = _server.call(http, url, "list_conversations", {"limit": 1000})["structuredContent"]
    logs = [
        _server.call(http, url, "replay_memory", {"conversation_id": c, "limit": 1000})["structuredContent"]
        for c in convs
    ]
    recalls = [_server.call(http, url, "recall_memory", {"conversation_id": c, "count": 3}) for c in convs]
    return listing, logs, [r["structuredContent"] for r in recalls]
