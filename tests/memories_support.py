"""Shared helpers for the long-term memory tests."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from convmem.logstore.memories import LongTermMemory, Memory

SITE = "memsite-01"
OTHER = "memsite-02"


def fields(n: int = 0, **over: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "category": "preference",
        "subject": f"subject number {n} about zebra{n}",
        "summary": f"summary {n}: the user likes quokka{n} facts",
        "details": f"details {n} mentioning walrus{n}",
        "tags": [f"tag{n}", "shared"],
        "source_uris": [f"https://example.org/doc/{n}"],
        "dedupe_key": f"key-{n}",
    }
    base.update(over)
    return base


def create(store: LongTermMemory, raw: dict[str, Any], site: str = SITE) -> Memory:
    _, token, _ = store.verify(site, "create", raw)
    return store.upsert(site, raw, token)


def update(store: LongTermMemory, memory_id: str, raw: dict[str, Any], site: str = SITE, **kw: Any) -> Memory:
    _, token, _ = store.verify(site, "update", raw, memory_id)
    return store.upsert(site, raw, token, memory_id=memory_id, **kw)


def delete(store: LongTermMemory, memory_id: str, force: bool = False, site: str = SITE) -> Memory | None:
    _, token, _ = store.verify(site, "delete", None, memory_id, force=force)
    return store.delete(site, memory_id, token, force)


def files_holding(root: Path, needles: list[bytes]) -> list[tuple[str, bytes]]:
    """Every (file, needle) where a file under ``root`` contains one of ``needles`` (also as JSON-escaped text)."""
    hits = []
    for dirpath, _dirs, names in os.walk(root):
        for name in names:
            path = os.path.join(dirpath, name)
            try:
                data = Path(path).read_bytes()
            except OSError:
                continue
            for needle in needles:
                if needle in data:
                    hits.append((path, needle))
    return hits


def tree_bytes(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` and its bytes (to prove a failed call wrote nothing)."""
    out = {}
    for dirpath, _dirs, names in os.walk(root):
        for name in names:
            path = os.path.join(dirpath, name)
            out[os.path.relpath(path, root)] = Path(path).read_bytes()
    return out
