"""Wheel layout for convmem: every installed module lives under the one name ``convmem``.

The repository keeps ``logstore/``, ``mcp_adapter/`` and ``tools/`` at its top
level, and their code imports each other by those short names. A wheel must
not install such generic top-level names (another distribution's ``tools``
would collide with ours), so the build maps each directory under ``convmem``
(``convmem.logstore`` <- ``logstore/`` ...) and rewrites, in the built copies
only, every absolute import of one of them: ``from logstore import X``
becomes ``from convmem.logstore import X``. Relative imports need nothing.

Only ``from PKG... import`` statements are rewritten; a plain ``import
logstore`` (which would bind a different name after rewriting) fails the
build with a message saying so, rather than producing a wheel that breaks at
run time. ``bench/`` is a development tool run from a checkout and is not
installed. Editable installs copy nothing and are left alone: there the
short names are the checkout's own top-level packages.
"""

from __future__ import annotations

import ast
import io
import os
import tokenize

#: The installed distribution's only top-level import name.
PREFIX = "convmem"
#: Repository directories installed under PREFIX.
MAPPED = ("logstore", "mcp_adapter", "tools")
#: Non-Python files shipped inside packages.
PACKAGE_DATA = {f"{PREFIX}.logstore": ["FORMAT.md", "py.typed"]}


class LayoutError(Exception):
    """The source uses an import form the wheel build cannot map."""


def package_layout(root: str) -> tuple[list[str], dict[str, str]]:
    """``(packages, package_dir)`` for setuptools: ``convmem`` plus every package under the mapped directories."""
    packages = [PREFIX]
    package_dir = {PREFIX: PREFIX}
    for top in MAPPED:
        package_dir[f"{PREFIX}.{top}"] = top
        for dirpath, dirnames, filenames in os.walk(os.path.join(root, top)):
            dirnames[:] = sorted(d for d in dirnames if d != "__pycache__" and not d.startswith("."))
            if "__init__.py" not in filenames:
                dirnames[:] = []
                continue
            rel = os.path.relpath(dirpath, root).replace(os.sep, ".")
            packages.append(f"{PREFIX}.{rel}")
    return packages, package_dir


def rewrite_imports(source: str, filename: str = "<source>") -> str:
    """``source`` with each absolute ``from logstore|mcp_adapter|tools...`` import moved under ``convmem``."""
    tree = ast.parse(source, filename)
    lines = source.splitlines(keepends=True)
    starts: set[tuple[int, int]] = set()  # (row, character column) of each `from` to rewrite
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in MAPPED:
                    raise LayoutError(
                        f"{filename}:{node.lineno}: `import {alias.name}` cannot be mapped under {PREFIX!r}; "
                        f"write `from {alias.name.rpartition('.')[0] or alias.name} import ...` instead"
                    )
        elif (
            isinstance(node, ast.ImportFrom)
            and node.level == 0
            and node.module is not None
            and node.module.split(".")[0] in MAPPED
        ):
            line = lines[node.lineno - 1]
            col = len(line.encode("utf-8")[: node.col_offset].decode("utf-8"))
            starts.add((node.lineno, col))
    if not starts:
        return source
    inserts: list[tuple[int, int]] = []
    pending = False
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.NAME and tok.string == "from" and tok.start in starts:
            pending = True
        elif pending and tok.type == tokenize.NAME:
            inserts.append(tok.start)
            pending = False
    if len(inserts) != len(starts):  # pragma: no cover - the tokenizer and the parser disagree
        raise LayoutError(f"{filename}: could not locate every import to rewrite")
    for row, col in sorted(inserts, reverse=True):
        line = lines[row - 1]
        lines[row - 1] = line[:col] + PREFIX + "." + line[col:]
    out = "".join(lines)
    ast.parse(out, filename)
    return out


def rewrite_file(path: str) -> None:
    """Rewrite one built ``.py`` file in place (idempotent)."""
    with open(path, encoding="utf-8") as f:
        source = f.read()
    new = rewrite_imports(source, path)
    if new != source:
        with open(path, "w", encoding="utf-8") as f:
            f.write(new)


# -- the dependency lock ----------------------------------------------------------------
#
# requirements.lock pins every runtime and test dependency with hashes (made by
# `make lock` with uv from pyproject.toml's ranges). Its first line records a
# fingerprint of those ranges, so a pyproject.toml edited since the lock was
# made is noticed (`python build_support.py check-lock`, run by `make test`).

LOCK_FILE = "requirements.lock"
FINGERPRINT_TAG = "# pyproject-fingerprint: "


def dependency_fingerprint(pyproject_path: str) -> str:
    """A hash of what the lock is made from: requires-python, dependencies and every extra."""
    import hashlib
    import json
    import tomllib

    with open(pyproject_path, "rb") as f:
        project = tomllib.load(f)["project"]
    basis = {
        "requires-python": project.get("requires-python"),
        "dependencies": sorted(project.get("dependencies", [])),
        "optional-dependencies": {k: sorted(v) for k, v in sorted(project.get("optional-dependencies", {}).items())},
    }
    return "sha256:" + hashlib.sha256(json.dumps(basis, sort_keys=True).encode()).hexdigest()


def lock_problem(root: str) -> str | None:
    """Why ``requirements.lock`` cannot be trusted for this pyproject.toml, or None when it is current."""
    lock = os.path.join(root, LOCK_FILE)
    try:
        with open(lock, encoding="utf-8") as f:
            first = f.readline().rstrip("\n")
    except FileNotFoundError:
        return f"{LOCK_FILE} is missing; run `make lock`"
    want = dependency_fingerprint(os.path.join(root, "pyproject.toml"))
    if not first.startswith(FINGERPRINT_TAG):
        return f"{LOCK_FILE} has no fingerprint line; run `make lock`"
    if first[len(FINGERPRINT_TAG) :] != want:
        return (
            f"{LOCK_FILE} is stale: pyproject.toml's dependencies changed since it was made; "
            "run `make lock` and commit the new lock"
        )
    return None


def stamp_lock(root: str, compiled: str) -> None:
    """Write ``requirements.lock`` from uv's output ``compiled``, with the fingerprint line first."""
    with open(compiled, encoding="utf-8") as f:
        body = f.read()
    header = (
        FINGERPRINT_TAG
        + dependency_fingerprint(os.path.join(root, "pyproject.toml"))
        + "\n# Made by `make lock` from pyproject.toml (dependencies and all extras); do not edit by hand.\n"
    )
    tmp = os.path.join(root, LOCK_FILE + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(header + body)
    os.replace(tmp, os.path.join(root, LOCK_FILE))


def main(argv: list[str]) -> int:
    """``python build_support.py check-lock | stamp-lock COMPILED``."""
    import sys

    root = os.path.dirname(os.path.abspath(__file__))
    if argv[:1] == ["check-lock"]:
        problem = lock_problem(root)
        if problem:
            print(f"error: {problem}", file=sys.stderr)
            return 1
        return 0
    if argv[:1] == ["stamp-lock"] and len(argv) == 2:
        stamp_lock(root, argv[1])
        return 0
    print("usage: python build_support.py check-lock | stamp-lock COMPILED", file=sys.stderr)
    return 2


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
