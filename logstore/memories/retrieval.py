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

import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Literal

from .. import fileio
from ._lexical import DEFAULT_WEIGHTS, LexicalIndex, query_terms
from ._semantic import Embedder, SemanticIndex, default_embedder

#: How many recent answers a retriever keeps (see ``Retriever._answers``).
ANSWERS_KEPT = 64

#: The constant of reciprocal rank fusion: a hit at rank r (from 1) scores w / (RRF_K + r).
RRF_K = 60


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
class Tuning:
    """The knobs of the ranking; the defaults were chosen on the dev half of bench/ltm_eval (see the README).

    ``lexical`` and ``semantic`` weigh each ranking in the fusion (0 leaves one
    out); ``bm25`` weighs the columns subject, summary, details, tags;
    ``min_similarity`` is the cosine below which the semantic ranking does not
    count a memory as relevant at all; ``lexical_gate`` is the cosine below
    which a lexical hit that lacks some of the query's words is dropped from
    the lexical ranking (when a model is attached): a memory sharing one
    incidental word with a task hint, and unlike it in meaning, must not push
    a memory that means the same out of the top two. A hit holding every query
    word is never dropped, so names and identifiers are always found.
    ``depth`` is how many hits of each ranking enter the fusion (at least the
    search's ``limit``); 30 ranks the dev half as well as 100 did, on the
    labelled set alone and among 10,000 distractors, for less work (see the
    README's long-term memory section).
    """

    lexical: float = 1.0
    semantic: float = 1.0
    bm25: tuple[float, float, float, float] = DEFAULT_WEIGHTS
    min_similarity: float = 0.1
    lexical_gate: float = 0.35
    depth: int = 30


def embedding_text(doc: MemoryDoc) -> str:
    """The text of ``doc`` that its vector is computed from: its content words, stop words removed.

    Averaging token vectors lets frequent function words pull every text
    towards the same point; dropping them (from queries too) measured better.
    """
    return " ".join(query_terms(" ".join((doc.subject, doc.summary, doc.details, " ".join(doc.tags)))))


@dataclass
class _Entry:
    key: int
    category: str
    tags: frozenset[str]
    active: bool


_Keep = Callable[[_Entry], bool]
_Default = Literal["default"]


