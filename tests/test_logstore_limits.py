"""Boundary tests: every limit at its exact value passes, one more fails and writes nothing."""

from __future__ import annotations

import pytest

from convmem.logstore import (
    MAX_BATCH_BYTES,
    MAX_BATCH_ITEMS,
    MAX_CONVERSATION_ITEMS,
    MAX_ITEM_BYTES,
    BatchTooLarge,
    ConversationFull,
    ConversationId,
    EmptyBatch,
    InvalidConversationId,
    InvalidPayload,
    MemoryStore,
    PayloadTooLarge,
    Range,
    SiteName,
    Tail,
)
from convmem.logstore.preallocation import wait_for_extensions
from tests.pg_support import content_digest

SITE = "site-0001"
CONV = "conv-0001"


def item_of_size(n: int) -> dict[str, str]:
    """A payload whose compact JSON encoding is exactly ``n`` bytes (n >= 8)."""
    return {"k": "x" * (n - len('{"k":""}'))}


@pytest.fixture
def store(store_factory):
    """A store of each backend (parametrised by ``backend_kind`` in conftest)."""
    return store_factory.open()


def assert_rejected_unchanged(store: MemoryStore, exc: type[Exception], site: str, conv: str, payloads) -> Exception:
    wait_for_extensions()  # an earlier append's background job (extend-ahead, pool refill) is not this append
    before = content_digest(store)
    with pytest.raises(exc) as info:
        store.append(site, conv, payloads)
    assert content_digest(store) == before
    return info.value


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("", "TooShort"),
        ("a" * 7, "TooShort"),
        ("a" * 65, "TooLong"),
        ("a" * 200, "TooLong"),
        ("abcdefg!", "InvalidCharacters"),
        ("abc defgh", "InvalidCharacters"),
        ("abcdéfghi", "InvalidCharacters"),
        ("abcdefgh\n", "InvalidCharacters"),
        ("../../etc/passwd", "InvalidCharacters"),
        ("abcd.efgh", "InvalidCharacters"),
    ],
)
def test_bad_ids_are_rejected_with_reason(value: str, reason: str) -> None:
    with pytest.raises(InvalidConversationId) as info:
        ConversationId(value)
    assert info.value.reason == reason
    assert info.value.details() == {"reason": reason}
    assert not info.value.retryable
    if reason == "TooShort" and value:
        assert SiteName(value) == value  # site names may be 1-64 characters
    else:
        with pytest.raises(InvalidConversationId):
            SiteName(value)


@pytest.mark.parametrize("n", [8, 9, 33, 63, 64])
def test_id_lengths_at_bounds_are_accepted(n: int) -> None:
    value = ("aZ0_-" * 13)[:n]
    assert ConversationId(value) == value
    assert SiteName(value) == value


def test_ids_are_case_sensitive_on_disk(store: MemoryStore) -> None:
    store.append(SITE, "Chat-ABCDEF", [{"who": "upper"}])
    store.append(SITE, "chat-abcdef", [{"who": "lower"}])
    assert store.read(SITE, "Chat-ABCDEF", Tail(5))[0].payload == {"who": "upper"}
    assert store.read(SITE, "chat-abcdef", Tail(5))[0].payload == {"who": "lower"}


def test_invalid_ids_write_nothing(store: MemoryStore) -> None:
    assert_rejected_unchanged(store, InvalidConversationId, SITE, "short", [{"a": 1}])
    assert_rejected_unchanged(store, InvalidConversationId, "bad site!", CONV, [{"a": 1}])


def test_empty_batch(store: MemoryStore) -> None:
    err = assert_rejected_unchanged(store, EmptyBatch, SITE, CONV, [])
    assert err.code == "EmptyBatch" and not err.retryable


