"""Helpers for the operator-tool tests: build data directories, damage them for real, run the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from convmem.logstore import FileStore, MemoryItem, Range, frame, layout

#: The operator tools run as their own module (`python -m convmem.tools`), as the installed CLI does.
TOOLS_CMD = [sys.executable, "-m", "convmem.tools"]

REPO = Path(__file__).resolve().parent.parent
SITE = "site-alpha"


def populate(root: Path, conversations: int = 3, batches: int = 40, segment_bytes: int = 4096) -> dict[str, int]:
    """Append ``batches`` two-item batches to each conversation; return items per conversation."""
    counts: dict[str, int] = {}
    with FileStore(root, segment_bytes=segment_bytes) as store:
        for c in range(conversations):
            cid = f"conv-{c:04d}"
            for i in range(batches):
                store.append(SITE, cid, [{"i": i, "text": "é" * (60 + i % 7)}, {"k": [i, None, True]}])
            counts[cid] = 2 * batches
    return counts


def conv_dir(root: Path, cid: str, site: str = SITE) -> Path:
    return Path(layout.conversation_dir(str(root), site, cid))


def segments(root: Path, cid: str, site: str = SITE) -> list[Path]:
    return sorted(conv_dir(root, cid, site).glob("*.seg"))


def record_offsets(seg: Path) -> list[tuple[int, int, int]]:
    """``(offset, size, kind)`` of each record of a (valid) segment, up to its preallocated zeros."""
    data = seg.read_bytes()
    pos, out = frame.SEGMENT_HEADER_SIZE, []
    while pos + frame.RECORD_HEADER_SIZE <= len(data) and any(data[pos : pos + frame.RECORD_HEADER_SIZE]):
        h = frame.decode_record_header(data, pos)
        out.append((pos, h.size, h.kind))
        pos += h.size
    return out


def salt_of(seg: Path) -> int:
    header = frame.decode_segment_header(seg.read_bytes()[: frame.SEGMENT_HEADER_SIZE])
    assert header is not None
    return header.salt


def flip_byte(path: Path, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0x40]))


def read_all(root: Path, cid: str, site: str = SITE) -> list[MemoryItem]:
    """Every item of a conversation, read through the engine."""
    with FileStore(root) as store:
        out: list[MemoryItem] = []
        while True:
            page = store.read(site, cid, Range(len(out), 1000))
            out.extend(page)
            if len(page) < 1000:
                return out


def cli(*args: str, stdin: bytes | None = None, timeout: float = 60) -> subprocess.CompletedProcess[bytes]:
    """Run ``python -m tools ARGS`` in a real subprocess."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run(
        [*TOOLS_CMD, *args], input=stdin, capture_output=True, env=env, timeout=timeout, cwd=REPO
    )


def fsck(root: Path, *args: str) -> tuple[int, dict[str, Any]]:
    """``convmem fsck ROOT ARGS --json``: exit status and the parsed report."""
    proc = cli("fsck", str(root), *args, "--json")
    assert proc.stdout, proc.stderr.decode()
    return proc.returncode, json.loads(proc.stdout)


def kinds(report: dict[str, Any]) -> list[str]:
    return sorted(p["kind"] for p in report["problems"])
