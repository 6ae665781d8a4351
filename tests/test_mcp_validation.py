"""Argument validation: the spec's codes where it names one, field and rule otherwise, and no crashes."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from convmem.mcp_adapter.errors import ToolFailure
from convmem.mcp_adapter.validation import ListArgs, RecallArgs, ReplayArgs, parse_arguments

CID = "valid-conv-id"


def failure(tool: str, arguments: dict[str, Any] | None) -> dict[str, Any]:
    with pytest.raises(ToolFailure) as info:
        parse_arguments(tool, arguments)
    return info.value.error_object()


def test_defaults_are_filled_in() -> None:
    assert parse_arguments("recall_memory", {"conversation_id": CID}) == RecallArgs(CID, 50)
    assert parse_arguments("replay_memory", {"conversation_id": CID, "limit": 5}) == ReplayArgs(CID, 5, 0)
    assert parse_arguments("list_conversations", None) == ListArgs(None, 50)
    assert parse_arguments("list_conversations", {"cursor": None}) == ListArgs(None, 50)


def test_bounds_are_inclusive() -> None:
    assert parse_arguments("recall_memory", {"conversation_id": CID, "count": 0}).count == 0  # type: ignore[union-attr]
    assert parse_arguments("recall_memory", {"conversation_id": CID, "count": 1000}).count == 1000  # type: ignore[union-attr]
    assert len(parse_arguments("append_memory", {"conversation_id": CID, "items": [{}] * 250}).items) == 250  # type: ignore[union-attr]
    big = parse_arguments("replay_memory", {"conversation_id": CID, "limit": 1, "offset": 2**64 - 1})
    assert isinstance(big, ReplayArgs) and big.offset == 2**64 - 1


def test_integral_floats_count_as_integers() -> None:
    assert parse_arguments("recall_memory", {"conversation_id": CID, "count": 7.0}) == RecallArgs(CID, 7)
    assert failure("recall_memory", {"conversation_id": CID, "count": 7.5})["field"] == "count"


def test_an_unknown_argument_is_refused_with_the_nearest_known_one() -> None:
    """A misspelt memory_context must not silently turn surfacing off."""
    got = failure("append_memory", {"conversation_id": CID, "items": [{"a": 1}], "memory_contxt": "units"})
    assert got["field"] == "memory_contxt"
    assert "did you mean `memory_context`?" in got["rule"] and "append_memory" in got["rule"]
    got = failure("replay_memory", {"conversation_id": CID, "limit": 5, "ofset": 3})
    assert got["field"] == "ofset" and "`offset`" in got["rule"]
    # Nothing near: the rule lists what the tool takes.
    got = failure("list_conversations", {"zzz": 1})
    assert got["field"] == "zzz" and "`cursor`, `limit`" in got["rule"]


def test_an_unknown_memory_tool_argument_is_refused_too() -> None:
    from convmem.mcp_adapter.memory_calls import parse_memory_arguments

    with pytest.raises(ToolFailure) as info:
        parse_memory_arguments("memory_search", {"query": "units", "limt": 3})
    assert info.value.details["field"] == "limt" and "`limit`" in info.value.details["rule"]


@pytest.mark.parametrize(
    ("tool", "arguments", "code", "extra"),
    [
        ("append_memory", {"conversation_id": CID, "items": []}, "EmptyBatch", {}),
        ("append_memory", {"conversation_id": CID, "items": [{}] * 251}, "BatchTooLarge", {"unit": "items"}),
        ("append_memory", {"conversation_id": "short", "items": [{}]}, "InvalidConversationId", {"reason": "TooShort"}),
        ("recall_memory", {"conversation_id": "a" * 65}, "InvalidConversationId", {"reason": "TooLong"}),
        ("replay_memory", {"conversation_id": "bad/slash-id", "limit": 1}, "InvalidConversationId", {}),
        ("append_memory", {"conversation_id": CID, "items": [[]]}, "InvalidArguments", {"field": "items[0]"}),
        ("append_memory", {"conversation_id": CID, "items": "x"}, "InvalidArguments", {"field": "items"}),
        ("append_memory", {"items": [{}]}, "InvalidArguments", {"field": "conversation_id"}),
        ("recall_memory", {"conversation_id": CID, "count": True}, "InvalidArguments", {"field": "count"}),
        ("recall_memory", {"conversation_id": CID, "count": None}, "InvalidArguments", {"field": "count"}),
        (
            "replay_memory",
            {"conversation_id": CID, "limit": 1, "offset": 2**64},
            "InvalidArguments",
            {"field": "offset"},
        ),
        ("list_conversations", {"limit": -1}, "InvalidArguments", {"field": "limit"}),
        ("list_conversations", {"cursor": []}, "InvalidArguments", {"field": "cursor"}),
    ],
)
def test_violations(tool: str, arguments: dict[str, Any], code: str, extra: dict[str, Any]) -> None:
    error = failure(tool, arguments)
    assert error["code"] == code and error["retryable"] is False
    assert extra.items() <= error.items()
    if code == "InvalidArguments":
        assert error["rule"] and error["field"] in error["message"]


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(
    tool=st.sampled_from(["append_memory", "recall_memory", "replay_memory", "list_conversations"]),
    arguments=st.dictionaries(
        st.sampled_from(["conversation_id", "items", "count", "limit", "offset", "cursor", "other"]),
        json_values,
        max_size=5,
    ),
)
def test_any_json_arguments_validate_or_fail_cleanly(tool: str, arguments: dict[str, Any]) -> None:
    try:
        parse_arguments(tool, arguments)
    except ToolFailure as exc:
        assert exc.code in {"InvalidArguments", "InvalidConversationId", "EmptyBatch", "BatchTooLarge"}
