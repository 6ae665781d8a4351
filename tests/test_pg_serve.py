"""The ``convmem`` command on PostgreSQL: ``site`` commands, ``serve`` over HTTP and stdio, start-up failures.

Real processes against the session's PostgreSQL server, each test in a schema
of its own (``--pg-schema``), the store chosen by ``--store`` or ``CONVMEM_STORE``.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp_helpers import ServerProcess, basic, connect, convmem_cmd, run_convmem, subprocess_env

from convmem.logstore import Tail
from convmem.logstore.postgres import PgStore
from tests.pg_support import drop_schema, new_schema
from tests.pgcluster import free_port

SITE, PASSWORD = "pg-site-0001", "pg-site-password-0123456789"


@pytest.fixture
def pg(pg_server: str) -> Iterator[tuple[str, str]]:
    schema = new_schema(pg_server)
    yield pg_server, schema
    drop_schema(pg_server, schema)


def _site(pg: tuple[str, str], *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return run_convmem("site", *args, "--store", pg[0], "--pg-schema", pg[1], input=stdin)


def test_site_commands_keep_sites_in_postgres(pg: tuple[str, str]) -> None:
    added = _site(pg, "add", SITE)
    assert added.returncode == 0, added.stderr
    password = added.stdout.strip()
    assert "PostgreSQL" in added.stderr and password not in added.stderr
    assert _site(pg, "add", SITE).returncode == 1
    assert _site(pg, "add", "other-site-01", "--password-stdin", stdin="other-password-123456\n").returncode == 0
    listed = _site(pg, "list")
    assert listed.stdout.split() == ["other-site-01", SITE]
    with PgStore(pg[0], schema=pg[1]) as store:
        from convmem.logstore.postgres import PgCredentials

        creds = PgCredentials(store)
        assert creds.verify(SITE, password) and not creds.verify(SITE, "wrong-password-000")
        store.append(SITE, "conv-0001", [{"a": 1}])
    changed = _site(pg, "passwd", SITE, "--password-stdin", stdin="new-password-0123456789\n")
    assert changed.returncode == 0, changed.stderr
    refused = _site(pg, "remove", SITE)
    assert refused.returncode == 1 and "still holds conversations" in refused.stderr
    removed = _site(pg, "remove", SITE, "--force")
    assert removed.returncode == 0, removed.stderr
    assert _site(pg, "list").stdout.split() == ["other-site-01"]
    with PgStore(pg[0], schema=pg[1]) as store:
        assert store.read(SITE, "conv-0001", Tail(5)) == []


@pytest.mark.anyio
async def test_two_servers_share_sites_and_conversations(pg: tuple[str, str], tmp_path: Path) -> None:
    assert _site(pg, "add", SITE, "--password-stdin", stdin=PASSWORD + "\n").returncode == 0
    servers = []
    for i in range(2):
        (tmp_path / f"s{i}").mkdir()
        servers.append(ServerProcess(tmp_path / f"s{i}" / "data", "--store", pg[0], "--pg-schema", pg[1]))
    try:
        assert "PostgreSQL" in servers[0].banner
        auth = basic(SITE, PASSWORD)
        for n, srv in enumerate(servers * 2):
            async with connect(srv.url, auth) as client:
                res = await client.call_tool("append_memory", {"conversation_id": "shared-conv", "items": [{"n": n}]})
                assert res.structured_content == {"first_seq": n, "last_seq": n}
        async with connect(servers[1].url, auth) as client:
            got = await client.call_tool("replay_memory", {"conversation_id": "shared-conv", "limit": 10})
        assert [i["payload"] for i in got.structured_content["items"]] == [{"n": n} for n in range(4)]
        # A site added while both run is seen by both, without a restart.
        assert _site(pg, "add", "late-site-01", "--password-stdin", stdin="late-password-0123456\n").returncode == 0
        for srv in servers:
            async with connect(srv.url, basic("late-site-01", "late-password-0123456")) as client:
                res = await client.call_tool("recall_memory", {"conversation_id": "shared-conv"})
                assert res.structured_content == {"items": []}
        assert httpx2.get(servers[0].base + "/healthz").json() == {"status": "ok"}
    finally:
        for srv in servers:
            assert srv.stop() == 0, srv.log()


def test_serve_exits_non_zero_when_postgres_is_unreachable(tmp_path: Path) -> None:
    dsn = f"postgresql://postgres@127.0.0.1:{free_port()}/postgres"
    done = subprocess.run(
        convmem_cmd("serve", "--port", "0", "--pg-connect-timeout", "2"),
        capture_output=True,
        text=True,
        timeout=60,
        env=subprocess_env(CONVMEM_STORE=dsn),
    )
    assert done.returncode == 2
    assert "cannot reach PostgreSQL" in done.stderr and "Connection refused" in done.stderr, done.stderr


def test_serve_refuses_asynchronous_commit_unless_told(pg: tuple[str, str], tmp_path: Path) -> None:
    dsn = pg[0] + ("&" if "?" in pg[0] else "?") + "options=-csynchronous_commit%3Doff"
    done = subprocess.run(
        convmem_cmd("serve", "--port", "0", "--store", dsn, "--pg-schema", pg[1]),
        capture_output=True,
        text=True,
        timeout=60,
        env=subprocess_env(),
    )
    assert done.returncode == 2 and "synchronous_commit = off" in done.stderr, done.stderr
    (tmp_path / "s").mkdir()
    srv = ServerProcess(tmp_path / "s" / "data", "--store", dsn, "--pg-schema", pg[1], "--pg-allow-async-commit")
    try:
        assert srv.proc.poll() is None
    finally:
        srv.stop()
    assert "can be LOST" in srv.log()


@pytest.mark.anyio
async def test_stdio_over_postgres(pg: tuple[str, str], tmp_path: Path) -> None:
    assert _site(pg, "add", SITE, "--password-stdin", stdin=PASSWORD + "\n").returncode == 0
    argv = convmem_cmd("serve", "--stdio", "--site", SITE, "--store", pg[0], "--pg-schema", pg[1])
    wrong = subprocess.run(
        argv, input="", capture_output=True, text=True, timeout=60, env=subprocess_env(CONVMEM_PASSWORD="wrong-one")
    )
    assert wrong.returncode == 3
    params = StdioServerParameters(
        command=argv[0], args=argv[1:], env=subprocess_env(CONVMEM_PASSWORD=PASSWORD), cwd=str(tmp_path)
    )
    async with Client(params, mode="legacy") as client:
        res = await client.call_tool("append_memory", {"conversation_id": "stdio-pg-1", "items": [{"a": 1}]})
        assert res.structured_content == {"first_seq": 0, "last_seq": 0}
    with PgStore(pg[0], schema=pg[1]) as store:
        assert [i.payload for i in store.read(SITE, "stdio-pg-1", Tail(5))] == [{"a": 1}]


def test_stats_on_postgres(pg: tuple[str, str]) -> None:
    with PgStore(pg[0], schema=pg[1]) as store:
        store.append(SITE, "conv-big-01", [{"k": "x" * 10}] * 5)
        store.append(SITE, "conv-small1", [{}])
    done = run_convmem("stats", pg[0], "--pg-schema", pg[1], "--json")
    assert done.returncode == 0, done.stderr
    import json

    (site,) = json.loads(done.stdout)
    assert (site["site"], site["conversations"], site["items"]) == (SITE, 2, 6)
    assert site["payload_bytes"] == 5 * len('{"k":"xxxxxxxxxx"}') + 2
    assert [c["conversation_id"] for c in site["largest"]] == ["conv-big-01", "conv-small1"]
    text = run_convmem("stats", pg[0], "--pg-schema", pg[1])
    assert text.returncode == 0 and "2 conversations, 6 items" in text.stdout


def test_site_add_refuses_rows_left_in_the_database_unless_purged(pg: tuple[str, str]) -> None:
    """A name whose conversations are still in the database is not handed to a new owner silently."""
    from convmem.logstore.postgres import PgCredentials

    assert _site(pg, "add", SITE, "--password-stdin", stdin=PASSWORD + "\n").returncode == 0
    with PgStore(pg[0], schema=pg[1]) as store:
        store.append(SITE, "left-0001", [{"old": "owner"}])
        PgCredentials(store).remove(SITE)  # the password is gone, the rows are not
    refused = _site(pg, "add", SITE, "--password-stdin", stdin="new-owner-password-01\n")
    assert refused.returncode == 1 and "--purge-data" in refused.stderr, refused.stderr
    with PgStore(pg[0], schema=pg[1]) as store:
        assert [i.payload for i in store.read(SITE, "left-0001", Tail(5))] == [{"old": "owner"}]
    purged = _site(pg, "add", SITE, "--password-stdin", "--purge-data", stdin="new-owner-password-01\n")
    assert purged.returncode == 0, purged.stderr
    with PgStore(pg[0], schema=pg[1]) as store:
        assert store.read(SITE, "left-0001", Tail(5)) == []
        assert PgCredentials(store).verify(SITE, "new-owner-password-01")


def test_serve_refuses_quotas_with_postgres(pg: tuple[str, str]) -> None:
    done = subprocess.run(
        convmem_cmd("serve", "--port", "0", "--store", pg[0], "--pg-schema", pg[1], "--quota-bytes", "1000000"),
        capture_output=True,
        text=True,
        timeout=60,
        env=subprocess_env(),
    )
    assert done.returncode == 2 and "not enforced with a PostgreSQL store" in done.stderr, done.stderr


def _stdio(pg: tuple[str, str], cwd: Path, *extra: str) -> StdioServerParameters:
    argv = convmem_cmd("serve", "--stdio", "--site", SITE, "--store", pg[0], "--pg-schema", pg[1], *extra)
    return StdioServerParameters(
        command=argv[0], args=argv[1:], env=subprocess_env(CONVMEM_PASSWORD=PASSWORD), cwd=str(cwd)
    )


def _memory() -> dict[str, object]:
    return {"category": "preference", "subject": "Units on the shared database",
            "summary": "The user wants metric units, kept in PostgreSQL", "dedupe_key": "units"}


@pytest.mark.anyio
async def test_memory_tools_keep_memories_in_postgres_without_a_data_dir(pg: tuple[str, str], tmp_path: Path) -> None:
    """PostgreSQL without --data-dir: memories live in the database; every server sees them; nothing lands in cwd."""
    assert _site(pg, "add", SITE, "--password-stdin", stdin=PASSWORD + "\n").returncode == 0
    async with Client(_stdio(pg, tmp_path), mode="legacy") as one, Client(_stdio(pg, tmp_path), mode="legacy") as two:
        verified = await one.call_tool("memory_verify", {"intent": "create", "candidate": _memory()})
        assert not verified.is_error, verified
        token = verified.structured_content["verify_token"]
        made = await one.call_tool("memory_upsert", {"memory": _memory(), "verify_token": token})
        assert not made.is_error, made
        mid = made.structured_content["memory"]["id"]
        again = await two.call_tool("memory_upsert", {"memory": _memory(), "verify_token": token})
        assert again.is_error and (again.meta or {})["convmem/error"]["code"] == "VerifyRequired"
        found = await two.call_tool("memory_search", {"query": "metric units"})
        assert [m["id"] for m in found.structured_content["memories"]] == [mid]
        erase = await two.call_tool("memory_verify", {"intent": "delete", "memory_id": mid, "force": True})
        gone = await two.call_tool(
            "memory_delete", {"memory_id": mid, "force": True, "verify_token": erase.structured_content["verify_token"]}
        )
        assert gone.structured_content["status"] == "erased"
        missing = await one.call_tool("memory_get", {"memory_id": mid})
        assert missing.is_error and (missing.meta or {})["convmem/error"]["code"] == "NotFound"
        ok = await one.call_tool("append_memory", {"conversation_id": "mem-less-1", "items": [{"a": 1}]})
        assert ok.structured_content == {"first_seq": 0, "last_seq": 0}
    assert list(tmp_path.iterdir()) == []
    with PgStore(pg[0], schema=pg[1]) as store:
        from convmem.logstore.postgres import PgLongTermMemory

        with PgLongTermMemory(store, listen=False) as memories:
            assert memories.all(SITE) == []


@pytest.mark.anyio
async def test_a_data_dir_beside_postgres_does_not_hold_memories(pg: tuple[str, str], tmp_path: Path) -> None:
    assert _site(pg, "add", SITE, "--password-stdin", stdin=PASSWORD + "\n").returncode == 0
    mem = tmp_path / "data-here"
    async with Client(_stdio(pg, tmp_path, "--data-dir", str(mem)), mode="legacy") as client:
        verified = await client.call_tool("memory_verify", {"intent": "create", "candidate": _memory()})
        token = verified.structured_content["verify_token"]
        made = await client.call_tool("memory_upsert", {"memory": _memory(), "verify_token": token})
        assert not made.is_error, made
    assert mem.is_dir() and not (mem / "sites").exists()
    with PgStore(pg[0], schema=pg[1]) as store:
        from convmem.logstore.postgres import PgLongTermMemory

        with PgLongTermMemory(store, listen=False) as memories:
            assert [m.fields.dedupe_key for m in memories.all(SITE)] == ["units"]


def test_site_remove_covers_the_memories_in_postgres(pg: tuple[str, str]) -> None:
    from memories_support import create

    from convmem.logstore.postgres import PgLongTermMemory

    assert _site(pg, "add", SITE, "--password-stdin", stdin=PASSWORD + "\n").returncode == 0
    with PgStore(pg[0], schema=pg[1]) as store, PgLongTermMemory(store) as memories:
        create(memories, _memory(), site=SITE)
        refused = _site(pg, "remove", SITE)
        assert refused.returncode == 1 and "1 long-term memories" in refused.stderr, refused.stderr
        removed = _site(pg, "remove", SITE, "--force", "--grace", "0")
        assert removed.returncode == 0, removed.stderr
        assert memories.all(SITE) == []  # this server, holding the site, sees the erasure at once
    assert _site(pg, "add", SITE, "--password-stdin", stdin=PASSWORD + "\n").returncode == 0
    with PgStore(pg[0], schema=pg[1]) as store, PgLongTermMemory(store, listen=False) as memories:
        assert memories.all(SITE) == []
