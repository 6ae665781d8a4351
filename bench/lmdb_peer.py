"""LMDB (the ``lmdb`` package) as the second peer: a B+tree with one sync per commit.

The environment is opened with LMDB's durable defaults (``sync=True``,
``metasync=True``): a write transaction's commit returns once its pages and
the meta page are on stable storage. One write transaction per batch; item
keys are ``site NUL conv NUL`` followed by the sequence number as 8 big-endian
bytes, so a tail is one cursor positioned at ``next_seq - n``; a second
database holds each conversation's next sequence number and last append time.
Values are the append time (8 bytes) and the payload as compact JSON.
Readers use read-only transactions (MVCC, no locks).
"""

from __future__ import annotations

import struct
import threading
import time
from typing import Any

import msgspec

_enc = msgspec.json.Encoder()
_dec_obj = msgspec.json.Decoder(type=dict[str, Any])
_META = struct.Struct(">QQ")  # next_seq, last append (µs)
_SEQ = struct.Struct(">Q")

#: The environment's address space: sparse, so only what is written takes disk.
MAP_SIZE = 1 << 36


def available() -> str | None:
    """None when the ``lmdb`` package can be imported; else why not."""
    try:
        import lmdb  # noqa: F401
    except ImportError as exc:
        return f"the lmdb package is not installed ({exc}); pip install -e '.[bench]'"
    return None


class Lmdb:
    """LMDB with a sync per committed batch."""

    def __init__(self, path: str, name: str = "lmdb") -> None:
        import lmdb

        self.name = name
        self.path = path
        self.env = lmdb.open(path, map_size=MAP_SIZE, max_dbs=2, max_readers=512, sync=True, metasync=True,
                             lock=True, readahead=False)
        self.items = self.env.open_db(b"items")
        self.meta = self.env.open_db(b"meta")
        #: True only while bulk-loading data that is read back (``Ctx.setup_mode``): batches share transactions.
        self._bulk_txn: Any = None
        self._bulk_count = 0
        self._lock = threading.Lock()

    @staticmethod
    def _prefix(site: str, conv: str) -> bytes:
        return site.encode() + b"\0" + conv.encode() + b"\0"

    def _write(self, txn: Any, site: str, conv: str, items: list[dict[str, Any]]) -> None:
        prefix = self._prefix(site, conv)
        raw = txn.get(prefix, db=self.meta)
        stamp = time.time_ns() // 1000
        if raw is None:
            first = 0
        else:
            first, last = _META.unpack(raw)
            stamp = max(stamp, last)
        cur = txn.cursor(db=self.items)
        cur.putmulti([(prefix + _SEQ.pack(first + i), _SEQ.pack(stamp) + _enc.encode(p)) for i, p in enumerate(items)])
        txn.put(prefix, _META.pack(first + len(items), stamp), db=self.meta)

    def begin_bulk(self) -> None:
        self._bulk_txn = self.env.begin(write=True)
        self._bulk_count = 0

    def end_bulk(self) -> None:
        if self._bulk_txn is not None:
            self._bulk_txn.commit()
            self._bulk_txn = None
            self.env.sync(True)

    def append(self, site: str, conv: str, items: list[dict[str, Any]]) -> None:
        if self._bulk_txn is not None:
            self._write(self._bulk_txn, site, conv, items)
            self._bulk_count += 1
            if self._bulk_count % 2000 == 0:
                self._bulk_txn.commit()
                self._bulk_txn = self.env.begin(write=True)
            return
        with self.env.begin(write=True) as txn:
            self._write(txn, site, conv, items)

    def range(self, site: str, conv: str, start: int, limit: int) -> list[Any]:
        prefix = self._prefix(site, conv)
        out: list[Any] = []
        with self.env.begin(buffers=True) as txn:
            raw = txn.get(prefix, db=self.meta)
            if raw is None:
                return out
            end = _META.unpack(raw)[0]
            stop = min(start + limit, end)
            if start >= stop:
                return out
            cur = txn.cursor(db=self.items)
            cur.set_key(prefix + _SEQ.pack(start))
            n = len(prefix)
            for key, value in cur:
                seq = _SEQ.unpack(key[n:])[0]
                out.append((seq, _SEQ.unpack(value[:8])[0], _dec_obj.decode(value[8:])))
                if seq + 1 >= stop:
                    break
        return out

    def tail(self, site: str, conv: str, n: int) -> list[Any]:
        with self.env.begin(buffers=True) as txn:
            raw = txn.get(self._prefix(site, conv), db=self.meta)
        if raw is None:
            return []
        end = _META.unpack(raw)[0]
        return self.range(site, conv, max(end - n, 0), n)

    def close(self) -> None:
        self.end_bulk()
        self.env.close()
