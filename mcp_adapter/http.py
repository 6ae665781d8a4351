"""The HTTP application: MCP at ``/mcp`` (streamable HTTP) and ``GET /healthz``.

``/mcp`` runs stateless with JSON responses: every POST is served on its own,
nothing is remembered between requests, so clients of every protocol version
the SDK speaks work, and the site is always taken from the request's own
``Authorization`` header. The SDK's DNS-rebinding protection (Host and Origin
checks) is on for every bind: loopback names on loopback, the configured
allowed hosts elsewhere.

Before the SDK sees a ``POST /mcp``, :class:`RequestAdmission` decides how
much body it may send: a request whose credentials check out may send as much
as the biggest valid append could need (:data:`MAX_BODY_BYTES`); any other
request only :data:`UNAUTHENTICATED_BODY_BYTES`. Credentials are checked
before the body is read; a too large body is answered 413 without reading it,
a body that arrives too slowly 408, more than one ``Authorization`` header
400. At most :data:`LARGE_BODY_SLOTS` large bodies are read and parsed at a
time, which bounds both the memory they take and how long their parsing can
hold the event loop. Those slots go only to requests whose credentials have
checked out: a body without ``Content-Length`` (chunked) from anyone else is
read without a slot, under the unauthenticated cap and the body deadline, so
slow unauthenticated uploads cannot keep a legitimate large append waiting.

``GET /mcp`` is answered 405: a stateless server has nothing to push, and an
event stream held open for nothing would let any client tie up memory.

``GET /metrics`` serves Prometheus metrics (see :mod:`.metrics` for who may
read them); every request gets a request id and a log line (:mod:`.requestlog`).

``/healthz`` needs no credentials: 200 ``{"status": "ok"}`` while the data
directory is usable (with PostgreSQL: while the database answers), 503
``{"status": "unavailable"}`` otherwise.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Sequence
from typing import Any

import anyio
import anyio.to_thread
from mcp.server import Server
from mcp.server.transport_security import TransportSecuritySettings
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from convmem.logstore import MAX_BATCH_BYTES

from . import exchange, metrics
from .auth import Authenticator
from .deadline import Begun, Deadline, at_once
from .errors import ToolFailure, unauthenticated
from .limits import BODY_TIMEOUT
from .requestlog import RequestLog
from .server import Backend
from .wire import DirectRoute, ResultSplice

MCP_PATH = "/mcp"
HEALTH_PATH = "/healthz"

#: Largest request body accepted. A maximal batch is 1 MiB of compact JSON; a
#: client that escapes every non-ASCII character (``\\u00e9`` for 2 bytes of
#: UTF-8) can triple that, and the JSON-RPC envelope adds a little.
MAX_BODY_BYTES = 3 * MAX_BATCH_BYTES + 256 * 1024

#: Largest body a request without valid credentials may send (initialize, tools/list, small calls).
UNAUTHENTICATED_BODY_BYTES = 64 * 1024
#: Most request bodies larger than UNAUTHENTICATED_BODY_BYTES read and parsed at the same time.
LARGE_BODY_SLOTS = 4

_LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


def data_dir_usable(data_dir: str) -> bool:
    """True when ``data_dir`` is a directory this process can read, write and enter."""
    return os.path.isdir(data_dir) and os.access(data_dir, os.R_OK | os.W_OK | os.X_OK)


def is_loopback(host: str) -> bool:
    """True when ``host`` (a bind address or name) only reaches this machine."""
    if host in _LOOPBACK_HOSTS:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def transport_security(host: str, allowed_hosts: Sequence[str] = ()) -> TransportSecuritySettings:
    """Host/Origin checks (DNS-rebinding protection) for the SDK transport.

    On loopback the loopback names are allowed, plus ``allowed_hosts``; off
    loopback only ``allowed_hosts`` (``name`` or ``name:port``; a bare name
    allows any port), which the caller must have made non-empty. Origins are
    the same hosts over http and https; requests without an Origin header
    (non-browser clients) are not affected by the Origin check.
    """
    names = list(allowed_hosts)
    if is_loopback(host):
        names += ["127.0.0.1", "localhost", "[::1]"]
    hosts: list[str] = []
    origins: list[str] = []
    for name in dict.fromkeys(names):
        patterns = [name] if _has_port(name) else [name, f"{name}:*"]
        hosts += patterns
        origins += [f"{scheme}://{p}" for p in patterns for scheme in ("http", "https")]
    return TransportSecuritySettings(enable_dns_rebinding_protection=True, allowed_hosts=hosts, allowed_origins=origins)


def _has_port(name: str) -> bool:
    if name.startswith("["):
        return "]:" in name
    return name.count(":") == 1


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


class RequestAdmission:
    """Admit ``POST /mcp`` bodies by credentials, size and speed before the SDK reads them.

    Invariants: no body byte is read before the credentials have been checked
    (when the body may be larger than the unauthenticated cap); no more than
    the allowed number of bytes is ever buffered per request; at most
    ``large_slots`` large bodies are buffered or parsed at once.
    """

    def __init__(
        self,
        app: ASGIApp,
        authenticator: Authenticator | None,
        *,
        max_body: int = MAX_BODY_BYTES,
        unauthenticated_body: int = UNAUTHENTICATED_BODY_BYTES,
        large_slots: int = LARGE_BODY_SLOTS,
        body_timeout: float = BODY_TIMEOUT,
    ) -> None:
        self.app = app
        self.authenticator = authenticator
        self.max_body = max_body
        self.unauthenticated_body = unauthenticated_body
        self.body_timeout = body_timeout
        self._large = anyio.CapacityLimiter(large_slots)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"].rstrip("/") != MCP_PATH:
            await self.app(scope, receive, send)
            return
        auth_headers = [v for k, v in scope["headers"] if k == b"authorization"]
        if len(auth_headers) > 1:
            await _plain(scope, receive, send, 400, "More than one Authorization header; send exactly one.")
            return
        declared = _content_length(scope)
        limit = self.unauthenticated_body
        if declared is None or declared > limit:
            verdict = await self._authenticate(scope, auth_headers)
            if verdict is None:
                limit = self.max_body
            elif verdict.code == "Throttled":
                # A large body with credentials we may not check yet: say when to come back, not "too large".
                retry = str(verdict.details.get("retry_after_seconds", 1))
                response = PlainTextResponse(
                    f"{verdict.message}.", status_code=429, headers={"Retry-After": retry, "Connection": "close"}
                )
                await response(scope, receive, send)
                return
        if declared is not None and declared > limit:
            await _plain(scope, receive, send, 413, _too_large(limit))
            return
        if limit <= self.unauthenticated_body or (declared is not None and declared <= self.unauthenticated_body):
            # Small, or not (yet) authenticated: no large-body slot, the small cap and the same deadline.
            await self._forward(scope, receive, send, min(limit, self.unauthenticated_body))
            return
        async with self._large:  # only a request whose credentials checked out gets here
            await self._forward(scope, receive, send, limit)

    async def _authenticate(self, scope: Scope, auth_headers: list[bytes]) -> ToolFailure | None:
        """None when the request's credentials are valid, else why not."""
        if self.authenticator is None or not auth_headers:
            return unauthenticated()
        client = scope.get("client")
        header = auth_headers[0].decode("latin-1")
        try:
            await self.authenticator.authenticate(header, client[0] if client else None)
        except ToolFailure as failure:
            return failure
        return None

    async def _forward(self, scope: Scope, receive: Receive, send: Send, limit: int) -> None:
        """Read the body (at most ``limit`` bytes, within the deadline), then hand it to the app."""
        body = await read_body(receive, limit, self.body_timeout)
        if not isinstance(body, bytes):
            await refuse_body(scope, receive, send, body, limit)
            return
        await self.app(scope, replaying(body, receive), send)


