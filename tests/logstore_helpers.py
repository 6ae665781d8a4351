"""Shared helpers for the engine tests: snapshots of a data directory."""

from __future__ import annotations

import hashlib
import os


def tree_digest(root: str) -> dict[str, str]:
    """Every file under ``root`` (relative path -> sha256 of its bytes), plus empty directories."""
    out: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        if not dirnames and not filenames:
            out[rel + "/"] = "dir"
        for name in filenames:
            path = os.path.join(dirpath, name)
            with open(path, "rb") as f:
                out[os.path.join(rel, name)] = hashlib.sha256(f.read()).hexdigest()
    return out


def segment_files(root: str) -> list[str]:
    """All segment files under ``root``, sorted."""
    found = []
    for dirpath, _dirs, files in os.walk(root):
        found.extend(os.path.join(dirpath, f) for f in files if f.endswith(".seg"))
    return sorted(found)


def data_size(path: str) -> int:
    """Bytes of a segment file up to its data end: the preallocated zeros after its records left out."""
    with open(path, "rb") as f:
        data = f.read()
    return max(len(data.rstrip(b"\x00")), 40)  # never inside the 40-byte segment header


def write_at_data_end(path: str | os.PathLike[str], data: bytes) -> int:
    """Write ``data`` where a segment's records end (over its preallocated zeros, or past its end); its offset."""
    offset = data_size(os.fspath(path))
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)
    return offset
