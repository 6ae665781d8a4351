"""End to end over stdio: ``convmem serve --stdio`` launched by the MCP SDK's stdio client."""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp_helpers import convmem_cmd, error_of, subprocess_env

from convmem.logstore import Tail, open_store
from convmem.logstore.site_credentials import CredentialFile

pytestmark = pytest.mark.anyio

SITE, PASSWORD = "stdio-site", "stdio-password-0123456789"


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    data = tmp_path / "data"
    CredentialFile(data).add(SITE, PASSWORD)
    return data


async def test_stdio_round_trip(data_dir: Path) -> None:
    argv = convmem_cmd("serve", "--stdio", "--site", SITE, "--data-dir", str(data_dir))
    params = StdioServerParameters(
        command=argv[0], args=argv[1:], env=subprocess_env(CONVMEM_PASSWORD=PASSWORD), cwd=str(data_dir.parent)
    )
    async with Client(params, mode="legacy") as client:
        assert client.server_info is not None and client.server_info.name == "convmem"
        names = {t.name for t in (await client.list_tools()).tools}
        assert names == {"append_memory", "recall_memory", "replay_memory", "list_conversations"} | {
            "memory_verify",
            "memory_upsert",
            "memory_delete",
            "memory_get",
            "memory_search",
        }
        appended = await client.call_tool("append_memory", {"conversation_id": "stdio-conv-1", "items": [{"a": 1}]})
        assert appended.structured_content == {"first_seq": 0, "last_seq": 0}
        recalled = await client.call_tool("recall_memory", {"conversation_id": "stdio-conv-1"})
        assert [i["payload"] for i in recalled.structured_content["items"]] == [{"a": 1}]
        listed = await client.call_tool("list_conversations", {})
        assert [c["conversation_id"] for c in listed.structured_content["conversations"]] == ["stdio-conv-1"]
        assert error_of(await client.call_tool("append_memory", {"conversation_id": "x", "items": [{}]}))["code"] == (
            "InvalidConversationId"
        )


def test_stdio_refuses_a_wrong_password(data_dir: Path) -> None:
    argv = convmem_cmd("serve", "--stdio", "--site", SITE, "--data-dir", str(data_dir))
    done = subprocess.run(
        argv, input="", capture_output=True, text=True, timeout=60, env=subprocess_env(CONVMEM_PASSWORD="wrong-one")
    )
    assert done.returncode == 3
    assert "wrong" in done.stderr
    missing = subprocess.run(argv, input="", capture_output=True, text=True, timeout=60, env=subprocess_env())
    assert missing.returncode == 2 and "CONVMEM_PASSWORD" in missing.stderr


def test_stdio_sigterm_exits_zero_after_answering(data_dir: Path) -> None:
    """Raw JSON-RPC over the pipes: an acknowledged append survives SIGTERM, and the exit status is 0."""
    argv = convmem_cmd("serve", "--stdio", "--site", SITE, "--data-dir", str(data_dir))
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=subprocess_env(CONVMEM_PASSWORD=PASSWORD),
    )
    assert proc.stdin is not None and proc.stdout is not None

    def request(message: dict[str, object]) -> dict[str, object]:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(json.dumps(message) + "\n")
        proc.stdin.flush()
        return dict(json.loads(proc.stdout.readline()))

    try:
        init = request(
            {
                "jsonrpc": "2.0",
                "id": 1,
                "method": "initialize",
                "params": {
                    "protocolVersion": "2025-06-18",
                    "capabilities": {},
                    "clientInfo": {"name": "raw", "version": "0"},
                },
            }
        )
        assert init["result"]["serverInfo"]["name"] == "convmem"  # type: ignore[index]
        proc.stdin.write(json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}) + "\n")
        appended = request(
            {
                "jsonrpc": "2.0",
                "id": 2,
                "method": "tools/call",
                "params": {
                    "name": "append_memory",
                    "arguments": {"conversation_id": "sigterm-conv", "items": [{"k": 1}]},
                },
            }
        )
        assert appended["result"]["structuredContent"] == {"first_seq": 0, "last_seq": 0}  # type: ignore[index]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    with open_store(data_dir) as store:
        assert [i.payload for i in store.read(SITE, "sigterm-conv", Tail(10))] == [{"k": 1}]
