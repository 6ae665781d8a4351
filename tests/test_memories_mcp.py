"""Long-term memory end to end over MCP: a real ``convmem serve`` process and the SDK client.

The SDK client checks every structured result against the tool's output
schema, so these calls also prove the results match the published schemas.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from mcp_helpers import ServerProcess, basic, connect, error_of

from convmem.mcp_adapter.memory_schemas import MEMORY_TOOL_NAMES
from tests.pg_support import backend_credentials

pytestmark = pytest.mark.anyio

ALPHA, ALPHA_PW = "alpha-memsite", "alpha-password-0123456789"
BRAVO, BRAVO_PW = "bravo-memsite", "bravo-password-0123456789"
CHARLIE, CHARLIE_PW = "charlie-memsite", "charlie-password-0123456789"
A, B, C = basic(ALPHA, ALPHA_PW), basic(BRAVO, BRAVO_PW), basic(CHARLIE, CHARLIE_PW)


@pytest.fixture(scope="module", params=["file", "postgres"])
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A server keeping memories in its data directory, or (``--store postgresql://``) in PostgreSQL."""
    data_dir = tmp_path_factory.mktemp("memories-mcp") / "data"
    with backend_credentials(request, data_dir) as (creds, store_args):
        creds.add(ALPHA, ALPHA_PW)
        creds.add(BRAVO, BRAVO_PW)
        creds.add(CHARLIE, CHARLIE_PW)
        proc = ServerProcess(data_dir, *store_args)
        proc.backend = request.param  # type: ignore[attr-defined]
        proc.store_args = store_args  # type: ignore[attr-defined]
        yield proc
        rc = proc.stop()
        assert rc == 0, proc.log()


def kept(server: ServerProcess) -> list[tuple[str, bytes]]:
    """Where the server keeps memories, as (name, bytes): its sites' files, or its memory tables' rows."""
    out = [(str(p), p.read_bytes()) for p in sorted(server.data_dir.rglob("*")) if p.is_file() and "sites" in p.parts]
    args: list[str] = server.store_args  # type: ignore[attr-defined]
    if args:
        import psycopg

        dsn, schema = args[1], args[3]
        with psycopg.connect(dsn, autocommit=True) as conn:
            for table in ("memories", "memory_sites", "memory_tokens"):
                rows = conn.execute(f'SELECT * FROM "{schema}".{table} ORDER BY 1, 2'.encode()).fetchall()
                out.append((table, repr(rows).encode() + b"".join(bytes(v) for r in rows for v in r
                                                                  if isinstance(v, bytes | memoryview))))
    return out


def ok(result: Any) -> dict[str, Any]:
    assert not result.is_error, result.content
    assert json.loads(result.content[0].text) == result.structured_content
    return dict(result.structured_content)


def memory(**over: Any) -> dict[str, Any]:
    tag = uuid.uuid4().hex[:8]
    base = {
        "category": "preference",
        "subject": f"Units of measure {tag}",
        "summary": f"The user wants metric units, Celsius temperatures {tag}",
        "details": "Said so while planning a hiking trip.",
        "tags": ["units", tag],
        "source_uris": ["https://notes.example/trip"],
    }
    base.update(over)
    return base


async def test_tools_are_listed_with_their_schemas(server: ServerProcess) -> None:
    async with connect(server.url, None) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
    assert set(MEMORY_TOOL_NAMES) <= set(tools)
    upsert = tools["memory_upsert"].input_schema
    assert upsert["$defs"]["MemoryFields"]["properties"]["subject"]["maxLength"] == 200
    assert "verify_token" not in upsert["required"]
    assert tools["memory_delete"].annotations.destructive_hint is True
    assert "LONG-TERM" in tools["memory_search"].description
    assert "CONVERSATION LOG" in tools["append_memory"].description
    assert "long-term memory" not in tools["append_memory"].description.split("\n\n")[0].lower()