class Retriever:
    """Fused lexical (and semantic) ranking over one site's memories, held in memory.

    Thread-safe: every public method holds one lock. ``index_dir`` is created
    and owned by the retriever for derived files; this implementation keeps
    everything in memory and writes nothing there.

    ``embedder`` is the model of the semantic ranking: by default the packaged
    WordLlama model (:func:`._semantic.default_embedder`); ``None`` ranks by
    BM25 alone. ``answers_kept`` is how many recent answers are kept for a
    repeated search (0: none), until the memories next change.
    """

    def __init__(
        self,
        index_dir: str,
        *,
        tuning: Tuning | None = None,
        embedder: Embedder | _Default | None = "default",
        answers_kept: int = ANSWERS_KEPT,
    ) -> None:
        self.index_dir = index_dir
        fileio.makedirs(index_dir)
        self._tuning = tuning or Tuning()
        self._embedder: Embedder | None = default_embedder() if embedder == "default" else embedder
        if self._embedder is None and self._tuning.semantic > 0:
            self._tuning = replace(self._tuning, semantic=0.0)
        self._lock = threading.RLock()
        self._lexical = LexicalIndex(self._tuning.bm25)
        self._semantic = SemanticIndex(self._embedder.dim if self._embedder else 1)
        self._entries: dict[str, _Entry] = {}
        self._ids: dict[int, str] = {}
        self._inactive: set[int] = set()  # keys of soft-deleted memories
        self._next_key = 1
        self._closed = False
        #: The last ``answers_kept`` answers of search, by their arguments, all dropped at every change of the
        #: memories: an agent often passes the same task hint on call after call. The answers are memory ids and
        #: scores; a key's query may hold a memory's text (memory_verify searches with it), and an erasure, like
        #: any change, empties the whole table. Process memory only, like everything here.
        self._answers_kept = answers_kept
        self._answers: OrderedDict[tuple[str, int, str | None, tuple[str, ...], bool], tuple[Hit, ...]] = OrderedDict()

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
            self._answers.clear()
            self._lexical.close()
            self._lexical = LexicalIndex(self._tuning.bm25)
            self._semantic = SemanticIndex(self._embedder.dim if self._embedder else 1)
            self._entries.clear()
            self._ids.clear()
            self._inactive.clear()
            self._next_key = 1
            rows = []
            for d in docs:
                entry = self._new_entry(d)
                rows.append((entry.key, d.subject, d.summary, d.details, d.tags))
            self._lexical.put_many(rows)
            if self._embedder is not None:
                vecs = self._embedder.embed([embedding_text(d) for d in docs])
                self._semantic.put_many([r[0] for r in rows], vecs, [d.active for d in docs])

    def upsert(self, doc: MemoryDoc) -> None:
        """Add ``doc`` or replace the memory of the same id (a soft delete is ``active=False``)."""
        with self._lock:
            self._check_open()
            self._answers.clear()
            old = self._entries.get(doc.memory_id)
            if old is None:
                entry = self._new_entry(doc)
            else:
                entry = _Entry(old.key, doc.category, frozenset(doc.tags), doc.active)
                self._entries[doc.memory_id] = entry
                if doc.active:
                    self._inactive.discard(entry.key)
                else:
                    self._inactive.add(entry.key)
            self._lexical.put(entry.key, doc.subject, doc.summary, doc.details, doc.tags)
            if self._embedder is not None:
                self._semantic.put(entry.key, self._embedder.embed([embedding_text(doc)])[0], doc.active)

    def erase(self, memory_id: str) -> None:
        """Forget ``memory_id`` entirely (no-op when unknown). Nothing of it was ever on disk."""
        with self._lock:
            self._check_open()
            self._answers.clear()
            entry = self._entries.pop(memory_id, None)
            if entry is None:
                return
            del self._ids[entry.key]
            self._inactive.discard(entry.key)
            self._lexical.remove(entry.key)
            self._semantic.remove(entry.key)

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
        key = (query, limit, category, tuple(tags), include_deleted)
        with self._lock:
            self._check_open()
            cached = self._answers.get(key)
            if cached is not None:
                self._answers.move_to_end(key)
                return list(cached)
            lex, sem = self._rankings(query, category, key[3], include_deleted, max(self._tuning.depth, limit))
            t = self._tuning
            fused: dict[str, float] = {}
            for weight, ranking in ((t.lexical, lex), (t.semantic, sem)):
                if weight > 0:
                    for rank, mid in enumerate(ranking, start=1):
                        fused[mid] = fused.get(mid, 0.0) + weight / (RRF_K + rank)
            ordered = sorted(fused.items(), key=lambda kv: (-kv[1], kv[0]))
            hits = tuple(Hit(mid, score) for mid, score in ordered[:limit])
            if self._answers_kept > 0:
                self._answers[key] = hits
                if len(self._answers) > self._answers_kept:
                    self._answers.popitem(last=False)
        return list(hits)

    def close(self) -> None:
        """Release the index; later calls raise ValueError. Idempotent."""
        with self._lock:
            if not self._closed:
                self._closed = True
                self._answers.clear()
                self._lexical.close()
                self._entries.clear()
                self._ids.clear()
                self._inactive.clear()

    # -- internals ---------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError("retriever is closed")

    def _new_entry(self, doc: MemoryDoc) -> _Entry:
        entry = _Entry(self._next_key, doc.category, frozenset(doc.tags), doc.active)
        self._next_key += 1
        self._entries[doc.memory_id] = entry
        self._ids[entry.key] = doc.memory_id
        if not doc.active:
            self._inactive.add(entry.key)
        return entry

    @staticmethod
    def _filter(category: str | None, tags: Sequence[str], include_deleted: bool) -> _Keep:
        want_tags = frozenset(tags)

        def keep(entry: _Entry) -> bool:
            return (
                (include_deleted or entry.active)
                and (category is None or entry.category == category)
                and want_tags <= entry.tags
            )

        return keep

    def _rankings(self, query: str, category: str | None, tags: tuple[str, ...], include_deleted: bool,
                  depth: int) -> tuple[list[str], list[str]]:
        """The lexical and semantic rankings of ``query`` (memory ids, best first, filtered, at most ``depth``).

        Either is empty when its weight is 0; the semantic one when no model is attached.
        """
        keep = self._filter(category, tags, include_deleted)
        terms = query_terms(query)
        t = self._tuning
        use_semantic = self._embedder is not None and t.semantic > 0 and bool(terms)
        gate = use_semantic and len(terms) > 1
        qvec = self._embedder.embed_one(" ".join(terms)) if use_semantic and self._embedder is not None else None
        sims = self._semantic.scores(qvec) if qvec is not None else None  # one pass, shared by the gate and the ranking
        lex: list[str] = []
        if t.lexical > 0:
            entry_of = self._entries
            ids = self._ids
            if category is None and not tags:  # activity alone: a set lookup per row, no call
                scored = self._lexical.rank(terms, limit=depth, skip=() if include_deleted else self._inactive)
            else:
                scored = self._lexical.rank(terms, limit=depth, keep=lambda k: keep(entry_of[ids[k]]))
            # Equal scores are ordered by memory id, not by key, so that a rebuilt index ranks the same.
            # (A tie at the depth cut may still keep a lower key: see LexicalIndex.rank.)
            ranked = sorted((score, ids[k], k) for k, score in scored)
            keys = [k for _, _, k in ranked]
            if gate and sims is not None and keys:
                near = self._semantic.similarity(sims, keys)
                doubtful = [k for k, sim in zip(keys, near, strict=True) if sim < t.lexical_gate]
                full = self._lexical.matching_all(terms, doubtful)
                keys = [k for k, sim in zip(keys, near, strict=True) if sim >= t.lexical_gate or k in full]
            lex = [self._ids[k] for k in keys]
        sem: list[str] = []
        if use_semantic and sims is not None:
            total = len(self._entries)
            # Without a category or tag filter every candidate counts (rank applies activity itself, and
            # includes every row tied with the last), so the top ``depth`` are exactly the best ``depth``.
            unfiltered = category is None and not tags
            want = depth if unfiltered else 2 * depth
            while True:
                cands = self._semantic.rank(sims, t.min_similarity, want, active_only=not include_deleted)
                if unfiltered:
                    kept = [(sim, self._ids[key]) for sim, key in cands]
                else:
                    kept = [(sim, mid) for sim, key in cands if keep(self._entries[mid := self._ids[key]])]
                if len(kept) >= depth or len(cands) < want or want >= total:
                    break
                want *= 4
            kept.sort(key=lambda c: (-c[0], c[1]))
            sem = [mid for _, mid in kept[:depth]]
        return lex, sem
