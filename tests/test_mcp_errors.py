"""How storage failures and unexpected exceptions reach the client.

The HTTP tests provoke every error a real store produces on demand; the
failures a healthy disk cannot be made to produce (Unavailable, Io, an
unexpected exception) are raised here by a small failing store behind the real
server, reached in process through the SDK's own client.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from mcp import Client
from mcp_helpers import error_of

from convmem.logstore import (
    BatchTooLarge,
    ConversationFull,
    ConversationListing,
    Corrupted,
    EmptyBatch,
    InvalidConversationId,
    InvalidCursor,
    InvalidPayload,
    Io,
    ListSelector,
    MemoryItem,
    MemoryStore,
    PayloadTooLarge,
    ReadSelector,
    SeqRange,
    StoreError,
    Timeout,
    Unavailable,
)
from convmem.mcp_adapter.errors import from_store_error
from convmem.mcp_adapter.server import Backend, build_server

pytestmark = pytest.mark.anyio


class FailingStore(MemoryStore):
    """Raises the configured exception from every call."""

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc

    def append(self, site: str, conversation_id: str, payloads: Sequence[Mapping[str, Any]]) -> SeqRange:
        raise self.exc

    def read(self, site: str, conversation_id: str, selector: ReadSelector) -> list[MemoryItem]:
        raise self.exc

    def list_conversations(self, site: str, selector: ListSelector) -> ConversationListing:
        raise self.exc

    def sites(self) -> list[str]:
        return []

    def drop_site(self, site: str) -> None:
        raise self.exc

    def close(self) -> None:
        pass


@pytest.mark.parametrize(
    ("exc", "code", "retryable", "details"),
    [
        (Unavailable("the store is closed"), "Unavailable", True, {}),
        (Timeout(5.0), "Timeout", True, {"waited_seconds": 5.0}),
        (Io("write failed: No space left on device", 28), "Io", True, {"errno": 28}),
        (ConversationFull(100_000, 100_001), "ConversationFull", False, {"limit": 100_000, "actual": 100_001}),
        (PayloadTooLarge(262_144, 300_000, 3), "PayloadTooLarge", False, {"index": 3, "actual": 300_000}),
        (BatchTooLarge(1_048_576, 2_000_000), "BatchTooLarge", False, {"unit": "bytes"}),
        (InvalidConversationId("TooLong", "x" * 70), "InvalidConversationId", False, {"reason": "TooLong"}),
        (InvalidCursor(), "InvalidCursor", False, {}),
        (InvalidPayload(2, "nesting too deep"), "InvalidArguments", False, {"field": "items[2]"}),
    ],
)
async def test_store_errors_reach_the_client(
    exc: StoreError, code: str, retryable: bool, details: dict[str, Any]
) -> None:
    server = build_server(Backend(store=FailingStore(exc), data_dir="/srv/data", fixed_site="error-site"))
    async with Client(server) as client:
        result = await client.call_tool("append_memory", {"conversation_id": "error-conv", "items": [{"a": 1}]})
    error = error_of(result)
    assert error["code"] == code and error["retryable"] is retryable
    assert details.items() <= error.items()
    text = result.content[0].text
    assert text.startswith(code) and ("retryable" if retryable else "permanent") in text


async def test_corrupted_names_the_file_relative_to_the_data_dir() -> None:
    exc = Corrupted("/srv/data/sites/ab/c/00/11/cd/00000000000000000000.seg", 4096, "checksum mismatch")
    server = build_server(Backend(store=FailingStore(exc), data_dir="/srv/data", fixed_site="error-site"))
    async with Client(server) as client:
        result = await client.call_tool("recall_memory", {"conversation_id": "error-conv"})
    error = error_of(result)
    assert error["code"] == "Corrupted" and error["retryable"] is False
    assert error["file"] == "sites/ab/c/00/11/cd/00000000000000000000.seg" and error["offset"] == 4096
    assert "/srv/data" not in result.content[0].text


async def test_unexpected_exceptions_are_retryable_internal_errors_without_internals(
    caplog: pytest.LogCaptureFixture,
) -> None:
    secret = "/very/private/path/and/stack-details"
    server = build_server(Backend(store=FailingStore(RuntimeError(secret)), data_dir="/srv", fixed_site="error-site"))
    async with Client(server) as client:
        result = await client.call_tool("list_conversations", {})
    error = error_of(result)
    assert error["code"] == "InternalError" and error["retryable"] is True
    assert secret not in result.content[0].text and secret not in str(error)
    request_id = error["request_id"]
    assert request_id in result.content[0].text
    assert any(request_id in r.getMessage() and r.exc_info for r in caplog.records)


def test_from_store_error_covers_every_spec_code(tmp_path: Path) -> None:
    mapped = {
        from_store_error(e, str(tmp_path)).code
        for e in (
            InvalidConversationId("TooShort", "x"),
            EmptyBatch(),
            BatchTooLarge(1, 2),
            PayloadTooLarge(1, 2, 0),
            ConversationFull(1, 2),
            Unavailable("x"),
            Timeout(1.0),
            Io("x"),
            Corrupted(str(tmp_path / "f.seg"), 0, "x"),
        )
    }
    assert mapped == {
        "InvalidConversationId",
        "EmptyBatch",
        "BatchTooLarge",
        "PayloadTooLarge",
        "ConversationFull",
        "Unavailable",
        "Timeout",
        "Io",
        "Corrupted",
    }
