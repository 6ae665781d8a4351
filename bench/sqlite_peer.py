"""SQLite as a competent user would tune it for this job: the bench's main peer.

* Items live in a rowid table keyed by one integer, ``conversation id << 32 | seq``,
  so an append inserts at the right edge of the B-tree and a tail is one
  range scan on the integer key; payloads are compact JSON bound as ``BLOB``
  (no text conversion, no collation).
* Conversations get an integer id in a second table, indexed by the last
  append for listings.
* ``journal_mode=WAL``, ``synchronous=FULL`` (a commit is on stable storage
  when it returns, like convmem's acknowledgement), ``page_size=4096`` (the
  file system's block), ``cache_size=-65536`` (64 MiB of page cache per
  connection), ``mmap_size=268435456`` (256 MiB read through the mapping),
  ``temp_store=MEMORY``; the WAL checkpoints itself at SQLite's default of
  1,000 pages.
* Every statement is prepared once per connection and reused (Python's
  ``sqlite3`` keeps a cache of prepared statements, ``cached_statements=64``).
* One connection per thread; one ``BEGIN IMMEDIATE`` transaction per batch.

:class:`SqliteGroupCommit` is the same database used the way an application
with many threads would: one writer thread that commits every batch queued
behind the current transaction in one transaction (one sync for all of them),
each caller waiting for its own batch's commit.
"""

from __future__ import annotations

import queue
import sqlite3
import threading
import time
from typing import Any

import msgspec

_enc = msgspec.json.Encoder()
_dec_obj = msgspec.json.Decoder(type=dict[str, Any])

#: The settings every connection gets (stated in the README and the JSON).
PRAGMAS = {
    "page_size": "4096",
    "journal_mode": "WAL",
    "cache_size": "-65536",
    "mmap_size": "268435456",
    "temp_store": "MEMORY",
}

SCHEMA = """
CREATE TABLE IF NOT EXISTS convs(
    id INTEGER PRIMARY KEY, site TEXT NOT NULL, conv TEXT NOT NULL,
    created INTEGER NOT NULL, last INTEGER NOT NULL, next_seq INTEGER NOT NULL,
    UNIQUE (site, conv));
CREATE INDEX IF NOT EXISTS convs_by_last ON convs(site, last DESC, conv);
CREATE TABLE IF NOT EXISTS items(k INTEGER PRIMARY KEY, recorded_at INTEGER NOT NULL, payload BLOB NOT NULL);
"""

SHIFT = 32

_GET_CONV = "SELECT id, last, next_seq FROM convs WHERE site=? AND conv=?"
_NEW_CONV = "INSERT INTO convs(site, conv, created, last, next_seq) VALUES (?,?,?,?,0) RETURNING id"
_PUT = "INSERT INTO items(k, recorded_at, payload) VALUES (?,?,?)"
_BUMP = "UPDATE convs SET last=?, next_seq=? WHERE id=?"
_TAIL = "SELECT k, recorded_at, payload FROM items WHERE k>=? AND k<? ORDER BY k DESC LIMIT ?"
_RANGE = "SELECT k, recorded_at, payload FROM items WHERE k>=? AND k<? ORDER BY k LIMIT ?"


class SqliteConnections:
    """Per-thread connections to one SQLite file, plus the listing queries both SQLite schemas share.

    Subclasses set the schema (run on the first connection) and ``_configure`` a new connection.
    """

    timeout = 60.0

    def __init__(self, path: str, synchronous: str, schema: str) -> None:
        self.path = path
        self.synchronous = synchronous
        self._local = threading.local()
        self._conns: list[sqlite3.Connection] = []
        self._conns_lock = threading.Lock()
        self.db.executescript(schema)

    def _configure(self, db: sqlite3.Connection) -> None:
        """Pragmas for a new connection (``synchronous`` is set after them)."""

    @property
    def db(self) -> sqlite3.Connection:
        db: sqlite3.Connection | None = getattr(self._local, "db", None)
        if db is None:
            db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=self.timeout,
                                 cached_statements=64)
            self._configure(db)
            db.execute(f"PRAGMA synchronous={self.synchronous}")
            self._local.db = db
            with self._conns_lock:
                self._conns.append(db)
        return db

    def set_synchronous(self, mode: str) -> None:
        """Change durability for later transactions (bulk setup uses OFF)."""
        self.synchronous = mode
        with self._conns_lock:
            for db in self._conns:
                db.execute(f"PRAGMA synchronous={mode}")

    def list_page(self, site: str, cursor: tuple[int, str] | None, limit: int) -> tuple[list[Any], Any]:
        if cursor is None:
            rows = self.db.execute(
                "SELECT conv, created, last FROM convs WHERE site=? ORDER BY last DESC, conv LIMIT ?",
                (site, limit + 1),
            ).fetchall()
        else:
            last, conv = cursor
            rows = self.db.execute(
                "SELECT conv, created, last FROM convs WHERE site=? AND last<=? AND NOT (last=? AND conv<=?) "
                "ORDER BY last DESC, conv LIMIT ?",
                (site, last, last, conv, limit + 1),
            ).fetchall()
        more = len(rows) > limit
        rows = rows[:limit]
        return rows, ((rows[-1][2], rows[-1][0]) if more and rows else None)

    def cursor_at(self, site: str, rank: int) -> tuple[int, str] | None:
        if rank <= 0:
            return None
        row = self.db.execute(
            "SELECT last, conv FROM convs WHERE site=? ORDER BY last DESC, conv LIMIT 1 OFFSET ?", (site, rank - 1)
        ).fetchone()
        return (row[0], row[1]) if row else None

    def close(self) -> None:
        with self._conns_lock:
            for db in self._conns:
                db.close()
            self._conns.clear()
        self._local = threading.local()