#: What :func:`read_body` gives instead of a body: the client went away, the body is too large, too slow.
GONE, TOO_LARGE, TOO_SLOW = 0, 413, 408


async def read_body(receive: Receive, limit: int, timeout: float) -> bytes | int:
    """The whole body, read within ``timeout`` seconds; else why not: :data:`GONE`, :data:`TOO_LARGE`, :data:`TOO_SLOW`.

    Invariant: never more than ``limit`` bytes are kept (the chunk that crosses it is dropped, the body refused).
    The deadline is armed the first time ``receive`` has to wait (:func:`.deadline.at_once`): until then no
    time passes for the body (messages the server holds already are taken without a turn of the event loop),
    so a body that is there with its head, the usual case, is read without a timer.
    """
    message = at_once(receive)
    if type(message) is dict and message["type"] == "http.request" and not message.get("more_body", False):
        chunk = message.get("body", b"")
        if type(chunk) is bytes and len(chunk) <= limit:
            return chunk  # the whole body in one message (what _Chunks would keep and join)
    body = _Chunks(limit)
    while True:
        if isinstance(message, Begun):
            refused: int | None = None
            with Deadline(timeout) as deadline:  # perf: a timer, not a cancel scope (see .deadline)
                refused = body.take(await message)
                while refused is None and body.more:
                    refused = body.take(await receive())
            if deadline.cancelled_caught:
                return TOO_SLOW
            return body.joined() if refused is None else refused
        refused = body.take(message)
        if refused is not None:
            return refused
        if not body.more:
            return body.joined()
        message = at_once(receive)


