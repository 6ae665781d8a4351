"""Server life cycle and storage failures, end to end: shutdown, demo site, health, Timeout, Corrupted, ties.

Each test runs its own ``convmem serve`` subprocess, because each one changes
the server's process or its data directory in a way others must not see.
"""

from __future__ import annotations

import fcntl
import os
import signal
import stat
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp_helpers import ServerProcess, basic, connect, error_of

from convmem.logstore import Range, open_store
from convmem.logstore import writer as logstore_writer
from convmem.logstore.site_credentials import CredentialFile

pytestmark = pytest.mark.anyio

SITE, PASSWORD = "life-site1", "life-password-0123456789"


def new_data_dir(tmp_path: Path) -> Path:
    data = tmp_path / "data"
    CredentialFile(data).add(SITE, PASSWORD)
    return data


def conversation_dir(data: Path, site: str, conversation_id: str) -> Path:
    """Where the engine keeps a conversation (see logstore/FORMAT.md, section 1)."""
    matches = list((data / "sites" / site.encode().hex() / "c").glob(f"*/*/{conversation_id.encode().hex()}"))
    assert len(matches) == 1, matches
    return matches[0]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
async def test_signal_finishes_in_flight_appends_and_exits_zero(tmp_path: Path, sig: int) -> None:
    data = new_data_dir(tmp_path)
    server = ServerProcess(data)
    auth = basic(SITE, PASSWORD)
    acked: dict[str, dict[str, Any]] = {}
    first_ack = anyio.Event()
    signalled = False
    unexpected: list[str] = []
    batch = [{"i": i, "pad": "p" * 2000} for i in range(200)]

    async def writer(n: int) -> None:
        cid = f"shutdown-{n:04d}"
        try:
            async with connect(server.url, auth) as client:
                for _ in range(50):
                    result = await client.call_tool("append_memory", {"conversation_id": cid, "items": batch})
                    if result.is_error:
                        # Only a shutting-down server may refuse, and only with a retryable error.
                        error = error_of(result)
                        if not (signalled and error["retryable"]):
                            unexpected.append(f"{cid}: {error}")
                        return
                    acked.setdefault(cid, {"count": 0})["count"] += len(batch)
                    first_ack.set()
        except Exception as exc:
            # The server going away after the signal ends a writer (its call was not acknowledged);
            # anything before the signal is a failure of its own.
            if not signalled:
                unexpected.append(f"{cid}: {exc!r}")

    async with anyio.create_task_group() as tg:
        for n in range(6):
            tg.start_soon(writer, n)
        with anyio.fail_after(60):
            await first_ack.wait()
        await anyio.sleep(0.05)
        signalled = True
        server.proc.send_signal(sig)
    # Wait for the one signal to take effect: a second one (stop()'s SIGTERM) could land while the
    # interpreter is finalising, when Python's handlers are gone, and kill the process with -15.
    rc = server.proc.wait(timeout=60)
    server.stop()
    assert rc == 0, server.log()
    assert not unexpected, unexpected
    assert acked
    # Every acknowledged item is there after the shutdown, in order.
    with open_store(data) as store:
        for cid, info in acked.items():
            seqs: list[int] = []
            while page := store.read(SITE, cid, Range(len(seqs), 1000)):
                seqs += [item.seq for item in page]
            assert len(seqs) >= info["count"] and seqs == list(range(len(seqs)))


