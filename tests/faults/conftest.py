"""Fault-injection suite: the soak switch (the one-line summary is printed by tests/conftest.py).

Soak mode (thousands of crash rounds, many more sampled flips) is switched on
with ``CONVMEM_SOAK=1`` (works from any directory), or ``--soak`` when pytest
is pointed at this directory (``pytest tests/faults --soak``).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ._common import soak

HERE = Path(__file__).parent
#: Per-test timeout in soak mode (seconds): a hang is still caught, eventually.
SOAK_TIMEOUT = 12 * 3600


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--soak", action="store_true", default=False, help="run the fault suite for hours, not minutes")


def pytest_configure(config: pytest.Config) -> None:
    try:
        if config.getoption("--soak"):
            os.environ["CONVMEM_SOAK"] = "1"
    except ValueError:
        pass  # option not registered: this conftest was loaded after the command line was parsed


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Soak runs (and runs with more rounds than CI's) outlive the suite's per-test timeout."""
    if soak() or os.environ.get("CONVMEM_FAULT_ROUNDS"):
        for item in items:
            if item.path.is_relative_to(HERE):
                item.add_marker(pytest.mark.timeout(SOAK_TIMEOUT))
