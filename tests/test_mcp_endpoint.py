"""``POST /mcp`` through :class:`~convmem.mcp_adapter.endpoint.McpEndpoint` is answered and logged as the layers do.

Two copies of the real application, each over its own data directory with
the same site, take the same requests: one as ``build_app`` makes it (the
endpoint in front), the other with the endpoint taken out (the layered
stack it stands in front of: Starlette's error layer, the request log,
admission, the splice layer, the exchange). Status, headers, body and the
request's log line must be the same, request ids and times aside: for every
request of the exchange's comparison, and for what only the endpoint decides
(bodies in pieces, a body larger than it said, a client that goes away, a
slow body, requests it leaves to the layers, an exception).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from starlette.types import ASGIApp, Message
from test_mcp_exchange import _RID, _TIME, AUTH, CASES, HEADERS, _scope, call, rpc
from test_mcp_exchange import _app as exchange_app

from convmem.mcp_adapter import endpoint, exchange
from convmem.mcp_adapter.http import UNAUTHENTICATED_BODY_BYTES

#: The body deadline of both apps: short, so that the slow-body case is quick.
BODY_TIMEOUT = 0.3


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.fields: list[dict[str, Any]] = []

    def emit(self, record: logging.LogRecord) -> None:
        request = getattr(record, "request", None)
        if isinstance(request, dict):
            self.fields.append({k: v for k, v in request.items() if k not in ("request_id", "latency_ms")})


@contextlib.asynccontextmanager
async def _app(data: Path, fast: bool) -> AsyncIterator[ASGIApp]:
    """The app as ``build_app`` makes it (``fast``), or with the endpoint taken out (the layered stack alone)."""
    async with exchange_app(data, True, body_timeout=BODY_TIMEOUT) as app:
        stack = app.middleware_stack
        assert isinstance(stack, endpoint.McpEndpoint)
        if not fast:
            app.middleware_stack = stack.layers
        yield app


Messages = list[Message]


async def _exchange(app: ASGIApp, scope: dict[str, Any], messages: Messages, lines: _Lines) -> tuple[Any, ...]:
    """Send ``messages`` as the request's body (then wait for ever); what was answered, raised and logged."""
    sent: Messages = []
    pending = list(messages)

    async def receive() -> Message:
        if pending:
            return pending.pop(0)
        await anyio.sleep_forever()
        raise AssertionError  # pragma: no cover

    async def send(message: Message) -> None:
        sent.append(message)

    lines.fields.clear()
    raised = None
    try:
        await app(dict(scope), receive, send)
    except Exception as exc:  # compared below: both paths raise the same
        raised = repr(exc)
    normal = []
    for message in sent:
        if message["type"] == "http.response.start":
            normal.append((message["status"], [(k, _RID.sub(b"RID", v)) for k, v in message["headers"]]))
        else:
            body = _TIME.sub(b"TIME", _RID.sub(b"RID", bytes(message.get("body", b""))))
            normal.append((body, message.get("more_body", False)))
    return normal, raised, list(lines.fields)


def _body(body: bytes) -> Messages:
    return [{"type": "http.request", "body": body, "more_body": False}]


def _headers(scope: dict[str, Any], **changes: str | None) -> dict[str, Any]:
    """``scope`` with headers replaced (None: removed) or, for a name given twice as ``NAME__2``, added."""
    headers = [(k, v) for k, v in scope["headers"] if k.decode() not in changes]
    for name, value in changes.items():
        if value is not None:
            headers.append((name.split("__")[0].encode(), value.encode()))
    return {**scope, "headers": headers}


