"""Ranking a site's long-term memories for a query: the retrieval behind search, verify and auto-surface.

A :class:`Retriever` keeps derived, rebuildable state only. The store hands it
the full current set of memories at open (:meth:`Retriever.load`) and every
change after that (:meth:`Retriever.upsert`, :meth:`Retriever.erase`); it is
never the source of truth. All of its state lives in process memory and is
rebuilt at every open, so no file under ``index_dir`` ever holds a memory's
text and erasure is complete as soon as :meth:`Retriever.erase` returns.

The exception is a memory's vector: the store computes it once at write
(:meth:`Retriever.vector_for`), keeps it in the memory's event (so erasing
the events erases it) and hands it back with the doc at open; a doc whose
stored vector is missing, stale or damaged is encoded again (see
:mod:`.vectors`).

Ranking is reciprocal rank fusion (k = 60) of a lexical ranking (BM25 from
SQLite FTS5, see :mod:`._lexical`) and, when an embedding model is attached,
a semantic one (cosine similarity of sentence vectors, see :mod:`._semantic`
and :mod:`.encoder`). Filters (active only unless ``include_deleted``,
category, tags) are applied before fusion. Every hit carries its cosine
similarity to the query (:attr:`Hit.similarity`), the readable score. A
hit is :attr:`Hit.relevant` (the auto-surface shows nothing else) when the
memory holds every word of the query, or its similarity reaches
:attr:`Tuning.relevance` and it covers enough of the query's words, by
holding them or by meaning (see :class:`Tuning`).
"""

from __future__ import annotations

import sqlite3
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import numpy as np

from .. import fileio
from . import vectors
from ._lexical import DEFAULT_WEIGHTS, LexicalIndex, query_terms
from ._semantic import Embedder, SemanticIndex, Vectors

#: How many recent answers a retriever keeps (see ``Retriever._answers``).
ANSWERS_KEPT = 64

#: How many query vectors a retriever keeps, by query text (1.5 KiB each, and 1.5 KiB per content word of the query
#: for its word vectors: about 10 KiB for a task hint of six content words).
QUERY_VECTORS_KEPT = 256

#: The constant of reciprocal rank fusion: a hit at rank r (from 1) scores w / (RRF_K + r).
RRF_K = 60

#: How many times a search ranks outside the lock before it ranks under it, when each try raced a change of the
#: index (see ``Retriever.search``): a lone write costs the searches beside it one more unlocked try, not a queue.
OPTIMISTIC_TRIES = 3


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
    #: The vector stored with the memory's events (see :mod:`.vectors`), if any; checked before use.
    vector: Mapping[str, Any] | None = field(default=None, compare=False)


@dataclass(frozen=True)
class Hit:
    """One ranked memory.

    ``score`` is the fused rank score (higher is better; only the order it
    gives is meaningful). ``similarity`` is the cosine similarity of the
    memory's vector to the query's, rounded to 3 places (None without a
    model): about 0.6 and above means the same topic, below 0.3 unrelated.
    ``relevant``: the auto-surface may show it (see :class:`Tuning`'s
    relevance rule).
    """

    memory_id: str
    score: float
    similarity: float | None = None
    relevant: bool = True


