"""The lexical half of memory retrieval: BM25 over an in-memory SQLite FTS5 table.

The table lives in an in-memory database of SQLite's ``memdb`` VFS (a
buffer of this process, named by a random id), rebuilt from the current
memories at every open, so no file on disk ever holds a memory's text and
erasing one only has to delete its row. ``secure_delete`` zeroes freed pages
and ``temp_store=MEMORY`` keeps sorts off temporary files.

One connection writes (its caller serialises the writes); rankings may also
run on read connections of a pool (:meth:`LexicalIndex.reading`), one per
ranking in flight, so that rankings of several threads run at once (SQLite
releases the GIL while it steps a statement). ``memdb`` has no WAL: a reader
cannot start while a write is under way (``sqlite3.OperationalError``,
"database is locked", at once: readers do not wait) and a write's commit waits
for the readers' statements in progress (the writer waits up to
``WRITE_WAIT_S``). A reader sees the table as some committed write left it;
that it is the state its caller expects is the caller's to check (see
``Retriever.search``).

Tokenisation: FTS5's ``unicode61`` tokenizer (case folded, diacritics removed)
wrapped in its Porter stemmer, so "deploys", "deployed" and "deploying" meet.
Stop words stay in the index (BM25's IDF makes them cheap) but are dropped
from queries, whose remaining terms are OR-ed: a memory need not contain every
word of a task hint to be found.
"""

from __future__ import annotations

import contextlib
import math
import re
import sqlite3
import threading
import unicodedata
import uuid
from collections.abc import Callable, Container, Iterable, Iterator, Sequence

#: BM25 column weights, in column order: subject, summary, details, tags.
#: Chosen by measurement on the dev half of bench/ltm_eval (see the README).
DEFAULT_WEIGHTS: tuple[float, float, float, float] = (4.0, 2.0, 1.0, 2.0)

#: English function words dropped from queries. Content words only remain.
STOP_WORDS: frozenset[str] = frozenset(
    """
    a about above after again against all am an and any are aren't as at be because been before being below
    between both but by can can't cannot could couldn't did didn't do does doesn't doing don't down during each
    few for from further had hadn't has hasn't have haven't having he he'd he'll he's her here here's hers herself
    him himself his how how's i i'd i'll i'm i've if in into is isn't it it's its itself let's me more most
    mustn't my myself no nor not of off on once only or other ought our ours ourselves out over own same shan't
    she she'd she'll she's should shouldn't so some such than that that's the their theirs them themselves then
    there there's these they they'd they'll they're they've this those through to too under until up very was
    wasn't we we'd we'll we're we've were weren't what what's when when's where where's which while who who's
    whom why why's with won't would wouldn't you you'd you'll you're you've your yours yourself yourselves
    s t d ll m re ve also just will shall may might must us get got please want wants need needs like
    """.split()
)

#: A word of :func:`words_of`, before folding (letters and digits).
WORD_PATTERN = re.compile(r"[^\W_]+", re.UNICODE)


def words_of(text: str) -> list[str]:
    """The words of ``text`` as ``unicode61`` splits them (letters and digits), case folded, diacritics removed."""
    if text.isascii():  # nothing to decompose or fold beyond ASCII case: the common case, ten times cheaper
        return WORD_PATTERN.findall(text.lower())
    folded = unicodedata.normalize("NFKD", text.casefold())
    # Only non-ASCII characters can be combining marks: look at those alone.
    folded = _NON_ASCII.sub(_drop_combining, folded)
    return WORD_PATTERN.findall(folded)


_NON_ASCII = re.compile(r"[^\x00-\x7f]")


def _drop_combining(m: re.Match[str]) -> str:
    c = m.group()
    return "" if unicodedata.combining(c) else c


def query_terms(text: str) -> list[str]:
    """The distinct content words of ``text``, lower-cased, in order of first appearance.

    Splits like FTS5's ``unicode61`` (letters and digits form words) after
    removing diacritics, and drops stop words; if a query is nothing but stop
    words they are kept, so "who am I" still searches something.
    """
    words = words_of(text)
    content = [w for w in words if w not in STOP_WORDS]
    out: list[str] = []
    for w in content or words:
        if w not in out:
            out.append(w)
    return out


#: A query word found in more than this share of the memories (and in more than COMMON_MIN of them) is
#: left out of the BM25 query unless it is the query's rarest: its IDF makes it worth little, and its
#: long posting list is what a query spends its time on. "Found" means the word itself, as written (case
#: and diacritics aside), counted in Python as rows come and go (see LexicalIndex._df): asking FTS5 would
#: count its stem's rows, exactly, but costs a statement walking every one of them on each query.
COMMON_SHARE = 0.02
COMMON_MIN = 50


#: How long a write waits for the rankings reading the table to finish their statements (a few ms at most).
WRITE_WAIT_S = 60.0

#: Page cache of each connection, KiB (SQLite's ``cache_size``): the pages live in the memdb buffer once,
#: so a connection's cache is a copy; small, so that neither the writer nor a pool of readers adds much.
CACHE_KIB = 64


