"""The MCP Inspector CLI, an independent (Node) client, lists, appends and recalls through the server.

Needs Node.js 22.19 or newer (the test extras install one from PyPI; see
``tests/npx.py``) and the npm registry (or a warm npm cache). Without them a
local run skips with the reason; with ``CI=true`` the tests fail instead. The
package is fetched once per session, outside the tests.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
from mcp_helpers import ServerProcess, basic
from node_support import cannot_run, npx_or_skip

from convmem.logstore.site_credentials import CredentialFile
from convmem.mcp_adapter.serve import INSPECTOR_PACKAGE

SITE, PASSWORD = "inspector-site", "inspector-password-0123456789"


@pytest.fixture(scope="session")
def inspector(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[str], dict[str, str]]:
    """argv prefix running the Inspector CLI and its environment; see the module docstring when it cannot run."""
    npx = npx_or_skip()
    cwd = tmp_path_factory.mktemp("inspector")
    argv = [*npx.argv, "-y", INSPECTOR_PACKAGE, "--cli"]
    try:
        warm = subprocess.run([*argv, "--help"], capture_output=True, text=True, timeout=300, cwd=cwd, env=npx.env)
    except subprocess.TimeoutExpired:
        cannot_run(f"fetching {INSPECTOR_PACKAGE} with npx took more than 300 s")
    if warm.returncode != 0:
        cannot_run(f"{INSPECTOR_PACKAGE} is not available via npx: {warm.stderr.strip()[-300:]}")
    return argv, npx.env


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    data = tmp_path_factory.mktemp("inspector-server") / "data"
    CredentialFile(data).add(SITE, PASSWORD)
    proc = ServerProcess(data)
    yield proc
    assert proc.stop() == 0


Inspector = tuple[list[str], dict[str, str]]


def run_inspector(inspector: Inspector, server: ServerProcess, *args: str, auth: bool = True) -> Any:
    header = ["--header", f"Authorization: {basic(SITE, PASSWORD)}"] if auth else []
    argv, env = inspector
    done = subprocess.run(
        [*argv, server.url, "--transport", "http", *header, *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=server.data_dir.parent,
        env=env,
    )
    # The CLI prints the JSON result first; with isError results it adds a one-line summary after it.
    decoder = json.JSONDecoder()
    result, _ = decoder.raw_decode(done.stdout.lstrip())
    return result


def test_inspector_lists_the_tools(inspector: Inspector, server: ServerProcess) -> None:
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


def test_inspector_appends_and_recalls(inspector: Inspector, server: ServerProcess) -> None:
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


def test_inspector_without_credentials_gets_a_tool_error(inspector: Inspector, server: ServerProcess) -> None:
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


def test_cannot_run_fails_in_ci_and_skips_elsewhere(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="must run in CI"):
        cannot_run("no node")
    monkeypatch.delenv("CI")
    with pytest.raises(pytest.skip.Exception, match="no node"):
        cannot_run("no node")


def test_an_old_node_is_not_taken(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    """A node older than 22.19 on PATH (and no wheel) is named in the reason, never used."""
    from tests import npx as tools_npx

    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "node").write_text("#!/bin/sh\necho v22.18.0\n")
    (fake / "node").chmod(0o755)
    (fake / "npx").write_text("#!/bin/sh\nexit 0\n")
    monkeypatch.setattr(tools_npx, "_candidates", lambda: [(str(fake), [str(fake / "npx")], "PATH (fake)")])
    with pytest.raises(tools_npx.NodeUnavailable, match=r"22\.19 or newer.*node 22\.18\.0"):
        tools_npx.find_npx()
