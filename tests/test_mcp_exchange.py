"""The single-exchange path (``mcp_adapter.exchange``) answers exactly as the SDK's own stateless path.

Two copies of the real application, each over its own data directory with
the same site, take the same requests: one serves ``POST /mcp`` through
:class:`~convmem.mcp_adapter.exchange.SingleExchange`, the other through the
SDK's handler (what ``exchange.install`` replaces). Status, headers and body
must be the same byte for byte, request ids aside (random per request): for
protocol requests, tool results and tool errors (served in place), and for
every request the path hands to the SDK (malformed, notifications, batches,
wrong headers, the 2026 protocol).
"""

from __future__ import annotations

import base64
import contextlib
import json
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mcp.server.transport_security import RequestBodyLimitMiddleware
from starlette.applications import Starlette
from starlette.types import ASGIApp, Message

from convmem.logstore import open_store
from convmem.logstore.site_credentials import CredentialFile
from convmem.mcp_adapter import exchange
from convmem.mcp_adapter.auth import Authenticator
from convmem.mcp_adapter.http import build_app
from convmem.mcp_adapter.server import Backend, build_server

SITE, PASSWORD = "exchange-site", "exchange-password-0123"
AUTH = ("Basic " + base64.b64encode(f"{SITE}:{PASSWORD}".encode()).decode()).encode()
HEADERS = {
    "host": "127.0.0.1:8765",
    "content-type": "application/json",
    "accept": "application/json, text/event-stream",
    "mcp-protocol-version": "2025-06-18",
    "authorization": AUTH.decode(),
}
_RID = re.compile(rb"[0-9a-f]{16}")
_TIME = re.compile(rb"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z")


CLIENT = {"capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}


def rpc(method: str, params: Any = None, id: Any = 1) -> bytes:
    msg: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
    if id is not None:
        msg["id"] = id
    if params is not None:
        msg["params"] = params
    return json.dumps(msg).encode()


def call(tool: str, arguments: Any) -> bytes:
    return rpc("tools/call", {"name": tool, "arguments": arguments})


#: (name, body, header changes): header value None removes the header.
CASES: list[tuple[str, bytes, dict[str, str | None]]] = [
    ("ping", rpc("ping"), {}),
    ("ping, string id, empty params", rpc("ping", {}, id="abc"), {}),
    ("ping, progress token", rpc("ping", {"_meta": {"progressToken": 7}}), {}),
    ("ping without a protocol header", rpc("ping"), {"mcp-protocol-version": None}),
    ("ping, older protocol", rpc("ping"), {"mcp-protocol-version": "2025-03-26"}),
    ("ping, params not an object", rpc("ping", [1]), {}),
    (
        "initialize",
        rpc("initialize", {"protocolVersion": "2025-06-18", **CLIENT}),
        {},
    ),
    (
        "initialize, unknown version",
        rpc("initialize", {"protocolVersion": "1999-01-01", **CLIENT}),
        {},
    ),
    ("initialize, bad params", rpc("initialize", {"protocolVersion": 5}), {}),
    ("tools/list", rpc("tools/list"), {}),
    ("method not found", rpc("no/such/method"), {}),
    ("tools/call without a name", rpc("tools/call", {"arguments": {}}), {}),
    ("unknown tool", call("no_such_tool", {}), {}),
    ("append", call("append_memory", {"conversation_id": "exchange-conv-1", "items": [{"k": "é\u2028"}]}), {}),
    ("recall", call("recall_memory", {"conversation_id": "exchange-conv-1", "count": 5}), {}),
    ("replay", call("replay_memory", {"conversation_id": "exchange-conv-1", "limit": 5}), {}),
    ("list", call("list_conversations", {}), {}),
    ("invalid arguments", call("append_memory", {"conversation_id": "x", "items": []}), {}),
    ("arguments not an object", call("recall_memory", [1, 2]), {}),
    ("memory tool", call("memory_search", {"query": "anything"}), {}),
    ("no credentials", call("list_conversations", {}), {"authorization": None}),
    ("wrong password", call("list_conversations", {}), {"authorization": "Basic eDp5"}),
    ("notification", rpc("notifications/initialized", id=None), {}),
    ("response message", json.dumps({"jsonrpc": "2.0", "id": 3, "result": {}}).encode(), {}),
    ("batch", b"[" + rpc("ping") + b"]", {}),
    ("parse error", b'{"jsonrpc": "2.0", "id": 1, "method": "ping"', {}),
    ("not JSON-RPC", b'{"hello": 1}', {}),
    ("wrong Accept", rpc("ping"), {"accept": "text/html"}),
    ("Accept wildcard", rpc("ping"), {"accept": "*/*"}),
    ("wrong Content-Type", rpc("ping"), {"content-type": "text/plain"}),
    ("Content-Type with charset", rpc("ping"), {"content-type": "application/json; charset=utf-8"}),
    ("bad Host", rpc("ping"), {"host": "attacker.example"}),
    ("bad Origin", rpc("ping"), {"origin": "http://attacker.example"}),
    ("2026 protocol", rpc("ping"), {"mcp-protocol-version": "2026-07-28"}),
    ("unknown protocol header", rpc("ping"), {"mcp-protocol-version": "bogus"}),
    # The envelope's shortcuts (mcp_adapter.envelope) and the bodies they leave to the SDK's parse.
    ("compact body, padded", b' {"jsonrpc":"2.0","id":7,"method":"ping"}\n', {}),
    ("ping, explicit null params", rpc("ping")[:-1] + b', "params": null}', {}),
    ("ping, big integer id", rpc("ping", id=2**70), {}),
    ("ping, duplicate ids", b'{"jsonrpc": "2.0", "id": 1, "id": "two", "method": "ping"}', {}),
    ("ping with an extra member", b'{"jsonrpc": "2.0", "id": 1, "method": "ping", "result": {}}', {}),
    ("ping, float id", b'{"jsonrpc": "2.0", "id": 1.0, "method": "ping"}', {}),
    ("ping, boolean id", b'{"jsonrpc": "2.0", "id": true, "method": "ping"}', {}),
    ("ping, NaN in params", b'{"jsonrpc": "2.0", "id": 1, "method": "ping", "params": {"x": NaN}}', {}),
    ("ping, lone surrogate id", b'{"jsonrpc": "2.0", "id": "\\ud800", "method": "ping"}', {}),
    ("body not UTF-8", b'{"jsonrpc": "2.0", "id": 1, "method": "\xff"}', {}),
    ("byte-order mark", b"\xef\xbb\xbf" + rpc("ping"), {}),
    ("tool call, float and big integer arguments", call("recall_memory", {"conversation_id": "exchange-conv-1",
                                                                          "count": 2.5, "x": 2**70}), {}),
    ("append, text needing escapes", call("append_memory", {"conversation_id": "exchange-conv-2",
                                                            "items": [{"k": "\x00\x1f\"\\/\u2028\U0001f600"}]}), {}),
    ("recall of escaped text", call("recall_memory", {"conversation_id": "exchange-conv-2", "count": 5}), {}),
]


def _scope(body: bytes, changes: dict[str, str | None]) -> dict[str, Any]:
    headers = {**HEADERS, **changes, "content-length": str(len(body))}
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/mcp",
        "raw_path": b"/mcp",
        "query_string": b"",
        "root_path": "",
        "headers": [(k.encode(), v.encode()) for k, v in headers.items() if v is not None],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8765),
        "state": {},
    }


