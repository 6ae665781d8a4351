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


class MemoryStores:
    """Opens long-term memory stores of one backend that all see the same memories (a directory, or a schema).

    ``kind`` is "file" or "postgres"; ``options`` go to every store opened.
    Each PostgreSQL memory store gets a conversation store of its own (as a
    server has), so two of them are two servers on one database.
    """

    def __init__(self, kind: str, tmp: Path, dsn: str | None) -> None:
        from tests import pg_support

        self.kind = kind
        self.dir = tmp / "data"
        self.dsn = dsn
        self.schema = pg_support.new_schema(dsn) if dsn else ""
        self.opened: list[Any] = []

    def open(self, **options: Any) -> Any:
        from convmem.logstore.memories import LongTermStore

        store: LongTermStore
        if self.kind == "file":
            store = LongTermMemory(self.dir, **options)
            self.opened.append(store)
            return store
        from convmem.logstore.postgres import PgLongTermMemory, PgStore

        assert self.dsn is not None
        lock_timeout = options.pop("lock_timeout", 5.0)
        logs = PgStore(self.dsn, schema=self.schema, pool_min=1, pool_max=4, lock_timeout=lock_timeout)
        self.opened.append(logs)
        store = PgLongTermMemory(logs, **options)
        self.opened.append(store)
        return store

    def cleanup(self) -> None:
        from tests import pg_support

        for s in reversed(self.opened):
            s.close()
        if self.kind == "postgres" and self.dsn:
            pg_support.drop_schema(self.dsn, self.schema)

    def snapshot(self) -> dict[str, Any]:
        """Everything the memories are kept in: the data directory's files, or the memory tables' rows."""
        if self.kind == "file":
            return tree_bytes(self.dir) if self.dir.exists() else {}
        import psycopg

        assert self.dsn is not None
        out: dict[str, Any] = {}
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            for table in ("memories", "memory_sites", "memory_tokens"):
                rows = conn.execute(f'SELECT * FROM "{self.schema}".{table} ORDER BY 1, 2'.encode()).fetchall()
                out[table] = [tuple(bytes(v) if isinstance(v, memoryview) else v for v in r) for r in rows]
        return out

    def holding(self, needles: list[bytes]) -> list[Any]:
        """Where ``needles`` are still kept: files of the data directory, or rows of the memory tables."""
        if self.kind == "file":
            return files_holding(self.dir, needles) if self.dir.exists() else []
        hits = []
        for table, rows in self.snapshot().items():
            for row in rows:
                blob = repr(row).encode() + b"".join(v for v in row if isinstance(v, bytes))
                hits += [(table, n) for n in needles if n in blob]
        return hits
