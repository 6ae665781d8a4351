"""End to end over real HTTP: a ``convmem serve`` subprocess on loopback, driven by the MCP SDK's client.

One server (with two sites) serves the whole module; every test uses its own
conversation ids so tests stay independent.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from mcp.shared.exceptions import MCPError
from mcp_helpers import ServerProcess, basic, connect, error_of

from convmem.mcp_adapter.memory_schemas import MEMORY_TOOL_NAMES
from convmem.mcp_adapter.schemas import input_schema, output_schema
from tests.pg_support import backend_credentials

pytestmark = pytest.mark.anyio

ALPHA, ALPHA_PW = "alpha-site", "alpha-password-0123456789"
BRAVO, BRAVO_PW = "bravo-site", "bravo-password-0123456789"


@pytest.fixture(scope="module", params=["file", "postgres"])
def server(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Iterator[ServerProcess]:
    """One server per backend; ``server.creds`` manages its sites from the test."""
    data_dir = tmp_path_factory.mktemp("http") / "data"
    with backend_credentials(request, data_dir) as (creds, store_args):
        creds.add(ALPHA, ALPHA_PW)
        creds.add(BRAVO, BRAVO_PW)
        proc = ServerProcess(data_dir, *store_args)
        proc.creds = creds  # type: ignore[attr-defined]
        yield proc
        rc = proc.stop()
        assert rc == 0, proc.log()


def conv() -> str:
    """A fresh, valid conversation id."""
    return f"t-{uuid.uuid4().hex}"


@pytest.fixture(params=["legacy", "auto"])
def mode(request: pytest.FixtureRequest) -> str:
    """Both connection styles: the initialize handshake and the 2026-07-28 per-request envelope."""
    return str(request.param)


async def call(
    server: ServerProcess, tool: str, args: dict[str, Any], auth: str | None = None, mode: str = "legacy"
) -> Any:
    async with connect(server.url, auth if auth is not None else basic(ALPHA, ALPHA_PW), mode=mode) as client:
        return await client.call_tool(tool, args)


def ok(result: Any) -> dict[str, Any]:
    """The structured content of a successful result, checked against its text twin."""
    assert not result.is_error, result.content
    assert json.loads(result.content[0].text) == result.structured_content
    return dict(result.structured_content)


# -- discovery -----------------------------------------------------------------------


async def test_initialize_and_list_tools_need_no_credentials(server: ServerProcess, mode: str) -> None:
    async with connect(server.url, None, mode=mode) as client:
        assert client.server_info is not None
        assert client.server_info.name == "convmem"
        assert client.server_info.version
        assert client.instructions and "recall_memory" in client.instructions
        tools = {t.name: t for t in (await client.list_tools()).tools}
    spec = {"append_memory", "recall_memory", "replay_memory", "list_conversations"}
    assert set(tools) == spec | set(MEMORY_TOOL_NAMES)
    for name, tool in tools.items():
        if name not in spec:
            continue  # the long-term memory tools: tests/test_memories_mcp.py
        assert tool.input_schema == input_schema(name)
        assert tool.output_schema == output_schema(name)
        assert tool.annotations is not None
        assert tool.annotations.read_only_hint is (name != "append_memory")
        assert tool.annotations.destructive_hint is False


async def test_unknown_tool_is_a_protocol_error(server: ServerProcess, mode: str) -> None:
    async with connect(server.url, basic(ALPHA, ALPHA_PW), mode=mode) as client:
        with pytest.raises(MCPError) as info:
            await client.call_tool("forget_everything", {})
    assert "forget_everything" in str(info.value)
    assert str(info.value).count("(request id ") == 1, str(info.value)


async def test_an_unknown_argument_is_refused_over_the_wire(server: ServerProcess) -> None:
    result = await call(server, "recall_memory", {"conversation_id": conv(), "memory_contxt": "units"})
    error = error_of(result)
    assert error["code"] == "InvalidArguments" and error["field"] == "memory_contxt"
    assert "did you mean `memory_context`?" in result.content[0].text


# -- the four tools --------------------------------------------------------------------


async def test_append_then_read_back_every_way(server: ServerProcess, mode: str) -> None:
    cid = conv()
    async with connect(server.url, basic(ALPHA, ALPHA_PW), mode=mode) as client:
        first = ok(await client.call_tool("append_memory", {"conversation_id": cid, "items": [{"n": 0}, {"n": 1}]}))
        second = ok(
            await client.call_tool(
                "append_memory", {"conversation_id": cid, "items": [{"n": 2, "deep": {"x": [1, None]}}]}
            )
        )
        recalled = ok(await client.call_tool("recall_memory", {"conversation_id": cid}))
        replayed = ok(await client.call_tool("replay_memory", {"conversation_id": cid, "limit": 2, "offset": 1}))
        listed = ok(await client.call_tool("list_conversations", {"limit": 1000}))
    assert first == {"first_seq": 0, "last_seq": 1}
    assert second == {"first_seq": 2, "last_seq": 2}
    items = recalled["items"]
    assert [i["seq"] for i in items] == [0, 1, 2]
    assert [i["payload"] for i in items] == [{"n": 0}, {"n": 1}, {"n": 2, "deep": {"x": [1, None]}}]
    assert items[0]["recorded_at"] == items[1]["recorded_at"] <= items[2]["recorded_at"]
    assert items[0]["recorded_at"].endswith("Z")
    assert replayed["items"] == items[1:3]
    summary = next(s for s in listed["conversations"] if s["conversation_id"] == cid)
    assert summary == {
        "conversation_id": cid,
        "created_at": items[0]["recorded_at"],
        "last_appended_at": items[2]["recorded_at"],
    }


async def test_unknown_conversation_reads_as_empty(server: ServerProcess) -> None:
    assert ok(await call(server, "recall_memory", {"conversation_id": conv()})) == {"items": []}
    assert ok(await call(server, "replay_memory", {"conversation_id": conv(), "limit": 10})) == {"items": []}


async def test_recall_count_defaults_and_bounds(server: ServerProcess) -> None:
    cid = conv()
    async with connect(server.url, basic(ALPHA, ALPHA_PW)) as client:
        ok(await client.call_tool("append_memory", {"conversation_id": cid, "items": [{"i": i} for i in range(60)]}))
        default = ok(await client.call_tool("recall_memory", {"conversation_id": cid}))["items"]
        zero = ok(await client.call_tool("recall_memory", {"conversation_id": cid, "count": 0}))["items"]
        one = ok(await client.call_tool("recall_memory", {"conversation_id": cid, "count": 1}))["items"]
        most = ok(await client.call_tool("recall_memory", {"conversation_id": cid, "count": 1000}))["items"]
        too_many = error_of(await client.call_tool("recall_memory", {"conversation_id": cid, "count": 1001}))
        negative = error_of(await client.call_tool("recall_memory", {"conversation_id": cid, "count": -1}))
        wrong_type = error_of(await client.call_tool("recall_memory", {"conversation_id": cid, "count": "5"}))
    assert [i["seq"] for i in default] == list(range(10, 60))
    assert zero == []
    assert [i["seq"] for i in one] == [59]
    assert [i["seq"] for i in most] == list(range(60))
    for error in (too_many, negative, wrong_type):
        assert error["code"] == "InvalidArguments" and error["field"] == "count"
        assert error["retryable"] is False
    assert "1000" in too_many["rule"] and "0" in negative["rule"]


async def test_replay_paging_and_bounds(server: ServerProcess) -> None:
    cid = conv()
    async with connect(server.url, basic(ALPHA, ALPHA_PW)) as client:
        ok(await client.call_tool("append_memory", {"conversation_id": cid, "items": [{"i": i} for i in range(5)]}))
        default_offset = ok(await client.call_tool("replay_memory", {"conversation_id": cid, "limit": 3}))["items"]
        limit_zero = ok(await client.call_tool("replay_memory", {"conversation_id": cid, "limit": 0}))["items"]
        tail = ok(await client.call_tool("replay_memory", {"conversation_id": cid, "limit": 3, "offset": 3}))["items"]
        past_end = ok(await client.call_tool("replay_memory", {"conversation_id": cid, "limit": 3, "offset": 99}))
        missing_limit = error_of(await client.call_tool("replay_memory", {"conversation_id": cid}))
        big_limit = error_of(await client.call_tool("replay_memory", {"conversation_id": cid, "limit": 1001}))
        neg_offset = error_of(
            await client.call_tool("replay_memory", {"conversation_id": cid, "limit": 1, "offset": -1})
        )
    assert [i["seq"] for i in default_offset] == [0, 1, 2]
    assert limit_zero == []
    assert [i["seq"] for i in tail] == [3, 4]
    assert past_end == {"items": []}
    assert (missing_limit["code"], missing_limit["field"]) == ("InvalidArguments", "limit")
    assert (big_limit["code"], big_limit["field"]) == ("InvalidArguments", "limit")
    assert (neg_offset["code"], neg_offset["field"]) == ("InvalidArguments", "offset")


# -- append errors ----------------------------------------------------------------------


async def test_batch_of_250_is_accepted_and_251_is_refused(server: ServerProcess) -> None:
    cid = conv()
    async with connect(server.url, basic(ALPHA, ALPHA_PW)) as client:
        accepted = ok(
            await client.call_tool("append_memory", {"conversation_id": cid, "items": [{"i": i} for i in range(250)]})
        )
        refused = error_of(
            await client.call_tool("append_memory", {"conversation_id": cid, "items": [{"i": i} for i in range(251)]})
        )
        after = ok(await client.call_tool("recall_memory", {"conversation_id": cid, "count": 1000}))["items"]
    assert accepted == {"first_seq": 0, "last_seq": 249}
    assert refused["code"] == "BatchTooLarge" and refused["retryable"] is False
    assert (refused["limit"], refused["actual"]) == (250, 251)
    assert len(after) == 250


async def test_empty_batch(server: ServerProcess) -> None:
    error = error_of(await call(server, "append_memory", {"conversation_id": conv(), "items": []}))
    assert error["code"] == "EmptyBatch" and error["retryable"] is False


async def test_payload_too_large_names_the_item(server: ServerProcess) -> None:
    big = "x" * (256 * 1024)
    result = await call(server, "append_memory", {"conversation_id": conv(), "items": [{"ok": 1}, {"big": big}]})
    error = error_of(result)
    assert error["code"] == "PayloadTooLarge" and error["retryable"] is False
    assert error["index"] == 1 and error["limit"] == 262144 and error["actual"] > 262144
    assert "PayloadTooLarge" in result.content[0].text


async def test_batch_too_large_in_bytes(server: ServerProcess) -> None:
    chunk = "y" * (200 * 1024)
    error = error_of(await call(server, "append_memory", {"conversation_id": conv(), "items": [{"c": chunk}] * 6}))
    assert error["code"] == "BatchTooLarge" and error["limit"] == 1048576 and error["actual"] > 1048576


@pytest.mark.parametrize(
    ("bad_id", "reason"),
    [
        ("short", "TooShort"),
        ("x" * 65, "TooLong"),
        ("has space!", "InvalidCharacters"),
        ("ünïcödé-id", "InvalidCharacters"),
    ],
)
async def test_invalid_conversation_id(server: ServerProcess, bad_id: str, reason: str) -> None:
    for tool, extra in (
        ("append_memory", {"items": [{"a": 1}]}),
        ("recall_memory", {}),
        ("replay_memory", {"limit": 1}),
    ):
        error = error_of(await call(server, tool, {"conversation_id": bad_id, **extra}))
        assert error["code"] == "InvalidConversationId" and error["reason"] == reason and error["retryable"] is False


async def test_argument_type_errors_name_the_field(server: ServerProcess) -> None:
    async with connect(server.url, basic(ALPHA, ALPHA_PW)) as client:
        not_object = error_of(
            await client.call_tool("append_memory", {"conversation_id": conv(), "items": [{"a": 1}, 7]})
        )
        missing = error_of(await client.call_tool("append_memory", {"conversation_id": conv()}))
        id_type = error_of(await client.call_tool("recall_memory", {"conversation_id": 12345678}))
        cursor_type = error_of(await client.call_tool("list_conversations", {"cursor": 5}))
    assert (not_object["code"], not_object["field"]) == ("InvalidArguments", "items[1]")
    assert (missing["code"], missing["field"]) == ("InvalidArguments", "items")
    assert (id_type["code"], id_type["field"]) == ("InvalidArguments", "conversation_id")
    assert (cursor_type["code"], cursor_type["field"]) == ("InvalidArguments", "cursor")


# -- listing ------------------------------------------------------------------------------


async def test_listing_pages_through_every_conversation_once(server: ServerProcess, tmp_path: Path) -> None:
    site, password = "paging-site", "paging-password-0123456789"
    server.creds.add(site, password)  # type: ignore[attr-defined]
    ids = [f"page-{i:04d}-{uuid.uuid4().hex[:6]}" for i in range(7)]
    async with connect(server.url, basic(site, password)) as client:
        for cid in ids:
            ok(await client.call_tool("append_memory", {"conversation_id": cid, "items": [{"k": cid}]}))
        # Touch the first one again: it becomes the most recently active.
        ok(await client.call_tool("append_memory", {"conversation_id": ids[0], "items": [{"k": "again"}]}))
        empty_page = ok(await client.call_tool("list_conversations", {"limit": 0}))
        pages: list[list[dict[str, Any]]] = []
        cursor = None
        while True:
            page = ok(await client.call_tool("list_conversations", {"limit": 3, "cursor": cursor}))
            pages.append(page["conversations"])
            cursor = page.get("next_cursor")
            if cursor is None:
                break
        whole = ok(await client.call_tool("list_conversations", {}))
    assert empty_page["conversations"] == []
    seen = [s["conversation_id"] for p in pages for s in p]
    assert seen == [s["conversation_id"] for s in whole["conversations"]]
    assert sorted(seen) == sorted(ids) and len(seen) == len(set(seen))
    assert seen[0] == ids[0]
    keys = [(s["last_appended_at"], s["conversation_id"]) for p in pages for s in p]
    assert keys == sorted(keys, key=lambda k: (-_ts(k[0]), k[1]))
    assert all(len(p) <= 3 for p in pages)
    assert whole.get("next_cursor") is None


def _ts(text: str) -> int:
    return int(text.replace("-", "").replace(":", "").replace("T", "").replace(".", "").rstrip("Z"))


async def test_bad_cursors(server: ServerProcess) -> None:
    ok(await call(server, "append_memory", {"conversation_id": conv(), "items": [{"a": 1}]}))
    ok(await call(server, "append_memory", {"conversation_id": conv(), "items": [{"a": 1}]}))
    page = ok(await call(server, "list_conversations", {"limit": 1}))
    token = page["next_cursor"]
    assert isinstance(token, str)
    garbage = error_of(await call(server, "list_conversations", {"cursor": "not-a-cursor"}))
    other_site = error_of(await call(server, "list_conversations", {"cursor": token}, auth=basic(BRAVO, BRAVO_PW)))
    for error in (garbage, other_site):
        assert error["code"] == "InvalidCursor" and error["retryable"] is False
    # The message says what is wrong, the advice what to do: neither repeats the other.
    text = (await call(server, "list_conversations", {"cursor": "not-a-cursor"})).content[0].text
    assert text.lower().count("exactly as received") == 1, text


# -- authentication and isolation -------------------------------------------------------------


@pytest.mark.parametrize(
    ("auth", "needle"),
    [
        ("", "missing or invalid credentials"),
        ("Bearer some-oauth-token", "Bearer tokens are not accepted"),
        (basic(ALPHA, "wrong-password-000000"), "missing or invalid credentials"),
        (basic("no-such-site", ALPHA_PW), "missing or invalid credentials"),
        ("Basic !!!not-base64", "missing or invalid credentials"),
        ("Digest username=alpha-site", "missing or invalid credentials"),
    ],
)
async def test_calls_without_valid_basic_credentials_are_refused(
    server: ServerProcess, auth: str, needle: str, mode: str
) -> None:
    async with connect(server.url, auth or None, mode=mode) as client:
        for tool, args in (
            ("append_memory", {"conversation_id": conv(), "items": [{"a": 1}]}),
            ("recall_memory", {"conversation_id": conv()}),
            ("list_conversations", {}),
        ):
            result = await client.call_tool(tool, args)
            error = error_of(result)
            assert error["code"] == "Unauthenticated" and error["retryable"] is False
            assert needle in result.content[0].text
            assert "Basic" in result.content[0].text


async def test_unknown_site_and_wrong_password_look_the_same(server: ServerProcess) -> None:
    wrong = await call(server, "recall_memory", {"conversation_id": conv()}, auth=basic(ALPHA, "nope-nope-nope"))
    unknown = await call(
        server, "recall_memory", {"conversation_id": conv()}, auth=basic("ghost-site", "nope-nope-nope")
    )
    # Identical apart from each request's own id.
    wrong_error, unknown_error = error_of(wrong), error_of(unknown)
    assert wrong_error.pop("request_id") != unknown_error.pop("request_id")
    assert wrong_error == unknown_error
    assert re.sub(r"request id \w+", "", wrong.content[0].text) == re.sub(
        r"request id \w+", "", unknown.content[0].text
    )


async def test_sites_cannot_see_each_other(server: ServerProcess) -> None:
    cid = conv()
    ok(await call(server, "append_memory", {"conversation_id": cid, "items": [{"secret": "alpha"}]}))
    bravo = basic(BRAVO, BRAVO_PW)
    assert ok(await call(server, "recall_memory", {"conversation_id": cid}, auth=bravo)) == {"items": []}
    assert ok(await call(server, "replay_memory", {"conversation_id": cid, "limit": 10}, auth=bravo)) == {"items": []}
    listed = ok(await call(server, "list_conversations", {"limit": 1000}, auth=bravo))
    assert cid not in {s["conversation_id"] for s in listed["conversations"]}
    # Same id, other site: an independent log starting at seq 0.
    assert ok(await call(server, "append_memory", {"conversation_id": cid, "items": [{"b": 1}]}, auth=bravo)) == {
        "first_seq": 0,
        "last_seq": 0,
    }
    alpha_items = ok(await call(server, "recall_memory", {"conversation_id": cid}))["items"]
    assert [i["payload"] for i in alpha_items] == [{"secret": "alpha"}]


async def test_site_comes_from_each_request_not_the_connection(server: ServerProcess) -> None:
    """One HTTP client switching credentials between calls acts for the site of each call."""
    cid = conv()
    headers = {"Authorization": basic(ALPHA, ALPHA_PW)}
    http = httpx2.AsyncClient(headers=headers, timeout=30)
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    async with http, Client(streamable_http_client(server.url, http_client=http), mode="legacy") as client:
        ok(await client.call_tool("append_memory", {"conversation_id": cid, "items": [{"who": "alpha"}]}))
        http.headers["Authorization"] = basic(BRAVO, BRAVO_PW)
        assert ok(await client.call_tool("recall_memory", {"conversation_id": cid})) == {"items": []}
        http.headers["Authorization"] = "Bearer x"
        assert error_of(await client.call_tool("recall_memory", {"conversation_id": cid}))["code"] == "Unauthenticated"


async def test_password_change_takes_effect_without_restart(server: ServerProcess) -> None:
    site, old, new = "rotate-site", "rotate-password-old-000", "rotate-password-new-000"
    creds = server.creds  # type: ignore[attr-defined]
    creds.add(site, old)
    assert ok(await call(server, "recall_memory", {"conversation_id": conv()}, auth=basic(site, old))) == {"items": []}
    creds.set_password(site, new)
    assert error_of(await call(server, "recall_memory", {"conversation_id": conv()}, auth=basic(site, old)))[
        "code"
    ] == ("Unauthenticated")
    assert ok(await call(server, "recall_memory", {"conversation_id": conv()}, auth=basic(site, new))) == {"items": []}


# -- raw HTTP: health, body limit, DNS rebinding, old protocol versions ---------------------------


def test_healthz(server: ServerProcess) -> None:
    response = httpx2.get(server.base + "/healthz")
    assert response.status_code == 200 and response.json() == {"status": "ok"}


def test_oversized_body_is_refused_before_parsing(server: ServerProcess) -> None:
    body = (
        b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"append_memory","arguments":{"x":"'
        + (b"z" * (5 * 1024 * 1024))
        + b'"}}}'
    )
    response = httpx2.post(
        server.url,
        content=body,
        headers={
            "Content-Type": "application/json",
            "Accept": "application/json, text/event-stream",
            "Authorization": basic(ALPHA, ALPHA_PW),
        },
        timeout=30,
    )
    assert response.status_code == 413


def test_foreign_host_header_is_refused(server: ServerProcess) -> None:
    response = httpx2.post(
        server.url,
        json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
        headers={"Host": "evil.example:80", "Accept": "application/json, text/event-stream"},
    )
    assert response.status_code == 421


@pytest.mark.parametrize("version", ["2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25"])
def test_older_protocol_versions_over_plain_json(server: ServerProcess, version: str) -> None:
    """A client of any handshake-era version can initialize and call tools with plain JSON POSTs."""
    headers = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
    init = httpx2.post(
        server.url,
        headers=headers,
        json={
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {"protocolVersion": version, "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}},
        },
    )
    assert init.status_code == 200, init.text
    assert init.headers["content-type"].startswith("application/json")
    assert init.json()["result"]["protocolVersion"] == version
    assert init.json()["result"]["serverInfo"]["name"] == "convmem"
    headers |= {"MCP-Protocol-Version": version, "Authorization": basic(ALPHA, ALPHA_PW)}
    cid = conv()
    appended = httpx2.post(
        server.url,
        headers=headers,
        json={
            "jsonrpc": "2.0",
            "id": 2,
            "method": "tools/call",
            "params": {"name": "append_memory", "arguments": {"conversation_id": cid, "items": [{"v": version}]}},
        },
    )
    assert appended.status_code == 200, appended.text
    result = appended.json()["result"]
    assert result["structuredContent"] == {"first_seq": 0, "last_seq": 0}
    assert json.loads(result["content"][0]["text"]) == result["structuredContent"]
    failed = httpx2.post(
        server.url,
        headers=headers,
        json={
            "jsonrpc": "2.0",
            "id": 3,
            "method": "tools/call",
            "params": {"name": "append_memory", "arguments": {"conversation_id": cid, "items": []}},
        },
    ).json()["result"]
    assert failed["isError"] is True and "structuredContent" not in failed
    assert failed["_meta"]["convmem/error"]["code"] == "EmptyBatch"