async def test_demo_site_is_created_once_and_reused(tmp_path: Path) -> None:
    data = tmp_path / "data"
    first = ServerProcess(data, "--demo-site")
    try:
        header = first.banner.split('--header "Authorization: ')[1].split('"')[0]
        assert "claude mcp add --transport http" in first.banner
        assert "npx -y @modelcontextprotocol/inspector" in first.banner and "--cli" in first.banner
        async with connect(first.url, header) as client:
            result = await client.call_tool("append_memory", {"conversation_id": "demo-conv-1", "items": [{"a": 1}]})
            assert not result.is_error
    finally:
        assert first.stop() == 0
    password_file = data / "auth" / "demo-site.password"
    assert stat.S_IMODE(password_file.stat().st_mode) == 0o600
    assert CredentialFile(data).sites() == ["demo-site"]
    second = ServerProcess(data, "--demo-site")
    try:
        assert second.banner.split('--header "Authorization: ')[1].split('"')[0] == header
        async with connect(second.url, header) as client:
            recalled = await client.call_tool("recall_memory", {"conversation_id": "demo-conv-1"})
            assert [i["payload"] for i in recalled.structured_content["items"]] == [{"a": 1}]
    finally:
        assert second.stop() == 0


async def test_a_vanished_data_directory_is_unavailable_not_unauthenticated(tmp_path: Path) -> None:
    data = new_data_dir(tmp_path)
    server = ServerProcess(data)
    try:
        assert httpx2.get(server.base + "/healthz").json() == {"status": "ok"}
        moved = tmp_path / "moved"
        data.rename(moved)
        response = httpx2.get(server.base + "/healthz")
        assert response.status_code == 503 and response.json() == {"status": "unavailable"}
        async with connect(server.url, basic(SITE, PASSWORD)) as client:
            result = await client.call_tool("recall_memory", {"conversation_id": "gone-conv1"})
            error = error_of(result)
            assert error["code"] == "Unavailable" and error["retryable"] is True
            moved.rename(data)
            assert httpx2.get(server.base + "/healthz").status_code == 200
            assert not (await client.call_tool("recall_memory", {"conversation_id": "gone-conv1"})).is_error
    finally:
        assert server.stop() == 0


async def test_busy_conversation_times_out_as_retryable(tmp_path: Path) -> None:
    data = new_data_dir(tmp_path)
    server = ServerProcess(data, "--lock-timeout", "0.2")
    try:
        async with connect(server.url, basic(SITE, PASSWORD)) as client:
            args = {"conversation_id": "busy-conv-1", "items": [{"a": 1}]}
            assert not (await client.call_tool("append_memory", args)).is_error
            lock = os.open(conversation_dir(data, SITE, "busy-conv-1") / "lock", os.O_RDWR)
            try:
                fcntl.flock(lock, fcntl.LOCK_EX)
                result = await client.call_tool("append_memory", args)
            finally:
                os.close(lock)
            error = error_of(result)
            assert error["code"] == "Timeout" and error["retryable"] is True
            assert "retry" in result.content[0].text
            again = await client.call_tool("append_memory", args)
            assert again.structured_content == {"first_seq": 1, "last_seq": 1}
    finally:
        assert server.stop() == 0


async def test_corruption_is_reported_with_file_and_offset(tmp_path: Path) -> None:
    data = new_data_dir(tmp_path)
    server = ServerProcess(data)
    try:
        async with connect(server.url, basic(SITE, PASSWORD)) as client:
            for n in range(2):
                args = {"conversation_id": "rotten-conv", "items": [{"n": n, "text": "hello world"}]}
                assert not (await client.call_tool("append_memory", args)).is_error
            segment = next(conversation_dir(data, SITE, "rotten-conv").glob("*.seg"))
            raw = bytearray(segment.read_bytes())
            raw[40 + 32 + 5] ^= 0xFF  # a byte inside the first record's body
            segment.write_bytes(bytes(raw))
            result = await client.call_tool("recall_memory", {"conversation_id": "rotten-conv"})
        error = error_of(result)
        assert error["code"] == "Corrupted" and error["retryable"] is False
        assert error["offset"] == 40
        assert not os.path.isabs(error["file"]) and error["file"].endswith(".seg")
        assert str(tmp_path) not in result.content[0].text
    finally:
        assert server.stop() == 0


