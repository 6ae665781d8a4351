"""Shared pytest configuration."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

# -- the fault suite's one-line summary ------------------------------------------
# Its counters live in faults._common.STATS of the process that ran the checks.
# Under pytest-xdist (`make test` runs two workers) each worker hands its
# counters to the controller, which adds them up and prints the line.


def pytest_sessionfinish(session: pytest.Session) -> None:
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:
        from faults._common import STATS

        workeroutput["convmem_fault_stats"] = dict(STATS)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object) -> None:
    from faults._common import STATS

    STATS.update(getattr(node, "workeroutput", {}).get("convmem_fault_stats", {}))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    from faults._common import STATS, summary_line

    line = summary_line(STATS)
    if line is not None:
        terminalreporter.write_line(line)


@pytest.fixture
def anyio_backend() -> str:
    """Async tests (``@pytest.mark.anyio``) run on asyncio."""
    return "asyncio"


# -- PostgreSQL ----------------------------------------------------------------
# One throwaway server for the whole session (initdb in a temp dir, its own port
# on 127.0.0.1), or the server named by CONVMEM_TEST_POSTGRES. Each test that
# uses it gets a schema of its own (tests/pg_support.py).


@pytest.fixture(scope="session")
def pg_server() -> Iterator[str]:
    """The DSN of a PostgreSQL server for the tests (skips when none can be had; fails in CI)."""
    from tests import node_support, pg_support

    dsn = pg_support.session_dsn()
    if dsn is None:
        node_support.cannot_run(pg_support.missing_reason())
    yield dsn


@pytest.fixture(params=["file", "postgres"])
def backend_kind(request: pytest.FixtureRequest) -> str:
    """Parametrises a test over both storage backends."""
    return str(request.param)


@pytest.fixture
def store_factory(backend_kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Any]:
    """Opens stores of the parametrised backend over one shared data set (closed and dropped afterwards)."""
    from tests import pg_support

    dsn = request.getfixturevalue("pg_server") if backend_kind == "postgres" else None
    factory = pg_support.StoreFactory(backend_kind, tmp_path, dsn)
    yield factory
    factory.cleanup()


@pytest.fixture
def memory_stores(backend_kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Any]:
    """Opens long-term memory stores of the parametrised backend over one set of memories (closed after)."""
    from memories_support import MemoryStores

    dsn = request.getfixturevalue("pg_server") if backend_kind == "postgres" else None
    stores = MemoryStores(backend_kind, tmp_path, dsn)
    yield stores
    stores.cleanup()
