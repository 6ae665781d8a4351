"""Operator tools facing hostile files: an import with a huge line, an export next to a planted link."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import pytest
from mcp_helpers import run_convmem

from convmem.logstore import open_store
from convmem.tools import export as export_tool
from convmem.tools import restore

SITE = "tools-site-01"


def test_import_refuses_an_over_long_line_without_reading_it_whole(tmp_path: Path) -> None:
    huge = tmp_path / "huge.jsonl"
    size = 64 * 1024 * 1024
    with open(huge, "wb") as f:
        f.write(b'{"conversation_id":"conv-000001","seq":0,"recorded_at":"2026-01-01T00:00:00Z","payload":{"x":"')
        f.truncate(size)  # a sparse 64 MiB line: no newline anywhere
    with open(huge, "rb") as f:
        with pytest.raises(restore.BadInput) as info:
            for _ in restore.batches(restore.items(f)):
                pass
        assert f.tell() <= restore.MAX_LINE_BYTES + 1  # refused after at most one line's worth
    assert "line 1" in str(info.value) and "longer than" in str(info.value)
    done = run_convmem("import", str(tmp_path / "data"), "--site", SITE, "--input", str(huge))
    assert done.returncode == 1, done.stderr
    assert "line 1" in done.stderr and "longer than" in done.stderr


def test_import_still_takes_the_largest_valid_items(tmp_path: Path) -> None:
    data = tmp_path / "data"
    big = {"blob": "b" * (256 * 1024 - 20)}
    with open_store(data) as store:
        store.append(SITE, "conv-000001", [big])
    out = tmp_path / "export.jsonl"
    assert run_convmem("export", str(data), "--site", SITE, "--output", str(out)).returncode == 0
    assert max(len(line) for line in out.read_bytes().splitlines()) > 256 * 1024 - 100
    done = run_convmem("import", str(tmp_path / "data2"), "--site", SITE, "--input", str(out))
    assert done.returncode == 0, done.stderr


def test_export_never_writes_through_a_planted_link(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with open_store(data) as store:
        store.append(SITE, "conv-000001", [{"secret": 1}])
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    output = tmp_path / "out.jsonl"
    # The name the export used to write through, for this very process.
    os.symlink(victim, f"{output}.tmp.{os.getpid()}")
    args = argparse.Namespace(data_dir=str(data), site=SITE, conversation=None, output=str(output), memories=False)
    assert export_tool.run(args) == 0
    assert victim.read_text() == "precious\n"
    assert b'"secret":1' in output.read_bytes()
    assert not output.is_symlink()
    assert os.stat(output).st_mode & 0o077 == 0  # tenant data: owner only
    leftovers = [p.name for p in tmp_path.iterdir() if ".tmp." in p.name and not p.is_symlink()]
    assert leftovers == []