def _endpoint_cases() -> list[tuple[str, dict[str, Any], Messages]]:
    ping = rpc("ping")
    big = b" " * (UNAUTHENTICATED_BODY_BYTES + 1)
    pieces: Messages = [
        {"type": "http.request", "body": ping[:10], "more_body": True},
        {"type": "http.request", "body": b"", "more_body": True},
        {"type": "http.request", "body": ping[10:], "more_body": False},
    ]
    base = _scope(ping, {})
    recall = call("recall_memory", {"conversation_id": "exchange-conv-1", "count": 5})
    return [
        ("ping in pieces", base, pieces),
        ("body larger than it said", base, [{"type": "http.request", "body": big, "more_body": False}]),
        ("client gone", base, [{"type": "http.disconnect"}]),
        ("client gone after a piece", base, [pieces[0], {"type": "http.disconnect"}]),
        ("slow body", base, pieces[:1]),
        ("two credentials", _headers(base, authorization__2=AUTH.decode()), _body(ping)),
        ("no Content-Length", _headers(base, **{"content-length": None}), _body(ping)),
        ("bad Content-Length", _headers(base, **{"content-length": "ten"}), _body(ping)),
        ("large body declared", _headers(base, **{"content-length": str(len(big))}), _body(big)),
        ("recall", _scope(recall, {}), _body(recall)),
        ("a path under /mcp", {**base, "path": "/mcp/", "raw_path": b"/mcp/"}, _body(ping)),
        ("GET /mcp", {**base, "method": "GET"}, _body(b"")),
        ("GET /healthz", {**base, "method": "GET", "path": "/healthz", "raw_path": b"/healthz"}, _body(b"")),
        ("a root path", {**base, "root_path": "/api"}, _body(ping)),
    ]


@pytest.fixture
def lines() -> Any:
    handler = _Lines()
    logger = logging.getLogger("convmem.request")
    logger.addHandler(handler)
    saved = logger.level
    logger.setLevel(logging.INFO)
    yield handler
    logger.removeHandler(handler)
    logger.setLevel(saved)


@pytest.mark.anyio
async def test_every_request_is_answered_and_logged_as_the_layers_do(tmp_path: Path, lines: _Lines) -> None:
    assert HEADERS["authorization"] == AUTH.decode()
    async with _app(tmp_path / "fast", True) as fast, _app(tmp_path / "layers", False) as layers:
        cases = [(name, _scope(body, changes), _body(body)) for name, body, changes in CASES]
        for name, scope, messages in [*cases, *_endpoint_cases()]:
            ours = await _exchange(fast, scope, messages, lines)
            theirs = await _exchange(layers, scope, messages, lines)
            assert ours == theirs, name
            assert ours[0] or name.startswith("client gone"), name  # every other case was answered
            assert len(ours[2]) == 1, name  # one request line each


@pytest.mark.anyio
async def test_an_exception_is_answered_500_after_the_line_and_raised(
    tmp_path: Path, lines: _Lines, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def broken(*_: Any) -> bytes:
        raise RuntimeError("broken exchange")

    monkeypatch.setattr(exchange.SingleExchange, "answer", broken)
    scope = _scope(rpc("ping"), {})
    async with _app(tmp_path / "fast", True) as fast, _app(tmp_path / "layers", False) as layers:
        ours = await _exchange(fast, scope, _body(rpc("ping")), lines)
        theirs = await _exchange(layers, scope, _body(rpc("ping")), lines)
    assert ours == theirs
    (start, body), raised, logged = ours
    assert start[0] == 500 and body[0] == b"Internal Server Error" and "broken exchange" in raised
    assert logged[0]["status"] is None and logged[0]["outcome"] == "error"


@pytest.mark.anyio
async def test_the_endpoint_serves_the_common_request_itself(tmp_path: Path, lines: _Lines) -> None:
    taken: list[str] = []
    async with _app(tmp_path / "fast", True) as fast:
        stack = fast.middleware_stack
        assert isinstance(stack, endpoint.McpEndpoint)
        layers = stack.layers

        async def watching(scope: Any, receive: Any, send: Any) -> None:
            taken.append(scope["path"])
            await layers(scope, receive, send)

        stack.layers = watching  # type: ignore[assignment]
        (start, _), _, _ = await _exchange(fast, _scope(rpc("ping"), {}), _body(rpc("ping")), lines)
        assert start[0] == 200 and taken == []
        await _exchange(fast, _headers(_scope(rpc("ping"), {}), authorization__2="x"), _body(rpc("ping")), lines)
        assert taken == ["/mcp"]
