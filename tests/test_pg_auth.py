"""The hardened Authenticator over site credentials kept in PostgreSQL (:class:`logstore.postgres.PgCredentials`)."""

from __future__ import annotations

import base64
from collections.abc import Iterator

import pytest

from convmem.logstore.postgres import PgCredentials, PgStore
from convmem.logstore.site_credentials import SCRYPT_N, PasswordHash, _scrypt
from convmem.mcp_adapter.auth import Authenticator
from convmem.mcp_adapter.errors import ToolFailure
from tests.pg_support import drop_schema, new_schema

pytestmark = pytest.mark.anyio

SITE = "pg-auth-site"
PASSWORD = "correct-horse-battery"
NEW_PASSWORD = "a-new-password-000"


def header(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


@pytest.fixture
def two_processes(pg_server: str) -> Iterator[tuple[PgCredentials, PgCredentials]]:
    """Two credential views over one schema through separate pools, as two server processes have."""
    schema = new_schema(pg_server)
    a = PgStore(pg_server, schema=schema, pool_min=1, pool_max=2)
    b = PgStore(pg_server, schema=schema, pool_min=1, pool_max=2)
    try:
        yield PgCredentials(a), PgCredentials(b)
    finally:
        a.close()
        b.close()
        drop_schema(pg_server, schema)


async def test_a_change_made_elsewhere_takes_effect_at_once(two_processes: tuple[PgCredentials, PgCredentials]) -> None:
    server, operator = two_processes
    operator.add(SITE, PASSWORD)
    authenticator = Authenticator(server)
    assert await authenticator.authenticate(header(SITE, PASSWORD)) == SITE  # now cached
    operator.set_password(SITE, NEW_PASSWORD)
    with pytest.raises(ToolFailure) as info:
        await authenticator.authenticate(header(SITE, PASSWORD))
    assert info.value.code == "Unauthenticated"
    assert await authenticator.authenticate(header(SITE, NEW_PASSWORD)) == SITE
    operator.remove(SITE)
    with pytest.raises(ToolFailure):
        await authenticator.authenticate(header(SITE, NEW_PASSWORD))


async def test_a_weak_hash_is_upgraded_on_login(two_processes: tuple[PgCredentials, PgCredentials]) -> None:
    server, operator = two_processes
    salt = b"w" * 16
    weak = PasswordHash(salt=salt, digest=_scrypt(PASSWORD, salt, 2**14, 8, 1), n=2**14)
    operator.put_hash(SITE, weak, "2026-01-01T00:00:00Z")
    assert weak.needs_rehash()
    assert await Authenticator(server).authenticate(header(SITE, PASSWORD)) == SITE
    upgraded = operator.load()[SITE]
    assert upgraded.n == SCRYPT_N and not upgraded.needs_rehash()
    assert operator.verify(SITE, PASSWORD) and not operator.verify(SITE, "wrong-password-0000")


def test_a_rehash_never_undoes_a_password_change(two_processes: tuple[PgCredentials, PgCredentials]) -> None:
    server, operator = two_processes
    operator.add(SITE, PASSWORD)
    old = server.load()[SITE]
    operator.set_password(SITE, NEW_PASSWORD)
    assert server.rehash(SITE, PASSWORD, old) is False
    assert operator.verify(SITE, NEW_PASSWORD) and not operator.verify(SITE, PASSWORD)


def test_a_stdio_login_checks_and_upgrades(two_processes: tuple[PgCredentials, PgCredentials]) -> None:
    server, operator = two_processes
    salt = b"x" * 16
    operator.put_hash(SITE, PasswordHash(salt=salt, digest=_scrypt(PASSWORD, salt, 2**14, 8, 1), n=2**14))
    assert not server.login(SITE, "wrong-password-0000")
    assert operator.load()[SITE].n == 2**14
    assert server.login(SITE, PASSWORD)
    assert operator.load()[SITE].n == SCRYPT_N


async def test_a_stalled_credential_query_never_stalls_the_event_loop(
    pg_server: str, two_processes: tuple[PgCredentials, PgCredentials]
) -> None:
    """The credential check asks the database from a worker thread.

    Another session holds the credential table locked, so the check waits on
    the lock. Meanwhile the event loop must keep running its other tasks, such
    as health checks and calls for other sites. Before the fix, the check ran on
    the loop and one unreachable database froze the whole server.
    """
    import anyio
    import psycopg

    server, operator = two_processes
    operator.add(SITE, PASSWORD)
    authenticator = Authenticator(server)
    results: list[str] = []
    with psycopg.connect(pg_server, autocommit=True) as blocker:
        blocker.execute("BEGIN")
        blocker.execute(f"LOCK TABLE {server._t} IN ACCESS EXCLUSIVE MODE".encode())

        async def login() -> None:
            results.append(await authenticator.authenticate(header(SITE, PASSWORD)))

        async with anyio.create_task_group() as tg:
            tg.start_soon(login)
            ticks = 0
            with anyio.fail_after(5):
                while ticks < 20:  # the loop keeps turning while the login waits on the lock
                    await anyio.sleep(0.01)
                    ticks += 1
            assert results == []  # still waiting on the lock: the check really is blocked
            blocker.execute("ROLLBACK")
    assert results == [SITE]
