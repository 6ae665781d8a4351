"""The layers show in the imports: read every module's imports and check their direction.

convmem is built in layers, each importing only those below it:

* the engine core (``convmem.logstore``'s own modules) imports none of its
  sibling packages and nothing of MCP or HTTP;
* ``logstore.maintenance``, ``logstore.memories`` and ``logstore.postgres``
  build on the core; ``memories`` may use ``maintenance`` (its backup copier
  plugs into the backup), never the reverse; ``postgres`` may use
  ``memories`` (its long-term memory store implements ``memories``' interface
  with ``memories``' own rules and ranking), never the reverse, and never
  ``maintenance``;
* ``convmem.mcp_adapter`` (the server) builds on ``logstore``;
* ``convmem.tools`` (operator commands) builds on ``logstore``'s public API.

Nothing anywhere imports the repository's short top-level names
(``logstore``, ``mcp_adapter``, ``tools``): the installed name is ``convmem``.
Imports inside functions count as much as those at the top of a module.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SHORT_NAMES = ("logstore", "mcp_adapter", "tools")
#: Third-party packages that speak MCP or HTTP: never imported by the engine.
PROTOCOL_PACKAGES = ("mcp", "starlette", "uvicorn", "httpx", "httpx2", "h11", "anyio")
#: Layers inside logstore, and the layers each may import.
LOGSTORE_LAYERS = {
    "core": {"core"},
    "maintenance": {"core", "maintenance"},
    "memories": {"core", "maintenance", "memories"},
    "postgres": {"core", "memories", "postgres"},
}
#: What remains to be moved; each entry is a known exception, to be emptied.
KNOWN: set[tuple[str, str]] = set()


def _modules(top: str) -> Iterator[tuple[Path, str]]:
    for path in sorted((REPO / top).rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        rel = path.relative_to(REPO)
        parts = ["convmem", *rel.with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        yield path, ".".join(parts)


def _imports(path: Path, module: str) -> Iterator[str]:
    """Every module ``path`` imports, relative imports resolved against ``module``."""
    is_package = path.name == "__init__.py"
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                base = node.module or ""
            else:
                package = module.split(".") if is_package else module.split(".")[:-1]
                package = package[: len(package) - (node.level - 1)]
                base = ".".join([*package, *([node.module] if node.module else [])])
            yield base
            for alias in node.names:  # `from . import x` imports the submodule x
                yield f"{base}.{alias.name}"


def _layer(module: str) -> str:
    parts = module.split(".")
    if len(parts) >= 3 and parts[2] in LOGSTORE_LAYERS and parts[2] != "core":
        return parts[2]
    return "core"


def _is_module(name: str) -> bool:
    """Whether ``convmem.x.y`` names a module or package (not a name inside one)."""
    rel = REPO / Path(*name.split(".")[1:])
    return rel.with_suffix(".py").is_file() or (rel / "__init__.py").is_file()


def _violations() -> list[str]:
    found: list[str] = []
    for top in ("logstore", "mcp_adapter", "tools", "convmem", "tests", "bench"):
        for path, module in _modules(top):
            rel = str(path.relative_to(REPO))
            for name in _imports(path, module):
                head = name.split(".")[0]
                if head in SHORT_NAMES:
                    found.append(f"{rel}: imports the short name {name!r}; write convmem.{name}")
                if top == "logstore":
                    if head in PROTOCOL_PACKAGES:
                        found.append(f"{rel}: the engine imports {name!r} (MCP/HTTP)")
                    if name.startswith(("convmem.mcp_adapter", "convmem.tools")):
                        found.append(f"{rel}: the engine imports {name!r}")
                    if name.startswith("convmem.logstore.") and _is_module(name):
                        mine, theirs = _layer(module), _layer(name)
                        if theirs not in LOGSTORE_LAYERS[mine]:
                            found.append(f"{rel}: logstore's {mine} imports {name!r} ({theirs})")
                elif top in ("mcp_adapter", "tools"):
                    other = "tools" if top == "mcp_adapter" else "mcp_adapter"
                    if name.startswith(f"convmem.{other}") and _is_module(name) and (rel, name) not in KNOWN:
                        found.append(f"{rel}: {top} imports {name!r}")
    return found


def test_imports_follow_the_layers() -> None:
    assert _violations() == []


@pytest.mark.parametrize(("rel", "name"), sorted(KNOWN))
def test_known_exceptions_are_still_real(rel: str, name: str) -> None:
    """An exception that no longer occurs is removed from KNOWN, so the list only shrinks."""
    path = REPO / rel
    module = ".".join(["convmem", *Path(rel).with_suffix("").parts])
    assert name in set(_imports(path, module)), f"{rel} no longer imports {name}: drop it from KNOWN"


def test_the_checker_sees_a_wrong_import(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from logstore import FileStore\n    from ..memories import site\n")
    names = list(_imports(bad, "convmem.logstore.reader"))
    assert "logstore" in names and "convmem.memories.site" in names
    assert "convmem.logstore.memories.site" in list(_imports(bad, "convmem.logstore.maintenance.x"))
