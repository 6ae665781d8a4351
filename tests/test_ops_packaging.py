"""Packaging: the dependency lock is current (the wheel itself: tests/test_ops_wheel.py).
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / ".ci"))
import lockfile  # noqa: E402

sys.path.remove(str(REPO / ".ci"))

#: Build a wheel with the test environment's setuptools: nothing is downloaded.
PIP_WHEEL = [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation"]


def test_lock_matches_pyproject() -> None:
    assert lockfile.lock_problem(str(REPO)) is None, lockfile.lock_problem(str(REPO))


def test_stale_lock_is_reported(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text((REPO / "pyproject.toml").read_text())
    (tmp_path / "requirements.lock").write_text((REPO / "requirements.lock").read_text())
    assert lockfile.lock_problem(str(tmp_path)) is None
    text = (tmp_path / "pyproject.toml").read_text().replace('"xxhash>=3.4",', '"xxhash>=3.4",\n    "psycopg>=3",')
    (tmp_path / "pyproject.toml").write_text(text)
    problem = lockfile.lock_problem(str(tmp_path))
    assert problem is not None and "run `make lock`" in problem
    (tmp_path / "requirements.lock").unlink()
    assert "missing" in (lockfile.lock_problem(str(tmp_path)) or "")
