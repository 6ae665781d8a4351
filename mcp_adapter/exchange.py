"""``POST /mcp`` answered in the request's own task: the SDK's protocol kernel without its per-request plumbing.

In stateless JSON mode the SDK serves each POST by building a transport with
two memory-stream pairs, starting a server task in its task group, a
message-router task and a dispatcher task group, and passing the request and
its response through those streams (about nine event-loop turns and three
tasks for a ``ping``). None of that carries anything for a stateless JSON
exchange: one request in, one response out, no back-channel.

:class:`SingleExchange` keeps every protocol decision with the SDK and only
drops the plumbing:

* The request is checked exactly as the SDK's transport checks it (Host and
  Origin via its :class:`TransportSecurityMiddleware`, ``Accept``,
  ``Content-Type``, JSON parse, JSON-RPC validation: the common request's
  exact shape by msgspec, anything else by the SDK's own adapter, see
  :mod:`.envelope`).
  Anything that is not a well-formed JSON-RPC *request* on the handshake-era
  path (an error of any kind, a notification, a response, a 2026 protocol
  version, a GET or DELETE) is handed to the SDK's own handler with the body
  replayed, so every error and every 202 is the SDK's.
* A well-formed request is served by the SDK's kernel, its
  :class:`~mcp.server.runner.ServerRunner` driven as
  :func:`mcp.server.runner.serve_one` drives it (:func:`_serve_one`), over a born-ready
  ``Connection.from_envelope`` (what the SDK's stateless path builds), with
  the dispatch context its dispatcher would give: streamable HTTP, no
  back-channel, the Starlette request as ``request_context``. The result or
  the error is written as the SDK's transport writes it
  (``JSONRPCResponse``/``JSONRPCError``, ``model_dump_json(by_alias=True,
  exclude_unset=True)``, ``Content-Type: application/json``; a result of
  plain JSON types by msgspec, byte for byte the same: :mod:`.envelope`),
  handler exceptions mapped by the SDK's own ladder.

``tests/test_mcp_exchange.py`` sends the same requests through both paths and
checks the responses are byte for byte the same.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Iterable, Mapping
from contextlib import AsyncExitStack
from functools import cached_property
from types import SimpleNamespace
from typing import Any

import anyio
from mcp.server.connection import Connection
from mcp.server.runner import ServerRunner, aclose_shielded
from mcp.server.streamable_http import CONTENT_TYPE_JSON, check_accept_headers
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import RequestBodyLimitMiddleware, TransportSecurityMiddleware
from mcp.shared.dispatcher import CallOptions
from mcp.shared.exceptions import NoBackChannelError
from mcp.shared.jsonrpc_dispatcher import handler_exception_to_error_data
from mcp.shared.message import ServerMessageMetadata
from mcp.shared.transport_context import TransportContext
from mcp_types import (
    DEFAULT_NEGOTIATED_VERSION,
    ClientCapabilities,
    ErrorData,
    Implementation,
    JSONRPCError,
    RequestId,
)
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS
from pydantic import BaseModel, ValidationError
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from . import envelope

# The dispatcher logs unmapped handler exceptions under its own name; so do we.
_dispatch_logger = logging.getLogger("mcp.shared.jsonrpc_dispatcher")

_PROTOCOL_HEADER = b"mcp-protocol-version"
_TRANSPORT = TransportContext(kind="streamable-http", can_send_request=False)
_JSON_HEADERS = [(b"content-type", CONTENT_TYPE_JSON.encode())]
#: The headers the transport's checks read (Host/Origin, Content-Type, Accept): their values decide the checks.
_CHECKED_HEADERS = (b"host", b"origin", b"content-type", b"accept")
#: Each of :data:`_CHECKED_HEADERS` by its place in that tuple.
_CHECKED_SLOTS = {name: slot for slot, name in enumerate(_CHECKED_HEADERS)}
#: Most header combinations remembered as passing (clients send a handful; anything past this is checked each time).
_PASSED_MAX = 64


class _DispatchContext:
    """The dispatch context of one stateless JSON exchange: no back-channel, notifications dropped.

    What the SDK's dispatcher hands a handler on this path: its notifications
    and progress reports are routed to the request's stream and dropped there
    (a JSON body carries only the response), and a server-initiated request
    raises :class:`NoBackChannelError`.
    """

    __slots__ = ("_cancel_requested", "message_metadata", "request_id")

    transport = _TRANSPORT
    can_send_request = False

    def __init__(self, request_id: RequestId, metadata: ServerMessageMetadata) -> None:
        self.request_id = request_id
        self.message_metadata = metadata
        self._cancel_requested: anyio.Event | None = None

    @property
    def cancel_requested(self) -> anyio.Event:
        """Set if the peer cancels the request (never, on this path): made when first asked for."""
        if self._cancel_requested is None:
            self._cancel_requested = anyio.Event()
        return self._cancel_requested

    async def notify(self, method: str, params: Mapping[str, Any] | None, opts: CallOptions | None = None) -> None:
        _dispatch_logger.debug("dropped %s: a JSON response carries only the result", method)

    async def send_raw_request(
        self, method: str, params: Mapping[str, Any] | None, opts: CallOptions | None = None
    ) -> dict[str, Any]:
        raise NoBackChannelError(method)

    async def progress(self, progress: float, total: float | None = None, message: str | None = None) -> None:
        return None


def _body_of(message: Message) -> bytes | None:
    """The whole body when ``message`` holds all of it (as :class:`RequestAdmission` replays it), else None."""
    if message["type"] != "http.request" or message.get("more_body", False):
        return None
    body = message.get("body", b"")
    return bytes(body)


class SingleExchange:
    """The session manager's request handler, with well-formed stateless JSON requests served in place."""

    def __init__(self, manager: StreamableHTTPSessionManager) -> None:
        if not (manager.stateless and manager.json_response):
            raise ValueError("the single-exchange path serves stateless JSON-response mode only")
        self.manager = manager
        # The SDK's handler, for everything this path does not answer itself.
        self.fallback: ASGIApp = manager._handle_request
        self.security = TransportSecurityMiddleware(manager.security_settings)
        #: Combinations of :data:`_CHECKED_HEADERS` values that passed the header checks.
        self._passed: set[tuple[bytes | None, ...]] = set()
        #: The set ``initialized`` event every born-ready connection shares (made in the loop, on first use).
        self._ready_event: anyio.Event | None = None

    def _ready(self) -> anyio.Event:
        """The set event :func:`_born_ready` gives each connection as its ``initialized``."""
        if self._ready_event is None:
            self._ready_event = anyio.Event()
            self._ready_event.set()
        return self._ready_event

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["method"] != "POST" or not self.running():
            await self.fallback(scope, receive, send)
            return
        version, passed = checked_headers(scope["headers"])
        if version is not None and version not in HANDSHAKE_PROTOCOL_VERSIONS:
            await self.fallback(scope, receive, send)  # the 2026 protocol's own entry
            return
        first = await receive()
        body = _body_of(first)
        reply = None if body is None else await self.answer(scope, receive, body, version, passed)
        if reply is None:
            await self.fallback(scope, _replaying(first, receive), send)
            return
        await send({"type": "http.response.start", "status": 200, "headers": reply_headers(reply)})
        await send({"type": "http.response.body", "body": reply})

    def running(self) -> bool:
        """True while the session manager runs (otherwise its own handler says why it cannot serve)."""
        return self.manager._task_group is not None

    async def answer(
        self, scope: Scope, receive: Receive, body: bytes, version: str | None, passed: tuple[bytes | None, ...]
    ) -> bytes | None:
        """The body of the 200 ``application/json`` reply to ``body``, served in place; None: the SDK's to answer.

        ``version`` and ``passed`` are what :func:`checked_headers` gives for
        the request; ``version`` is None or a handshake-era version. Nothing
        has been sent when None is returned: the caller hands the request to
        :attr:`fallback` with the body replayed.
        """
        request = Request(scope, receive)
        if passed not in self._passed and not await self._headers_pass(request, passed):
            return None
        message = envelope.parse(body)  # None: not a JSON-RPC request, the SDK's to answer
        if message is None:
            return None
        return await self._reply(request, message, version)

    async def _headers_pass(self, request: Request, headers: tuple[bytes | None, ...]) -> bool:
        """True if the request passes the transport's header checks (Host/Origin, Accept, Content-Type).

        ``headers`` are the request's :data:`_CHECKED_HEADERS`, the only input of
        the checks: a combination that passed once is remembered and not
        checked again (:meth:`answer` looks it up; at most :data:`_PASSED_MAX`
        combinations are remembered; a failing one is checked every time, so
        it logs as the SDK does).
        """
        if await self.security.validate_request(request, is_post=True) is not None:
            return False
        has_json, _ = check_accept_headers(request)
        if not has_json or not _json_content_type(request):
            return False
        if len(self._passed) < _PASSED_MAX:
            self._passed.add(headers)
        return True

    async def _reply(self, request: Request, message: envelope.Request, version: str | None) -> bytes:
        """Run the SDK's kernel for ``message``: its response's body, as the SDK's transport writes it."""
        metadata = ServerMessageMetadata(request_context=request, can_send_request=False)
        dctx = _DispatchContext(message.id, metadata)
        connection = _born_ready(version or DEFAULT_NEGOTIATED_VERSION, self._ready())
        try:
            result = await _serve_one(self.manager.app, dctx, message, connection, self.manager._lifespan_state)
        except Exception as exc:
            error = handler_exception_to_error_data(exc)
            if error is None:
                _dispatch_logger.exception("handler for %r raised", message.method)
                error = ErrorData(code=0, message=str(exc))  # the dispatcher's catch-all, pinned for v1 compat
            reply = JSONRPCError(jsonrpc="2.0", id=message.id, error=error)
            return reply.model_dump_json(by_alias=True, exclude_unset=True).encode()
        return envelope.encode_response(message.id, result)