class Sqlite(SqliteConnections):
    """The tuned SQLite; ``synchronous="NORMAL"`` gives the labelled, non-durable reference."""

    def __init__(self, path: str, synchronous: str = "FULL", name: str = "sqlite") -> None:
        self.name = name
        super().__init__(path, synchronous, SCHEMA)

    def _configure(self, db: sqlite3.Connection) -> None:
        for k, v in PRAGMAS.items():
            db.execute(f"PRAGMA {k}={v}")

    @staticmethod
    def write(db: sqlite3.Connection, site: str, conv: str, items: list[dict[str, Any]]) -> None:
        """The statements of one batch, inside the caller's transaction."""
        stamp = time.time_ns() // 1000
        row = db.execute(_GET_CONV, (site, conv)).fetchone()
        if row is None:
            cid, first = db.execute(_NEW_CONV, (site, conv, stamp, stamp)).fetchone()[0], 0
        else:
            cid, last, first = row
            stamp = max(stamp, last)
        base = (cid << SHIFT) + first
        db.executemany(_PUT, [(base + i, stamp, _enc.encode(p)) for i, p in enumerate(items)])
        db.execute(_BUMP, (stamp, first + len(items), cid))

    def append(self, site: str, conv: str, items: list[dict[str, Any]]) -> None:
        db = self.db
        db.execute("BEGIN IMMEDIATE")
        try:
            self.write(db, site, conv, items)
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise

    def _bounds(self, site: str, conv: str) -> tuple[int, int] | None:
        row = self.db.execute(_GET_CONV, (site, conv)).fetchone()
        return None if row is None else (row[0], row[2])

    def tail(self, site: str, conv: str, n: int) -> list[Any]:
        row = self.db.execute(_GET_CONV, (site, conv)).fetchone()
        if row is None:
            return []
        lo = row[0] << SHIFT
        rows = self.db.execute(_TAIL, (lo, lo + (1 << SHIFT), n)).fetchall()
        rows.reverse()
        mask = (1 << SHIFT) - 1
        return [(k & mask, r, _dec_obj.decode(p)) for k, r, p in rows]

    def range(self, site: str, conv: str, start: int, limit: int) -> list[Any]:
        row = self.db.execute(_GET_CONV, (site, conv)).fetchone()
        if row is None:
            return []
        lo = row[0] << SHIFT
        rows = self.db.execute(_RANGE, (lo + start, lo + (1 << SHIFT), limit)).fetchall()
        mask = (1 << SHIFT) - 1
        return [(k & mask, r, _dec_obj.decode(p)) for k, r, p in rows]



class SqliteGroupCommit:
    """The tuned SQLite behind one writer thread that commits queued batches together.

    ``append`` returns once the transaction holding its batch has committed
    (``synchronous=FULL``): as durable as :class:`Sqlite`, with one sync per
    group instead of per batch. Only for appends from threads of one process.
    """

    def __init__(self, path: str, name: str = "sqlite-group") -> None:
        self.name = name
        self.sqlite = Sqlite(path)
        self._q: queue.SimpleQueue[tuple[str, str, list[dict[str, Any]], list[Any]] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._writer, name="sqlite-group-commit", daemon=True)
        self._thread.start()

    def _writer(self) -> None:
        db = self.sqlite.db
        while True:
            first = self._q.get()
            if first is None:
                return
            group = [first]
            while True:
                try:
                    nxt = self._q.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    self._q.put(None)
                    break
                group.append(nxt)
            error: BaseException | None = None
            db.execute("BEGIN IMMEDIATE")
            try:
                for site, conv, items, _box in group:
                    Sqlite.write(db, site, conv, items)
                db.execute("COMMIT")
            except BaseException as exc:
                db.execute("ROLLBACK")
                error = exc
            for *_rest, box in group:
                box.append(error)
                box[0].set()

    def append(self, site: str, conv: str, items: list[dict[str, Any]]) -> None:
        done = threading.Event()
        box: list[Any] = [done]
        self._q.put((site, conv, items, box))
        done.wait()
        if box[1] is not None:
            raise box[1]

    def tail(self, site: str, conv: str, n: int) -> list[Any]:
        return self.sqlite.tail(site, conv, n)

    def range(self, site: str, conv: str, start: int, limit: int) -> list[Any]:
        return self.sqlite.range(site, conv, start, limit)

    def close(self) -> None:
        self._q.put(None)
        self._thread.join()
        self.sqlite.close()
