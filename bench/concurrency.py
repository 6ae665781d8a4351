"""Workload 5: four writers at once, as threads and as processes.

Four threads, then four processes, append 10-item batches to four distinct
conversations; then four of each append to one shared conversation. The
figure is acknowledged batches per second across all writers, from the first
writer's start to the last one's end.
"""

from __future__ import annotations

import multiprocessing as mp
import threading
import time
from collections.abc import Callable
from typing import Any

from .backends import Convmem, Floor, Postgres, Sqlite
from .context import SITE, Ctx
from .util import Row, interleaved, payloads

WRITERS = 4
BATCH = 10
CASES = [("threads", True), ("processes", True), ("threads", False), ("processes", False)]


def steps(ctx: Ctx) -> int:
    return len(CASES)


def _open(kind: str, ctx_paths: dict[str, str]) -> Any:
    if kind == "convmem":
        return Convmem(ctx_paths["convmem"])
    if kind == "sqlite":
        return Sqlite(ctx_paths["sqlite"])
    if kind == "postgres":
        return Postgres(ctx_paths["postgres"])
    return Floor(ctx_paths["floor"])


def _proc_worker(kind: str, paths: dict[str, str], conv: str, n: int, item_bytes: int,
                 ready: Any, go: Any, out: Any) -> None:
    backend = _open(kind, paths)
    items = payloads(BATCH, item_bytes)
    backend.append(SITE, conv, items)  # open files and connections before the clock starts
    ready.release()
    go.wait()
    t0 = time.monotonic()
    for _ in range(n):
        backend.append(SITE, conv, items)
    out.put((t0, time.monotonic()))
    backend.close()


def _threads(backend: Any, convs: list[str], n: int, items: list[dict]) -> float:
    for c in set(convs):
        backend.append(SITE, c, items)
    barrier = threading.Barrier(len(convs))
    spans: list[tuple[float, float]] = []

    def work(conv: str) -> None:
        barrier.wait()
        t0 = time.monotonic()
        for _ in range(n):
            backend.append(SITE, conv, items)
        spans.append((t0, time.monotonic()))

    threads = [threading.Thread(target=work, args=(c,)) for c in convs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return len(convs) * n / (max(e for _, e in spans) - min(s for s, _ in spans))


def _processes(kind: str, paths: dict[str, str], convs: list[str], n: int, item_bytes: int) -> float:
    mpc = mp.get_context("spawn")
    ready, go, out = mpc.Semaphore(0), mpc.Event(), mpc.Queue()
    procs = [mpc.Process(target=_proc_worker, args=(kind, paths, c, n, item_bytes, ready, go, out)) for c in convs]
    for p in procs:
        p.start()
    for _ in procs:
        ready.acquire()
    go.set()
    spans = [out.get(timeout=300) for _ in procs]
    for p in procs:
        p.join()
    return len(convs) * n / (max(e for _, e in spans) - min(s for s, _ in spans))


def run(ctx: Ctx) -> list[Row]:
    rows = []
    items = payloads(BATCH, ctx.sizes.item_bytes)
    paths = {"convmem": ctx.convmem_dir, "sqlite": ctx.sqlite_path, "floor": ctx.floor_dir}
    if ctx.postgres_dsn is not None:
        paths["postgres"] = ctx.postgres_dsn
    n = ctx.sizes.concurrent_appends
    for how, distinct in CASES:
        where = "distinct conversations" if distinct else "the same conversation"
        ctx.progress.step(f"concurrency: {WRITERS} {how}, {where}")
        convs = [f"conc-{how}-{i}" for i in range(WRITERS)] if distinct else [f"conc-{how}-shared"] * WRITERS
        fns: dict[str, Callable[[], float]] = {}
        for b in ctx.backends():
            if how == "threads":
                fns[b.name] = lambda b=b, convs=convs: _threads(b, convs, n, items)
            else:
                fns[b.name] = lambda b=b, convs=convs: _processes(b.name, paths, convs, n, ctx.sizes.item_bytes)
        rows.append(Row("concurrency", f"append 10-item batches, {WRITERS} {how}, {where}", "batches/s",
                        samples=interleaved(ctx.sizes.concurrency_rounds, fns),
                        extra={"how": how, "distinct": distinct}))
        ctx.progress.step(f"concurrency: {how}", advance=1)
    return rows
