"""One site's long-term memories as one server holds them: rows read from PostgreSQL, and their index.

The database holds the truth; a :class:`SiteView` holds a copy of the site's
rows (as :class:`~logstore.memories.Memory` records) and the ranking index
built from them with their stored vectors, plus the value of the site's
change counter the copy reflects (``seen``). :meth:`SiteView.refresh` reads
the counter (one indexed row) and, when it moved, the rows written since
(``change > seen``), or every row again when an erasure happened since
(``erased > seen``: an erased row leaves nothing to read). Both reads run in
one REPEATABLE READ snapshot, so the copy is exactly the site at one change.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import msgspec
import psycopg

from ..memories.indexing import RetrieverLike, to_doc
from ..memories.record import Memory, fields_from_stored
from ._memsql import MemoryStatements

_vec_decoder = msgspec.json.Decoder(type=dict[str, Any])


def memory_from_row(row: Sequence[Any]) -> tuple[Memory, Any]:
    """The record and the stored vector (a dict, or None) of a row of ``COLUMNS``."""
    mid, status, version, created, updated, accessed, deleted, record, vec = row
    m = Memory(
        memory_id=str(mid),
        fields=fields_from_stored(msgspec.json.decode(bytes(record))),
        status=str(status),
        created_us=int(created),
        updated_us=int(updated),
        last_accessed_us=max(int(accessed), int(updated)),
        deleted_us=int(deleted) if deleted is not None else None,
        version=int(version),
    )
    return m, (_vec_decoder.decode(bytes(vec)) if vec is not None else None)


class SiteView:
    """What this server holds of one site; every method but :meth:`touch` is called with ``mutex`` held."""

    def __init__(self, site: str, sql: MemoryStatements, retriever_factory: Callable[[Any], RetrieverLike]) -> None:
        self.site = site
        self.sql = sql
        self.mutex = threading.RLock()
        self.state: dict[str, Memory] = {}
        #: The site's change counter as the state reflects it; -1 before the first read.
        self.seen = -1
        #: Stored vectors by id, kept from the rows read until the index is built (then None).
        self._vecs: dict[str, Any] | None = {}
        self._factory = retriever_factory
        self._retriever: RetrieverLike | None = None
        #: Access times not yet written to the database, by id.
        self.touched: dict[str, int] = {}

    def retriever(self) -> RetrieverLike:
        if self._retriever is None:
            vecs = self._vecs or {}
            self._retriever = self._factory(None)
            self._retriever.load([to_doc(m, vecs.get(k)) for k, m in self.state.items()])
            self._vecs = None
        return self._retriever

    def refresh(self, conn: psycopg.Connection[Any]) -> None:
        """Bring the state up to the site's current change (see the module's docstring)."""
        row = conn.execute(self.sql.counters, (self.site,)).fetchone()
        if row is not None and int(row[0]) == self.seen:
            return
        if row is None and self.seen == 0:
            return
        with conn.transaction():
            conn.execute(b"SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            row = conn.execute(self.sql.counters, (self.site,)).fetchone()
            changes, erased = (int(row[0]), int(row[1])) if row is not None else (0, 0)
            if changes == self.seen:
                return
            if self.seen < 0 or erased > self.seen or changes < self.seen:
                rows = conn.execute(self.sql.rows_all, (self.site,)).fetchall()
                self._replace([memory_from_row(r) for r in rows])
            else:
                for r in conn.execute(self.sql.rows_since, (self.site, self.seen)).fetchall():
                    self.put(*memory_from_row(r))
            self.seen = changes

    def _replace(self, rows: list[tuple[Memory, Any]]) -> None:
        self.state = {m.memory_id: self._with_touch(m) for m, _ in rows}
        vecs = {m.memory_id: v for m, v in rows}
        if self._retriever is not None:
            self._retriever.load([to_doc(m, vecs.get(k)) for k, m in self.state.items()])
        else:
            self._vecs = vecs

    def _with_touch(self, m: Memory) -> Memory:
        at = self.touched.get(m.memory_id)
        return m if at is None else m.touched(at)

    def put(self, m: Memory, vec: Any) -> Memory:
        """Hold ``m`` (read or just written) with its stored vector."""
        m = self._with_touch(m)
        prev = self.state.get(m.memory_id)
        if prev is not None:
            m = m.touched(prev.last_accessed_us)
        self.state[m.memory_id] = m
        if self._retriever is not None:
            self._retriever.upsert(to_doc(m, vec))
        elif self._vecs is not None:
            self._vecs[m.memory_id] = vec
        return m

    def forget(self, memory_id: str) -> None:
        """Drop an erased memory from the state, the index and the pending access times."""
        self.state.pop(memory_id, None)
        self.touched.pop(memory_id, None)
        if self._retriever is not None:
            self._retriever.erase(memory_id)
        elif self._vecs is not None:
            self._vecs.pop(memory_id, None)

    def touch(self, ms: Sequence[Memory], now: int) -> list[Memory]:
        """Record that these memories were just shown; their records with the new access time."""
        with self.mutex:
            out = []
            for m in ms:
                cur = self.state.get(m.memory_id)
                if cur is None:
                    continue
                t = cur.touched(now)
                self.state[m.memory_id] = t
                self.touched[m.memory_id] = t.last_accessed_us
                out.append(t)
            return out

    def flush(self, conn: psycopg.Connection[Any]) -> None:
        """Write the pending access times (never a change of the site: no counter, no version)."""
        if not self.touched:
            return
        ids, times = list(self.touched), list(self.touched.values())
        conn.execute(self.sql.touch, (ids, times, self.site))
        self.touched.clear()

    def indexed(self) -> int:
        """How many memories this server holds for the site now: its records, and its ranking index when
        built (0 once :meth:`release` let them go). Records read without an index (a ``get``, a listing)
        count too: they take memory all the same."""
        return len(self.state)

    def release(self) -> None:
        """Let go of the records and the ranking index; the next call reads every row (and its stored vector)
        again, and the next ranking builds the index from them. Pending access times are kept."""
        with self.mutex:
            if self._retriever is not None:
                self._retriever.close()
                self._retriever = None
            self.state, self._vecs, self.seen = {}, {}, -1

    def close(self) -> None:
        if self._retriever is not None:
            self._retriever.close()
            self._retriever = None
