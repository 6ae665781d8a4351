"""The JSON-RPC envelope of the single exchange: the common request decoded, the common response encoded, by msgspec.

The SDK decodes a body with ``pydantic_core.from_json`` and validates it
against the union of the four JSON-RPC messages, and encodes a response as a
``JSONRPCResponse`` model's ``model_dump_json``: about 2 us each for a
``ping`` in a loop of their own, more in a request's context. Here the
common shapes take msgspec instead, and only when that gives exactly what
the SDK gives; everything else takes the SDK's own code, so every error and
every unusual body is the SDK's:

* :func:`parse`: a body whose object has only the request's members
  (``jsonrpc`` ``"2.0"``, an integer or string ``id``, a string ``method``,
  an object or null ``params``) is decoded by a msgspec struct of that exact
  shape. msgspec accepts a subset of what the SDK accepts and decodes it to
  the same values: it is strict where pydantic is lax (``1.0`` or ``true`` as
  an id, ``NaN``, a number out of a float's range are refused) and it refuses
  every body the SDK refuses (invalid UTF-8 or JSON, lone surrogates, extra
  members), and it is given no body that could nest containers deeper than
  the SDK's parser allows. A refused body goes to the SDK's union, which classifies it
  (a request with extra members, a notification, an error, a response).
* :func:`encode_response`: the response to a result made only of dicts with
  string keys, lists, strings, integers, booleans and ``None`` (exactly
  those types, at most :data:`_MAX_DEPTH` deep) is encoded by msgspec, which
  writes those values byte for byte as pydantic does (compact, the same
  string escapes, big integers as digits); any other result (a float, whose
  exponent pydantic writes as ``1e+16`` and msgspec as ``1e16``, a subclass,
  a tuple) is encoded by the SDK's model.

``tests/test_mcp_envelope.py`` checks both against the SDK on generated
bodies and results, the fallback cases included.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec
import pydantic_core
from mcp_types import JSONRPCRequest, JSONRPCResponse, RequestId, jsonrpc_message_adapter
from pydantic import ValidationError

#: Deepest result :func:`encode_response` gives to msgspec (a deeper one is the SDK's to encode).
_MAX_DEPTH = 32

#: pydantic_core's parser refuses containers nested more than about 200 deep (200 objects, 201 arrays),
#: msgspec's about 1,000: a body with at most this many ``{`` and ``[`` (inside strings too) cannot nest
#: deeper than the SDK accepts, and only such a body is given to msgspec; any other is the SDK's to parse,
#: so a deep one gets the SDK's parse error.
_OPENERS_SAFE = 200


class WireRequest(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """A JSON-RPC request of the exact shape the SDK's ``JSONRPCRequest`` validates, decoded by msgspec."""

    jsonrpc: Literal["2.0"]
    id: int | str
    method: str
    params: dict[str, Any] | None = None


#: A request as the exchange reads it: ``id``, ``method`` and ``params``, from either decoder.
Request = WireRequest | JSONRPCRequest

_decoder = msgspec.json.Decoder(WireRequest)
_encoder = msgspec.json.Encoder()


def parse(body: bytes) -> Request | None:
    """The JSON-RPC request in ``body``, as the SDK's union gives it; None when the body is not a valid request."""
    if len(body) <= _OPENERS_SAFE or body.count(b"{") + body.count(b"[") <= _OPENERS_SAFE:
        try:
            return _decoder.decode(body)
        except msgspec.DecodeError:  # ValidationError is a DecodeError: any other shape is the SDK's to classify
            pass
    try:
        message = jsonrpc_message_adapter.validate_python(pydantic_core.from_json(body), by_name=False)
    except (ValueError, ValidationError):
        return None
    return message if isinstance(message, JSONRPCRequest) else None


def encode_response(request_id: RequestId, result: dict[str, Any]) -> bytes:
    """``JSONRPCResponse(jsonrpc="2.0", id=request_id, result=result)`` as the SDK's transport writes it."""
    if type(request_id) in (int, str) and _plain(result):
        try:
            return _encoder.encode({"jsonrpc": "2.0", "id": request_id, "result": result})
        except (ValueError, OverflowError):  # a lone surrogate, an integer msgspec cannot write: the SDK's error
            pass
    response = JSONRPCResponse(jsonrpc="2.0", id=request_id, result=result)
    return response.model_dump_json(by_alias=True, exclude_unset=True).encode()


def _plain(value: dict[str, Any]) -> bool:
    """True if ``value`` holds only the types msgspec writes as pydantic does (see the module docstring)."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        kind = type(item)
        if kind is dict:
            if depth >= _MAX_DEPTH:
                return False
            for key, member in item.items():
                if type(key) is not str:
                    return False
                stack.append((member, depth + 1))
        elif kind is list:
            if depth >= _MAX_DEPTH:
                return False
            stack.extend((member, depth + 1) for member in item)
        elif kind is not str and kind is not int and kind is not bool and item is not None:
            return False
    return True
