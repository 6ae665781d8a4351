"""The exchange's JSON-RPC envelope (``mcp_adapter.envelope``) gives exactly what the SDK's parse and encoding give.

``parse`` against the SDK's own parse (``pydantic_core.from_json`` and the
JSON-RPC union), ``encode_response`` against ``JSONRPCResponse.model_dump_json``,
on generated bodies and results: the shapes msgspec takes and the ones it
leaves to the SDK (floats, tuples, subclasses, deep nesting, extra members,
lax ids, bodies that are not JSON).
"""

from __future__ import annotations

import json
from typing import Any

import pydantic_core
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from mcp_types import JSONRPCRequest, JSONRPCResponse, jsonrpc_message_adapter

from convmem.mcp_adapter import envelope


def _sdk_parse(body: bytes) -> tuple[Any, ...] | None:
    try:
        message = jsonrpc_message_adapter.validate_python(pydantic_core.from_json(body), by_name=False)
    except ValueError:  # pydantic's ValidationError is a ValueError
        return None
    return (message.id, message.method, message.params) if isinstance(message, JSONRPCRequest) else None


def _ours(body: bytes) -> tuple[Any, ...] | None:
    message = envelope.parse(body)
    return None if message is None else (message.id, message.method, message.params)


def _same(a: Any, b: Any) -> bool:
    """Equal values of equal types all the way down (``1 == 1.0 == True`` is not enough); NaN equals NaN."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) and a != a:
        return b != b
    return bool(a == b)


_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=8)
)
_values = st.recursive(
    _scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=12,
)
#: The request's members, each either the usual kind or one the SDK's model treats another way.
_ids = st.integers(min_value=-(2**70), max_value=2**70) | st.text(max_size=6) | st.floats() | st.booleans() | st.none()
_members = st.fixed_dictionaries(
    {"jsonrpc": st.sampled_from(["2.0", "2.0", "1.0", 2])},
    optional={
        "id": _ids,
        "method": st.text(max_size=12) | st.integers(),
        "params": st.none() | st.dictionaries(st.text(max_size=6), _values, max_size=4) | st.lists(_values, max_size=2),
        "result": st.dictionaries(st.text(max_size=3), _values, max_size=2),
        "error": st.fixed_dictionaries({"code": st.integers(), "message": st.text(max_size=5)}),
        "extra": _values,
    },
)


@st.composite
def _bodies(draw: st.DrawFn) -> bytes:
    """A JSON-RPC-like body, serialised in one of several ways (NaN literals, padding, duplicate members, cuts)."""
    members = draw(_members)
    separators = draw(st.sampled_from([(",", ":"), (", ", ": ")]))
    text = json.dumps(members, ensure_ascii=draw(st.booleans()), separators=separators)
    mangle = draw(st.sampled_from(["none", "none", "pad", "duplicate", "cut", "bom", "trailing"]))
    if mangle == "pad":
        text = " \n" + text + "\t "
    elif mangle == "duplicate" and len(text) > 2:
        text = text[:-1] + ', "id": ' + json.dumps(draw(_ids)) + "}"
    elif mangle == "cut":
        text = text[: draw(st.integers(min_value=0, max_value=len(text)))]
    elif mangle == "bom":
        text = "\ufeff" + text
    elif mangle == "trailing":
        text += draw(st.sampled_from(["x", "\x00", "{}", "  "]))
    return text.encode("utf-8", "surrogatepass")


@settings(max_examples=2000, deadline=None)
@given(_bodies())
@example(b'{"jsonrpc":"2.0","id":1,"method":"ping"}')
@example(b'{"jsonrpc":"2.0","id":1,"method":"ping","result":{}}')  # extra member: the SDK's union still says request
@example(b'{"jsonrpc":"2.0","id":1.0,"method":"ping"}')  # a lax id: the SDK sees a notification
@example(b'{"jsonrpc":"2.0","id":1,"method":"p","params":{"x":NaN,"y":1e400}}')
@example(b'{"jsonrpc":"2.0","id":"\\ud800","method":"p"}')
@example(b'{"jsonrpc":"2.0","id":1,"method":"p","params":{"x":"\xed\xa0\x80"}}')
@example(b'{"jsonrpc":"2.0","id":18446744073709551616,"id":2,"method":"p","params":{"a":1,"a":[2]}}')
@example(b'{"jsonrpc":"2.0","id":1,"method":"p","params":{"x":' + b"9" * 4000 + b"}}")  # a big integer, same value
@example(b'{"jsonrpc":"2.0","id":1,"method":"p","params":{"x":' + b"9" * 5000 + b"}}")  # past both decoders' limit
@example(b'{"jsonrpc":"2.0","id":1,"method":"p","params":{"x":' + b"[" * 197 + b"]" * 197 + b"}}")  # within both
@example(b'{"jsonrpc":"2.0","id":1,"method":"p","params":{"x":' + b"[" * 198 + b"]" * 198 + b"}}")  # the SDK's limit
@example(b'{"jsonrpc":"2.0","id":1,"method":"p","params":{"x":' + b"[" * 199 + b"]" * 199 + b"}}")
@example(b'{"jsonrpc":"2.0","id":1,"method":"p","params":{"x":' + b"[" * 500 + b"]" * 500 + b"}}")  # past the SDK's
@example(b'{"jsonrpc":"2.0","id":1,"method":"p","params":{"x":' + b"[" * 1000 + b"]" * 1000 + b"}}")  # past msgspec's
@example(b'{"jsonrpc":"2.0","id":1,"method":"p","params":{"x":' + b"[" * 100000 + b"]" * 100000 + b"}}")
@example(b'{"jsonrpc":"2.0","id":1,"method":"p","params":{"x":"' + b"[" * 300 + b'"}}')  # brackets in a string
def test_parse_gives_what_the_sdks_parse_gives(body: bytes) -> None:
    ours, theirs = _ours(body), _sdk_parse(body)
    assert _same(ours, theirs), (body, ours, theirs)


def test_the_common_request_is_decoded_by_msgspec_and_anything_else_by_the_sdk() -> None:
    assert type(envelope.parse(b'{"jsonrpc":"2.0","id":"a","method":"tools/list","params":{}}')) is envelope.WireRequest
    assert type(envelope.parse(b'{"jsonrpc":"2.0","id":1,"method":"ping","result":{}}')) is JSONRPCRequest
    assert envelope.parse(b'{"jsonrpc":"2.0","id":1.0,"method":"ping"}') is None  # a notification
    assert envelope.parse(b'{"jsonrpc":"2.0","id":1,"result":{}}') is None  # a response
    assert envelope.parse(b"[]") is None


class _Str(str):
    pass


_results = st.dictionaries(
    st.text(max_size=5),
    st.recursive(
        _scalars | st.builds(_Str, st.text(max_size=3)),
        lambda inner: st.lists(inner, max_size=3)
        | st.lists(inner, max_size=2).map(tuple)
        | st.dictionaries(st.text(max_size=4), inner, max_size=3),
        max_leaves=12,
    ),
    max_size=4,
)


def _sdk_encode(request_id: Any, result: dict[str, Any]) -> bytes | str:
    try:
        return JSONRPCResponse(jsonrpc="2.0", id=request_id, result=result).model_dump_json(
            by_alias=True, exclude_unset=True
        ).encode()
    except Exception as exc:  # the SDK's own error is what the exchange must raise too
        return type(exc).__name__


def _our_encode(request_id: Any, result: dict[str, Any]) -> bytes | str:
    try:
        return envelope.encode_response(request_id, result)
    except Exception as exc:
        return type(exc).__name__


def _nested(depth: int) -> dict[str, Any]:
    result: dict[str, Any] = {"leaf": [1, "x", None, True]}
    for _ in range(depth):
        result = {"d": [result]}
    return result


@settings(max_examples=2000, deadline=None)
@given(st.integers(min_value=-(2**70), max_value=2**70) | st.text(max_size=6), _results)
@example(1, {})
@example(1, {"v": 1e16, "w": [0.5, -0.0]})
@example("a", {"s": "\x00\x1f\x7f\u2028\U0001f600\"\\/", "big": 2**80})
@example(1, {"bad": "\ud800"})
@example(1, {"t": (1, 2), "sub": _Str("x")})
@example(1, _nested(40))
@example(1, _nested(10))
@example(1, {"huge": 10**5000, "negative": -(10**4000)})
def test_encode_response_writes_what_the_sdks_model_writes(request_id: Any, result: dict[str, Any]) -> None:
    assert _our_encode(request_id, result) == _sdk_encode(request_id, result)


@pytest.mark.parametrize(
    ("result", "plain"),
    [({}, True), ({"a": [1, "x", None, False, {"b": []}]}, True), ({"f": 1.0}, False), ({"t": ()}, False),
     ({"s": _Str("x")}, False), ({1: "x"}, False), (_nested(10), True), (_nested(40), False)],
)
def test_only_plain_results_are_written_by_msgspec(result: dict[str, Any], plain: bool) -> None:
    assert envelope._plain(result) is plain
