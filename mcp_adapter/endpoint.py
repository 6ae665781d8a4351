"""``POST /mcp`` in one ASGI callable: the request log, admission, splice and exchange steps inline.

The app's layers (:class:`~.requestlog.RequestLog`, :class:`~.http.NoEventStream`,
:class:`~.http.RequestAdmission`, :class:`~.wire.ResultSplice` under
Starlette's :class:`~starlette.middleware.errors.ServerErrorMiddleware`) each
wrap ``receive`` and ``send`` and copy the response's messages on their way
out; for a small ``ping`` that plumbing cost as much CPU as the request line.
:class:`McpEndpoint` stands in front of that stack (as the Starlette app's
middleware stack, so ``scope["app"]`` is still set) and serves the common
request itself, taking the same steps in the same order:

1. the request id and the request's :class:`~.requestlog.RequestInfo` made
   current (:func:`.requestlog.begin`);
2. the body read as admission reads a small body: under the unauthenticated
   cap and the body deadline (:func:`.http.read_body`), no large-body slot;
3. a :class:`~.wire.Splice` and the router's scope keys put in the scope, as
   the splice layer's direct route does;
4. the exchange (:meth:`.exchange.SingleExchange.answer`), its reply written
   with the request id header, a pending read result spliced in
   (:func:`.wire.send_spliced`);
5. the request line (:func:`.requestlog.end`) after the response; an
   exception escaping the request answered 500 as Starlette's error layer
   answers it, after the line, and raised on to uvicorn.

The common request is a ``POST`` to exactly ``/mcp`` (no root path, not
routed yet) with a ``Content-Length`` of at most the unauthenticated cap and
at most one ``Authorization`` header, a handshake-era or absent
``MCP-Protocol-Version``, while the session manager runs. Everything else
(other paths and methods, large or chunked bodies, two credentials, the
2026 protocol) goes to the layered stack untouched, before a byte is read.
Inside the fast path, whatever the exchange does not serve in place (errors,
notifications, batches) and every refusal (413, 408) are answered through the
same ``send`` wrappers the layers use (:func:`.requestlog.tagging`,
:func:`.wire.splicing`), so their bytes, the request id in an error's text
included, are the layers' own (``tests/test_mcp_endpoint.py`` compares the
two paths byte for byte, log lines included).
"""

from __future__ import annotations

from typing import Any

from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS
from starlette.middleware.errors import ServerErrorMiddleware
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from . import exchange, requestlog, wire
from .exchange import SingleExchange
from .http import read_body, refuse_body, replaying
from .wire import DirectRoute, Splice


