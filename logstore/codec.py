"""Payload encoding: compact JSON, measured and checked against the limits.

An item's size is the length in bytes of its compact UTF-8 JSON encoding (no
insignificant whitespace, non-ASCII characters as UTF-8, not ``\\u`` escapes).
A batch is stored as one JSON array of those encodings, so the bytes on disk
are exactly the items' encodings plus brackets and commas.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from .errors import BatchTooLarge, EmptyBatch, InvalidPayload, PayloadTooLarge
from .limits import MAX_BATCH_BYTES, MAX_BATCH_ITEMS, MAX_ITEM_BYTES

_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(type=list[dict[str, Any]])
#: The decoder of :func:`decode_batch`, for a hot loop that calls it directly.
batch_decoder = _decoder
_splitter = msgspec.json.Decoder(type=list[msgspec.Raw])
_OPEN_BRACE = 0x7B


def _has_non_finite(value: object) -> bool:
    """True when a float NaN/Infinity hides in ``value`` (JSON cannot hold them)."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, float):
            if not math.isfinite(v):
                return True
        elif isinstance(v, dict):
            stack.extend(v.values())
        elif isinstance(v, (list, tuple)):
            stack.extend(v)
    return False


def encode_batch(payloads: Sequence[Mapping[str, Any]]) -> tuple[bytes, int]:
    """Encode a batch for storage; return ``(json_array_bytes, item_count)``.

    Checks, in this order, so the most specific error wins: the batch is not
    empty and holds at most ``MAX_BATCH_ITEMS``; every item is a JSON object
    of at most ``MAX_ITEM_BYTES``; the items add up to at most
    ``MAX_BATCH_BYTES``. Raises before anything is written. The array is
    exactly ``[`` + the items of :func:`encode_items` joined by ``,`` + ``]``.
    """
    fast = _encode_plain(payloads)
    if fast is not None:
        return fast, len(payloads)
    parts, total = _encode_parts(payloads)
    body = b"[" + b",".join(parts) + b"]"
    _check_batch(payloads, parts, body, total)
    return body, len(parts)


def _encode_plain(payloads: Sequence[Mapping[str, Any]]) -> bytes | None:
    """The common case in one encoder call: a list of 1..MAX_BATCH_ITEMS dicts whose array fits one item's limit.

    msgspec writes a list of dicts exactly as ``[`` + each dict's compact
    encoding joined by ``,`` + ``]``, so when the whole array is at most
    ``MAX_ITEM_BYTES`` no item can exceed it, nor the batch its byte limit,
    and the checks of :func:`encode_batch` reduce to the count and non-finite
    numbers. None means "take the item-by-item path" (it raises the precise error).
    """
    if type(payloads) is not list or not 0 < len(payloads) <= MAX_BATCH_ITEMS:
        return None
    for item in payloads:
        if type(item) is not dict:
            return None
    try:
        body = _encoder.encode(payloads)
    except (TypeError, UnicodeEncodeError, OverflowError, ValueError):
        return None
    if len(body) > MAX_ITEM_BYTES or (b"null" in body and any(map(_has_non_finite, payloads))):
        return None
    return body


def encode_items(payloads: Sequence[Mapping[str, Any]]) -> list[bytes]:
    """Each item's compact JSON bytes (what a database backend stores verbatim).

    The same checks and errors, in the same order, as :func:`encode_batch`.
    """
    parts, total = _encode_parts(payloads)
    _check_batch(payloads, parts, b",".join(parts), total)
    return parts


def _encode_parts(payloads: Sequence[Mapping[str, Any]]) -> tuple[list[bytes], int]:
    """The items' encodings and their total size, after the count, type and per-item size checks."""
    n = len(payloads)
    if n == 0:
        raise EmptyBatch()
    if n > MAX_BATCH_ITEMS:
        raise BatchTooLarge(MAX_BATCH_ITEMS, n, unit="items")
    parts: list[bytes] = []
    total = 0
    try:
        for i, item in enumerate(payloads):
            if not isinstance(item, Mapping):
                raise InvalidPayload(i, f"an item must be a JSON object, not {type(item).__name__}")
            try:
                enc = _encoder.encode(item)
            except (TypeError, UnicodeEncodeError, OverflowError, ValueError) as exc:
                raise InvalidPayload(i, f"not encodable as JSON: {exc}") from exc
            parts.append(enc)
            size = len(enc)
            if size > MAX_ITEM_BYTES:
                raise PayloadTooLarge(MAX_ITEM_BYTES, size, index=i)
            total += size
    except (InvalidPayload, PayloadTooLarge):
        _reject_non_finite(payloads, parts)  # an earlier item's NaN is reported first, as before
        raise
    return parts, total


def _check_batch(payloads: Sequence[Mapping[str, Any]], parts: list[bytes], joined: bytes, total: int) -> None:
    """Non-finite numbers, then the batch's byte limit; ``joined`` is the items joined by ``,``."""
    # One search of the whole body instead of three per item (a large share of an
    # append's CPU time); only a body holding "null" needs the walk.
    if b"null" in joined:
        _reject_non_finite(payloads, parts)
    if total > MAX_BATCH_BYTES:
        raise BatchTooLarge(MAX_BATCH_BYTES, total)


def _reject_non_finite(payloads: Sequence[Mapping[str, Any]], parts: list[bytes]) -> None:
    """Raise InvalidPayload for the first encoded item that held NaN or Infinity.

    msgspec writes non-finite floats as ``null``; refuse rather than alter data.
    Only an encoding containing ``null`` can come from one.
    """
    for i, enc in enumerate(parts):
        if b"null" in enc and _has_non_finite(payloads[i]):
            raise InvalidPayload(i, "NaN and Infinity are not JSON numbers")


def decode_batch(body: bytes | memoryview) -> list[dict[str, Any]]:
    """Decode a stored batch body back to its items (raises msgspec.DecodeError)."""
    return _decoder.decode(body)


class BadBatchBody(ValueError):
    """A stored batch body that is not a JSON array of ``count`` objects (the reader reports it as Corrupted)."""


def split_batch(body: bytes | memoryview, count: int) -> list[msgspec.Raw]:
    """A stored batch's items as undecoded JSON, after checking the whole body's shape.

    Every check :func:`decode_batch` makes of the body's shape, without
    building its items: the body is one JSON array (the whole of it is
    parsed), of exactly ``count`` elements, each a JSON object, and it is
    valid UTF-8. Raises :class:`BadBatchBody` saying which check failed.
    The items keep ``body`` alive; decode the ones wanted with
    :func:`decode_items`, or pass them on as they are.
    """
    try:
        items = _splitter.decode(body)
    except msgspec.DecodeError as exc:
        raise BadBatchBody(f"batch body is not a JSON array of objects: {exc}") from None
    if len(items) != count:
        raise BadBatchBody(f"batch holds {len(items)} items, header says {count}")
    for i, item in enumerate(items):
        if memoryview(item)[0] != _OPEN_BRACE:  # the parser skips whitespace: an element starts with its value
            raise BadBatchBody(f"batch body is not a JSON array of objects: item {i} is not a JSON object")
    try:
        str(body, "utf-8")  # the parse above checks the syntax, not the encoding of strings
    except UnicodeDecodeError as exc:
        raise BadBatchBody(f"batch body is not a JSON array of objects: not UTF-8 at byte {exc.start}") from None
    return items


def decode_items(items: list[msgspec.Raw]) -> list[dict[str, Any]]:
    """Decode items returned by :func:`split_batch` (each one is known to be a JSON object)."""
    return _decoder.decode(b"[" + b",".join(items) + b"]")
