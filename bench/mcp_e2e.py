"""Workload ``mcp``: ``recall_memory`` end to end over HTTP against a no-op tool of the same size.

The bench starts the product's server (``convmem serve`` on 127.0.0.1, a
free port) with one extra tool registered for this process only
(:mod:`bench.noopserver`): ``bench_noop`` authenticates like any tool and
returns a stored result without touching the store. Its result is the very
``structuredContent`` a ``recall_memory`` of the last 50 items of a
1,000-item conversation returned, so both calls move the same bytes through
the same HTTP, JSON-RPC, authentication and result-shaping path; the ratio
is the store's share. The calls are raw JSON-RPC POSTs over one kept-alive
connection (:mod:`bench.rawhttp`, requests built once), the client parsing nothing, the two tools
taking turns call by call. ``ping`` (the protocol's own no-op) and
``append_memory`` of 10 items are timed alongside for context.

The MCP layer's own cost is measured in the same turns against
two floors: a bare ASGI app under the same uvicorn answering the same POST
with a fixed body (:mod:`bench.noopserver`, ``--bare``), and the engine's own
append of one item (``MemoryStore.append`` in this process, same disk). The
figures: ``ping`` over the bare app, ``recall_memory`` of 50 items minus
``ping``, ``append_memory`` of one item minus the engine's append (medians;
pairs of one turn resampled together), and ``recall_memory`` calls per
second from 8 clients (threads, one kept-alive connection each) on the one
server process.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from convmem.logstore import open_store

from . import mcpserver, rawhttp
from .context import Ctx
from .rawhttp import KeptAlive
from .util import CONVMEM, Row, interleaved_ops, payloads

CONV = "mcp-bench-conv-1"
RECALL = 50
#: Concurrent clients of the throughput figure.
CLIENTS = 8
ENGINE_SITE = "bench-engine-site"


def steps(ctx: Ctx) -> int:
    return 1


class RawClient:
    """JSON-RPC POSTs over one kept-alive HTTP/1.1 connection (:mod:`bench.rawhttp`: the client costs little)."""

    def __init__(self, url: str) -> None:
        self.conn = KeptAlive(url, mcpserver.mcp_headers())

    def prepare(self, method: str, params: dict[str, Any] | None = None) -> bytes:
        """The request's bytes, built once so that a timed loop only sends them."""
        return self.conn.request(rawhttp.jsonrpc(method, params))

    def prepare_tool(self, name: str, arguments: dict[str, Any]) -> bytes:
        return self.prepare("tools/call", {"name": name, "arguments": arguments})

    def send(self, request: bytes) -> bytes:
        status, data = self.conn.send(request)
        if status != 200 or not data.startswith(b'{"jsonrpc":"2.0","id":1,"result"') or b'"isError":true' in data:
            raise RuntimeError(f"call failed: HTTP {status}: {data[:300]!r} (request {request[-200:]!r})")
        return data

    def post(self, method: str, params: dict[str, Any] | None = None) -> bytes:
        return self.send(self.prepare(method, params))

    def tool(self, name: str, arguments: dict[str, Any]) -> bytes:
        return self.send(self.prepare_tool(name, arguments))

    def close(self) -> None:
        self.conn.close()


def throughput(url: str, clients: int, calls: int, arguments: dict[str, Any]) -> tuple[float, list[float]]:
    """``recall_memory`` calls per second from ``clients`` threads making ``calls`` calls each; and every latency."""
    conns = [RawClient(url) for _ in range(clients)]
    request = conns[0].prepare_tool("recall_memory", arguments)  # the same bytes on every connection
    for c in conns:
        c.send(request)  # connected and warm
    latencies: list[list[float]] = [[] for _ in conns]
    failures: list[BaseException] = []
    start = threading.Barrier(clients + 1)

    def work(i: int) -> None:
        c, out = conns[i], latencies[i]
        start.wait()
        try:
            for _ in range(calls):
                t0 = time.perf_counter()
                c.send(request)
                out.append(time.perf_counter() - t0)
        except BaseException as exc:  # reported below, after every thread has ended
            failures.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    seconds = time.perf_counter() - t0
    for c in conns:
        c.close()
    if failures:
        raise RuntimeError(f"a concurrent client failed: {failures[0]!r}")
    return clients * calls / seconds, [x for out in latencies for x in out]


