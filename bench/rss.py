"""Workload ``rss``: the server's peak RSS while it answers one ``replay_memory`` page of 1,000 items of 256 KiB.

The conversation (1,000 items of just under 256 KiB, four per batch) is
written through the store before the server starts. The server's peak RSS
(``VmHWM``, reset just before the call where the kernel allows) is set
against the size of the HTTP response body.
"""

from __future__ import annotations

import anyio

from logstore import MAX_ITEM_BYTES, open_store

from . import mcpserver
from .context import Ctx
from .util import CONVMEM, Row, engine_sync_disabled

CONV = "mcp-bench-big-items"
ITEMS = 1000


def steps(ctx: Ctx) -> int:
    return 1


def _build(data_dir: str, items: int) -> None:
    text = "x" * (MAX_ITEM_BYTES - 64)
    store = open_store(data_dir)
    try:
        with engine_sync_disabled():
            for i in range(0, items, 4):
                store.append(mcpserver.SITE, CONV, [{"n": i + k, "text": text} for k in range(4)])
    finally:
        store.close()


async def _replay(url: str, items: int) -> int:
    sizes: list[int] = []

    async def hook(response: object) -> None:
        headers = getattr(response, "headers", {})
        if "content-length" in headers:
            sizes.append(int(headers["content-length"]))

    async with mcpserver.client(url, on_response=hook) as c:
        r = await c.call_tool("replay_memory", {"conversation_id": CONV, "offset": 0, "limit": items})
        assert not r.is_error, r
        assert len(r.structured_content["items"]) == items
    return max(sizes)


def run(ctx: Ctx) -> list[Row]:
    why = mcpserver.available()
    if why:
        return [Row("rss", "replay_memory peak RSS", "MiB", note=f"unavailable: {why}")]
    items = ITEMS if not ctx.quick else 200
    ctx.progress.step(f"rss: replay of {items} items of 256 KiB")
    data_dir = f"{ctx.workdir}/mcp-mem-data"
    _build(data_dir, items)
    server = mcpserver.Server(data_dir)
    try:
        base = server.status("VmRSS")
        reset = server.reset_peak()
        size = anyio.run(_replay, server.url, items)
        peak = server.status("VmHWM")
    finally:
        server.stop()
    mib = 1024 * 1024
    ratio = peak / size
    row = Row("rss", f"replay_memory of {items:,} items of 256 KiB: server peak RSS", "MiB", higher_better=False,
              samples={CONVMEM: [peak / mib]},
              note=f"response {size / mib:.0f} MiB; peak RSS {ratio:.2f}x response",
              extra={"rss_vs_response": ratio, "response_bytes": size, "peak_rss_bytes": peak,
                     "rss_before_bytes": base, "peak_reset": reset, "items": items})
    ctx.progress.step("rss", advance=1)
    return [row]