async def _request(app: ASGIApp, body: bytes, changes: dict[str, str | None]) -> tuple[int, list[Any], bytes]:
    sent: list[Message] = []
    delivered = False

    async def receive() -> Message:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}
        await anyio.sleep_forever()
        raise AssertionError  # pragma: no cover

    async def send(message: Message) -> None:
        sent.append(message)

    await app(_scope(body, changes), receive, send)
    start = sent[0]
    headers = [(k, _RID.sub(b"RID", v)) for k, v in start["headers"]]
    payload = b"".join(m.get("body", b"") for m in sent[1:])
    return start["status"], headers, _TIME.sub(b"TIME", _RID.sub(b"RID", payload))


@contextlib.asynccontextmanager
async def _app(data: Path, single_exchange: bool, **options: Any) -> AsyncIterator[Starlette]:
    """The real app over a new data directory with the site (``options`` for ``build_app``), while it runs."""
    CredentialFile(data).add(SITE, PASSWORD)
    store = open_store(str(data))
    backend = Backend(store=store, data_dir=str(data), authenticator=Authenticator(CredentialFile(data)))
    server = build_server(backend)
    app = build_app(server, backend, host="127.0.0.1", **options)
    if not single_exchange:  # what exchange.install replaced: the SDK's own handler
        manager = server.session_manager
        manager.asgi_app = RequestBodyLimitMiddleware(manager._handle_request, manager.max_request_body_size)
    try:
        async with app.router.lifespan_context(app):
            yield app
    finally:
        backend.close_memories()
        store.close()


@pytest.mark.anyio
async def test_every_request_is_answered_as_the_sdk_answers_it(tmp_path: Path) -> None:
    async with _app(tmp_path / "fast", True) as fast, _app(tmp_path / "sdk", False) as sdk:
        for name, body, changes in CASES:
            ours = await _request(fast, body, changes)
            theirs = await _request(sdk, body, changes)
            assert ours == theirs, name


