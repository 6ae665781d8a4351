"""Workload ``workers``: ``append_memory`` calls/s from 8 clients against ``serve --workers 1`` and ``--workers 2``.

Each client is a thread with its own kept-alive HTTP connection, appending
one item per call to its own conversation, as fast as the server answers, for
a fixed time per round; the rounds of the two configurations take turns. The
supervisor hands each connection to the worker holding the fewest; with two
workers the split of the 8 connections is reported (from the
``x-convmem-worker`` response header) beside the figure. Each configuration
gets a fresh data directory.
"""

from __future__ import annotations

import threading
import time
from collections import Counter

from . import mcpserver, rawhttp
from .context import Ctx
from .rawhttp import KeptAlive
from .util import CONVMEM, Row, payloads

CLIENTS = 8
#: The response header naming the worker that answered (``convmem.mcp_adapter.workers.WORKER_HEADER``).
WORKER_HEADER = "x-convmem-worker"
WORKER_COUNTS = (1, 2)


def steps(ctx: Ctx) -> int:
    return len(WORKER_COUNTS)


def _round_seconds(ctx: Ctx) -> float:
    return 1.0 if ctx.sizes.ops < 100 else 4.0 if ctx.quick else 8.0


def _client(url: str, cid: str, item: dict[str, object], until: float, out: list[int], pids: Counter[str]) -> None:
    conn = KeptAlive(url, mcpserver.mcp_headers())
    request = conn.request(rawhttp.jsonrpc("tools/call", {"name": "append_memory",
                                                          "arguments": {"conversation_id": cid, "items": [item]}}))
    done = 0
    try:
        while time.monotonic() < until:
            status, data = conn.send(request)
            if status != 200 or b'"isError":true' in data:
                raise RuntimeError(f"append_memory failed: HTTP {status}: {data[:300]!r}")
            done += 1
        pid = conn.header(WORKER_HEADER) or "1 worker"
    finally:
        conn.close()
    out.append(done)
    pids[pid] += 1


def _round(url: str, seconds: float, item: dict[str, object], tag: str) -> tuple[float, Counter[str]]:
    """Calls/s of one round of 8 clients; and how many connections each worker held."""
    counts: list[int] = []
    pids: Counter[str] = Counter()
    until = time.monotonic() + seconds
    started = time.monotonic()
    threads = [threading.Thread(target=_client, args=(url, f"workers-bench-{tag}-{i}", item, until, counts, pids))
               for i in range(CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if len(counts) != CLIENTS:
        raise RuntimeError("a bench client failed")
    return sum(counts) / (time.monotonic() - started), pids


def run(ctx: Ctx) -> list[Row]:
    why = mcpserver.available()
    if why:
        raise RuntimeError(f"workers workload unavailable: {why}")
    item = payloads(1, ctx.sizes.item_bytes)[0]
    seconds = _round_seconds(ctx)
    servers = {n: mcpserver.Server(f"{ctx.workdir}/workers-{n}-data", extra_args=("--workers", str(n)))
               for n in WORKER_COUNTS}
    rates: dict[int, list[float]] = {n: [] for n in WORKER_COUNTS}
    splits: dict[int, list[list[int]]] = {n: [] for n in WORKER_COUNTS}
    try:
        for server in servers.values():  # warm up: the first appends create the conversations
            _round(server.url, 0.5, item, "c")
        for r in range(max(ctx.sizes.rounds // 2, 1)):
            for n in WORKER_COUNTS:
                ctx.progress.step(f"workers: append_memory from {CLIENTS} clients, {n} worker(s), round {r + 1}")
                rate, pids = _round(servers[n].url, seconds, item, "c")
                rates[n].append(rate)
                splits[n].append(sorted(pids.values()))
    finally:
        for server in servers.values():
            server.stop()
    rows = []
    for n in WORKER_COUNTS:
        rows.append(Row("workers", f"append_memory calls/s, {CLIENTS} clients, serve --workers {n}", "calls/s",
                        samples={CONVMEM: rates[n]},
                        extra={"workers": n, "connections_per_worker": splits[n], "round_seconds": seconds}))
        ctx.progress.step("workers", advance=1)
    return rows
