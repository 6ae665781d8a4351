"""append_memory's optional idempotency key and expected next seq through the MCP server (a real FileStore).

Without them every call answers as the spec says (the conformance tests);
with them: a keyed retry returns the original range, a reused key with other
items is IdempotencyConflict (permanent, naming the range), a stale
``expected_next_seq`` is SeqConflict carrying the actual next seq, and a
malformed key is InvalidArguments before anything is stored.
"""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest
from mcp import Client
from mcp_helpers import error_of

from convmem.logstore import FileStore, Range
from convmem.mcp_adapter.server import Backend, build_server

pytestmark = pytest.mark.anyio

CONV = "conv-mcp-idem-1"


async def test_idempotent_and_optimistic_appends(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    server = build_server(Backend(store=store, data_dir=str(tmp_path), fixed_site="mcp-site"))
    try:
        async with Client(server) as client:
            args = {"conversation_id": CONV, "items": [{"a": 1}, {"a": 2}], "idempotency_key": "turn-1"}
            first = await client.call_tool("append_memory", args)
            again = await client.call_tool("append_memory", args)
            assert first.structured_content == again.structured_content == {"first_seq": 0, "last_seq": 1}
            other = await client.call_tool("append_memory", {**args, "items": [{"a": 3}]})
            error = error_of(other)
            assert error["code"] == "IdempotencyConflict" and error["retryable"] is False
            assert (error["first_seq"], error["last_seq"]) == (0, 1)
            stale = await client.call_tool(
                "append_memory", {"conversation_id": CONV, "items": [{"b": 1}], "expected_next_seq": 1}
            )
            error = error_of(stale)
            assert error["code"] == "SeqConflict" and error["actual_next_seq"] == 2 and not error["retryable"]
            ok = await client.call_tool(
                "append_memory", {"conversation_id": CONV, "items": [{"b": 1}], "expected_next_seq": 2}
            )
            assert ok.structured_content == {"first_seq": 2, "last_seq": 2}
            for bad in ("", "x" * 129, "no spaces"):
                result = await client.call_tool(
                    "append_memory", {"conversation_id": CONV, "items": [{"c": 1}], "idempotency_key": bad}
                )
                error = error_of(result)
                assert error["code"] == "InvalidArguments" and error["field"] == "idempotency_key"
            plain = await client.call_tool("append_memory", {"conversation_id": CONV, "items": [{"d": 1}]})
            assert plain.structured_content == {"first_seq": 3, "last_seq": 3}
        assert len(store.read("mcp-site", CONV, Range(0, 10))) == 4
    finally:
        store.close()


async def test_replay_wait_ms_returns_the_item_that_arrives(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    backend = Backend(store=store, data_dir=str(tmp_path), fixed_site="mcp-site")
    server = build_server(backend)
    try:
        store.append("mcp-site", CONV, [{"n": 0}])
        async with Client(server) as client:
            async with anyio.create_task_group() as tg:

                async def later() -> None:
                    await anyio.sleep(0.3)
                    await client.call_tool("append_memory", {"conversation_id": CONV, "items": [{"n": 1}]})

                tg.start_soon(later)
                got = await client.call_tool(
                    "replay_memory", {"conversation_id": CONV, "offset": 1, "limit": 10, "wait_ms": 30000}
                )
            assert [i["payload"] for i in got.structured_content["items"]] == [{"n": 1}]
            # Not at the end: answered at once, as without wait_ms.
            page = await client.call_tool(
                "replay_memory", {"conversation_id": CONV, "offset": 0, "limit": 10, "wait_ms": 30000}
            )
            assert len(page.structured_content["items"]) == 2
            # Over the bound of waiting calls: answered at once with the empty page.
            backend.followers.max_per_site = 0
            empty = await client.call_tool(
                "replay_memory", {"conversation_id": CONV, "offset": 2, "limit": 10, "wait_ms": 30000}
            )
            assert empty.structured_content == {"items": []}
            bad = await client.call_tool(
                "replay_memory", {"conversation_id": CONV, "offset": 2, "limit": 10, "wait_ms": 30001}
            )
            assert error_of(bad)["code"] == "InvalidArguments"
    finally:
        store.close()