@pytest.mark.anyio
async def test_the_fast_path_serves_well_formed_requests_itself(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    handed_over: list[str] = []
    async with _app(tmp_path / "fast", True) as fast:
        single = next(m for m in _walk(fast) if isinstance(m, exchange.SingleExchange))
        sdk_handler = single.fallback

        async def watching(scope: Any, receive: Any, send: Any) -> None:
            handed_over.append(scope["path"])
            await sdk_handler(scope, receive, send)

        monkeypatch.setattr(single, "fallback", watching)
        status, _, body = await _request(fast, call("list_conversations", {}), {})
        assert status == 200 and b'"conversations"' in body and not handed_over
        status, _, _ = await _request(fast, rpc("notifications/initialized", id=None), {})
        assert status == 202 and handed_over == ["/mcp"]


_HEADER_NAMES = st.sampled_from(
    [b"host", b"origin", b"content-type", b"accept", b"mcp-protocol-version", b"authorization", b"x-other"]
)


@settings(max_examples=500, deadline=None)
@given(st.lists(st.tuples(_HEADER_NAMES, st.binary(max_size=6)), max_size=10))
def test_checked_headers_gives_the_first_value_of_each_name(headers: list[tuple[bytes, bytes]]) -> None:
    def first(name: bytes) -> bytes | None:
        return next((value for key, value in headers if key == name), None)

    version = first(b"mcp-protocol-version")
    checked = tuple(first(name) for name in exchange._CHECKED_HEADERS)
    expected = (None if version is None else version.decode("latin-1"), checked)
    assert exchange.checked_headers(headers) == expected


def test_the_runner_is_driven_through_its_own_on_request_method() -> None:
    # on_request is the SDK's cached property giving _on_request; the exchange calls that method itself.
    assert exchange._ON_REQUEST_IS_THE_METHOD


def _walk(app: Any) -> list[Any]:
    """The single-exchange handler inside the app (found through the MCP route's session manager)."""
    for route in app.routes:
        manager = getattr(getattr(route, "app", None), "session_manager", None) or getattr(
            getattr(route, "endpoint", None), "session_manager", None
        )
        if manager is not None:
            return [manager.asgi_app.app]
    return []


@pytest.mark.anyio
async def test_a_connection_exit_stack_with_something_on_it_is_unwound() -> None:
    from mcp.server import Server
    from mcp.server.connection import Connection
    from mcp.shared.message import ServerMessageMetadata
    from mcp_types import JSONRPCRequest

    ran: list[str] = []
    stack = exchange._WatchedExitStack()
    assert not stack.used
    stack.callback(ran.append, "sync")
    assert stack.used
    connection = Connection.from_envelope("2025-06-18", None, None)
    connection.exit_stack = stack
    dctx = exchange._DispatchContext(1, ServerMessageMetadata(request_context=None, can_send_request=False))
    message = JSONRPCRequest(jsonrpc="2.0", id=1, method="ping")
    assert await exchange._serve_one(Server("t"), dctx, message, connection, None) == {}
    assert ran == ["sync"]
    for push in ("push_async_callback", "push_async_exit", "push"):
        fresh = exchange._WatchedExitStack()

        async def noop(*_: Any) -> None:
            return None

        getattr(fresh, push)(noop)
        assert fresh.used, push
    entered = exchange._WatchedExitStack()
    entered.enter_context(contextlib.nullcontext())
    assert entered.used


@pytest.mark.anyio
async def test_the_born_ready_connection_is_what_from_envelope_builds() -> None:
    import anyio
    from mcp.server.connection import Connection

    assert exchange._NONE_IS_NOT_SUPPLIED and exchange._FIELDS_KNOWN
    ready = anyio.Event()
    ready.set()
    for version in ("2025-06-18", "2025-03-26"):
        theirs = Connection.from_envelope(version, None, None)
        for ours in (exchange._born_ready(version), exchange._born_ready(version, ready)):
            assert ours.outbound is theirs.outbound and ours.has_standalone_channel == theirs.has_standalone_channel
            for name in ("protocol_version", "session_id", "client_params", "client_capabilities", "state"):
                assert getattr(ours, name) == getattr(theirs, name), name
            assert ours.initialized.is_set() and theirs.initialized.is_set()
            assert type(ours.initialized) is type(theirs.initialized)
            assert ours.initialize_accepted == theirs.initialize_accepted
            assert set(vars(ours)) == set(vars(theirs))
            assert isinstance(ours.exit_stack, exchange._WatchedExitStack) and not ours.exit_stack.used
        shared = exchange._born_ready(version, ready)
        assert shared.initialized is ready  # the shared set event, not one made per connection
        assert shared.state is not exchange._born_ready(version, ready).state  # per-connection state stays fresh


@pytest.mark.anyio
async def test_post_mcp_reaches_the_exchange_with_the_routers_scope(tmp_path: Path) -> None:
    seen: list[dict[str, Any]] = []
    async with _app(tmp_path / "fast", True) as fast:
        single = next(m for m in _walk(fast) if isinstance(m, exchange.SingleExchange))
        route = next(r for r in fast.routes if getattr(r, "path", None) == "/mcp")
        sdk_handler = single.fallback

        async def watching(scope: Any, receive: Any, send: Any) -> None:
            seen.append(dict(scope))
            await sdk_handler(scope, receive, send)

        single.fallback = watching
        status, _, _ = await _request(fast, rpc("notifications/initialized", id=None), {})
        assert status == 202
        assert seen[0]["route"] is route and seen[0]["endpoint"] is route.endpoint
        assert seen[0]["router"] is fast.router and seen[0]["path_params"] == {}
        # Any other path is Starlette's to route: "/mcp/" is redirected as before.
        sent: list[Message] = []

        async def receive() -> Message:
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(message: Message) -> None:
            sent.append(message)

        await fast({**_scope(b"", {}), "path": "/mcp/", "raw_path": b"/mcp/"}, receive, send)
        assert sent[0]["status"] == 307
