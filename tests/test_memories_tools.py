"""Operator tools on long-term memories: fsck (--repair), export/import --memories, stats, dump."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

from memories_support import OTHER, SITE, create, delete, fields, files_holding, tree_bytes

from convmem.logstore import open_store
from convmem.logstore.memories import LongTermMemory
from convmem.logstore.memories.eventlog import salvage
from convmem.logstore.memories.site import LOG_NAME, memories_dir
from tests.tools_support import TOOLS_CMD

REPO = Path(__file__).resolve().parent.parent


def tool(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([*TOOLS_CMD, *args], capture_output=True, text=True, env=env, timeout=120)


def populated(root: Path) -> list[str]:
    open_store(root).close()
    with LongTermMemory(root) as store:
        ids = [create(store, fields(i)).memory_id for i in range(4)]
        delete(store, ids[1])
    return ids


def log_path(root: Path, site: str = SITE) -> Path:
    return Path(memories_dir(str(root), site)) / LOG_NAME


def test_fsck_clean_then_torn_tail_repaired(tmp_path: Path) -> None:
    populated(tmp_path)
    done = tool("fsck", str(tmp_path))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "memories: 1 site, 5 events, 4 memories; 0 problems" in done.stdout
    with open(log_path(tmp_path), "ab") as f:
        f.write(b"\x07" * 25)
    done = tool("fsck", str(tmp_path))
    assert done.returncode == 4 and "memory-torn-tail" in done.stdout
    done = tool("fsck", str(tmp_path), "--repair")
    assert done.returncode == 1 and "REPAIRED: cut away" in done.stdout
    assert tool("fsck", str(tmp_path)).returncode == 0


def test_fsck_reports_damage_with_offset_and_drops_only_it(tmp_path: Path) -> None:
    ids = populated(tmp_path)
    path = log_path(tmp_path)
    events = salvage(str(path))[0]
    second = events[1].offset
    data = bytearray(path.read_bytes())
    data[second + 50] ^= 0x55
    path.write_bytes(bytes(data))
    done = tool("fsck", str(tmp_path), "--json")
    assert done.returncode == 4
    report = json.loads(done.stdout)
    kinds = {(p["kind"], p["offset"]) for p in report["memory_problems"]}
    assert ("memory-corrupt-record", second) in kinds
    done = tool("fsck", str(tmp_path), "--repair")
    assert done.returncode == 4  # --repair alone never drops acknowledged data
    done = tool("fsck", str(tmp_path), "--truncate-at-corruption")
    assert done.returncode == 1, done.stdout
    with LongTermMemory(tmp_path) as store:
        assert {m.memory_id for m in store.all(SITE)} == {ids[0], ids[2], ids[3]}


def test_fsck_removes_stale_rewrite_files_and_flags_strays(tmp_path: Path) -> None:
    populated(tmp_path)
    stale = log_path(tmp_path).with_name(LOG_NAME + ".rewrite.4242")
    stale.write_bytes(b"stale")
    stray = log_path(tmp_path).with_name("notes.txt")
    stray.write_text("mine")
    done = tool("fsck", str(tmp_path), "--repair")
    assert done.returncode == 4 and "memory-stray-file" in done.stdout
    assert not stale.exists() and stray.exists()


def test_export_import_round_trip_and_erased_memories_are_not_exported(tmp_path: Path) -> None:
    ids = populated(tmp_path)
    secret = fields(9, summary="exported-then-erased-okapi")
    with LongTermMemory(tmp_path) as store:
        victim = create(store, secret)
        delete(store, victim.memory_id, force=True)
        originals = {m.memory_id: m.to_json() for m in store.all(SITE)}
    out = tmp_path.parent / f"{tmp_path.name}-export.json"
    done = tool("export", str(tmp_path), "--site", SITE, "--memories", "--output", str(out))
    assert done.returncode == 0, done.stderr
    doc = json.loads(out.read_text())
    assert doc["format"] == "convmem-memories" and doc["site"] == SITE
    assert {m["id"] for m in doc["memories"]} == set(ids)
    assert b"exported-then-erased-okapi" not in out.read_bytes()
    done = tool("import", str(tmp_path), "--site", OTHER, "--memories", "--input", str(out))
    assert done.returncode == 0, done.stderr
    with LongTermMemory(tmp_path) as store:
        copied = {m.memory_id: m.to_json() for m in store.all(OTHER)}
    for mid, rec in originals.items():
        want = {k: v for k, v in rec.items() if k != "last_accessed_at"}
        assert {k: v for k, v in copied[mid].items() if k != "last_accessed_at"} == want
    again = tool("import", str(tmp_path), "--site", OTHER, "--memories", "--input", str(out))
    assert again.returncode == 0 and "0 memories; 4 already present" in again.stderr


def test_import_rejects_bad_input_by_field_and_writes_nothing(tmp_path: Path) -> None:
    populated(tmp_path)
    out = tmp_path.parent / f"{tmp_path.name}-export.json"
    assert tool("export", str(tmp_path), "--site", SITE, "--memories", "--output", str(out)).returncode == 0
    doc: dict[str, Any] = json.loads(out.read_text())
    doc["memories"][2]["subject"] = "x" * 201
    out.write_text(json.dumps(doc))
    before = tree_bytes(tmp_path)
    done = tool("import", str(tmp_path), "--site", OTHER, "--memories", "--input", str(out))
    assert done.returncode == 1 and "memories[2].subject" in done.stderr
    assert tree_bytes(tmp_path) == before


def test_stats_and_dump(tmp_path: Path) -> None:
    populated(tmp_path)
    done = tool("stats", str(tmp_path))
    assert done.returncode == 0
    assert f"site {SITE} memories: 3 active, 1 soft-deleted" in done.stdout
    doc = json.loads(tool("stats", str(tmp_path), "--json").stdout)
    assert doc[0]["memories"]["active"] == 3 and doc[0]["memories"]["deleted"] == 1
    dump = tool("dump", str(log_path(tmp_path)))
    assert dump.returncode == 0 and dump.stdout.count('"op":"create"') == 4


def test_fsck_repair_never_resurrects_erased_content(tmp_path: Path) -> None:
    open_store(tmp_path).close()
    with LongTermMemory(tmp_path) as store:
        m = create(store, fields(1, summary="fsck-erasure-lemur"))
        delete(store, m.memory_id, force=True)
    assert tool("fsck", str(tmp_path), "--repair").returncode == 0
    assert files_holding(tmp_path, [b"fsck-erasure-lemur"]) == []
