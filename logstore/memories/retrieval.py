"""Ranking a site's long-term memories for a query: the retrieval behind search, verify and auto-surface.

A :class:`Retriever` keeps derived, rebuildable state only. The store hands it
the full current set of memories at open (:meth:`Retriever.load`) and every
change after that (:meth:`Retriever.upsert`, :meth:`Retriever.erase`); it is
never the source of truth. All of its state lives in process memory and is
rebuilt at every open, so no file under ``index_dir`` ever holds a memory's
text and erasure is complete as soon as :meth:`Retriever.erase` returns.

Ranking is reciprocal rank fusion (k = 60) of a lexical ranking (BM25 from
SQLite FTS5, see :mod:`._lexical`) and, when an embedding model is attached,
a semantic one (cosine similarity, see :mod:`._semantic`). Filters (active
only unless ``include_deleted``, category, tags) are applied before fusion.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from ._lexical import DEFAULT_WEIGHTS, LexicalIndex, query_terms

#: The constant of reciprocal rank fusion: a hit at rank r (from 1) scores w / (RRF_K + r).
RRF_K = 60

#: How many hits of each ranking enter the fusion.
FUSION_DEPTH = 100


@dataclass(frozen=True)
class MemoryDoc:
    """What retrieval needs of one memory: its id, filter fields and searchable text."""

    memory_id: str
    category: str
    subject: str
    summary: str
    details: str
    tags: tuple[str, ...]
    active: bool


@dataclass(frozen=True)
class Hit:
    """One ranked memory: its id and fused score (higher is better; only the order is meaningful)."""

    memory_id: str
    score: float


@dataclass(frozen=True)
class FusionWeights:
    """The weight of each ranking in the fusion; a weight of 0 leaves that ranking out."""

    lexical: float = 1.0
    semantic: float = 0.0


@dataclass
class _Entry:
    key: int
    category: str
    tags: frozenset[str]
    active: bool


_Keep = Callable[[_Entry], bool]


class Retriever:
    """Fused lexical (and semantic) ranking over one site's memories, held in memory.

    Thread-safe: every public method holds one lock. ``index_dir`` is created
    and owned by the retriever for derived files; this implementation keeps
    everything in memory and writes nothing there.
    """

    def __init__(
        self,
        index_dir: str,
        *,
        fusion: FusionWeights | None = None,
        bm25_weights: Sequence[float] = DEFAULT_WEIGHTS,
    ) -> None:
        self.index_dir = index_dir
        os.makedirs(index_dir, exist_ok=True)
        self._fusion = fusion or FusionWeights()
        self._lock = threading.RLock()
        self._lexical = LexicalIndex(bm25_weights)
        self._entries: dict[str, _Entry] = {}
        self._ids: dict[int, str] = {}
        self._next_key = 1
        self._closed = False

    # -- state -------------------------------------------------------------

    def load(self, docs: Iterable[MemoryDoc]) -> None:
        """Replace the whole state by ``docs`` (the store's current memories at open).

        Raises ValueError if two docs share a memory id.
        """
        docs = list(docs)
        seen: set[str] = set()
        for d in docs:
            if d.memory_id in seen:
                raise ValueError(f"load: memory id {d.memory_id!r} given twice")
            seen.add(d.memory_id)
        with self._lock:
            self._check_open()
            self._lexical.close()
            self._lexical = LexicalIndex(self._lexical_weights())
            self._entries.clear()
            self._ids.clear()
            self._next_key = 1
            rows = []
            for d in docs:
                entry = self._new_entry(d)
                rows.append((entry.key, d.subject, d.summary, d.details, d.tags))
            self._lexical.put_many(rows)

    def upsert(self, doc: MemoryDoc) -> None:
        """Add ``doc`` or replace the memory of the same id (a soft delete is ``active=False``)."""
        with self._lock:
            self._check_open()
            old = self._entries.get(doc.memory_id)
            if old is None:
                entry = self._new_entry(doc)
            else:
                entry = _Entry(old.key, doc.category, frozenset(doc.tags), doc.active)
                self._entries[doc.memory_id] = entry
            self._lexical.put(entry.key, doc.subject, doc.summary, doc.details, doc.tags)

    def erase(self, memory_id: str) -> None:
        """Forget ``memory_id`` entirely (no-op when unknown). Nothing of it was ever on disk."""
        with self._lock:
            self._check_open()
            entry = self._entries.pop(memory_id, None)
            if entry is None:
                return
            del self._ids[entry.key]
            self._lexical.remove(entry.key)

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    # -- ranking -----------------------------------------------------------

    def search(
        self,
        query: str,
        *,
        limit: int,
        category: str | None = None,
        tags: Sequence[str] = (),
        include_deleted: bool = False,
    ) -> list[Hit]:
        """At most ``limit`` memories relevant to ``query``, best first.

        Only active memories unless ``include_deleted``; only those of
        ``category`` when given; only those carrying every tag in ``tags``
        (exact, case-sensitive match). A memory that neither ranking finds
        relevant is never returned, so the list may be shorter than ``limit``.
        """
        if limit < 1:
            raise ValueError(f"limit must be at least 1, got {limit}")
        want_tags = frozenset(tags)
        with self._lock:
            self._check_open()

            def keep(entry: _Entry) -> bool:
                return (
                    (include_deleted or entry.active)
                    and (category is None or entry.category == category)
                    and want_tags <= entry.tags
                )

            depth = max(limit, FUSION_DEPTH)
            fused: dict[str, float] = {}
            if self._fusion.lexical > 0:
                for rank, mid in enumerate(self._lexical_ranking(query, keep, depth), start=1):
                    fused[mid] = fused.get(mid, 0.0) + self._fusion.lexical / (RRF_K + rank)
        ordered = sorted(fused.items(), key=lambda kv: (-kv[1], kv[0]))
        return [Hit(mid, score) for mid, score in ordered[:limit]]

    def close(self) -> None:
        """Release the index; later calls raise ValueError. Idempotent."""
        with self._lock:
            if not self._closed:
                self._closed = True
                self._lexical.close()
                self._entries.clear()
                self._ids.clear()

    # -- internals ---------------------------------------------------------

    def _lexical_weights(self) -> Sequence[float]:
        return self._lexical._weights

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError("retriever is closed")

    def _new_entry(self, doc: MemoryDoc) -> _Entry:
        entry = _Entry(self._next_key, doc.category, frozenset(doc.tags), doc.active)
        self._next_key += 1
        self._entries[doc.memory_id] = entry
        self._ids[entry.key] = doc.memory_id
        return entry

    def _lexical_ranking(self, query: str, keep: _Keep, depth: int) -> list[str]:
        """Memory ids by BM25 (ties by id), filtered, at most ``depth``."""
        scored = []
        for key, score in self._lexical.rank(query_terms(query)):
            mid = self._ids[key]
            if keep(self._entries[mid]):
                scored.append((score, mid))
        scored.sort()
        return [mid for _, mid in scored[:depth]]