def _quote(term: str) -> str:
    return '"' + term.replace('"', '""') + '"'


def _any(terms: Sequence[str]) -> str:
    return " OR ".join(_quote(t) for t in terms)


class LexicalIndex:
    """BM25 ranking of memories by FTS5; rows are addressed by caller-chosen integer keys.

    The table holds the four searched columns only; filters (activity,
    category, tags) are the caller's, applied as rows come out of the ranking
    (see :meth:`rank`).
    """

    def __init__(self, weights: Sequence[float] = DEFAULT_WEIGHTS) -> None:
        if len(weights) != 4:
            raise ValueError("weights: one per column (subject, summary, details, tags)")
        self._weights = tuple(float(w) for w in weights)
        self._uri = f"file:/convmem-bm25-{uuid.uuid4().hex}?vfs=memdb"
        db = self._connect(WRITE_WAIT_S)
        db.execute(
            "CREATE VIRTUAL TABLE fts USING fts5(subject, summary, details, tags, "
            "tokenize = 'porter unicode61 remove_diacritics 2')"
        )
        w = self._weights
        self._rank_sql = (f"SELECT rowid, bm25(fts, {w[0]!r}, {w[1]!r}, {w[2]!r}, {w[3]!r}) AS score "
                          "FROM fts WHERE fts MATCH ? ORDER BY score, rowid")
        self._db = db
        self._rows = 0  # rows in the table
        #: Idle read connections (see :meth:`reading`); ``_pool_lock`` guards them and ``_closed``.
        self._idle: list[sqlite3.Connection] = []
        self._pool_lock = threading.Lock()
        self._closed = False
        #: word -> how many rows hold it (words as :func:`words_of` splits them; zero counts are removed)
        self._df: dict[str, int] = {}

    def _connect(self, wait_s: float) -> sqlite3.Connection:
        db = sqlite3.connect(self._uri, uri=True, timeout=wait_s, check_same_thread=False, isolation_level=None)
        db.execute("PRAGMA secure_delete=ON")
        db.execute("PRAGMA temp_store=MEMORY")
        db.execute(f"PRAGMA cache_size=-{CACHE_KIB}")
        return db

    @contextlib.contextmanager
    def reading(self) -> Iterator[sqlite3.Connection]:
        """A read connection for one ranking (from the pool, or a new one), back to the pool after.

        Pass it as ``db`` to :meth:`rank`, :meth:`matching_all` and
        :meth:`held_terms`. It fails with ``sqlite3.OperationalError`` while a
        write is under way, rather than wait. A connection in use when the
        index closes is closed when it comes back.
        """
        with self._pool_lock:
            if self._closed:
                raise sqlite3.ProgrammingError("the lexical index is closed")
            db = self._idle.pop() if self._idle else None
        if db is None:
            db = self._connect(0.0)
        try:
            yield db
        finally:
            with self._pool_lock:
                if not self._closed:
                    self._idle.append(db)
                    db = None
            if db is not None:
                db.close()

    def put(self, key: int, subject: str, summary: str, details: str, tags: Iterable[str]) -> None:
        """Index (or re-index) the row ``key``."""
        self.remove(key)
        row = (subject, summary, details, " ".join(tags))
        self._db.execute("INSERT INTO fts(rowid, subject, summary, details, tags) VALUES (?, ?, ?, ?, ?)",
                         (key, *row))
        self._rows += 1
        self._count(row, 1)

    def put_many(self, rows: Iterable[tuple[int, str, str, str, Sequence[str]]]) -> None:
        """Index many new rows in one transaction (keys must not be present yet)."""
        listed = [(k, s, m, d, " ".join(t)) for k, s, m, d, t in rows]
        self._db.execute("BEGIN")
        try:
            cur = self._db.executemany(
                "INSERT INTO fts(rowid, subject, summary, details, tags) VALUES (?, ?, ?, ?, ?)", listed
            )
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")
        self._rows += cur.rowcount
        for row in listed:
            self._count(row[1:], 1)

    def remove(self, key: int) -> None:
        """Drop the row ``key`` (no-op when absent), and the idle readers, whose page caches may hold its text."""
        old = self._db.execute("SELECT subject, summary, details, tags FROM fts WHERE rowid = ?", (key,)).fetchone()
        if old is None:
            return
        self._db.execute("DELETE FROM fts WHERE rowid = ?", (key,))
        self._rows -= 1
        self._count(old, -1)
        with self._pool_lock:
            idle, self._idle = self._idle, []
        for db in idle:
            db.close()

    def _count(self, row: Sequence[str], delta: int) -> None:
        """Add ``delta`` to the row count of every distinct word of ``row`` (its four columns)."""
        df = self._df
        for w in set(words_of(" ".join(row))):
            n = df.get(w, 0) + delta
            if n:
                df[w] = n
            else:
                del df[w]

    def rank(self, terms: Sequence[str], *, limit: int | None, skip: Container[int] = (),
             keep: Callable[[int], bool] | None = None,
             db: sqlite3.Connection | None = None) -> list[tuple[int, float]]:
        """``(key, bm25)`` of rows matching any of ``terms``, not in ``skip``, passing ``keep``; best first.

        Lower bm25 is better; ties are ordered by key. At most ``limit`` when
        given. Words common to many rows are dropped first (see ``COMMON_SHARE``).

        The filter runs here, in Python, on the caller's own record of each
        row, rather than as SQL on the UNINDEXED columns: reading a column
        means a lookup in FTS5's content table for every matching row, which
        cost as much as ranking them. ``bm25()`` is called directly rather
        than through the configured ``rank``, whose arguments FTS5 evaluates
        again with a statement of its own on every query. ``db``: a connection
        of :meth:`reading` (default: the writer's).
        """
        terms = self._uncommon(terms)
        if not terms:
            return []
        conn = db or self._db
        if limit is None:
            return self._ranked(conn, terms, None, skip, keep, -1)[0]
        # First ask SQLite for a few more rows than wanted (its sorter then keeps only that many), and
        # again for all of them only if filtered-out rows left fewer than ``limit``.
        fetch = 2 * limit + 8
        out, fetched = self._ranked(conn, terms, fetch, skip, keep, limit)
        if len(out) < limit and fetched == fetch:
            out = self._ranked(conn, terms, None, skip, keep, limit)[0]
        return out

    def _ranked(self, db: sqlite3.Connection, terms: Sequence[str], fetch: int | None, skip: Container[int],
                keep: Callable[[int], bool] | None, want: int) -> tuple[list[tuple[int, float]], int]:
        """The rows of :meth:`rank` among the best ``fetch`` matches (all when None), and how many came back."""
        sql, args = (self._rank_sql, (_any(terms),)) if fetch is None else \
            (self._rank_sql + " LIMIT ?", (_any(terms), fetch))
        out: list[tuple[int, float]] = []
        fetched = 0
        cur = db.execute(sql, args)
        try:
            for k, r in cur:
                fetched += 1
                if k not in skip and (keep is None or keep(k)):
                    out.append((k, r))
                    if len(out) == want:
                        break
        finally:
            cur.close()  # ends the statement, and with it the read lock a write's commit waits for
        return out, fetched

    def _uncommon(self, terms: Sequence[str]) -> list[str]:
        if not terms:
            return []
        cap = max(COMMON_MIN, int(COMMON_SHARE * self._rows))
        counted = list(zip(self._counts(terms), terms, strict=True))
        kept = [t for n, t in counted if n <= cap]
        return kept or [min(counted)[1]]

    def _counts(self, terms: Sequence[str]) -> list[int]:
        """How many rows hold each of ``terms`` (the word itself: see ``COMMON_SHARE``)."""
        return [self._df.get(t, 0) for t in terms]

    def matching_all(self, terms: Sequence[str], among: Sequence[int] | None,
                     db: sqlite3.Connection | None = None) -> set[int]:
        """Those of the keys ``among`` (every key when None) whose rows contain every one of ``terms`` (after
        stemming)."""
        if not terms or (among is not None and not among):
            return set()
        match = " AND ".join(_quote(t) for t in terms)
        # Intersecting here is far cheaper than ``rowid IN (...)``, which runs the MATCH once per value.
        cur = (db or self._db).execute("SELECT rowid FROM fts WHERE fts MATCH ?", (match,))
        found = {int(k) for (k,) in cur}
        return found if among is None else found & set(among)

    def held_terms(self, terms: Sequence[str], among: Sequence[int],
                   db: sqlite3.Connection | None = None) -> tuple[list[float], dict[int, set[int]]]:
        """The weight of each of ``terms`` and, for each key of ``among``, the positions of the terms its row
        holds (after stemming).

        A term weighs its BM25 inverse document frequency, from the counts of
        words as written (see ``COMMON_SHARE``): a rare word, a name, weighs far
        more than a word most memories hold. One statement per term, each
        limited to the rows of ``among`` (a handful), so the cost does not grow
        with the index.
        """
        held: dict[int, set[int]] = {k: set() for k in among}
        if not terms or not among:
            return [], held
        n = self._rows
        idf = [math.log((n - min(c, n) + 0.5) / (min(c, n) + 0.5) + 1.0) for c in self._counts(terms)]
        sql = f"SELECT rowid FROM fts WHERE fts MATCH ? AND rowid IN ({','.join('?' * len(held))})"
        conn = db or self._db
        for i, term in enumerate(terms):
            for (k,) in conn.execute(sql, (_quote(term), *held)):
                held[int(k)].add(i)
        return idf, held

    def close(self) -> None:
        """Close the writer and the idle readers (a reader in use is closed when it comes back)."""
        with self._pool_lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for db in idle:
            db.close()
        self._df.clear()
        self._db.close()
