"""Small things a new user meets: empty sites, `| head`, dumping an index, finding a conversation's files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from mcp_helpers import run_convmem

from tests.tools_support import REPO, SITE, cli, conv_dir, populate, segments


def test_export_and_stats_of_an_added_site_without_conversations(tmp_path: Path) -> None:
    root = tmp_path / "data"
    populate(root, conversations=1, batches=2)
    assert run_convmem("site", "add", "acme", "--data-dir", str(root)).returncode == 0
    proc = cli("export", str(root), "--site", "acme")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == b"" and b"exported 0 items" in proc.stderr
    proc = cli("export", str(root), "--site", "acme", "--conversation", "conv-0000")
    assert proc.returncode == 8 and b"does not exist" in proc.stderr
    proc = cli("stats", str(root), "--json")
    assert proc.returncode == 0, proc.stderr
    by_site = {s["site"]: s for s in json.loads(proc.stdout)}
    assert set(by_site) == {"acme", SITE}
    assert (by_site["acme"]["conversations"], by_site["acme"]["items"]) == (0, 0)
    text = cli("stats", str(root), "--site", "acme").stdout.decode()
    assert "site acme: 0 conversations, 0 items" in text
    # A site nobody added is still unknown.
    assert cli("export", str(root), "--site", "nobody").returncode == 8
    assert cli("stats", str(root), "--site", "nobody").returncode == 8


def test_stats_before_the_server_ever_ran(tmp_path: Path) -> None:
    root = tmp_path / "fresh"
    assert run_convmem("site", "add", "demo", "--data-dir", str(root)).returncode == 0
    proc = cli("stats", str(root))
    assert proc.returncode == 0, proc.stderr
    assert "site demo: 0 conversations" in proc.stdout.decode()


def test_export_into_head_stops_quietly(tmp_path: Path) -> None:
    root = tmp_path / "data"
    populate(root, conversations=3, batches=200)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    pipeline = subprocess.run(
        f"{sys.executable} -m tools export {root} --site {SITE} | head -n 2; echo \"status=${{PIPESTATUS[0]}}\"",
        shell=True,
        executable="/bin/bash",
        capture_output=True,
        env=env,
        cwd=REPO,
        timeout=60,
    )
    out = pipeline.stdout.decode().splitlines()
    assert len(out) == 3 and json.loads(out[0])["seq"] == 0
    assert out[2] in ("status=0", "status=141"), out[2]
    assert pipeline.stderr == b"", pipeline.stderr


def test_dump_reads_an_index_file(tmp_path: Path) -> None:
    root = tmp_path / "data"
    populate(root, conversations=1, batches=150, segment_bytes=64 * 1024)
    seg = segments(root, "conv-0000")[0]
    idx = seg.with_suffix(".idx")
    proc = cli("dump", str(idx))
    assert proc.returncode == 0, proc.stdout
    text = proc.stdout.decode()
    assert "index of base_seq=0" in text and f"checked against {seg}" in text
    assert " ok\n" in text and ", 0 wrong" in text
    doc = json.loads(cli("dump", str(idx), "--json").stdout)
    assert doc["entries"] and all(e["verdict"] == "ok" for e in doc["entries"])
    # An entry that points into the middle of a record is called wrong.
    raw = bytearray(idx.read_bytes())
    raw[36:40] = (int.from_bytes(raw[36:40], "little") + 3).to_bytes(4, "little")
    idx.write_bytes(bytes(raw))
    proc = cli("dump", str(idx))
    assert proc.returncode == 4 and "does not point at a valid record" in proc.stdout.decode()
    # Something that is neither: says what dump reads.
    other = tmp_path / "notes.txt"
    other.write_text("hello")
    proc = cli("dump", str(other))
    assert proc.returncode == 4 and "segment (.seg) and index (.idx)" in proc.stdout.decode()
    assert cli("dump", str(tmp_path)).returncode == 8


def test_locate_prints_a_conversations_files(tmp_path: Path) -> None:
    root = tmp_path / "data"
    populate(root, conversations=2, batches=40)
    proc = cli("locate", str(root), SITE, "conv-0001")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.decode().splitlines()
    assert lines[0] == str(conv_dir(root, "conv-0001"))
    names = [seg.name for seg in segments(root, "conv-0001")]
    assert all(any(line.strip().startswith(n) for line in lines) for n in names)
    doc = json.loads(cli("locate", str(root), SITE, "conv-0001", "--json").stdout)
    assert {f["path"] for f in doc["files"]} >= {str(s) for s in segments(root, "conv-0001")}
    missing = cli("locate", str(root), SITE, "conv-9999")
    assert missing.returncode == 1 and b"has no files" in missing.stderr
    assert cli("locate", str(root), SITE, "bad id").returncode == 8
    assert cli("locate", str(tmp_path / "nowhere"), SITE, "conv-0001").returncode == 8