def reply_headers(body: bytes) -> list[tuple[bytes, bytes]]:
    """The headers of a reply :meth:`SingleExchange.answer` gave: JSON and its length, as the SDK's transport sends."""
    return [*_JSON_HEADERS, (b"content-length", str(len(body)).encode())]


def checked_headers(headers: Iterable[tuple[bytes, bytes]]) -> tuple[str | None, tuple[bytes | None, ...]]:
    """The request's ``MCP-Protocol-Version`` (the first) and its :data:`_CHECKED_HEADERS` values (the first of each).

    The values are what the transport's checks read (Starlette's ``Headers.get`` gives the first of a name).
    """
    version: str | None = None
    found: list[bytes | None] = [None] * len(_CHECKED_HEADERS)
    for key, value in headers:
        if key == _PROTOCOL_HEADER:
            if version is None:
                version = value.decode("latin-1")
            continue
        slot = _CHECKED_SLOTS.get(key)
        if slot is not None and found[slot] is None:
            found[slot] = value
    return version, tuple(found)


def _validates_none(model: type[BaseModel]) -> bool:
    try:
        model.model_validate(None, by_name=False)
    except ValidationError:
        return False
    return True


#: ``Connection.from_envelope``'s default outbound: the connection cannot reach its peer.
_NO_CHANNEL = inspect.signature(Connection.from_envelope).parameters["outbound"].default
#: ``from_envelope`` turns the envelope's client info and capabilities into models; ``None`` never becomes one.
_NONE_IS_NOT_SUPPLIED = not any(_validates_none(m) for m in (Implementation, ClientCapabilities))


