"""Workload 8: end to end through ``convmem serve`` over HTTP on loopback, with the SDK client.

Calls per second, one client, calls back to back, for:

* ``ping``: the no-op baseline (the server has no no-op tool; a ping takes the
  same HTTP and JSON-RPC path but no tool dispatch);
* a ``recall_memory`` call rejected by validation (malformed id): the whole
  tool path (auth, argument checks, error result) without storage;
* ``append_memory`` of 10 items of about 1 KiB, and ``recall_memory`` of the
  last 50 of a 1,000-item conversation.

``recall_memory`` over ``ping`` is the storage-plus-tool share of a call; the
same recall timed straight through the store (in this process, after the
server stops) shows how much of it is storage. The SDK client validates every
structured result against the tool's output schema (``jsonschema``), which
for 50 items costs more than the server's whole answer; so ``ping`` and
``recall_memory`` are also timed as raw JSON-RPC POSTs (``httpx``), the
server's side of the ratio.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Awaitable, Callable
from typing import Any

import anyio

from logstore import Tail, open_store

from . import mcpserver
from .context import Ctx
from .util import CONVMEM, Row, median, payloads, rate

CONV = "mcp-bench-conv-1"


def steps(ctx: Ctx) -> int:
    return 1


async def _rate(fn: Callable[[], Awaitable[Any]], n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        await fn()
    return n / (time.perf_counter() - t0)


async def _measure(url: str, ctx: Ctx) -> dict[str, list[float]]:
    # ping only exists in the SDK's legacy mode, which is what this server speaks.
    warnings.filterwarnings("ignore", message="ping is removed")
    items = payloads(10, ctx.sizes.item_bytes)
    async with mcpserver.client(url) as c:
        for _ in range(100):  # a 1,000-item conversation to recall from
            r = await c.call_tool("append_memory", {"conversation_id": CONV, "items": items})
            assert not r.is_error, r
        bad = await c.call_tool("recall_memory", {"conversation_id": "bad!"})
        assert bad.is_error
        calls: dict[str, Callable[[], Awaitable[Any]]] = {
            "ping": c.send_ping,
            "rejected": lambda: c.call_tool("recall_memory", {"conversation_id": "bad!"}),
            "append": lambda: c.call_tool("append_memory", {"conversation_id": CONV + "-a", "items": items}),
            "recall": lambda: c.call_tool("recall_memory", {"conversation_id": CONV, "count": 50}),
        }
        import httpx2

        headers = {"Authorization": mcpserver.auth_header(), "Accept": "application/json, text/event-stream",
                   "MCP-Protocol-Version": "2025-06-18"}
        async with httpx2.AsyncClient(headers=headers, timeout=60) as raw:

            async def post(method: str, params: dict[str, Any] | None = None) -> None:
                body = {"jsonrpc": "2.0", "id": 1, "method": method, **({"params": params} if params else {})}
                r = await raw.post(url, json=body)
                # Check without parsing the whole body: the client's JSON parse is not the server's cost.
                assert r.status_code == 200 and r.content.startswith(b'{"jsonrpc":"2.0","id":1,"result"'), r.text[:300]

            calls["raw_ping"] = lambda: post("ping")
            calls["raw_recall"] = lambda: post(
                "tools/call", {"name": "recall_memory", "arguments": {"conversation_id": CONV, "count": 50}})
            out: dict[str, list[float]] = {k: [] for k in calls}
            for _ in range(ctx.sizes.rounds):
                for name, fn in calls.items():
                    out[name].append(await _rate(fn, ctx.sizes.mcp_calls))
            return out


def _engine_recall_ms(data_dir: str) -> float:
    """The same recall straight through the store, in this process: milliseconds per call."""
    store = open_store(data_dir)
    try:
        calls = 500
        store.read(mcpserver.SITE, CONV, Tail(50))
        return 1000 / median([rate(lambda: store.read(mcpserver.SITE, CONV, Tail(50)), calls) for _ in range(5)])
    finally:
        store.close()


def run(ctx: Ctx) -> list[Row]:
    why = mcpserver.available()
    if why:
        return [Row("mcp", "MCP end to end", "calls/s", note=f"unavailable: {why}")]
    ctx.progress.step("MCP end to end over HTTP")
    server = mcpserver.Server(f"{ctx.workdir}/mcp-data")
    try:
        res = anyio.run(_measure, server.url, ctx)
    finally:
        server.stop()
    ping = median(res["ping"])
    engine_ms = _engine_recall_ms(f"{ctx.workdir}/mcp-data")
    rows = []
    labels = {
        "ping": ("MCP ping (no-op baseline)", "ping"),
        "rejected": ("MCP tools/call rejected before storage", "rejected_call"),
        "append": ("MCP append_memory, 10 items", "append_memory"),
        "recall": ("MCP recall_memory, last 50", "recall_memory"),
        "raw_ping": ("raw HTTP JSON-RPC ping", "raw_ping"),
        "raw_recall": ("raw HTTP JSON-RPC recall_memory, last 50", "raw_recall_memory"),
    }
    for key, (label, tool) in labels.items():
        samples = res[key]
        base = res["raw_ping"] if key.startswith("raw_") else res["ping"]
        vs = [x / y for x, y in zip(samples, base, strict=True)]
        vs_noop = median(vs)
        note = "" if key in ("ping", "raw_ping") else f"{vs_noop:.2f}x ping"
        extra = {"tool": tool, "vs_noop": vs_noop, "ping_calls_per_s": ping}
        if key in ("recall", "raw_recall"):
            share = engine_ms / (1000 / median(samples))
            note += f"; the store's own read is {share:.0%} of the call"
            extra.update(engine_recall_ms=engine_ms, engine_share=share)
        rows.append(Row("mcp", label, "calls/s", samples={CONVMEM: samples}, note=note, extra=extra))
    ctx.progress.step("MCP", advance=1)
    return rows