class McpEndpoint:
    """The app's entry: the common ``POST /mcp`` served in one coroutine, everything else by ``layers``.

    Invariant: a request is taken by the fast path only when the layers would
    take the same steps for it (see the module docstring); the decision reads
    the scope only, so a request sent on to ``layers`` is untouched.
    """

    def __init__(
        self, layers: ServerErrorMiddleware, direct: DirectRoute, *, small_body: int, body_timeout: float
    ) -> None:
        if layers.debug or layers.handler is not None:
            raise ValueError("the fast path answers an exception as Starlette's default 500 only")
        self.layers = layers
        self.direct = direct
        self.small_body = small_body
        self.body_timeout = body_timeout

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        taken = self._takes(scope)
        if taken is None:
            await self.layers(scope, receive, send)
            return
        handler, version, passed = taken
        response = _Response(send)
        info, token = requestlog.begin(scope)
        try:
            try:
                await self._serve(scope, receive, response, handler, info, version, passed)
            finally:
                requestlog.end(info, token, scope)
        except Exception as exc:
            if not response.started:  # as Starlette's error layer: a 500 if nothing was sent, and raise on
                await self.layers.error_response(Request(scope), exc)(scope, receive, send)
            raise

    def _takes(self, scope: Scope) -> tuple[ASGIApp, str | None, tuple[bytes | None, ...]] | None:
        """The exchange handler when the fast path serves this request (see the module docstring), else None.

        With the handler: what :func:`.exchange.checked_headers` gives for the
        request's headers, read in the same pass over them.
        """
        if (
            scope["type"] != "http"
            or scope["method"] != "POST"
            or scope["path"] != self.direct.path
            or scope.get("root_path")
            or "router" in scope
        ):
            return None
        declared: int | None = None
        seen_length = False
        credentials = 0
        version: str | None = None
        found: list[bytes | None] = [None] * len(exchange._CHECKED_HEADERS)
        checked = exchange._CHECKED_SLOTS
        for key, value in scope["headers"]:
            if key == b"content-length":
                if not seen_length:
                    seen_length = True
                    try:
                        declared = int(value)
                    except ValueError:
                        return None
            elif key == b"authorization":
                credentials += 1
            elif key == exchange._PROTOCOL_HEADER:
                if version is None:
                    version = value.decode("latin-1")
            else:
                slot = checked.get(key)
                if slot is not None and found[slot] is None:
                    found[slot] = value
        if declared is None or declared > self.small_body or credentials > 1:
            return None
        handler = self.direct.handler()
        if isinstance(handler, SingleExchange) and not handler.running():
            return None
        return handler, version, tuple(found)

    async def _serve(
        self,
        scope: Scope,
        receive: Receive,
        response: _Response,
        handler: ASGIApp,
        info: requestlog.RequestInfo,
        version: str | None,
        passed: tuple[bytes | None, ...],
    ) -> None:
        counted = requestlog.counting(info, receive)
        body = await read_body(counted, self.small_body, self.body_timeout)
        if not isinstance(body, bytes):
            await refuse_body(scope, counted, requestlog.tagging(info, response.send), body, self.small_body)
            return
        splice = Splice()
        direct = self.direct
        scope[wire.SCOPE_KEY] = splice
        scope["router"], scope["route"] = direct.router, direct.route
        scope["endpoint"], scope["path_params"] = direct.route.endpoint, {}
        reply = None
        if isinstance(handler, SingleExchange):
            if version is None or version in HANDSHAKE_PROTOCOL_VERSIONS:
                reply = await handler.answer(scope, counted, body, version, passed)
        if reply is None:  # the exchange's own fallback, or a handler that is not the exchange
            if isinstance(handler, SingleExchange):
                handler = handler.fallback
            tagged = requestlog.tagging(info, response.send)
            await handler(scope, replaying(body, counted), wire.splicing(splice, tagged))
            return
        headers = exchange.reply_headers(reply)
        tag = (b"x-request-id", info.request_id.encode())
        info.status = 200
        response.started = True
        if splice.pending:  # the request id after the new length, as the log layer adds it outside the splice's
            start: Message = {"type": "http.response.start", "status": 200, "headers": headers}
            info.response_bytes = await wire.send_spliced(splice, start, reply, response.raw, (tag,))
            return
        splice.open = False
        headers.append(tag)
        start = {"type": "http.response.start", "status": 200, "headers": headers}
        send = response.raw
        await send(start)
        info.response_bytes = len(reply)
        await send({"type": "http.response.body", "body": reply})


class _Response:
    """The server's ``send`` (``raw``), and whether a response has begun on it (what the error layer records)."""

    __slots__ = ("raw", "started")

    def __init__(self, raw: Send) -> None:
        self.raw = raw
        self.started = False

    async def send(self, message: Message) -> None:
        """``raw``, noting the response's start (the wrapped path's ``send``)."""
        if message["type"] == "http.response.start":
            self.started = True
        await self.raw(message)


def install(app: Any, direct: DirectRoute, *, small_body: int, body_timeout: float) -> None:
    """Put :class:`McpEndpoint` in front of the Starlette ``app``'s middleware stack (built now: no more layers)."""
    app.middleware_stack = McpEndpoint(
        app.build_middleware_stack(), direct, small_body=small_body, body_timeout=body_timeout
    )
