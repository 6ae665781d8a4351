"""convmem.client against a real ``convmem serve``, including a server killed with -9 mid-flush.

The appender's promise: every item it reported sent is in the log exactly
once, whatever happened to the server; items it could not take are counted,
never lost silently. The blocking client's iterators read a whole
conversation and the listing; ``follow()`` yields an item appended while it
waits; the async client does the same calls.
"""

from __future__ import annotations

import signal
import socket
import threading
import time
from pathlib import Path

import anyio
import pytest

from convmem.client import Appender, AsyncMemoryClient, MemoryClient, ToolError
from convmem.logstore import FileStore, Range
from convmem.logstore.site_credentials import CredentialFile
from tests.mcp_helpers import ServerProcess

SITE, PASSWORD = "client-site", "client-password-0123456789"
CONV = "conv-client-0001"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _serve(data_dir: Path, port: int) -> ServerProcess:
    return ServerProcess(data_dir, "--port", str(port))


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    root = tmp_path / "data"
    CredentialFile(root).add(SITE, PASSWORD)
    return root


def test_appender_through_a_server_killed_mid_flush(data_dir: Path) -> None:
    port = _free_port()
    server = _serve(data_dir, port)
    client = MemoryClient(server.url, SITE, PASSWORD, timeout=10)
    appender = Appender(client, CONV, max_buffer=100_000, retry_initial=0.05, retry_max=0.5)
    try:
        for n in range(3000):
            assert appender.add({"n": n, "text": "x" * 200})
        deadline = time.monotonic() + 60
        while appender.sent == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert appender.sent > 0
        server.stop(signal.SIGKILL)  # mid-flush: batches in flight, more buffered
        time.sleep(0.3)
        server = _serve(data_dir, port)  # the same address: the appender's retries reach it
        assert appender.flush(120)
    finally:
        appender.close(5)
        client.close()
        assert server.stop() == 0, server.log()
    assert appender.sent == 3000 and appender.failed == appender.dropped == appender.unsent == 0
    with FileStore(data_dir) as store:
        items = store.read(SITE, CONV, Range(0, 1000)) + store.read(SITE, CONV, Range(1000, 1000))
        items += store.read(SITE, CONV, Range(2000, 1000)) + store.read(SITE, CONV, Range(3000, 1000))
    numbers = [i.payload["n"] for i in items]
    assert sorted(numbers) == list(range(3000))  # every item sent, exactly once
    assert numbers == list(range(3000))  # and in the order added
    seqs = [(f, lo) for _k, f, lo in appender.acknowledged]
    assert seqs == sorted(seqs)


def test_a_full_buffer_drops_and_counts(data_dir: Path) -> None:
    port = _free_port()
    server = _serve(data_dir, port)
    server.stop(signal.SIGKILL)  # nobody answers: the buffer fills
    client = MemoryClient(server.url, SITE, PASSWORD, timeout=2)
    appender = Appender(client, CONV, max_buffer=10, retry_initial=0.05, retry_max=0.1, exit_timeout=0.5)
    try:
        added = sum(appender.add({"n": n}) for n in range(300))
        assert appender.dropped == 300 - added and appender.dropped > 0
    finally:
        appender.close()
        client.close()
    assert appender.sent == 0 and appender.unsent + appender.dropped == 300


def test_iterators_follow_and_errors(data_dir: Path) -> None:
    server = _serve(data_dir, _free_port())
    try:
        with MemoryClient(server.url, SITE, PASSWORD) as client:
            for b in range(5):
                client.append(CONV, [{"b": b, "i": i} for i in range(250)], idempotency_key=f"b{b}")
            assert client.append(CONV, [{"b": 0, "i": i} for i in range(250)], idempotency_key="b0") == (0, 249)
            with pytest.raises(ToolError) as info:
                client.append(CONV, [{"other": 1}], idempotency_key="b0")
            assert info.value.code == "IdempotencyConflict" and not info.value.retryable
            assert [i["seq"] for i in client.replay(CONV, page=300)] == list(range(1250))
            client.append("conv-client-0002", [{"x": 1}])
            assert [c["conversation_id"] for c in client.conversations(page=1)] == ["conv-client-0002", CONV]

            def later() -> None:
                time.sleep(0.3)
                with MemoryClient(server.url, SITE, PASSWORD) as other:
                    other.append(CONV, [{"late": True}])

            t = threading.Thread(target=later)
            t.start()
            followed = client.follow(CONV, offset=1250, wait_ms=20_000)
            assert next(followed)["payload"] == {"late": True}
            t.join()

        async def with_async() -> None:
            async with AsyncMemoryClient(server.url, SITE, PASSWORD) as aclient:
                assert (await aclient.recall(CONV, 1))[0]["payload"] == {"late": True}
                seen = [i["seq"] async for i in aclient.replay(CONV, offset=1200, page=20)]
                assert seen == list(range(1200, 1251))

        anyio.run(with_async)
    finally:
        assert server.stop() == 0, server.log()
