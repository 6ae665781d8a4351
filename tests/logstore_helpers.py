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