#: The knobs of :class:`Tuning` that only judge hits (the relevance rule): changing them ranks nothing anew.
RELEVANCE_KNOBS = ("relevance", "overlap_weight", "overlap_relevance", "coverage_weight",
                   "paraphrase_coverage_weight", "paraphrase_relevance", "coverage_low", "coverage_high")


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

    The relevance rule (:attr:`Hit.relevant`; the auto-surface shows nothing
    else): a hit holding every query word is relevant; any other needs a
    similarity of at least ``relevance`` and enough evidence that it speaks of
    what the query asks. Two shares of the query's word weight (BM25 IDF: rare
    words, names, weigh most) measure that: ``share``, the part the memory
    holds (after stemming), and ``coverage``, the part it holds or comes
    close to: a query word it does not hold counts by the cosine between that
    word's vector, read in the query's context (the encoder's states of its
    tokens, averaged: ``Encoder.embed_query``), and the memory's vector, from
    nothing at ``coverage_low`` to whole at ``coverage_high``. A memory sharing
    some of the query's words needs ``similarity + overlap_weight * share +
    coverage_weight * coverage >= overlap_relevance``; one sharing none (a
    paraphrase) ``similarity + paraphrase_coverage_weight * coverage >=
    paraphrase_relevance``. Coverage is what tells a hint about something the
    store does not hold, naming something it does ("what tuning does Sam use
    on the guitar" against "Sam is learning fingerstyle guitar"), from one the
    memory answers: the shared name lifts similarity and share alike, but the
    word asked about ("tuning") finds nothing close in the memory. Without
    word vectors (an embedder lacking ``embed_query``) coverage is the share.
    ``python -m bench.ltm_eval.tune`` chose the gate, weights and rule for the
    shipped encoder on the dev half: the rule with the highest abstention on
    the dev no-answer hints whose auto-surface recall@2 on the dev queries
    stays within 0.03 of the ranking's recall@2.
    """

    lexical: float = 1.0
    semantic: float = 1.0
    bm25: tuple[float, float, float, float] = DEFAULT_WEIGHTS
    min_similarity: float = 0.1
    lexical_gate: float = 0.4
    depth: int = 30
    relevance: float = 0.3
    overlap_weight: float = 0.8
    coverage_weight: float = 0.2
    overlap_relevance: float = 0.95
    paraphrase_coverage_weight: float = 0.2
    paraphrase_relevance: float = 0.35
    coverage_low: float = 0.15
    coverage_high: float = 0.6


def embedding_text(doc: MemoryDoc) -> str:
    """The text of ``doc`` that its vector is computed from: its fields as sentences, then its tags.

    A sentence encoder reads word order and function words, so it is given
    natural text (queries too, as typed): measured better than the content
    words alone (bench/ltm_eval/models/README.md).
    """
    s = ". ".join(p.strip().rstrip(".") for p in (doc.subject, doc.summary, doc.details) if p.strip())
    if doc.tags:
        s += ". " + ", ".join(doc.tags)
    return s


@dataclass(frozen=True)
class EncodedQuery:
    """A query's vector, computed by :meth:`Retriever.encode_query` before the caller takes any lock.

    ``text`` is what the encoder was given (see ``Retriever._query_text``),
    ``model_id`` the model that gave ``vector`` (None without one); a search
    uses the vector only if both match what it would compute itself.
    """

    text: str
    model_id: str | None
    vector: Vectors | None
    #: One unit vector per content word of the query (see ``Retriever._query_vector``), None when the
    #: embedder cannot give them; the relevance rule's coverage needs them.
    words: Vectors | None = None


@dataclass(slots=True)
class _Entry:
    key: int
    category: str
    tags: frozenset[str]
    active: bool


@dataclass(frozen=True)
class _View:
    """The parts of a retriever a ranking reads, as they were when it began (see ``Retriever.search``)."""

    lexical: LexicalIndex
    semantic: SemanticIndex
    entries: dict[str, _Entry]
    ids: dict[int, str]
    inactive: set[int]
    tuning: Tuning


#: What a ranking that raced a change may raise, reading structures the change was rewriting.
_TORN = (KeyError, IndexError, ValueError, RuntimeError, sqlite3.Error)

#: A query's vector and its content words' vectors (None when the embedder gives none).
_QueryVectors = tuple[Vectors, Vectors | None]

class _HoldingAll:
    """Which rows hold every term of a query: one FTS statement per search, however often it is asked."""

    def __init__(self, lexical: LexicalIndex, terms: Sequence[str], db: sqlite3.Connection | None) -> None:
        self._lexical, self._terms, self._db = lexical, terms, db
        self._rows: set[int] | None = None

    def among(self, keys: Sequence[int]) -> set[int]:
        if not self._terms or not keys:
            return set()
        if self._rows is None:
            self._rows = self._lexical.matching_all(self._terms, None, self._db)
        return self._rows & set(keys)


def _coverage(view: _View, t: Tuning, keys: Sequence[int], words: Vectors, weights: Sequence[float],
              held: Mapping[int, set[int]]) -> dict[int, float]:
    """For each of ``keys``, the share of the query's word weight (``weights``, one per query word, the
    rows of ``words``) that the memory covers: a word it holds counts whole, any other by how close that
    word's vector (read in the query's context) is to the memory's vector, from nothing at
    ``coverage_low`` to whole at ``coverage_high``."""
    total = sum(weights)
    if not total or len(words) != len(weights):
        return {}
    close = np.einsum("ij,kj->ik", words, view.semantic.vectors(keys))  # (query words, keys); no BLAS threads
    part = np.clip((close - t.coverage_low) / max(t.coverage_high - t.coverage_low, 1e-6), 0.0, 1.0)
    w = np.asarray(weights, dtype=np.float32)
    out = {}
    for j, k in enumerate(keys):
        col = part[:, j]
        for i in held.get(k, ()):
            col[i] = 1.0
        out[k] = float(w @ col) / total
    return out


_Keep = Callable[[_Entry], bool]
_NO_TAGS: frozenset[str] = frozenset()
_Default = Literal["default"]


class Retriever:
    """Fused lexical (and semantic) ranking over one site's memories, held in memory.

    Thread-safe: every public method holds one lock, except that encoding a
    new query or memory text runs outside it (the encoder releases the GIL,
    so searches of other threads go on meanwhile), and so does a search's
    ranking, optimistically: see :meth:`search`. ``index_dir`` is created
    and owned by the retriever for derived files; this implementation keeps
    everything in memory and writes nothing there.

    ``embedder`` is the model of the semantic ranking: by default the shipped
    sentence encoder (:func:`.encoder.default_encoder`); ``None`` ranks by
    BM25 alone. ``answers_kept`` is how many recent answers are kept for a
    repeated search (0: none), until the memories next change;
    ``query_vectors_kept`` how many query vectors, by query text, until an
    erasure.
    """

    def __init__(
        self,
        index_dir: str | None = None,
        *,
        tuning: Tuning | None = None,
        embedder: Embedder | _Default | None = "default",
        answers_kept: int = ANSWERS_KEPT,
        query_vectors_kept: int = QUERY_VECTORS_KEPT,
    ) -> None:
        self.index_dir = index_dir
        # None: the store has no directory for the index (PostgreSQL); nothing is written anyway.
        # Durably: this may be the first thing to create the site's directories (a verify before
        # the first write builds the retriever), and the writers' makedirs_durable trusts any
        # directory it finds; an unsynced ``sites/<hex>`` entry would lose acknowledged memories.
        if index_dir is not None:
            fileio.makedirs_durable(index_dir)
        self._tuning = tuning or Tuning()
        if embedder == "default":
            from .encoder import default_encoder

            embedder = default_encoder()
        self._embedder: Embedder | None = embedder
        if self._embedder is None and self._tuning.semantic > 0:
            self._tuning = replace(self._tuning, semantic=0.0)
        self._lock = threading.RLock()
        #: Bumped under the lock before every change of what a ranking reads: a ranking run outside the lock
        #: stands only if the version is the same after it as before (see :meth:`search`).
        self._version = 0
        self._lexical = LexicalIndex(self._tuning.bm25)
        self._semantic = SemanticIndex(self._embedder.dim if self._embedder else 1)
        self._entries: dict[str, _Entry] = {}
        self._ids: dict[int, str] = {}
        self._inactive: set[int] = set()  # keys of soft-deleted memories
        self._next_key = 1
        #: Every distinct tag set of the entries, shared by them (see ``_tag_set``); grows only with new sets.
        self._tag_sets: dict[frozenset[str], frozenset[str]] = {}
        self._closed = False
        #: How many docs of the last load had no usable stored vector (encoded again).
        self.recomputed = 0
        #: The last ``answers_kept`` answers of search, by their arguments, all dropped at every change of the
        #: memories: an agent often passes the same task hint on call after call. The answers are memory ids and
        #: scores; a key's query may hold a memory's text (memory_verify searches with it), and an erasure, like
        #: any change, empties the whole table. Process memory only, like everything here.
        self._answers_kept = answers_kept
        self._answers: OrderedDict[tuple[str, int, str | None, tuple[str, ...], bool], tuple[Hit, ...]] = OrderedDict()
        #: Query vectors by query text: they do not depend on the memories, so only an erasure (whose memory's
        #: text a verify query may have held) empties the table.
        self._qvecs_kept = query_vectors_kept
        self._qvecs: OrderedDict[str, _QueryVectors] = OrderedDict()

    # -- vectors -----------------------------------------------------------

    def vector_for(self, doc: MemoryDoc) -> dict[str, Any] | None:
        """The stored form of ``doc``'s vector (to keep with its events), None without a model.

        Needs no lock and touches no state: a writer calls it before taking its own locks.
        """
        if self._embedder is None:
            return None
        text = embedding_text(doc)
        return vectors.pack(self._embedder.embed_one(text), self._embedder.model_id, text)

    def _vectors_of(self, docs: Sequence[MemoryDoc], out: Vectors | None = None) -> Vectors:
        """The vectors of ``docs`` (into ``out``'s first rows when given): the stored ones that pass every
        check, the others encoded now."""
        emb = self._embedder
        assert emb is not None
        texts = [embedding_text(d) for d in docs]
        out, redo = vectors.unpack_many([d.vector for d in docs], texts, emb.model_id, emb.dim, out)
        if redo:
            out[redo] = vectors.rounded(emb.embed([texts[i] for i in redo]))
        self.recomputed = len(redo)
        return out

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
        # The new semantic index is filled outside the lock, its matrix written in place (no second copy).
        semantic = SemanticIndex(self._embedder.dim if self._embedder else 1, capacity=len(docs) + 64)
        vecs = self._vectors_of(docs, semantic.matrix_for(len(docs))) if self._embedder is not None else None
        with self._lock:
            self._check_open()
            self._version += 1
            self._answers.clear()
            self._lexical.close()
            self._lexical = LexicalIndex(self._tuning.bm25)
            self._semantic = semantic
            # New containers, not cleared ones: a ranking still reading the old ones finds them as they were.
            self._entries = {}
            self._tag_sets.clear()
            self._ids = {}
            self._inactive = set()
            self._next_key = 1
            rows = []
            for d in docs:
                entry = self._new_entry(d)
                rows.append((entry.key, d.subject, d.summary, d.details, d.tags))
            self._lexical.put_many(rows)
            if vecs is not None:
                self._semantic.put_many([r[0] for r in rows], vecs, [d.active for d in docs])

    def upsert(self, doc: MemoryDoc) -> None:
        """Add ``doc`` or replace the memory of the same id (a soft delete is ``active=False``)."""
        vec = self._vectors_of([doc])[0] if self._embedder is not None else None
        with self._lock:
            self._check_open()
            self._version += 1
            self._answers.clear()
            old = self._entries.get(doc.memory_id)
            if old is None:
                entry = self._new_entry(doc)
            else:
                entry = _Entry(old.key, doc.category, self._tag_set(doc.tags), doc.active)
                self._entries[doc.memory_id] = entry
                if doc.active:
                    self._inactive.discard(entry.key)
                else:
                    self._inactive.add(entry.key)
            self._lexical.put(entry.key, doc.subject, doc.summary, doc.details, doc.tags)
            if vec is not None:
                self._semantic.put(entry.key, vec, doc.active)

    def erase(self, memory_id: str) -> None:
        """Forget ``memory_id`` entirely (no-op when unknown). Nothing of it was ever on disk here."""
        with self._lock:
            self._check_open()
            self._version += 1
            self._answers.clear()
            self._qvecs.clear()
            entry = self._entries.pop(memory_id, None)
            if entry is None:
                return
            del self._ids[entry.key]
            self._inactive.discard(entry.key)
            self._lexical.remove(entry.key)
            self._semantic.remove(entry.key)

    def set_relevance(self, tuning: Tuning) -> None:
        """Judge hits by ``tuning``'s relevance rule from now on (its :data:`RELEVANCE_KNOBS`; its other knobs
        are ignored): the rule ranks nothing, so nothing is rebuilt.

        For the tuning kit, which tries many rules on one index. Drops the kept answers.
        """
        with self._lock:
            self._check_open()
            self._version += 1
            self._answers.clear()
            self._tuning = replace(self._tuning, **{f: getattr(tuning, f) for f in RELEVANCE_KNOBS})

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
        encoded: EncodedQuery | None = None,
    ) -> list[Hit]:
        """At most ``limit`` memories relevant to ``query``, best first.

        Only active memories unless ``include_deleted``; only those of
        ``category`` when given; only those carrying every tag in ``tags``
        (exact, case-sensitive match). A memory that neither ranking finds
        relevant is never returned, so the list may be shorter than ``limit``.
        A query not seen lately is encoded before the lock is taken, unless
        ``encoded`` (from :meth:`encode_query`, by a caller that encoded it
        before taking locks of its own) already holds its vector.

        The ranking itself runs outside the lock too, on a read connection of
        its own (``LexicalIndex.reading``) and on the structures as they were
        when it began (:class:`_View`), so that the rankings of several
        threads run at once. It is optimistic: every change bumps a version
        under the lock before it touches anything, and the ranking stands
        only if the version is unchanged once it is done (checked under the
        lock); otherwise (a write ran meanwhile; what it read may be torn) it
        is thrown away, whatever it returned or raised, and run again: outside
        the lock again, up to :data:`OPTIMISTIC_TRIES` tries in all, then under
        the lock on the writer's connection. So the hits are always those of
        one state of the index that held while the search ran.
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
        qvec = self._given_vector(query, encoded) if encoded is not None else self._query_vector(query)
        hits: tuple[Hit, ...] | None = None
        for _ in range(OPTIMISTIC_TRIES):
            with self._lock:
                self._check_open()
                version, view = self._version, self._view()
            try:
                with view.lexical.reading() as db:
                    hits = self._ranked(view, db, query, qvec, limit, category, key[3], include_deleted)
            except _TORN:
                hits = None  # a write under way (memdb refuses the reader), or the index changed under the ranking
                with self._lock:
                    if self._version == version:
                        raise
            with self._lock:
                self._check_open()
                if hits is not None and self._version == version:
                    break
                hits = None
        with self._lock:
            self._check_open()
            if hits is None:  # every try raced a change: rank under the lock, where no change can run
                hits = self._ranked(self._view(), None, query, qvec, limit, category, key[3], include_deleted)
            if self._answers_kept > 0:
                self._answers[key] = hits
                if len(self._answers) > self._answers_kept:
                    self._answers.popitem(last=False)
        return list(hits)

    def _view(self) -> _View:
        """What a ranking reads, now (lock held)."""
        return _View(self._lexical, self._semantic, self._entries, self._ids, self._inactive, self._tuning)

    def _ranked(self, view: _View, db: sqlite3.Connection | None, query: str, qv: _QueryVectors | None,
                limit: int, category: str | None, tags: tuple[str, ...], include_deleted: bool) -> tuple[Hit, ...]:
        """The hits of a search on ``view``; BM25 on ``db`` (the writer's connection when None: lock held)."""
        t = view.tuning
        qvec, words = qv if qv is not None else (None, None)
        terms = query_terms(query)
        holding = _HoldingAll(view.lexical, terms, db)
        lex, sem, sims = self._rankings(view, db, terms, holding, qvec, category, tags, include_deleted,
                                        max(t.depth, limit))
        fused: dict[str, float] = {}
        for weight, ranking in ((t.lexical, lex), (t.semantic, sem)):
            if weight > 0:
                for rank, mid in enumerate(ranking, start=1):
                    fused[mid] = fused.get(mid, 0.0) + weight / (RRF_K + rank)
        ordered = sorted(fused.items(), key=lambda kv: (-kv[1], kv[0]))[:limit]
        return tuple(self._judged(view, db, ordered, sims, terms, words, holding))

    def answers_at_once(self, query: str, limit: int) -> bool:
        """True when a search of ``query`` would neither encode nor rank: its answer is kept."""
        with self._lock:
            return (query, limit, None, (), False) in self._answers

    def _query_text(self, query: str) -> str:
        """What the encoder is given for ``query``: the query as typed (stripped), "" when it has no words."""
        return query.strip() if query_terms(query) else ""

    def encode_query(self, query: str) -> EncodedQuery:
        """The vector :meth:`search` needs for ``query`` (from the table of query vectors, else encoded now).

        Takes the lock only to read and fill that table, never while encoding:
        a caller that serialises its searches under a lock of its own (a
        site's mutex) encodes first, so that encodes of several threads run
        in parallel, and then hands the result to :meth:`search`.
        """
        got = self._query_vector(query)
        return EncodedQuery(self._query_text(query), self._model_id(), *(got or (None, None)))

    def _model_id(self) -> str | None:
        return self._embedder.model_id if self._embedder is not None else None

    def _given_vector(self, query: str, encoded: EncodedQuery) -> _QueryVectors | None:
        """``encoded``'s vectors if they were made for ``query`` by this retriever's model, else computed now."""
        if encoded.text == self._query_text(query) and encoded.model_id == self._model_id():
            if self._embedder is None or self._tuning.semantic <= 0 or not encoded.text:
                return None
            if encoded.vector is not None:
                return encoded.vector, encoded.words
        return self._query_vector(query)

    def _query_vector(self, query: str) -> _QueryVectors | None:
        """The vector of ``query`` and those of its content words (:func:`._lexical.query_terms`, in that
        order; None when the embedder gives no word vectors), None without a model or words: from the
        table, else encoded unlocked."""
        text = self._query_text(query)
        emb = self._embedder
        if emb is None or self._tuning.semantic <= 0 or not text:
            return None
        with self._lock:
            got = self._qvecs.get(text)
            if got is not None:
                self._qvecs.move_to_end(text)
                return got
        by_word = getattr(emb, "embed_query", None)
        got = by_word(text, query_terms(text)) if by_word is not None else (emb.embed_one(text), None)
        if self._qvecs_kept > 0:
            with self._lock:
                self._qvecs[text] = got
                if len(self._qvecs) > self._qvecs_kept:
                    self._qvecs.popitem(last=False)
        return got

    @staticmethod
    def _judged(view: _View, db: sqlite3.Connection | None, ordered: Sequence[tuple[str, float]],
                sims: Vectors | None, terms: Sequence[str], words: Vectors | None,
                holding: _HoldingAll) -> Iterable[Hit]:
        """Hits of ``ordered`` (id, fused score) with their similarity and relevance (see :class:`Tuning`)."""
        keys = [view.entries[mid].key for mid, _ in ordered]
        if sims is None:
            for mid, score in ordered:
                yield Hit(mid, score, None, True)
            return
        t = view.tuning
        near = view.semantic.similarity(sims, keys)
        full = holding.among(keys)
        similar = [k for k, sim in zip(keys, near, strict=True) if sim >= t.relevance and k not in full]
        weights, held = view.lexical.held_terms(terms, similar, db) if similar else ([], {})
        cover = _coverage(view, t, similar, words, weights, held) if words is not None and similar else {}
        total = sum(weights) or 1.0
        for (mid, score), k, sim in zip(ordered, keys, near, strict=True):
            relevant = k in full
            if not relevant and sim >= t.relevance:
                share = sum(weights[i] for i in held.get(k, ())) / total
                c = cover.get(k, share)
                if share == 0.0:
                    relevant = sim + t.paraphrase_coverage_weight * c >= t.paraphrase_relevance
                else:
                    relevant = sim + t.overlap_weight * share + t.coverage_weight * c >= t.overlap_relevance
            yield Hit(mid, score, round(sim, 3), relevant)

    def close(self) -> None:
        """Release the index; later calls raise ValueError. Idempotent."""
        with self._lock:
            if not self._closed:
                self._closed = True
                self._version += 1
                self._answers.clear()
                self._lexical.close()
                self._entries.clear()
                self._ids.clear()
                self._inactive.clear()

    # -- internals ---------------------------------------------------------

    def _tag_set(self, tags: Sequence[str]) -> frozenset[str]:
        """``frozenset(tags)``, one object for every memory with the same tags (a site reuses a few)."""
        if not tags:
            return _NO_TAGS
        key = frozenset(tags)
        if len(self._tag_sets) > 2 * len(self._entries) + 64:  # sets of erased memories linger: start again
            self._tag_sets.clear()
        return self._tag_sets.setdefault(key, key)

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError("retriever is closed")

    def _new_entry(self, doc: MemoryDoc) -> _Entry:
        entry = _Entry(self._next_key, doc.category, self._tag_set(doc.tags), doc.active)
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

    def _rankings(self, view: _View, db: sqlite3.Connection | None, terms: list[str], holding: _HoldingAll,
                  qvec: Vectors | None, category: str | None, tags: tuple[str, ...], include_deleted: bool,
                  depth: int) -> tuple[list[str], list[str], Vectors | None]:
        """The lexical and semantic rankings of a query of ``terms`` (memory ids, best first, filtered, at most
        ``depth``) and the similarities of every row to ``qvec``.

        Either ranking is empty when its weight is 0; the semantic one when there is no query vector.
        """
        keep = self._filter(category, tags, include_deleted)
        t = view.tuning
        semantic, lexical = view.semantic, view.lexical
        use_semantic = qvec is not None and t.semantic > 0 and bool(terms)
        gate = use_semantic and len(terms) > 1
        sims = semantic.scores(qvec) if qvec is not None else None  # one pass, shared by the gate and the ranking
        lex: list[str] = []
        entry_of = view.entries
        ids = view.ids
        if t.lexical > 0:
            if category is None and not tags:  # activity alone: a set lookup per row, no call
                scored = lexical.rank(terms, limit=depth, skip=() if include_deleted else view.inactive, db=db)
            else:
                scored = lexical.rank(terms, limit=depth, keep=lambda k: keep(entry_of[ids[k]]), db=db)
            # Equal scores are ordered by memory id, not by key, so that a rebuilt index ranks the same.
            # (A tie at the depth cut may still keep a lower key: see LexicalIndex.rank.)
            ranked = sorted((score, ids[k], k) for k, score in scored)
            keys = [k for _, _, k in ranked]
            if gate and sims is not None and keys:
                near = semantic.similarity(sims, keys)
                doubtful = [k for k, sim in zip(keys, near, strict=True) if sim < t.lexical_gate]
                full = holding.among(doubtful)
                keys = [k for k, sim in zip(keys, near, strict=True) if sim >= t.lexical_gate or k in full]
            lex = [ids[k] for k in keys]
        sem: list[str] = []
        if use_semantic and sims is not None:
            total = len(entry_of)
            # Without a category or tag filter every candidate counts (rank applies activity itself, and
            # includes every row tied with the last), so the top ``depth`` are exactly the best ``depth``.
            unfiltered = category is None and not tags
            want = depth if unfiltered else 2 * depth
            while True:
                cands = semantic.rank(sims, t.min_similarity, want, active_only=not include_deleted)
                if unfiltered:
                    kept = [(sim, ids[key]) for sim, key in cands]
                else:
                    kept = [(sim, mid) for sim, key in cands if keep(entry_of[mid := ids[key]])]
                if len(kept) >= depth or len(cands) < want or want >= total:
                    break
                want *= 4
            kept.sort(key=lambda c: (-c[0], c[1]))
            sem = [mid for _, mid in kept[:depth]]
        return lex, sem, sims