#: What ``Connection.__init__`` sets, and which of it is made fresh per connection (the rest is constants).
_CONNECTION_FIELDS = frozenset(
    {"outbound", "protocol_version", "session_id", "client_capabilities", "_client_params", "initialized", "state",
     "exit_stack"}
)
#: A born-ready connection's attributes that do not depend on the request (no session, no client info).
_CONSTANT_FIELDS = {"outbound": _NO_CHANNEL, "session_id": None, "client_capabilities": None, "_client_params": None}
#: The SDK's ``__init__`` sets exactly :data:`_CONNECTION_FIELDS` and nothing else (checked on a connection built now).
_FIELDS_KNOWN = set(vars(Connection(_NO_CHANNEL, protocol_version="", client_params=None))) == _CONNECTION_FIELDS


def _born_ready(version: str, ready: anyio.Event | None = None) -> Connection:
    """``Connection.from_envelope(version, None, None)``, without the work in it that cannot vary.

    A handshake-era request carries no client info or capabilities in an
    envelope. ``from_envelope`` validates each ``None`` into its model, which
    fails (checked at import, :data:`_NONE_IS_NOT_SUPPLIED`; each failure
    builds a ``ValidationError``), then builds a connection with neither and
    sets its ``initialized`` event. Here the connection gets the same
    attributes without ``__init__``: the constants, the version, a fresh
    ``state`` and a :class:`_WatchedExitStack`, and ``ready`` (an event
    already set, shared by every connection of a :class:`SingleExchange`: an
    anyio event cannot be cleared, so a set one never changes; making and
    setting one was about 3 us a request). Invariant: done only while the
    SDK's ``__init__`` sets exactly :data:`_CONNECTION_FIELDS`
    (:data:`_FIELDS_KNOWN`); else, or with no ``ready``, the SDK's
    constructor builds it.
    """
    if not _NONE_IS_NOT_SUPPLIED:  # pragma: no cover - a future SDK giving None a meaning
        connection = Connection.from_envelope(version, None, None)
    elif ready is None or not _FIELDS_KNOWN:
        connection = Connection(_NO_CHANNEL, protocol_version=version, client_params=None)
        connection.client_capabilities = None
        connection.initialized.set()
    else:
        connection = Connection.__new__(Connection)
        fields = vars(connection)
        fields.update(_CONSTANT_FIELDS)
        fields["protocol_version"], fields["initialized"], fields["state"] = version, ready, {}
    connection.exit_stack = _WatchedExitStack()
    return connection


