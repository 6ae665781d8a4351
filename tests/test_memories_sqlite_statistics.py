"""SQLite's heap statistics turned off at start-up: only when nothing of SQLite's is alive, never under it.

Every case runs in a child interpreter: the setting is process-wide, and
shutting SQLite down in the test process would be the very thing the
function refuses to do. ``sqlite3_memory_used`` is read through the same
library as the module reads it; a counter that moves while a connection
opens is counting.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.mcp_helpers import ServerProcess, subprocess_env

_PRELUDE = """
import ctypes, json, sqlite3, _sqlite3
from convmem.logstore.memories import turn_off_sqlite_statistics
lib = ctypes.CDLL(_sqlite3.__file__)
lib.sqlite3_memory_used.restype = ctypes.c_int64
def counting():
    before = lib.sqlite3_memory_used()
    c = sqlite3.connect(":memory:")
    c.execute("SELECT 1").fetchall()
    moved = lib.sqlite3_memory_used() != before
    c.close()
    return moved
"""


def _child(body: str, **env: str) -> dict[str, object]:
    code = _PRELUDE + textwrap.dedent(body)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env=subprocess_env(**env), check=True)
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def test_fresh_process_turns_them_off_and_sqlite_still_works() -> None:
    r = _child("""
        first = turn_off_sqlite_statistics()
        again = turn_off_sqlite_statistics()
        db = sqlite3.connect(":memory:")
        db.execute("CREATE VIRTUAL TABLE t USING fts5(a, tokenize = 'porter unicode61')")
        db.executemany("INSERT INTO t VALUES (?)", [("deploys on friday",), ("metric units",)])
        found = db.execute("SELECT a FROM t WHERE t MATCH 'deploy'").fetchall()
        print(json.dumps({"first": list(first), "again": list(again), "counting": counting(), "found": found}))
    """)
    assert r["first"] == [True, "SQLite's heap statistics turned off (their mutex was taken on every allocation "
                          "of every connection)", False]
    assert r["again"] == [True, "SQLite's heap statistics were already off", False]
    assert r["counting"] is False
    assert r["found"] == [["deploys on friday"]]


def test_a_live_connection_leaves_them_on_and_untouched() -> None:
    r = _child("""
        held = sqlite3.connect(":memory:")
        held.execute("CREATE TABLE k (v)")
        held.execute("INSERT INTO k VALUES (1)")
        outcome = turn_off_sqlite_statistics()
        print(json.dumps({"outcome": list(outcome), "counting": counting(),
                          "still": held.execute("SELECT v FROM k").fetchall()}))
    """)
    off, detail, failed = r["outcome"]  # type: ignore[misc]
    assert (off, failed) == (False, True)
    assert "bytes of SQLite's are in use in this process" in str(detail)
    assert r["counting"] is True  # never shut down under the open connection
    assert r["still"] == [[1]]


def test_the_environment_keeps_them_on() -> None:
    r = _child("""
        print(json.dumps({"outcome": list(turn_off_sqlite_statistics()), "counting": counting()}))
    """, CONVMEM_SQLITE_MEMSTATUS="1")
    assert r["outcome"] == [False, "SQLite's heap statistics kept on (CONVMEM_SQLITE_MEMSTATUS=1)", False]
    assert r["counting"] is True


def test_rankings_are_the_same_either_way() -> None:
    body = """
        import os
        if os.environ.get("CONVMEM_SQLITE_MEMSTATUS") != "1":
            assert turn_off_sqlite_statistics().off
        from convmem.logstore.memories._lexical import LexicalIndex, query_terms
        import random
        rnd = random.Random(7)
        words = "deploy friday metric units oslo fiscal year schedule backup region invoice".split()
        ix = LexicalIndex()
        ix.put_many((i, " ".join(rnd.choices(words, k=3)), " ".join(rnd.choices(words, k=12)), "",
                     rnd.sample(words, 2)) for i in range(500))
        out = []
        for q in ["deploy on friday", "metric units in oslo", "the fiscal year invoice", "backup region"]:
            with ix.reading() as db:
                out.append(ix.rank(query_terms(q), limit=10, db=db))
        ix.close()
        print(json.dumps({"counting": counting(), "ranked": out}))
    """
    on, off = _child(body, CONVMEM_SQLITE_MEMSTATUS="1"), _child(body)
    assert (on["counting"], off["counting"]) == (True, False)
    assert on["ranked"] == off["ranked"] and all(on["ranked"])  # type: ignore[arg-type]


@pytest.mark.parametrize("keep", ["", "1"])
def test_convmem_serve_logs_what_it_did(tmp_path: Path, keep: str) -> None:
    env = subprocess_env(**({"CONVMEM_SQLITE_MEMSTATUS": keep} if keep else {}))
    server = ServerProcess(tmp_path / "data", env=env)
    try:
        log = server.log()
    finally:
        assert server.stop() == 0
    expected = "kept on (CONVMEM_SQLITE_MEMSTATUS=1)" if keep else "heap statistics turned off"
    assert expected in log, log
    assert "left on" not in log
