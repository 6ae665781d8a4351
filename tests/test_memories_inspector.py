"""The MCP Inspector CLI (an independent Node client) reads the memory tools and runs the verify-first workflow.

What an agent reads in the Inspector's tool listing must let it tell the two
memories apart: every description names the one it touches.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from mcp_helpers import ServerProcess
from test_mcp_inspector import PASSWORD, SITE, inspector, run_inspector

from convmem.logstore.site_credentials import CredentialFile

__all__ = ["inspector"]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    data = tmp_path_factory.mktemp("inspector-memories") / "data"
    CredentialFile(data).add(SITE, PASSWORD)
    proc = ServerProcess(data)
    yield proc
    assert proc.stop() == 0


def call(inspector: list[str], server: ServerProcess, tool: str, **args: Any) -> Any:
    argv = ["--method", "tools/call", "--tool-name", tool, "--tool-arg"]
    argv += [f"{k}={json.dumps(v) if not isinstance(v, str) else v}" for k, v in args.items()]
    return run_inspector(inspector, server, *argv)


def test_listing_tells_the_two_memories_apart(inspector: list[str], server: ServerProcess) -> None:
    listed = run_inspector(inspector, server, "--method", "tools/list", auth=False)
    tools = {t["name"]: t for t in listed["tools"]}
    for name in ("append_memory", "recall_memory", "replay_memory", "list_conversations"):
        assert "CONVERSATION LOG" in tools[name]["description"], name
        assert "LONG-TERM" not in tools[name]["description"], name
    for name in ("memory_verify", "memory_upsert", "memory_delete", "memory_get", "memory_search"):
        assert "LONG-TERM memories" in tools[name]["description"], name
    for name in ("memory_verify", "memory_upsert"):
        assert "Never store secrets" in tools[name]["description"]
    assert "memory_context" in tools["recall_memory"]["inputSchema"]["properties"]
    assert tools["recall_memory"]["inputSchema"]["required"] == ["conversation_id"]


def test_verify_then_upsert_then_surface(inspector: list[str], server: ServerProcess) -> None:
    candidate = {"category": "convention", "subject": "Commit style", "summary": "Commit messages are imperative"}
    refused = call(inspector, server, "memory_upsert", memory=candidate)
    assert refused["isError"] is True and refused["_meta"]["convmem/error"]["code"] == "VerifyRequired"
    verified = call(inspector, server, "memory_verify", intent="create", candidate=candidate)
    token = verified["structuredContent"]["verify_token"]
    stored = call(inspector, server, "memory_upsert", memory=candidate, verify_token=token)
    assert stored["isError"] is False
    mid = stored["structuredContent"]["memory"]["id"]
    recalled = call(
        inspector, server, "recall_memory", conversation_id="inspector-mem-1", memory_context="write a commit message"
    )
    assert recalled["structuredContent"]["items"] == []
    assert recalled["structuredContent"]["memories"][0]["id"] == mid
    assert "Relevant memories" in recalled["content"][0]["text"]
