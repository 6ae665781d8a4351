"""The MCP Inspector CLI, an independent (Node) client, lists, appends and recalls through the server.

Needs ``npx`` and the npm registry (or a warm npm cache); skipped with the
reason otherwise. The package is fetched once per session, outside the tests.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
from mcp_helpers import ServerProcess, basic

from mcp_adapter.credentials import CredentialFile
from mcp_adapter.serve import INSPECTOR_PACKAGE

SITE, PASSWORD = "inspector-site", "inspector-password-0123456789"


@pytest.fixture(scope="session")
def inspector(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """argv prefix running the Inspector CLI; skips when it cannot be made available."""
    npx = shutil.which("npx")
    if npx is None:
        pytest.skip("npx is not installed: the MCP Inspector CLI test needs Node.js")
    cwd = tmp_path_factory.mktemp("inspector")
    argv = [npx, "-y", INSPECTOR_PACKAGE, "--cli"]
    try:
        warm = subprocess.run([*argv, "--help"], capture_output=True, text=True, timeout=300, cwd=cwd)
    except subprocess.TimeoutExpired:
        pytest.skip(f"fetching {INSPECTOR_PACKAGE} with npx took more than 300 s")
    if warm.returncode != 0:
        pytest.skip(f"{INSPECTOR_PACKAGE} is not available via npx: {warm.stderr.strip()[-300:]}")
    return argv


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    data = tmp_path_factory.mktemp("inspector-server") / "data"
    CredentialFile(data).add(SITE, PASSWORD)
    proc = ServerProcess(data)
    yield proc
    assert proc.stop() == 0


def run_inspector(inspector: list[str], server: ServerProcess, *args: str, auth: bool = True) -> Any:
    header = ["--header", f"Authorization: {basic(SITE, PASSWORD)}"] if auth else []
    done = subprocess.run(
        [*inspector, server.url, "--transport", "http", *header, *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=server.data_dir.parent,
    )
    # The CLI prints the JSON result first; with isError results it adds a one-line summary after it.
    decoder = json.JSONDecoder()
    result, _ = decoder.raw_decode(done.stdout.lstrip())
    return result


def test_inspector_lists_the_tools(inspector: list[str], server: ServerProcess) -> None:
    listed = run_inspector(inspector, server, "--method", "tools/list", auth=False)
    tools = {t["name"]: t for t in listed["tools"]}
    assert set(tools) == {"append_memory", "recall_memory", "replay_memory", "list_conversations"} | {
        "memory_verify",
        "memory_upsert",
        "memory_delete",
        "memory_get",
        "memory_search",
    }
    assert tools["append_memory"]["inputSchema"]["properties"]["items"]["maxItems"] == 250
    assert tools["recall_memory"]["annotations"]["readOnlyHint"] is True


def test_inspector_appends_and_recalls(inspector: list[str], server: ServerProcess) -> None:
    appended = run_inspector(
        inspector,
        server,
        "--method",
        "tools/call",
        "--tool-name",
        "append_memory",
        "--tool-arg",
        "conversation_id=inspector-conv-1",
        'items=[{"role": "user", "text": "remember the milk"}, {"role": "assistant", "text": "noted"}]',
    )
    assert appended["isError"] is False
    assert appended["structuredContent"] == {"first_seq": 0, "last_seq": 1}
    recalled = run_inspector(
        inspector,
        server,
        "--method",
        "tools/call",
        "--tool-name",
        "recall_memory",
        "--tool-arg",
        "conversation_id=inspector-conv-1",
        "count=1",
    )
    items = recalled["structuredContent"]["items"]
    assert [(i["seq"], i["payload"]) for i in items] == [(1, {"role": "assistant", "text": "noted"})]


def test_inspector_without_credentials_gets_a_tool_error(inspector: list[str], server: ServerProcess) -> None:
    result = run_inspector(
        inspector,
        server,
        "--method",
        "tools/call",
        "--tool-name",
        "recall_memory",
        "--tool-arg",
        "conversation_id=inspector-conv-1",
        auth=False,
    )
    assert result["isError"] is True
    assert result["_meta"]["convmem/error"]["code"] == "Unauthenticated"
    assert "structuredContent" not in result