async def test_verify_first_workflow(server: ServerProcess) -> None:
    async with connect(server.url, A) as client:
        raw = memory(dedupe_key=f"units-{uuid.uuid4().hex[:6]}")
        refused = error_of(await client.call_tool("memory_upsert", {"memory": raw}))
        assert refused["code"] == "VerifyRequired" and refused["retryable"] is False
        text = (await client.call_tool("memory_upsert", {"memory": raw})).content[0].text
        assert "memory_verify" in text

        verified = ok(await client.call_tool("memory_verify", {"intent": "create", "candidate": raw}))
        assert verified["related"] == [] and verified["expires_at"].endswith("Z")
        token = verified["verify_token"]
        created = ok(await client.call_tool("memory_upsert", {"memory": raw, "verify_token": token}))["memory"]
        assert created["id"].startswith("mem_") and created["version"] == 1 and created["status"] == "active"
        again = error_of(await client.call_tool("memory_upsert", {"memory": raw, "verify_token": token}))
        assert again["code"] == "VerifyRequired"

        # A second copy of the same fact is refused, naming the memory that holds the key.
        dup = memory(dedupe_key=raw["dedupe_key"])
        related = ok(await client.call_tool("memory_verify", {"intent": "create", "candidate": dup}))
        assert related["related"][0]["id"] == created["id"]
        failed = error_of(
            await client.call_tool("memory_upsert", {"memory": dup, "verify_token": related["verify_token"]})
        )
        assert failed["code"] == "DuplicateMemory" and failed["existing_id"] == created["id"]

        got = ok(await client.call_tool("memory_get", {"memory_id": created["id"]}))["memory"]
        assert got["details"] == raw["details"] and got["source_uris"] == raw["source_uris"]
        found = ok(await client.call_tool("memory_search", {"query": "metric Celsius", "tags": [raw["tags"][1]]}))
        assert [m["id"] for m in found["memories"]] == [created["id"]]
        assert isinstance(found["memories"][0]["score"], float)

        changed = dict(raw, summary="Metric units, but miles for running distances")
        upd = ok(
            await client.call_tool(
                "memory_verify", {"intent": "update", "candidate": changed, "memory_id": created["id"]}
            )
        )
        assert upd["related"][0]["id"] == created["id"]
        conflict = error_of(
            await client.call_tool(
                "memory_upsert",
                {
                    "memory": changed,
                    "memory_id": created["id"],
                    "verify_token": upd["verify_token"],
                    "expected_version": 7,
                },
            )
        )
        assert conflict["code"] == "VersionConflict" and conflict["current_version"] == 1
        updated = ok(
            await client.call_tool(
                "memory_upsert",
                {
                    "memory": changed,
                    "memory_id": created["id"],
                    "verify_token": upd["verify_token"],
                    "expected_version": 1,
                },
            )
        )["memory"]
        assert updated["version"] == 2 and updated["summary"] == changed["summary"]

        dele = ok(await client.call_tool("memory_verify", {"intent": "delete", "memory_id": created["id"]}))
        soft = ok(
            await client.call_tool("memory_delete", {"memory_id": created["id"], "verify_token": dele["verify_token"]})
        )
        assert soft["status"] == "deleted" and soft["memory"]["status"] == "deleted"
        gone = ok(await client.call_tool("memory_search", {"query": "metric Celsius miles"}))
        assert created["id"] not in [m["id"] for m in gone["memories"]]
        dele = ok(
            await client.call_tool("memory_verify", {"intent": "delete", "memory_id": created["id"], "force": True})
        )
        erased = ok(
            await client.call_tool(
                "memory_delete", {"memory_id": created["id"], "verify_token": dele["verify_token"], "force": True}
            )
        )
        assert erased == {"memory_id": created["id"], "status": "erased", "memory": None}
        missing = error_of(await client.call_tool("memory_get", {"memory_id": created["id"]}))
        assert missing["code"] == "NotFound"
    assert raw["summary"].encode() not in b"".join(p.read_bytes() for p in server.data_dir.rglob("*") if p.is_file())
    assert raw["summary"].encode() not in b"".join(data for _, data in kept(server))