class _Chunks:
    """A body's chunks as they are received, at most ``limit`` bytes of them."""

    __slots__ = ("chunks", "limit", "more", "size")

    def __init__(self, limit: int) -> None:
        self.chunks: list[bytes] = []
        self.limit = limit
        self.size = 0
        self.more = True

    def take(self, message: Message) -> int | None:
        """Keep ``message``'s chunk; :data:`GONE` or :data:`TOO_LARGE` instead when the body cannot be had."""
        if message["type"] != "http.request":
            return GONE
        chunk = message.get("body", b"")
        self.size += len(chunk)
        if self.size > self.limit:
            return TOO_LARGE
        self.chunks.append(chunk)
        self.more = message.get("more_body", False)
        return None

    def joined(self) -> bytes:
        return b"".join(self.chunks)


def replaying(body: bytes, receive: Receive) -> Receive:
    """``receive`` giving the whole ``body`` first (what was read), then what ``receive`` gives."""
    replayed = False

    async def replay() -> Message:
        nonlocal replayed
        if not replayed:
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


async def refuse_body(scope: Scope, receive: Receive, send: Send, why: int, limit: int) -> None:
    """Answer what :func:`read_body` gave instead of a body (nothing when the client went away)."""
    if why == TOO_LARGE:
        await _plain(scope, receive, send, 413, _too_large(limit))
    elif why == TOO_SLOW:
        await _plain(scope, receive, send, 408, "The request body did not arrive in time.")


def _content_length(scope: Scope) -> int | None:
    for key, value in scope["headers"]:
        if key == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


def _too_large(limit: int) -> str:
    return f"The request body is larger than the {limit} bytes this request may send."


async def _plain(scope: Scope, receive: Receive, send: Send, status: int, text: str) -> None:
    headers = {"Connection": "close"} if status in (408, 413) else None
    await PlainTextResponse(text, status_code=status, headers=headers)(scope, receive, send)


def build_app(
    server: Server[Any],
    backend: Backend,
    *,
    host: str,
    allowed_hosts: Sequence[str] = (),
    body_timeout: float = BODY_TIMEOUT,
    metrics_token: str | None = None,
) -> Starlette:
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
        transport_security=transport_security(host, allowed_hosts),
        host=host,
        custom_starlette_routes=[
            Route(HEALTH_PATH, healthz, methods=["GET"]),
            Route(metrics.METRICS_PATH, metrics.endpoint(metrics_token), methods=["GET"]),  # ops
        ],
    )
    manager = server.session_manager
    exchange.install(manager)  # perf: well-formed POSTs served in place (see .exchange)
    if MAX_BODY_BYTES > manager.max_request_body_size:  # pragma: no cover - both are this module's constant
        raise ValueError("an admitted body could exceed the SDK's body-size limit")
    route = next(r for r in app.router.routes if isinstance(r, Route) and r.path == MCP_PATH)
    # perf: an admitted POST /mcp goes from the splice layer straight to the exchange (see .wire.ResultSplice).
    direct = DirectRoute(MCP_PATH, app.router, route, lambda: exchange.without_body_limit(manager))
    app.add_middleware(ResultSplice, direct=direct)  # innermost: writes read results into the SDK's response
    app.add_middleware(RequestAdmission, authenticator=backend.authenticator, body_timeout=body_timeout)
    app.add_middleware(NoEventStream)
    app.add_middleware(RequestLog)  # ops: request ids and the request log line; keep it the outermost
    from .endpoint import install  # here: the endpoint module reads bodies with this module's functions

    # perf: the common POST /mcp served by one callable taking the layers' steps (see .endpoint)
    install(app, direct, small_body=UNAUTHENTICATED_BODY_BYTES, body_timeout=body_timeout)
    return app
