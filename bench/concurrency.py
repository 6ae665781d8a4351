"""Workload ``concurrency``: 1, 4, 16 and 64 writers, as threads and as processes.

Writers append 10-item batches of about 1 KiB each:

* on distinct conversations (one each), 1, 4, 16 and 64 of them, as threads
  of one process and as separate processes;
* 4 on the same conversation, as threads and as processes.

The figure is acknowledged batches per second across all writers, from the
first writer's start to the last one's end; every batch's wall time is kept
as well (p50/p99/p99.9). SQLite runs twice: one connection per writer
(``sqlite``), and, for threads, the way an application would: one writer
thread committing every batch queued behind the current transaction together
(``sqlite-group``, each caller waiting for its own batch's commit). The
pre-zeroed floor joins the threads and the distinct-conversation processes.
Every case and backend runs once per round, the backends' order rotating,
so cases of one round (1 writer and 4 on one conversation, say) pair up.

The processes are spawned once and kept for the whole workload: starting
64 interpreters per measurement would measure interpreter start-up.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import threading
import time
from typing import Any

from convmem.logstore.preallocation import wait_for_extensions

from .backends import Convmem, Postgres
from .context import SITE, Ctx
from .floor_peer import Floor
from .lmdb_peer import Lmdb
from .sqlite_peer import Sqlite, SqliteGroupCommit
from .util import CONVMEM, FLOOR, LMDB, POSTGRES, SQLITE, SQLITE_GROUP, Row, payloads

BATCH = 10
SAME = 4


def _cases(ctx: Ctx) -> list[tuple[str, int, bool]]:
    """(how, writers, distinct conversations)."""
    hows = ["threads", "processes"] if ctx.sizes.writer_processes else ["threads"]
    out = [(how, w, True) for how in hows for w in ctx.sizes.writers]
    return out + [(how, SAME, False) for how in hows]


def steps(ctx: Ctx) -> int:
    return len(_cases(ctx))


def _open(kind: str, paths: dict[str, str]) -> Any:
    if kind == CONVMEM:
        return Convmem(paths[CONVMEM])
    if kind == SQLITE:
        return Sqlite(paths[SQLITE])
    if kind == LMDB:
        return Lmdb(paths[LMDB])
    if kind == POSTGRES:
        return Postgres(paths[POSTGRES])
    return Floor(paths[FLOOR])


def _worker(conn: Any) -> None:
    """A writer process: opens backends on demand and appends when told to go."""
    logging.getLogger("logstore.postgres").setLevel(logging.ERROR)  # the bulk store's async-commit warning
    opened: dict[str, Any] = {}
    try:
        while True:
            msg = conn.recv()
            if msg[0] == "quit":
                return
            _op, kind, paths, conv, n, item_bytes = msg
            b = opened.get(kind) or opened.setdefault(kind, _open(kind, paths))
            items = payloads(BATCH, item_bytes)
            b.append(SITE, conv, items)
            if isinstance(b, Floor):
                b.reserve(SITE, conv, (n + 1) * BATCH * (item_bytes + 64))
            conn.send("ready")
            conn.recv()  # go
            lat = []
            clock = time.perf_counter
            t0 = clock()
            for _ in range(n):
                s = clock()
                b.append(SITE, conv, items)
                lat.append(clock() - s)
            wait_for_extensions()  # timed: the run's background I/O is its own, never the next case's
            t1 = clock()
            conn.send((t0, t1, lat))
    finally:
        for b in opened.values():
            b.close()


class Pool:
    """Writer processes spawned once; each runs one writer per case."""

    def __init__(self, size: int) -> None:
        ctx = mp.get_context("spawn")
        self.conns = []
        self.procs = []
        for _ in range(size):
            parent, child = ctx.Pipe()
            p = ctx.Process(target=_worker, args=(child,), daemon=True)
            p.start()
            self.conns.append(parent)
            self.procs.append(p)

    def run(self, kind: str, paths: dict[str, str], convs: list[str], n: int, item_bytes: int
            ) -> tuple[float, list[float]]:
        conns = self.conns[: len(convs)]
        for c, conv in zip(conns, convs, strict=True):
            c.send(("run", kind, paths, conv, n, item_bytes))
        for c in conns:
            if not c.poll(600):
                raise RuntimeError("a writer process did not get ready")
            assert c.recv() == "ready"
        for c in conns:
            c.send("go")
        spans = [c.recv() for c in conns]
        lat = [x for _s, _e, lt in spans for x in lt]
        return len(convs) * n / (max(e for _, e, _l in spans) - min(s for s, _e, _l in spans)), lat

    def close(self) -> None:
        for c in self.conns:
            c.send(("quit",))
        for p in self.procs:
            p.join(timeout=60)


def _threads(b: Any, convs: list[str], n: int, items: list[dict[str, Any]], item_bytes: int
             ) -> tuple[float, list[float]]:
    for c in set(convs):
        b.append(SITE, c, items)
        if isinstance(b, Floor):
            b.reserve(SITE, c, (n * len(convs) + 1) * BATCH * (item_bytes + 64))
    barrier = threading.Barrier(len(convs))
    spans: list[tuple[float, float, list[float]]] = []

    def work(conv: str) -> None:
        lat = []
        clock = time.perf_counter
        barrier.wait()
        t0 = clock()
        for _ in range(n):
            s = clock()
            b.append(SITE, conv, items)
            lat.append(clock() - s)
        spans.append((t0, clock(), lat))

    threads = [threading.Thread(target=work, args=(c,)) for c in convs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wait_for_extensions()  # timed: convmem's background I/O is its own, never the next backend's
    end = time.perf_counter()
    lat = [x for _s, _e, lt in spans for x in lt]
    return len(convs) * n / (end - min(s for s, _e, _l in spans)), lat


#: Rounds of convmem's 1-writer and 4-writers-on-one-conversation threads, at least: the
#: ratio of the two (``same_conversation4_vs_1``) is the median over rounds of the figures
#: of one round, and each figure spans a few tens of milliseconds, which one stall of the
#: disk (another process's I/O) can halve: with two or three rounds the median is one
#: round's luck. Rounds beyond the workload's own run these two cases alone.
SAME_PAIRS = 9


def _more_same_pairs(ctx: Ctx, thr: dict[tuple[str, int, bool], dict[str, list[float]]],
                     lats: dict[tuple[str, int, bool], dict[str, list[float]]], items: list[dict[str, Any]],
                     rounds: int) -> None:
    """Run convmem's (threads, 1, distinct) and (threads, 4, same) cases in pairs up to :data:`SAME_PAIRS` rounds.

    The two cases of a pair run back to back, their order alternating, so a
    slow moment of the machine falls on either side as often.
    """
    one, same = ("threads", 1, True), ("threads", SAME, False)
    if one not in thr or same not in thr:
        return
    b = ctx.convmem
    for r in range(rounds, SAME_PAIRS):
        ctx.progress.step(f"concurrency: 1 writer and {SAME} on one conversation, convmem (round {r + 1}/{SAME_PAIRS})")
        n = max(-(-ctx.sizes.concurrent_ops // rounds), 2)
        cases = [(one, [f"conc-pair-1-{r}"], n), (same, [f"conc-pair-same-{r}"] * SAME, max(n // SAME, 2))]
        for case, convs, per in cases if r % 2 else cases[::-1]:
            rate, lat = _threads(b, convs, per, items, ctx.sizes.item_bytes)
            thr[case].setdefault(b.name, []).append(rate)
            lats[case].setdefault(b.name, []).extend(lat)


def run(ctx: Ctx) -> list[Row]:
    items = payloads(BATCH, ctx.sizes.item_bytes)
    paths = {CONVMEM: ctx.convmem_dir, SQLITE: ctx.sqlite_path, FLOOR: ctx.floor_dir, LMDB: ctx.lmdb_dir}
    if ctx.postgres_dsn is not None:
        paths[POSTGRES] = ctx.postgres_dsn
    group = SqliteGroupCommit(ctx.sqlite_path, SQLITE_GROUP)
    cases = _cases(ctx)
    procs = max((w for how, w, _d in cases if how == "processes"), default=0)
    pool = Pool(procs) if procs else None
    rounds = ctx.sizes.concurrency_rounds
    thr: dict[tuple[str, int, bool], dict[str, list[float]]] = {c: {} for c in cases}
    lats: dict[tuple[str, int, bool], dict[str, list[float]]] = {c: {} for c in cases}
    try:
        for r in range(rounds):
            for case in cases:
                how, writers, distinct = case
                where = "distinct conversations" if distinct else "the same conversation"
                ctx.progress.step(f"concurrency: {writers} {how}, {where} (round {r + 1}/{rounds})",
                                  advance=1 if r == rounds - 1 else 0)
                n = max(-(-ctx.sizes.concurrent_ops // (writers * rounds)), 2)
                backends: list[Any] = [b for b in ctx.backends() if how == "threads" or distinct or b is not ctx.floor]
                if how == "threads":
                    backends.insert(2, group)
                order = backends[r % len(backends):] + backends[: r % len(backends)]
                for b in order:
                    convs = ([f"conc-{how}-{writers}-{b.name}-{i}" for i in range(writers)] if distinct
                             else [f"conc-{how}-same-{b.name}"] * writers)
                    if how == "threads":
                        rate, lat = _threads(b, convs, n, items, ctx.sizes.item_bytes)
                    else:
                        assert pool is not None
                        rate, lat = pool.run(b.name, paths, convs, n, ctx.sizes.item_bytes)
                    thr[case].setdefault(b.name, []).append(rate)
                    lats[case].setdefault(b.name, []).extend(lat)
        _more_same_pairs(ctx, thr, lats, items, rounds)
    finally:
        if pool is not None:
            pool.close()
        group.close()
    rows = []
    for case in cases:
        how, writers, distinct = case
        where = "distinct conversations" if distinct else "the same conversation"
        rows.append(Row("concurrency", f"append 10-item batches, {writers} {how}, {where}", "batches/s",
                        samples=thr[case], latencies=lats[case],
                        extra={"how": how, "writers": writers, "distinct": distinct}))
    return rows
