"""The dependency lock: ``requirements.lock`` must match pyproject.toml's ranges.

``python .ci/lockfile.py check-lock`` (run by ``make test``) says when the lock
is missing or stale; ``stamp-lock COMPILED`` (run by ``make lock``) writes it.
"""

from __future__ import annotations

import os

# -- the dependency lock ----------------------------------------------------------------
#
# requirements.lock pins every runtime and test dependency with hashes (made by
# `make lock` with uv from pyproject.toml's ranges). Its first line records a
# fingerprint of those ranges, so a pyproject.toml edited since the lock was
# made is noticed (`python .ci/lockfile.py check-lock`, run by `make test`).

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
    """``python .ci/lockfile.py check-lock | stamp-lock COMPILED``."""
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if argv[:1] == ["check-lock"]:
        problem = lock_problem(root)
        if problem:
            print(f"error: {problem}", file=sys.stderr)
            return 1
        return 0
    if argv[:1] == ["stamp-lock"] and len(argv) == 2:
        stamp_lock(root, argv[1])
        return 0
    print("usage: python .ci/lockfile.py check-lock | stamp-lock COMPILED", file=sys.stderr)
    return 2


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
