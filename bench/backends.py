"""convmem and PostgreSQL through the store API, and the bench's earlier SQLite and floor (now labelled extras).

Every backend takes the same payload dicts and returns decoded items, so
each figure includes encoding and decoding:

* :class:`Convmem`: a :class:`logstore.FileStore` with its default durability.
* :class:`Sqlite`: the schema this bench used before its tuned SQLite peer, kept as the
  labelled ``sqlite-text-schema`` row: WAL mode, ``synchronous=FULL``, items
  keyed by ``(site, conv, seq)`` ``WITHOUT ROWID``, payloads as compact JSON
  text. The peer is :class:`bench.sqlite_peer.Sqlite` (integer keys, BLOBs).
* :class:`Floor`: the labelled ``floor-extending`` row: the same bytes
  appended to one plain file per conversation with one ``fdatasync`` per
  batch, so every sync also grows the file. The floor proper is
  :class:`bench.floor_peer.Floor` (pre-zeroed space).
* :class:`Postgres`: convmem's PostgreSQL backend.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from typing import Any

import msgspec

from bench.floor_peer import RWF_DSYNC
from bench.sqlite_peer import SqliteConnections
from convmem.logstore import ListCursor, ListSelector, Range, Tail, open_store

_enc = msgspec.json.Encoder()
_dec_list = msgspec.json.Decoder(type=list[dict[str, Any]])
_dec_obj = msgspec.json.Decoder(type=dict[str, Any])


class Convmem:
    """convmem through its public API."""

    name = "convmem"

    def __init__(self, root: str, **options: Any) -> None:
        self.root = root
        self.store = open_store(root, **options)

    def append(self, site: str, conv: str, items: list[dict[str, Any]]) -> None:
        self.store.append(site, conv, items)

    def tail(self, site: str, conv: str, n: int) -> list[Any]:
        return self.store.read(site, conv, Tail(n))

    def range(self, site: str, conv: str, start: int, limit: int) -> list[Any]:
        return self.store.read(site, conv, Range(start, limit))

    def list_page(self, site: str, cursor: Any, limit: int) -> tuple[list[Any], Any]:
        page = self.store.list_conversations(site, ListSelector(cursor, limit))
        return page.summaries, page.next_cursor

    def cursor_at(self, site: str, rank: int) -> ListCursor | None:
        """The cursor whose next page starts at position ``rank`` of the listing."""
        cursor = None
        left = rank
        while left > 0:
            rows, cursor = self.list_page(site, cursor, min(left, 1000))
            left -= len(rows)
            if cursor is None:
                break
        return cursor

    def close(self) -> None:
        self.store.close()


SCHEMA = """
CREATE TABLE IF NOT EXISTS items(
    site TEXT NOT NULL, conv TEXT NOT NULL, seq INTEGER NOT NULL,
    recorded_at INTEGER NOT NULL, payload TEXT NOT NULL,
    PRIMARY KEY (site, conv, seq)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS convs(
    site TEXT NOT NULL, conv TEXT NOT NULL, created INTEGER NOT NULL,
    last INTEGER NOT NULL, next_seq INTEGER NOT NULL,
    PRIMARY KEY (site, conv)) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS convs_by_last ON convs(site, last DESC, conv);
"""


class Sqlite(SqliteConnections):
    """The SQLite design a user would pick; one connection per thread."""

    name = "sqlite"
    timeout = 30.0

    def __init__(self, path: str, synchronous: str = "FULL") -> None:
        super().__init__(path, synchronous, SCHEMA)

    def _configure(self, db: sqlite3.Connection) -> None:
        db.execute("PRAGMA journal_mode=WAL")

    def append(self, site: str, conv: str, items: list[dict[str, Any]]) -> None:
        texts = [_enc.encode(p).decode() for p in items]
        db = self.db
        stamp = time.time_ns() // 1000
        db.execute("BEGIN IMMEDIATE")
        try:
            row = db.execute(
                "SELECT created, last, next_seq FROM convs WHERE site=? AND conv=?", (site, conv)
            ).fetchone()
            first = row[2] if row else 0
            stamp = max(stamp, row[1]) if row else stamp
            db.executemany(
                "INSERT INTO items(site, conv, seq, recorded_at, payload) VALUES (?,?,?,?,?)",
                [(site, conv, first + i, stamp, t) for i, t in enumerate(texts)],
            )
            db.execute(
                "INSERT INTO convs(site, conv, created, last, next_seq) VALUES (?,?,?,?,?) "
                "ON CONFLICT(site, conv) DO UPDATE SET last=excluded.last, next_seq=excluded.next_seq",
                (site, conv, stamp, stamp, first + len(texts)),
            )
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise

    def tail(self, site: str, conv: str, n: int) -> list[Any]:
        rows = self.db.execute(
            "SELECT seq, recorded_at, payload FROM items WHERE site=? AND conv=? ORDER BY seq DESC LIMIT ?",
            (site, conv, n),
        ).fetchall()
        rows.reverse()
        return [(s, r, _dec_obj.decode(p)) for s, r, p in rows]

    def range(self, site: str, conv: str, start: int, limit: int) -> list[Any]:
        rows = self.db.execute(
            "SELECT seq, recorded_at, payload FROM items WHERE site=? AND conv=? AND seq>=? ORDER BY seq LIMIT ?",
            (site, conv, start, limit),
        ).fetchall()
        return [(s, r, _dec_obj.decode(p)) for s, r, p in rows]



class Floor:
    """Append-only flat files with one ``fdatasync`` per batch; one ``pread`` per read."""

    name = "floor"

    def __init__(self, root: str) -> None:
        self.root = root
        #: False only while bulk-loading data that is read back (``Ctx.setup_mode``).
        self.sync = True
        os.makedirs(root, exist_ok=True)
        self._files: dict[tuple[str, str], tuple[int, list[int], threading.Lock]] = {}
        self._lock = threading.Lock()

    def path(self, site: str, conv: str) -> str:
        return os.path.join(self.root, f"{site}.{conv}.log")

    def _file(self, site: str, conv: str) -> tuple[int, list[int], threading.Lock]:
        key = (site, conv)
        f = self._files.get(key)
        if f is None:
            with self._lock:
                f = self._files.get(key)
                if f is None:
                    fd = os.open(self.path(site, conv), os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
                    f = self._files[key] = (fd, [os.fstat(fd).st_size], threading.Lock())
        return f

    def append(self, site: str, conv: str, items: list[dict[str, Any]]) -> None:
        encoded = [_enc.encode(p) for p in items]
        data = b",".join(encoded) + b","
        fd, offsets, lock = self._file(site, conv)
        with lock:
            if self.sync and RWF_DSYNC is not None:
                os.pwritev(fd, [data], 0, RWF_DSYNC)  # O_APPEND: at the end, whatever the offset; synced
            else:
                os.write(fd, data)
                if self.sync:
                    os.fdatasync(fd)
            pos = offsets[-1]
            for e in encoded:
                pos += len(e) + 1
                offsets.append(pos)

    def range(self, site: str, conv: str, start: int, limit: int) -> list[Any]:
        fd, offsets, _lock = self._file(site, conv)
        stop = min(start + limit, len(offsets) - 1)
        if start >= stop:
            return []
        lo, hi = offsets[start], offsets[stop]
        return _dec_list.decode(b"[" + os.pread(fd, hi - lo - 1, lo) + b"]")

    def tail(self, site: str, conv: str, n: int) -> list[Any]:
        _fd, offsets, _lock = self._file(site, conv)
        return self.range(site, conv, max(len(offsets) - 1 - n, 0), n)

    def close(self) -> None:
        with self._lock:
            for fd, _o, _l in self._files.values():
                os.close(fd)
            self._files.clear()


class Postgres:
    """convmem's PostgreSQL backend (:class:`logstore.postgres.PgStore`) on a loopback server.

    Durable as served: ``synchronous_commit = on``, one transaction per batch.
    While ``bulk`` is set (``Ctx.setup_mode``) appends go through a second
    store whose sessions commit asynchronously: same rows, faster build.
    """

    name = "postgres"

    def __init__(self, dsn: str, **options: Any) -> None:
        import logging

        from convmem.logstore.postgres import PgStore

        # The bulk store's "synchronous_commit = off" warning is expected here, in every process.
        logging.getLogger("logstore.postgres").setLevel(logging.ERROR)
        self.dsn = dsn
        self.store = PgStore(dsn, **options)
        sep = "&" if "?" in dsn else "?"
        self._bulk_store = PgStore(dsn + sep + "options=-csynchronous_commit%3Doff", allow_async_commit=True)
        self.bulk = False

    def append(self, site: str, conv: str, items: list[dict[str, Any]]) -> None:
        (self._bulk_store if self.bulk else self.store).append(site, conv, items)

    def tail(self, site: str, conv: str, n: int) -> list[Any]:
        return self.store.read(site, conv, Tail(n))

    def range(self, site: str, conv: str, start: int, limit: int) -> list[Any]:
        return self.store.read(site, conv, Range(start, limit))

    def list_page(self, site: str, cursor: Any, limit: int) -> tuple[list[Any], Any]:
        page = self.store.list_conversations(site, ListSelector(cursor, limit))
        return page.summaries, page.next_cursor

    def cursor_at(self, site: str, rank: int) -> ListCursor | None:
        cursor = None
        left = rank
        while left > 0:
            rows, cursor = self.list_page(site, cursor, min(left, 1000))
            left -= len(rows)
            if cursor is None:
                break
        return cursor

    def analyze(self) -> None:
        """Refresh the planner's statistics of the store's tables."""
        with self.store._conn() as conn:
            conn.execute(f'ANALYZE "{self.store.schema}".conversations, "{self.store.schema}".items'.encode())

    def close(self) -> None:
        self.store.close()
        self._bulk_store.close()
