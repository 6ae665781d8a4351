"""The batch encoder's one-call path gives exactly the item-by-item path's bytes and errors."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from convmem.logstore import MAX_BATCH_ITEMS, MAX_ITEM_BYTES, InvalidPayload, PayloadTooLarge, StoreError
from convmem.logstore.codec import encode_batch, encode_items

_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=20)
)
_values = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
_items = st.dictionaries(st.text(max_size=8), _values, max_size=5)


def _slow(payloads: list[Any]) -> tuple[bytes, int] | tuple[type, str]:
    """What the item-by-item path makes of ``payloads``: the batch, or the error's type and message."""
    try:
        parts = encode_items(payloads)
    except StoreError as exc:
        return type(exc), str(exc)
    return b"[" + b",".join(parts) + b"]", len(parts)


def _fast(payloads: list[Any]) -> tuple[bytes, int] | tuple[type, str]:
    try:
        return encode_batch(payloads)
    except StoreError as exc:
        return type(exc), str(exc)


@settings(max_examples=300, deadline=None)
@given(st.lists(_items | _values, min_size=0, max_size=12))
def test_encode_batch_matches_the_item_by_item_encoding(payloads: list[Any]) -> None:
    assert _fast(payloads) == _slow(payloads)


def test_one_call_path_boundaries() -> None:
    """Around the sizes where the one-call path hands over to the item-by-item one."""
    def item(n: int) -> dict[str, str]:
        return {"k": "x" * (n - len('{"k":""}'))}

    for payloads in (
        [item(MAX_ITEM_BYTES - 2)],  # the array is exactly MAX_ITEM_BYTES
        [item(MAX_ITEM_BYTES - 1)],  # the array is one byte over: item-by-item, and it passes
        [item(MAX_ITEM_BYTES)],
        [item(MAX_ITEM_BYTES + 1)],
        [item(100)] * MAX_BATCH_ITEMS,
        [item(100)] * (MAX_BATCH_ITEMS + 1),
        [{"a": 1.5}, {"b": math.nan}],
        [{"a": None}, {"b": [math.inf]}],
        [{"a": None}],
        ({"a": 1},),  # a tuple, not a list
    ):
        assert _fast(list(payloads)) == _slow(list(payloads))
        assert _fast(payloads) == _slow(payloads)  # type: ignore[arg-type]
    with pytest.raises(PayloadTooLarge):
        encode_batch([item(MAX_ITEM_BYTES + 1)])
    with pytest.raises(InvalidPayload, match="item 1"):
        encode_batch([{"a": 1}, {"b": math.nan}])
