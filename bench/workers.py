"""Workload ``workers``: ``append_memory`` calls/s from 8 clients against ``serve --workers 1`` and ``--workers 2``.

Each client is a thread with its own kept-alive HTTP connection, appending
one item per call to its own conversation, as fast as the server answers, for
a fixed time per round; the rounds of the two configurations take turns. The
kernel gives each connection to one worker when it is accepted, so with two
workers the split of the 8 connections is reported (from the
``x-convmem-worker`` response header) beside the figure. Each configuration
gets a fresh data directory.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
import urllib.parse
from collections import Counter

from . import mcpserver
from .context import Ctx
from .util import CONVMEM, Row, payloads

CLIENTS = 8
WORKER_COUNTS = (1, 2)


def steps(ctx: Ctx) -> int:
    return len(WORKER_COUNTS)


def _round_seconds(ctx: Ctx) -> float:
    return 1.0 if ctx.sizes.ops < 100 else 4.0 if ctx.quick else 8.0


def _client(url: str, cid: str, item: dict[str, object], until: float, out: list[int], pids: Counter[str]) -> None:
    u = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname or "127.0.0.1", u.port, timeout=120)
    headers = {"Authorization": mcpserver.auth_header(), "Content-Type": "application/json",
               "Accept": "application/json, text/event-stream", "MCP-Protocol-Version": "2025-06-18"}
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                       "params": {"name": "append_memory", "arguments": {"conversation_id": cid, "items": [item]}}})
    done = 0
    pid = "?"
    try:
        while time.monotonic() < until:
            conn.request("POST", u.path, body=body, headers=headers)
            r = conn.getresponse()
            data = r.read()
            if r.status != 200 or b'"isError":true' in data:
                raise RuntimeError(f"append_memory failed: HTTP {r.status}: {data[:300]!r}")
            pid = r.getheader("x-convmem-worker") or "1 worker"
            done += 1
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