BAD_CALLS = [
    ("memory_verify", {"intent": "rename"}, "intent"),
    ("memory_verify", {"intent": "create"}, "candidate"),
    (
        "memory_verify",
        {"intent": "create", "candidate": {"category": "c", "subject": "s" * 201, "summary": "x"}},
        "candidate.subject",
    ),
    ("memory_verify", {"intent": "delete", "memory_id": "mem_nope"}, "memory_id"),
    ("memory_upsert", {"memory": "not an object"}, "memory"),
    ("memory_upsert", {"memory": {"category": "c", "subject": "s", "summary": "x", "tags": ["t"] * 13}}, "memory.tags"),
    (
        "memory_upsert",
        {"memory": {"category": "c", "subject": "s", "summary": "x", "source_uris": ["rel/path"]}},
        "memory.source_uris[0]",
    ),
    (
        "memory_upsert",
        {"memory": {"category": "c", "subject": "s", "summary": "x"}, "expected_version": 0},
        "expected_version",
    ),
    ("memory_upsert", {"memory": {"category": "c", "subject": "s", "summary": "x"}, "verify_token": 5}, "verify_token"),
    ("memory_delete", {"memory_id": "mem_x", "force": "yes"}, "force"),
    ("memory_delete", {}, "memory_id"),
    ("memory_get", {"memory_id": 12}, "memory_id"),
    ("memory_search", {"query": ""}, "query"),
    ("memory_search", {"query": "q" * 1001}, "query"),
    ("memory_search", {"query": "q", "limit": 21}, "limit"),
    ("memory_search", {"query": "q", "limit": 0}, "limit"),
    ("memory_search", {"query": "q", "tags": ["t" * 65]}, "tags[0]"),
    ("memory_search", {"query": "q", "category": ""}, "category"),
    ("memory_search", {"query": "q", "include_deleted": "no"}, "include_deleted"),
    ("recall_memory", {"conversation_id": "conv-0000001", "memory_context": ""}, "memory_context"),
    (
        "append_memory",
        {"conversation_id": "conv-0000001", "items": [{}], "memory_context": "c" * 1001},
        "memory_context",
    ),
]


@pytest.mark.parametrize(("tool", "args", "field"), BAD_CALLS, ids=[f"{t}-{f}" for t, _, f in BAD_CALLS])
async def test_malformed_arguments_name_the_field(
    server: ServerProcess, tool: str, args: dict[str, Any], field: str
) -> None:
    before = [(name, len(data)) for name, data in kept(server)]
    async with connect(server.url, B) as client:
        error = error_of(await client.call_tool(tool, args))
    assert error["code"] == "InvalidArguments" and error["field"] == field, error
    assert [(name, len(data)) for name, data in kept(server)] == before


async def _create(client: Any, raw: dict[str, Any]) -> dict[str, Any]:
    token = ok(await client.call_tool("memory_verify", {"intent": "create", "candidate": raw}))["verify_token"]
    return ok(await client.call_tool("memory_upsert", {"memory": raw, "verify_token": token}))["memory"]