def test_item_size_exact_limit_passes_one_more_fails(store: MemoryStore) -> None:
    err = assert_rejected_unchanged(store, PayloadTooLarge, SITE, CONV, [{"a": 1}, item_of_size(MAX_ITEM_BYTES + 1)])
    assert (err.limit, err.actual, err.index) == (MAX_ITEM_BYTES, MAX_ITEM_BYTES + 1, 1)
    rng = store.append(SITE, CONV, [item_of_size(MAX_ITEM_BYTES)])
    assert (rng.first, rng.last) == (0, 0)
    assert store.read(SITE, CONV, Tail(1))[0].payload == item_of_size(MAX_ITEM_BYTES)


def test_item_size_counts_utf8_bytes_not_characters(store: MemoryStore) -> None:
    # "é" is two bytes in UTF-8: a payload of (limit - 8) / 2 + 1 such characters is one byte over... or more.
    n_chars = (MAX_ITEM_BYTES - 8) // 2
    ok = {"k": "é" * n_chars}
    store.append(SITE, CONV, [ok])
    err = assert_rejected_unchanged(store, PayloadTooLarge, SITE, CONV, [{"k": "é" * (n_chars + 1)}])
    assert err.actual == 8 + 2 * (n_chars + 1)


def test_batch_bytes_exact_limit_passes_one_more_fails(store: MemoryStore) -> None:
    over = [item_of_size(MAX_ITEM_BYTES)] * 3 + [item_of_size(MAX_ITEM_BYTES - 1), {}]
    err = assert_rejected_unchanged(store, BatchTooLarge, SITE, CONV, over)
    assert (err.limit, err.actual) == (MAX_BATCH_BYTES, MAX_BATCH_BYTES + 1)
    exact = [item_of_size(MAX_ITEM_BYTES)] * 4
    rng = store.append(SITE, CONV, exact)
    assert (rng.first, rng.last) == (0, 3)
    assert [i.payload for i in store.read(SITE, CONV, Range(0, 10))] == exact


def test_batch_item_count_limit(store: MemoryStore) -> None:
    err = assert_rejected_unchanged(store, BatchTooLarge, SITE, CONV, [{"i": i} for i in range(MAX_BATCH_ITEMS + 1)])
    assert (err.limit, err.actual) == (MAX_BATCH_ITEMS, MAX_BATCH_ITEMS + 1)
    rng = store.append(SITE, CONV, [{"i": i} for i in range(MAX_BATCH_ITEMS)])
    assert (rng.first, rng.last) == (0, MAX_BATCH_ITEMS - 1)


@pytest.mark.parametrize("bad", [[1], ["text"], [None], [[1, 2]], [{"a": float("nan")}], [{"a": float("inf")}]])
def test_non_objects_and_non_json_are_rejected(store: MemoryStore, bad) -> None:
    err = assert_rejected_unchanged(store, InvalidPayload, SITE, CONV, bad)
    assert err.index == 0


def test_lone_surrogate_is_rejected(store: MemoryStore) -> None:
    assert_rejected_unchanged(store, InvalidPayload, SITE, CONV, [{"a": 1}, {"s": "\ud800"}])


def test_conversation_item_limit(store_factory) -> None:
    store = store_factory.open(segment_bytes=1 << 20)
    try:
        full = MAX_CONVERSATION_ITEMS - 1
        batch = [{}] * MAX_BATCH_ITEMS
        while full >= MAX_BATCH_ITEMS:
            store.append(SITE, CONV, batch)
            full -= MAX_BATCH_ITEMS
        if full:
            store.append(SITE, CONV, [{}] * full)
        err = assert_rejected_unchanged(store, ConversationFull, SITE, CONV, [{"a": 1}, {"b": 2}])
        assert (err.limit, err.actual) == (MAX_CONVERSATION_ITEMS, MAX_CONVERSATION_ITEMS + 1)
        rng = store.append(SITE, CONV, [{"last": True}])
        assert (rng.first, rng.last) == (MAX_CONVERSATION_ITEMS - 1, MAX_CONVERSATION_ITEMS - 1)
        assert_rejected_unchanged(store, ConversationFull, SITE, CONV, [{"one": "more"}])
        assert [i.seq for i in store.read(SITE, CONV, Tail(3))] == [99_997, 99_998, 99_999]
    finally:
        store.close()