class _WatchedExitStack(AsyncExitStack):
    """A connection's exit stack that knows whether anything was pushed on it.

    Every way to push (``push``, ``callback``, ``enter_context`` and their
    async forms) goes through contextlib's one ``_push_exit_callback``.
    """

    used = False

    def _push_exit_callback(self, callback: Any, is_sync: bool = True) -> None:
        self.used = True
        super()._push_exit_callback(callback, is_sync)  # type: ignore[misc]


def _on_request_is_the_method() -> bool:
    """True if the SDK's ``ServerRunner.on_request`` is a cached property giving the runner's ``_on_request``."""
    prop = ServerRunner.__dict__.get("on_request")
    if not isinstance(prop, cached_property):
        return False
    probe = SimpleNamespace(_on_request=object())
    return bool(prop.func(probe) is probe._on_request)


#: ``runner.on_request`` is ``runner._on_request``, cached on the runner (checked at import).
_ON_REQUEST_IS_THE_METHOD = _on_request_is_the_method()


async def _serve_one(
    server: Any, dctx: _DispatchContext, message: envelope.Request, connection: Connection, lifespan_state: Any
) -> dict[str, Any]:
    """:func:`mcp.server.runner.serve_one`, step for step, without its per-request costs that carry nothing.

    The SDK's driver builds a :class:`ServerRunner`, runs its ``on_request``
    and unwinds the connection's exit stack under a shielded, bounded cancel
    scope. Here the unwinding is skipped when nothing was pushed on the stack
    (unwinding an empty stack does nothing; ``_WatchedExitStack`` sees every
    push), and the runner's ``_on_request`` is called directly: ``on_request``
    is a cached property that gives exactly that bound method
    (:data:`_ON_REQUEST_IS_THE_METHOD`, checked at import) and stores it on the
    runner, a reference cycle the cycle collector would have to free. Should
    a later SDK make it anything else, its ``on_request`` is used and the
    cached value dropped afterwards, so the request's objects are still freed
    at once.
    """
    runner = ServerRunner(server, connection, lifespan_state)
    try:
        if _ON_REQUEST_IS_THE_METHOD:
            return await runner._on_request(dctx, message.method, message.params)
        return await runner.on_request(dctx, message.method, message.params)
    finally:
        if not _ON_REQUEST_IS_THE_METHOD:
            runner.__dict__.pop("on_request", None)
        if not isinstance(connection.exit_stack, _WatchedExitStack) or connection.exit_stack.used:
            await aclose_shielded(connection)


def _json_content_type(request: Request) -> bool:
    """The transport's own Content-Type rule: ``application/json`` among the first parameter's parts."""
    content_type = request.headers.get("content-type", "")
    return any(part.strip() == CONTENT_TYPE_JSON for part in content_type.split(";")[0].split(","))


def _replaying(first: Message, receive: Receive) -> Receive:
    """``receive`` with ``first`` given back once more before anything else."""
    pending: list[Message] = [first]

    async def replay() -> Message:
        if pending:
            return pending.pop()
        return await receive()

    return replay


def install(manager: StreamableHTTPSessionManager) -> None:
    """Serve ``manager``'s stateless JSON POSTs through :class:`SingleExchange` (inside its body-size limit)."""
    manager.asgi_app = RequestBodyLimitMiddleware(SingleExchange(manager), manager.max_request_body_size)


def without_body_limit(manager: StreamableHTTPSessionManager) -> ASGIApp:
    """``manager``'s request handler past the SDK's body-size limit, for a request whose body is already capped.

    Only for a request :class:`~convmem.mcp_adapter.http.RequestAdmission`
    has read: its caps are never above the manager's limit (checked where the
    app is built), so the limit (which reads the body again and copies it)
    could never refuse it.
    """
    app = manager.asgi_app
    return app.app if isinstance(app, RequestBodyLimitMiddleware) else app