async def test_listing_pagination_with_ties(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Conversations sharing one last_appended_at are ordered by id and paged without loss or repeats."""
    data = new_data_dir(tmp_path)
    tied = sorted(f"tie-{c}-conv" for c in "qwertyuiop")
    # Prepare the data with a frozen clock, so that all these conversations really tie.
    monkeypatch.setattr(logstore_writer, "now_us", lambda: 1_800_000_000_000_000)
    with open_store(data) as store:
        for cid in reversed(tied):
            store.append(SITE, cid, [{"k": cid}])
    monkeypatch.setattr(logstore_writer, "now_us", lambda: 1_700_000_000_000_000)
    with open_store(data) as store:
        store.append(SITE, "older-conv", [{"k": "old"}])
    monkeypatch.undo()
    server = ServerProcess(data)
    try:
        async with connect(server.url, basic(SITE, PASSWORD)) as client:
            ids: list[str] = []
            cursor = None
            pages = 0
            while True:
                page = (await client.call_tool("list_conversations", {"limit": 3, "cursor": cursor})).structured_content
                pages += 1
                ids += [s["conversation_id"] for s in page["conversations"]]
                cursor = page.get("next_cursor")
                if cursor is None:
                    break
        assert ids == [*tied, "older-conv"]
        assert pages == 4
    finally:
        assert server.stop() == 0


async def test_full_conversation(tmp_path: Path) -> None:
    data = new_data_dir(tmp_path)
    with open_store(data) as store:  # fill to one item short of the limit, without HTTP round trips
        for _ in range(399):
            store.append(SITE, "nearly-full", [{}] * 250)
        store.append(SITE, "nearly-full", [{}] * 249)
    server = ServerProcess(data)
    try:
        async with connect(server.url, basic(SITE, PASSWORD)) as client:
            too_many = error_of(
                await client.call_tool("append_memory", {"conversation_id": "nearly-full", "items": [{}, {}]})
            )
            last = await client.call_tool(
                "append_memory", {"conversation_id": "nearly-full", "items": [{"last": True}]}
            )
            after = error_of(await client.call_tool("append_memory", {"conversation_id": "nearly-full", "items": [{}]}))
        assert too_many["code"] == "ConversationFull" and too_many["retryable"] is False
        assert (too_many["limit"], too_many["actual"]) == (100_000, 100_001)
        assert last.structured_content == {"first_seq": 99_999, "last_seq": 99_999}
        assert after["code"] == "ConversationFull"
    finally:
        assert server.stop() == 0


async def test_a_blocked_storage_call_does_not_stall_other_requests(tmp_path: Path) -> None:
    """An append stuck waiting for its conversation runs in a worker thread; other calls go on meanwhile."""
    data = new_data_dir(tmp_path)
    server = ServerProcess(data, "--lock-timeout", "30")
    auth = basic(SITE, PASSWORD)
    try:
        async with connect(server.url, auth) as client:
            assert not (
                await client.call_tool("append_memory", {"conversation_id": "blocked-conv", "items": [{}]})
            ).is_error
        lock = os.open(conversation_dir(data, SITE, "blocked-conv") / "lock", os.O_RDWR)
        fcntl.flock(lock, fcntl.LOCK_EX)
        outcome: dict[str, Any] = {}

        async def blocked_append() -> None:
            async with connect(server.url, auth) as client:
                args = {"conversation_id": "blocked-conv", "items": [{"late": True}]}
                outcome["append"] = await client.call_tool("append_memory", args)

        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(blocked_append)
                await anyio.sleep(0.3)
                started = anyio.current_time()
                async with connect(server.url, auth) as client:
                    other = await client.call_tool("append_memory", {"conversation_id": "free-conv1", "items": [{}]})
                    listed = await client.call_tool("list_conversations", {})
                elapsed = anyio.current_time() - started
                assert "append" not in outcome  # still waiting for the lock
                fcntl.flock(lock, fcntl.LOCK_UN)
        finally:
            os.close(lock)
        assert not other.is_error and not listed.is_error
        assert elapsed < 10.0  # far below the 30 s the blocked append may wait
        assert outcome["append"].structured_content == {"first_seq": 1, "last_seq": 1}
    finally:
        assert server.stop() == 0