def run(ctx: Ctx) -> list[Row]:
    why = mcpserver.available()
    if why:
        raise RuntimeError(f"MCP workload unavailable: {why}")
    label = f"MCP over HTTP: recall_memory of {RECALL} against a no-op tool of the same size"
    ctx.progress.step(label)
    payload_file = os.path.join(ctx.workdir, "mcp-noop-result.json")
    server = mcpserver.Server(f"{ctx.workdir}/mcp-data", noop_payload=payload_file)
    bare = mcpserver.Server(f"{ctx.workdir}/mcp-bare/data", bare=True)
    engine = open_store(f"{ctx.workdir}/mcp-engine")
    try:
        c = RawClient(server.url)
        floor = RawClient(bare.url)
        items = payloads(10, ctx.sizes.item_bytes)
        for _ in range(100):  # a 1,000-item conversation to recall from
            c.tool("append_memory", {"conversation_id": CONV, "items": items})
        recall_args = {"conversation_id": CONV, "count": RECALL}
        body = c.tool("recall_memory", recall_args)
        with open(payload_file, "wb") as f:
            f.write(json.dumps(json.loads(body)["result"]["structuredContent"]).encode())
        noop_body = c.tool("bench_noop", recall_args)
        sizes = {"recall_memory": len(body), "bench_noop": len(noop_body)}
        if abs(len(body) - len(noop_body)) > 0.01 * len(body):
            raise RuntimeError(f"the no-op's response is not the recall's size: {sizes}")
        one = payloads(1, ctx.sizes.item_bytes)
        recall = c.prepare_tool("recall_memory", recall_args)
        noop = c.prepare_tool("bench_noop", recall_args)
        ping = c.prepare("ping")
        append10 = c.prepare_tool("append_memory", {"conversation_id": CONV + "-a", "items": items})
        append1 = c.prepare_tool("append_memory", {"conversation_id": CONV + "-b", "items": one})
        bare_ping = floor.prepare("ping")
        fns: dict[str, Callable[[], object]] = {
            "recall_memory": lambda: c.send(recall),
            "bench_noop": lambda: c.send(noop),
            "ping": lambda: c.send(ping),
            "append_memory": lambda: c.send(append10),
            "append_memory_1": lambda: c.send(append1),
            "bare_app": lambda: floor.send(bare_ping),
            "engine_append_1": lambda: engine.append(ENGINE_SITE, CONV + "-e", one),
        }
        samples = interleaved_ops(ctx.sizes.ops, fns, progress=ctx.progress, label="mcp")
        c.close()
        floor.close()
        rate, concurrent = throughput(server.url, CLIENTS, max(ctx.sizes.ops // 2, 10), recall_args)
    finally:
        server.stop()
        bare.stop()
        engine.close()
    rows = []
    for name, what in (("recall_memory", f"recall_memory, last {RECALL} of 1,000 items"),
                       ("bench_noop", "bench_noop: the same result, no store"),
                       ("ping", "ping (protocol no-op)"),
                       ("append_memory", "append_memory, 10 items"),
                       ("append_memory_1", "append_memory, 1 item"),
                       ("bare_app", "bare ASGI app, same uvicorn, fixed body (floor)"),
                       ("engine_append_1", "engine append of 1 item, no MCP (floor)")):
        rows.append(Row("mcp", f"MCP raw HTTP JSON-RPC: {what}", "ms/call", higher_better=False, per_op=True,
                        samples={CONVMEM: samples[name]},
                        extra={"tool": name, "response_bytes": sizes.get(name)}))
    rows.append(Row("mcp", f"MCP recall_memory of {RECALL}, {CLIENTS} concurrent clients, one server process",
                    "calls/s", samples={CONVMEM: [rate]}, latencies={CONVMEM: concurrent},
                    extra={"tool": "recall_memory_concurrent", "clients": CLIENTS, "calls_per_s": rate}))
    ctx.progress.step("MCP", advance=1)
    return rows
