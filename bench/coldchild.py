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

from convmem.logstore import ListSelector, Tail, open_store


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
            cid = db.execute("SELECT id FROM convs WHERE site=? AND conv=?", (site, conv)).fetchone()[0]
            rows = db.execute("SELECT k, recorded_at, payload FROM items WHERE k>=? AND k<? ORDER BY k DESC LIMIT 50",
                              (cid << 32, (cid + 1) << 32)).fetchall()
            [msgspec.json.decode(p) for _s, _r, p in rows]
        else:
            rows = db.execute("SELECT conv, created, last FROM convs WHERE site=? ORDER BY last DESC, conv LIMIT 50",
                              (site,)).fetchall()
        assert len(rows) == 50
    else:
        fd = os.open(path, os.O_RDONLY)
        size = a.get("end") or os.fstat(fd).st_size  # the pre-zeroed floor's file is longer than its data
        n = min(a["bytes"], size)
        assert len(os.pread(fd, n, size - n)) == n
    ms = (time.perf_counter() - t0) * 1000
    print(json.dumps({"ms": ms}))


if __name__ == "__main__":
    main()
