"""The HTTP application: MCP at ``/mcp`` (streamable HTTP) and ``GET /healthz``.

``/mcp`` runs stateless with JSON responses: every POST is served on its own,
nothing is remembered between requests, so clients of every protocol version
the SDK speaks work, and the site is always taken from the request's own
``Authorization`` header. Request bodies larger than the biggest valid append
could need are refused with 413 before they are parsed. For loopback binds
the SDK's DNS-rebinding protection (Host and Origin checks) is on.

``GET /mcp`` is answered 405: a stateless server has nothing to push, and an
event stream held open for nothing would let any client tie up memory.

``/healthz`` needs no credentials: 200 ``{"status": "ok"}`` while the data
directory is usable (with PostgreSQL: while the database answers), 503
``{"status": "unavailable"}`` otherwise.
"""

from __future__ import annotations

import os
from typing import Any

import anyio.to_thread
from mcp.server import Server
from mcp.server.transport_security import TransportSecuritySettings
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from logstore import MAX_BATCH_BYTES

from .server import Backend

MCP_PATH = "/mcp"
HEALTH_PATH = "/healthz"

#: Largest request body accepted. A maximal batch is 1 MiB of compact JSON; a
#: client that escapes every non-ASCII character (``\\u00e9`` for 2 bytes of
#: UTF-8) can triple that, and the JSON-RPC envelope adds a little.
MAX_BODY_BYTES = 3 * MAX_BATCH_BYTES + 256 * 1024

_LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


def data_dir_usable(data_dir: str) -> bool:
    """True when ``data_dir`` is a directory this process can read, write and enter."""
    return os.path.isdir(data_dir) and os.access(data_dir, os.R_OK | os.W_OK | os.X_OK)


def transport_security(host: str) -> TransportSecuritySettings | None:
    """DNS-rebinding protection for loopback binds; None (no Host check) otherwise."""
    if host not in _LOOPBACK_HOSTS:
        return None
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        allowed_hosts=["127.0.0.1:*", "localhost:*", "[::1]:*", "127.0.0.1", "localhost", "[::1]"],
        allowed_origins=["http://127.0.0.1:*", "http://localhost:*", "http://[::1]:*"],
    )


class NoEventStream:
    """Answer ``GET /mcp`` with 405 instead of opening an SSE stream that could never carry anything.

    The MCP transport lets a server without a server-to-client stream do so;
    clients then simply make POST requests.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "GET" and scope["path"].rstrip("/") == MCP_PATH:
            response = PlainTextResponse(
                "This server is stateless and offers no event stream: send requests with POST.",
                status_code=405,
                headers={"Allow": "POST"},
            )
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)


def build_app(server: Server[Any], backend: Backend, *, host: str) -> Starlette:
    """The ASGI app serving ``server`` over ``backend``."""

    async def healthz(request: Request) -> JSONResponse:
        if backend.health is not None:
            ok = await anyio.to_thread.run_sync(backend.health)
        else:
            ok = await anyio.to_thread.run_sync(data_dir_usable, backend.data_dir)
        if ok:
            return JSONResponse({"status": "ok"})
        return JSONResponse({"status": "unavailable"}, status_code=503)

    app = server.streamable_http_app(
        streamable_http_path=MCP_PATH,
        json_response=True,
        stateless_http=True,
        max_request_body_size=MAX_BODY_BYTES,
        transport_security=transport_security(host),
        host=host,
        custom_starlette_routes=[Route(HEALTH_PATH, healthz, methods=["GET"])],
    )
    app.add_middleware(NoEventStream)
    return app
