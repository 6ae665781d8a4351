"""The fresh process of the cold-open workload: import untimed, then time one open and first read.

Usage: ``python -m bench.coldchild JSON``; prints ``{"ms": ...}``.
"""

from __future__ import annotations

import json
import os
import sqlite3
import sys
import time

import msgspec

from logstore import ListSelector, Tail, open_store


def main() -> None:
    a = json.loads(sys.argv[1])
    backend, path, site, conv = a["backend"], a["path"], a.get("site"), a.get("conv")
    t0 = time.perf_counter()
    if backend == "convmem":
        store = open_store(path)
        if conv:
            assert len(store.read(site, conv, Tail(50))) == 50
        else:
            assert len(store.list_conversations(site, ListSelector(None, 50)).summaries) == 50
    elif backend == "sqlite":
        db = sqlite3.connect(path)
        db.execute("PRAGMA journal_mode=WAL")
        if conv:
            rows = db.execute("SELECT seq, recorded_at, payload FROM items WHERE site=? AND conv=? "
                              "ORDER BY seq DESC LIMIT 50", (site, conv)).fetchall()
            [msgspec.json.decode(p) for _s, _r, p in rows]
        else:
            rows = db.execute("SELECT conv, created, last FROM convs WHERE site=? ORDER BY last DESC, conv LIMIT 50",
                              (site,)).fetchall()
        assert len(rows) == 50
    else:
        fd = os.open(path, os.O_RDONLY)
        size = os.fstat(fd).st_size
        n = min(a["bytes"], size)
        assert len(os.pread(fd, n, size - n)) == n
    ms = (time.perf_counter() - t0) * 1000
    print(json.dumps({"ms": ms}))


if __name__ == "__main__":
    main()