async def test_memory_context_surfaces_on_recall_and_append(server: ServerProcess) -> None:
    cid = f"t-{uuid.uuid4().hex}"
    async with connect(server.url, A) as client:
        deploy = await _create(
            client,
            memory(
                category="procedure", subject="Deploy branch", summary="Deploys go out from the release branch only"
            ),
        )
        await _create(client, memory(subject="Favourite editor", summary="The user edits in Helix"))
        appended = await client.call_tool(
            "append_memory",
            {"conversation_id": cid, "items": [{"text": "let's ship"}], "memory_context": "deploy the release branch"},
        )
        assert not appended.is_error
        sc = appended.structured_content
        assert (sc["first_seq"], sc["last_seq"]) == (0, 0)
        assert 1 <= len(sc["memories"]) <= 2
        assert sc["memories"][0] == {"id": deploy["id"], "subject": deploy["subject"], "summary": deploy["summary"]}
        text = appended.content[0].text
        assert "Relevant memories" in text and f"{deploy['subject']}: {deploy['summary']}" in text
        assert json.loads(text.split("\n\n")[0]) == {"first_seq": 0, "last_seq": 0}
        recalled = await client.call_tool(
            "recall_memory", {"conversation_id": cid, "memory_context": "how do deploys from the release branch work"}
        )
        assert recalled.structured_content["memories"][0]["id"] == deploy["id"]
        assert [i["payload"] for i in recalled.structured_content["items"]] == [{"text": "let's ship"}]
        # Shown before is no reason to hide it: the same line comes back.
        again = await client.call_tool(
            "recall_memory", {"conversation_id": cid, "memory_context": "how do deploys from the release branch work"}
        )
        assert again.structured_content["memories"] == recalled.structured_content["memories"]
    async with connect(server.url, B) as client:  # another site never sees alpha's memories
        other = await client.call_tool(
            "recall_memory", {"conversation_id": cid, "memory_context": "deploy release branch"}
        )
        assert other.structured_content["memories"] == []
        assert "none found" in other.content[0].text
        found = ok(await client.call_tool("memory_search", {"query": "deploy release branch"}))
        assert found["memories"] == []


async def test_spec_tools_answer_unchanged_without_memory_context(server: ServerProcess) -> None:
    cid = f"t-{uuid.uuid4().hex}"
    async with connect(server.url, A) as client:
        await _create(client, memory(subject="Unrelated fact", summary="shipping release branch"))
        appended = ok(await client.call_tool("append_memory", {"conversation_id": cid, "items": [{"n": 1}, {"n": 2}]}))
        assert appended == {"first_seq": 0, "last_seq": 1}
        recalled = ok(await client.call_tool("recall_memory", {"conversation_id": cid, "count": 1}))
        assert list(recalled) == ["items"] and [i["payload"] for i in recalled["items"]] == [{"n": 2}]
        replayed = ok(await client.call_tool("replay_memory", {"conversation_id": cid, "limit": 5}))
        assert list(replayed) == ["items"] and len(replayed["items"]) == 2
        listed = ok(await client.call_tool("list_conversations", {"limit": 1000}))
        assert set(listed) == {"conversations", "next_cursor"}
        raw = await client.call_tool("recall_memory", {"conversation_id": cid, "count": 1})
        assert len(raw.content) == 1 and raw.content[0].text == json.dumps(recalled, separators=(",", ":"))


async def test_a_failing_memory_store_never_fails_the_log_call(server: ServerProcess) -> None:
    if server.backend != "file":  # type: ignore[attr-defined]
        pytest.skip("damages the memory log of a data directory")
    cid = f"t-{uuid.uuid4().hex}"
    async with connect(server.url, C) as client:  # a site of its own: its memories stay damaged
        await _create(client, memory(subject="Damaged later", summary="this site's memory log gets a bad header"))
        log = server.data_dir / "sites" / CHARLIE.encode().hex() / "memories" / "00000000000000000000.seg"
        damaged = log.with_name("replacement")
        damaged.write_bytes(b"\x00" * 64)
        damaged.replace(log)  # a new file (new inode): the server reads it again and finds it damaged
        result = await client.call_tool(
            "append_memory", {"conversation_id": cid, "items": [{"n": 1}], "memory_context": "bad header"}
        )
        assert not result.is_error
        assert result.structured_content == {"first_seq": 0, "last_seq": 0, "memories": []}
        assert "Relevant memories: unavailable (Corrupted, permanent: ask the operator)" in result.content[0].text
        error = error_of(await client.call_tool("memory_search", {"query": "damaged"}))
        assert error["code"] == "Corrupted" and error["offset"] == 0
        assert not error["file"].startswith("/")
