"""Workload ``mcp``: ``recall_memory`` end to end over HTTP against a no-op tool of the same size.

The bench starts the product's server (``convmem serve`` on 127.0.0.1, a
free port) with one extra tool registered for this process only
(:mod:`bench.noopserver`): ``bench_noop`` authenticates like any tool and
returns a stored result without touching the store. Its result is the very
``structuredContent`` a ``recall_memory`` of the last 50 items of a
1,000-item conversation returned, so both calls move the same bytes through
the same HTTP, JSON-RPC, authentication and result-shaping path; the ratio
is the store's share. The calls are raw JSON-RPC POSTs over one kept-alive
connection (``http.client``), the client parsing nothing, the two tools
taking turns call by call. ``ping`` (the protocol's own no-op) and
``append_memory`` of 10 items are timed alongside for context.
"""

from __future__ import annotations

import http.client
import json
import os
import urllib.parse
from collections.abc import Callable
from typing import Any

from . import mcpserver
from .context import Ctx
from .util import CONVMEM, Row, interleaved_ops, payloads

CONV = "mcp-bench-conv-1"
RECALL = 50


def steps(ctx: Ctx) -> int:
    return 1


class RawClient:
    """JSON-RPC POSTs over one HTTP/1.1 connection, as any client library would send them."""

    def __init__(self, url: str) -> None:
        u = urllib.parse.urlsplit(url)
        self.path = u.path
        self.conn = http.client.HTTPConnection(u.hostname or "127.0.0.1", u.port, timeout=120)
        self.headers = {"Authorization": mcpserver.auth_header(), "Content-Type": "application/json",
                        "Accept": "application/json, text/event-stream", "MCP-Protocol-Version": "2025-06-18"}

    def post(self, method: str, params: dict[str, Any] | None = None) -> bytes:
        body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, **({"params": params} if params else {})})
        self.conn.request("POST", self.path, body=body, headers=self.headers)
        r = self.conn.getresponse()
        data = r.read()
        if r.status != 200 or not data.startswith(b'{"jsonrpc":"2.0","id":1,"result"') or b'"isError":true' in data:
            raise RuntimeError(f"{method} failed: HTTP {r.status}: {data[:300]!r}")
        return data

    def tool(self, name: str, arguments: dict[str, Any]) -> bytes:
        return self.post("tools/call", {"name": name, "arguments": arguments})

    def close(self) -> None:
        self.conn.close()


def run(ctx: Ctx) -> list[Row]:
    why = mcpserver.available()
    if why:
        raise RuntimeError(f"MCP workload unavailable: {why}")
    label = f"MCP over HTTP: recall_memory of {RECALL} against a no-op tool of the same size"
    ctx.progress.step(label)
    payload_file = os.path.join(ctx.workdir, "mcp-noop-result.json")
    server = mcpserver.Server(f"{ctx.workdir}/mcp-data", noop_payload=payload_file)
    try:
        c = RawClient(server.url)
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
        fns: dict[str, Callable[[], object]] = {
            "recall_memory": lambda: c.tool("recall_memory", recall_args),
            "bench_noop": lambda: c.tool("bench_noop", recall_args),
            "ping": lambda: c.post("ping"),
            "append_memory": lambda: c.tool("append_memory", {"conversation_id": CONV + "-a", "items": items}),
        }
        samples = interleaved_ops(ctx.sizes.ops, fns, progress=ctx.progress, label="mcp")
        c.close()
    finally:
        server.stop()
    rows = []
    for name, what in (("recall_memory", f"recall_memory, last {RECALL} of 1,000 items"),
                       ("bench_noop", "bench_noop: the same result, no store"),
                       ("ping", "ping (protocol no-op)"),
                       ("append_memory", "append_memory, 10 items")):
        rows.append(Row("mcp", f"MCP raw HTTP JSON-RPC: {what}", "ms/call", higher_better=False, per_op=True,
                        samples={CONVMEM: samples[name]},
                        extra={"tool": name, "response_bytes": sizes.get(name)}))
    ctx.progress.step("MCP", advance=1)
    return rows
