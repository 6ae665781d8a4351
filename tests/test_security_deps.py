"""The installed dependencies satisfy the floors declared in pyproject.toml (raised past known advisories)."""

from __future__ import annotations

import importlib.metadata
import tomllib
from pathlib import Path

from packaging.requirements import Requirement

PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"

#: Lowest releases without the advisories the project tracks, and releases that have them.
ADVISORY_FLOORS = {"starlette": ("1.0.1", ["1.0.0", "0.49.1", "0.40.0"]), "h11": ("0.16.0", ["0.15.0", "0.14.0"])}


def _requirements() -> dict[str, Requirement]:
    deps = tomllib.loads(PYPROJECT.read_text())["project"]["dependencies"]
    return {(r := Requirement(d)).name.lower(): r for d in deps}


def test_declared_floors_exclude_the_advisories() -> None:
    reqs = _requirements()
    for name, (floor, affected) in ADVISORY_FLOORS.items():
        assert name in reqs, f"{name} must be a declared dependency so that its floor applies"
        assert reqs[name].specifier.contains(floor), (name, str(reqs[name].specifier))
        for version in affected:
            assert not reqs[name].specifier.contains(version), (name, version, str(reqs[name].specifier))


def test_installed_versions_satisfy_the_declared_ranges() -> None:
    for name, req in _requirements().items():
        installed = importlib.metadata.version(name)
        assert req.specifier.contains(installed, prereleases=True), f"{name} {installed} does not satisfy {req}"
