"""Workload ``rss``: the server's peak memory while it answers one large ``replay_memory`` page.

A conversation of items of just under 256 KiB each (1,000 in a full run,
four per batch) is written through the store before the server starts.
Each sample starts a fresh ``convmem serve``, reads its resident set once it
is idle (the interpreter, the libraries and the server: the baseline), resets
the peak mark (``VmHWM``, via ``/proc/PID/clear_refs`` where the kernel
allows it), asks for every item in one ``replay_memory`` call, and reads the
peak. The figure is ``(peak - baseline) / payload bytes``, where the payload
bytes are the items' JSON as stored: the memory the call itself needed per
byte it returned. Several samples, each in a new process; the median with a
bootstrap interval.
"""

from __future__ import annotations

import json

import msgspec

from convmem.logstore import MAX_ITEM_BYTES, open_store

from . import mcpserver
from .context import Ctx
from .mcp_e2e import RawClient
from .util import CONVMEM, Row, engine_sync_disabled, median, median_ci

CONV = "mcp-bench-big-items"


def steps(ctx: Ctx) -> int:
    return 1


def _build(data_dir: str, items: int) -> int:
    """Write the conversation; returns the payload bytes (compact JSON of every item)."""
    text = "x" * (MAX_ITEM_BYTES - 64)
    total = 0
    mcpserver.add_site(data_dir)  # before the data: see add_site
    store = open_store(data_dir)
    try:
        with engine_sync_disabled():
            for i in range(0, items, 4):
                batch = [{"n": i + k, "text": text} for k in range(min(4, items - i))]
                total += sum(len(msgspec.json.encode(p)) for p in batch)
                store.append(mcpserver.SITE, CONV, batch)
    finally:
        store.close()
    return total


def run(ctx: Ctx) -> list[Row]:
    why = mcpserver.available()
    if why:
        raise RuntimeError(f"rss workload unavailable: {why}")
    items = ctx.sizes.rss_items
    ctx.progress.step(f"rss: replay of {items} items of 256 KiB, {ctx.sizes.rss_samples} fresh servers")
    data_dir = f"{ctx.workdir}/mcp-mem-data"
    payload = _build(data_dir, items)
    ratios, peaks, bases, responses, resets = [], [], [], [], []
    for s in range(ctx.sizes.rss_samples):
        ctx.progress.note(f"sample {s + 1}/{ctx.sizes.rss_samples}")
        server = mcpserver.Server(data_dir)
        try:
            c = RawClient(server.url)
            c.post("ping")
            base = server.status("VmRSS")
            resets.append(server.reset_peak())
            body = c.tool("replay_memory", {"conversation_id": CONV, "offset": 0, "limit": items})
            peak = server.status("VmHWM")
            c.close()
        finally:
            server.stop()
        assert len(json.loads(body)["result"]["structuredContent"]["items"]) == items
        ratios.append((peak - base) / payload)
        peaks.append(peak)
        bases.append(base)
        responses.append(len(body))
    mib = 1024 * 1024
    value, lo, hi = median_ci(ratios)
    row = Row("rss", f"replay_memory of {items:,} items of 256 KiB: server peak RSS above its idle baseline",
              "MiB", higher_better=False, samples={CONVMEM: [(p - b) / mib for p, b in zip(peaks, bases, strict=True)]},
              latencies={},
              note=f"payload {payload / mib:.0f} MiB; (peak - baseline) {value:.2f}x payload [{lo:.2f}, {hi:.2f}]",
              extra={"rss_vs_payload": value, "rss_vs_payload_ci": [lo, hi], "rss_vs_payload_samples": ratios,
                     "payload_bytes": payload, "response_bytes": median(responses), "peak_rss_bytes": peaks,
                     "baseline_rss_bytes": bases, "peak_reset": resets, "items": items})
    ctx.progress.step("rss", advance=1)
    return [row]
