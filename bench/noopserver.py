"""The bench's no-op servers: ``bench_noop`` inside ``convmem serve``, and the bare ASGI app (the floor).

``python -m bench.noopserver --bare``: the floor of the ``mcp`` workload. A
bare Starlette app under the same uvicorn as ``convmem serve`` (the same
event loop, HTTP parser, connection guard and limits, on 127.0.0.1 and a free
port) answers ``POST /mcp`` with a fixed JSON-RPC result after reading the
body: what any Python HTTP service pays per call, with no MCP, no
authentication, no logging. It prints the same banner lines the bench reads
from ``convmem serve``.

``python -m bench.noopserver PAYLOAD_FILE serve ARGS...``: ``convmem serve``
with one extra tool for the bench, ``bench_noop``, a no-op of a chosen size. The product's
server is started unchanged (same CLI, authentication, validation limits and
result shaping); only this process's ``tools/call`` dispatcher learns one more
name, which the product's tool list never shows. ``bench_noop`` authenticates
the call like any tool, then returns the structured result stored in
``PAYLOAD_FILE`` (read once, on the first call) without touching the store:
the baseline that a ``recall_memory`` returning the same bytes is compared with.
It shapes its result the way ``recall_memory`` does (``mcp_adapter.wire``:
the stored JSON, escaped for the text block each call, spliced into the HTTP
response). The two differ by the store's read and its encoding, and by what
``call_tool`` does for every product tool and this one skips: the call's
bookkeeping (``requestlog.ToolCall``: its metrics and request-line fields) and
the arguments' validation.
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


#: The bare app's answer: what ``ping`` answers.
BARE_BODY = b'{"jsonrpc":"2.0","id":1,"result":{}}'


def bare_main() -> None:
    """Serve the bare app until SIGTERM (see the module docstring)."""
    import signal

    import uvicorn
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    from convmem.cli import build_parser
    from convmem.mcp_adapter import serve, tls

    async def mcp(request: Request) -> Response:
        await request.body()
        return Response(BARE_BODY, media_type="application/json")

    args = build_parser()[0].parse_args(["serve"])  # convmem serve's defaults: the same limits
    app = Starlette(routes=[Route("/mcp", mcp, methods=["POST"])])
    sock = serve._bind("127.0.0.1", 0)
    config = uvicorn.Config(app, log_level="warning", lifespan="off", access_log=False, server_header=False,
                            **serve.connection_limits(args), **tls.uvicorn_options(args))  # forwarded headers too
    server = uvicorn.Server(config)
    port = sock.getsockname()[1]
    print(f"bare app listening on 127.0.0.1:{port}\n  MCP endpoint: http://127.0.0.1:{port}/mcp\n\n"
          "Press Ctrl+C to stop.", flush=True)

    async def run() -> None:
        await server.serve(sockets=[sock])

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: None)
    serve.run_event_loop(run())
    sock.close()


def main() -> None:
    if sys.argv[1] == "--bare":
        bare_main()
        return
    _install(sys.argv[1])
    from convmem.cli import main as cli_main

    sys.exit(cli_main(sys.argv[2:]))


if __name__ == "__main__":
    main()
