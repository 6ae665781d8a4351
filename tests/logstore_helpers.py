"""Shared helpers for the engine tests: snapshots of a data directory."""

from __future__ import annotations

import hashlib
import os

from convmem.logstore import layout


def _skip_made_ahead(dirpath: str, dirnames: list[str]) -> None:
    """Leave out of an ``os.walk`` what the engine makes ahead of need (logstore.convpool): no conversation's data."""
    for name in (layout.SPARE_DIR, layout.POOL_DIR if os.path.basename(os.path.dirname(dirpath)) == "sites" else ""):
        if name in dirnames:
            dirnames.remove(name)


def tree_digest(root: str) -> dict[str, str]:
    """Every file under ``root`` (relative path -> sha256 of its bytes), plus empty directories.

    A site's pool and spare directories (made ahead, in the background) are left out.
    """
    out: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        _skip_made_ahead(dirpath, dirnames)
        rel = os.path.relpath(dirpath, root)
        if not dirnames and not filenames:
            out[rel + "/"] = "dir"
        for name in filenames:
            path = os.path.join(dirpath, name)
            with open(path, "rb") as f:
                out[os.path.join(rel, name)] = hashlib.sha256(f.read()).hexdigest()
    return out


def segment_files(root: str) -> list[str]:
    """All segment files of conversations under ``root``, sorted (a site's pool left out)."""
    found = []
    for dirpath, dirs, files in os.walk(root):
        _skip_made_ahead(dirpath, dirs)
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
