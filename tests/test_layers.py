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
* nothing in ``logstore`` imports anything of convmem outside it: not the
  server, not the tools, not the command line;
* ``convmem.options`` (command-line options both front ends share) builds
  on ``logstore`` only;
* ``convmem.mcp_adapter`` (the server) and ``convmem.tools`` (operator
  commands) build on ``logstore`` and ``convmem.options``, and neither
  imports the other;
* ``convmem.cli`` (the ``convmem`` command) is the one place that puts the
  server and the tools together: nothing imports it but ``convmem.__main__``,
  and only it imports the two command-line modules ``mcp_adapter.cli`` and
  ``tools.cli`` (the server's modules never import its command line back);
* ``convmem.client`` (the Python client) stands alone.

Nothing anywhere imports the repository's short top-level names
(``logstore``, ``mcp_adapter``, ``tools``): the installed name is ``convmem``.
Imports inside functions count as much as those at the top of a module, and
so does a module named to ``importlib.import_module`` or ``__import__`` (a
name built at run time counts by its fixed beginning, e.g. an f-string that
starts with ``{__package__}.`` or ``{__name__}.``).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

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
#: The parts of the convmem package (longest prefix wins), and the parts of convmem each may import.
PARTS = {
    "convmem.logstore": {"convmem.logstore"},
    "convmem.options": {"convmem.logstore", "convmem.options"},
    "convmem.mcp_adapter": {"convmem.logstore", "convmem.options", "convmem.mcp_adapter"},
    "convmem.tools": {"convmem.logstore", "convmem.options", "convmem.tools"},
    "convmem.client": {"convmem.client"},
    "convmem.cli": {"convmem.logstore", "convmem.options", "convmem.mcp_adapter", "convmem.tools", "convmem.cli"},
    "convmem.__main__": {"convmem.cli"},
    # The package itself (convmem/__init__.py): a docstring, nothing to import.
    "convmem": set(),
}
#: The command-line modules of the server and the tools, and the only modules that may import each.
COMMAND_LINES = {
    "convmem.mcp_adapter.cli": {"convmem.cli"},
    "convmem.tools.cli": {"convmem.cli", "convmem.tools.__main__"},
}
#: Where each part's files are in the repository (convmem/ links to logstore/, mcp_adapter/ and tools/).
SOURCES = {"logstore": "convmem.logstore", "mcp_adapter": "convmem.mcp_adapter", "tools": "convmem.tools"}


def _module_name(rel: Path) -> str:
    """The module name of a repository file: tools/stats.py -> convmem.tools.stats, tests/x.py -> tests.x."""
    parts = list(rel.with_suffix("").parts)
    if parts[0] in SOURCES:
        parts.insert(0, "convmem")
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules(top: str) -> Iterator[tuple[Path, str]]:
    for path in sorted((REPO / top).rglob("*.py")):  # rglob does not follow convmem/'s symbolic links
        if "__pycache__" in path.parts:
            continue
        yield path, _module_name(path.relative_to(REPO))


def _dynamic_name(node: ast.expr, package: str, module: str) -> str | None:
    """The module a call to ``import_module``/``__import__`` names, or its fixed beginning; None if unknown."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        fixed = ""
        for part in node.values:
            if isinstance(part, ast.Constant) and isinstance(part.value, str):
                fixed += part.value
            elif (
                isinstance(part, ast.FormattedValue)
                and isinstance(part.value, ast.Name)
                and part.value.id in ("__package__", "__name__")
                and not fixed
            ):
                fixed = package if part.value.id == "__package__" else module
            else:
                break
        return fixed.rstrip(".") or None
    return None


def _resolve(name: str, level: int, package: list[str]) -> str:
    """An absolute module name for ``name`` imported ``level`` dots up from ``package``."""
    if level == 0:
        return name
    base = package[: len(package) - (level - 1)]
    return ".".join([*base, *([name] if name else [])])


def _imports(path: Path, module: str) -> Iterator[str]:
    """Every module ``path`` imports, relative imports resolved against ``module``."""
    is_package = path.name == "__init__.py"
    package = module.split(".") if is_package else module.split(".")[:-1]
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(node.module or "", node.level, package)
            yield base
            for alias in node.names:  # `from . import x` imports the submodule x
                yield f"{base}.{alias.name}"
        elif isinstance(node, ast.Call) and node.args:
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            if called not in ("import_module", "__import__"):
                continue
            name = _dynamic_name(node.args[0], ".".join(package), module)
            if name is None:
                continue
            anchor = next((k.value for k in node.keywords if k.arg == "package"), None)
            if called == "import_module" and name.startswith(".") and isinstance(anchor, ast.Constant):
                level = len(name) - len(name.lstrip("."))
                name = _resolve(name.lstrip("."), level, str(anchor.value).split("."))
            elif called == "import_module" and name.startswith("."):
                # import_module(".x", package=__package__) or similar: relative to this module's package.
                level = len(name) - len(name.lstrip("."))
                name = _resolve(name.lstrip("."), level, package)
            yield name


def _within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def _part(name: str) -> str | None:
    """The part of convmem (a key of PARTS) that module ``name`` belongs to; None outside convmem."""
    matches = [p for p in PARTS if _within(name, p)]
    return max(matches, key=len) if matches else None


def _layer(module: str) -> str:
    parts = module.split(".")
    if len(parts) >= 3 and parts[2] in LOGSTORE_LAYERS and parts[2] != "core":
        return parts[2]
    return "core"


def _is_module(name: str) -> bool:
    """Whether ``convmem.x.y`` names a module or package (not a name inside one)."""
    rel = REPO / "convmem" / Path(*name.split(".")[1:])  # convmem/ links to the three top-level packages
    return rel.with_suffix(".py").is_file() or (rel / "__init__.py").is_file()


def _violations_of(path: Path, module: str, rel: str) -> Iterator[str]:
    """What is wrong with the imports of ``path`` (the module ``module``, the repository file ``rel``)."""
    mine = _part(module)
    for name in _imports(path, module):
        head = name.split(".")[0]
        if head in SHORT_NAMES:
            yield f"{rel}: imports the short name {name!r}; write convmem.{name}"
        if mine is None:
            continue  # tests and bench may import any part of convmem
        if mine == "convmem.logstore" and head in PROTOCOL_PACKAGES:
            yield f"{rel}: the engine imports {name!r} (MCP/HTTP)"
        theirs = _part(name)
        if theirs in (None, "convmem") or not _is_module(name):
            continue  # outside convmem, the bare package (a docstring), or a name inside a module
        if theirs not in PARTS[mine]:
            yield f"{rel}: {mine} imports {name!r} ({theirs})"
        cli = next((c for c in COMMAND_LINES if _within(name, c)), None)
        if cli is not None and module != cli and module not in COMMAND_LINES[cli]:
            yield f"{rel}: imports the command line {cli!r}; only {sorted(COMMAND_LINES[cli])} may"
        elif mine == theirs == "convmem.logstore":
            own, other = _layer(module), _layer(name)
            if other not in LOGSTORE_LAYERS[own]:
                yield f"{rel}: logstore's {own} imports {name!r} ({other})"


def _violations() -> list[str]:
    found: list[str] = []
    for top in ("logstore", "mcp_adapter", "tools", "convmem", "tests", "bench"):
        for path, module in _modules(top):
            found.extend(_violations_of(path, module, str(path.relative_to(REPO))))
    return found


def test_imports_follow_the_layers() -> None:
    assert _violations() == []


def test_every_source_file_has_a_part() -> None:
    """A new top-level module of convmem gets a rule in PARTS before it can be imported from anywhere."""
    for top, part in SOURCES.items():
        assert _part(part) == part, top
    for _path, module in _modules("convmem"):
        assert _part(module) is not None, f"{module}: add it to PARTS with what it may import"


def test_the_checker_sees_a_wrong_import(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from logstore import FileStore\n    from ..memories import site\n")
    names = list(_imports(bad, "convmem.logstore.reader"))
    assert "logstore" in names and "convmem.memories.site" in names
    assert "convmem.logstore.memories.site" in list(_imports(bad, "convmem.logstore.maintenance.x"))


def test_the_checker_reads_names_given_to_import_module(tmp_path: Path) -> None:
    text = (
        "import importlib\n"
        "from importlib import import_module\n"
        "def f(name):\n"
        "    importlib.import_module('convmem.mcp_adapter.serve')\n"
        "    import_module(f'{__package__}.{name}')\n"
        "    import_module(f'{__name__}.{name}')\n"
        "    importlib.import_module('.site_credentials', package='convmem.logstore')\n"
        "    import_module('..cli', __package__)\n"
        "    __import__('convmem.client')\n"
        "    importlib.import_module(name)\n"  # unknowable: not counted
    )
    code = tmp_path / "dyn.py"
    code.write_text(text)
    names = set(_imports(code, "convmem.tools.stats"))
    expected = {"convmem.mcp_adapter.serve", "convmem.tools", "convmem.tools.stats"}
    expected |= {"convmem.logstore.site_credentials", "convmem.cli"}
    assert expected | {"convmem.client"} <= names, names
    found = _violations_of_text(tmp_path, "tools/stats.py", text)
    for wrong in ("convmem.mcp_adapter.serve", "convmem.cli", "convmem.client"):
        assert any(repr(wrong) in v for v in found), (wrong, found)
    assert len(found) == 3, found


def test_the_checker_sees_each_forbidden_direction(tmp_path: Path) -> None:
    """One import in the wrong direction per rule, each reported (so no rule is silently dead)."""
    cases = {
        "logstore/reader.py": "from convmem.mcp_adapter import auth",
        "logstore/writer.py": "def f():\n    import convmem.tools.fsck",
        "logstore/index.py": "from convmem import cli",
        "logstore/codec.py": "from convmem.options import env",
        "logstore/frame.py": "import mcp.types",
        "logstore/ids.py": "from .maintenance import scan_index",
        "logstore/model.py": "from .postgres import PgStore",
        "logstore/postgres/x.py": "from ..maintenance import backup",
        "logstore/maintenance/x.py": "from ..memories import store",
        "logstore/memories/x.py": "from ..postgres import PgStore",
        "tools/stats.py": "from convmem.mcp_adapter.cli import COMMANDS",
        "tools/fsck.py": "import importlib\nimportlib.import_module('convmem.mcp_adapter')",
        "mcp_adapter/serve.py": "from convmem.tools import fsck",
        "mcp_adapter/cli.py": "from convmem.cli import main",
        "mcp_adapter/server.py": "def f():\n    from .cli import COMMANDS",
        "tools/dump.py": "from . import cli",
        "convmem/options.py": "from convmem.mcp_adapter import serve",
        "convmem/client/_sync.py": "from convmem.logstore import FileStore",
        "tests/test_x.py": "import logstore",
    }
    for rel, text in cases.items():
        assert _violations_of_text(tmp_path, rel, text + "\n"), (rel, text)
    allowed = {
        "logstore/postgres/x.py": "from ..memories import store\nfrom ..site_credentials import PasswordHash",
        "logstore/memories/x.py": "from ..maintenance import backup",
        "tools/stats.py": "from convmem.options import add_quota_options\nfrom convmem.logstore import postgres",
        "mcp_adapter/serve.py": "from convmem.logstore.site_credentials import DEMO_SITE",
        "convmem/cli.py": "from convmem.mcp_adapter import cli\nfrom convmem.tools import cli as t",
        "tools/__main__.py": "from .cli import main",
        "tests/test_x.py": "from convmem.mcp_adapter import cli\nfrom convmem.tools import cli as t",
    }
    for rel, text in allowed.items():
        assert _violations_of_text(tmp_path, rel, text + "\n") == [], (rel, text)


def _violations_of_text(tmp_path: Path, rel: str, text: str) -> list[str]:
    """The violations ``text`` would have as the repository file ``rel`` (written under ``tmp_path``)."""
    path = tmp_path / "repo" / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return list(_violations_of(path, _module_name(Path(rel)), rel))
