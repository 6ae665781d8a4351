"""``convmem serve`` with one extra tool for the bench: ``bench_noop``, a no-op of a chosen size.

Usage: ``python -m bench.noopserver PAYLOAD_FILE serve ARGS...``. The product's
server is started unchanged (same CLI, authentication, validation limits and
result shaping); only this process's ``tools/call`` dispatcher learns one more
name, which the product's tool list never shows. ``bench_noop`` authenticates
the call like any tool, then returns the structured result stored in
``PAYLOAD_FILE`` (read once, on the first call) without touching the store:
the baseline that a ``recall_memory`` returning the same bytes is compared with.
It shapes its result the way ``recall_memory`` does (``mcp_adapter.wire``:
the stored JSON, escaped for the text block each call, spliced into the HTTP
response), so the two differ only by the store's read and its encoding.
"""

from __future__ import annotations

import sys
from typing import Any

import msgspec

NOOP = "bench_noop"


def _install(payload_file: str) -> None:
    from convmem.mcp_adapter import server, wire

    original = server.call_tool
    cache: dict[str, Any] = {}

    async def call_tool(backend: Any, ctx: Any, name: str, arguments: Any) -> Any:
        if name != NOOP:
            return await original(backend, ctx, name, arguments)
        await server._resolve_site(backend, ctx)
        if "payload" not in cache:
            with open(payload_file, "rb") as f:
                cache["payload"] = msgspec.json.encode(msgspec.json.decode(f.read()))  # compact, as served
        return server._finish(wire.Prepared.from_json(cache["payload"]), wire.splice_of(ctx.request))

    server.call_tool = call_tool


def main() -> None:
    _install(sys.argv[1])
    from convmem.mcp_adapter.cli import main as cli_main

    sys.exit(cli_main(sys.argv[2:]))


if __name__ == "__main__":
    main()
