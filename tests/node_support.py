"""Finding Node.js for the tests that drive the server with Node clients (Inspector, conformance suite).

In CI (``CI=true``), where the test extras install Node.js, a test that cannot
run fails: a silent skip would hide a broken setup. A local run without a
suitable Node.js skips, with the reason.
"""

from __future__ import annotations

import os
from typing import NoReturn

import pytest

from tests.npx import NodeUnavailable, Npx, find_npx


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def cannot_run(reason: str) -> NoReturn:
    """Fail in CI, skip elsewhere."""
    if in_ci():
        pytest.fail(f"{reason} (CI=true: this test must run in CI)", pytrace=False)
    pytest.skip(reason)


def npx_or_skip() -> Npx:
    """A working npx on Node.js 22.19 or newer, or :func:`cannot_run`."""
    try:
        return find_npx()
    except NodeUnavailable as exc:
        cannot_run(str(exc))
