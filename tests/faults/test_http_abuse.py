"""Oversized and malformed HTTP bodies, and slow clients, against the running server.

None may take the server down, make it answer 5xx, change the data
directory, or make it hold the bodies in memory: its resident memory after
many oversized uploads (several at once) stays within a fixed bound, and
ordinary calls keep being served while slow clients hold connections open.
"""

from __future__ import annotations

import contextlib
import socket
import statistics
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest
from mcp_helpers import ServerProcess

from . import _server
from ._common import STATS

pytestmark = pytest.mark.timeout(240)

#: Resident memory the server may gain over the whole module (it serves ~3 MiB bodies at most).
RSS_SLACK_KIB = 160 * 1024
#: Loopback source addresses: the attacker's, and a legitimate client's (Linux routes all of 127/8 to lo).
ATTACKER = "127.0.0.2"
VICTIM = "127.0.0.3"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, Path]]:
    data = tmp_path_factory.mktemp("abuse") / "data"
    proc = _server.start(data)
    try:
        with httpx2.Client(timeout=30) as http:
            _server.call(http, proc.url, "append_memory", {"conversation_id": "abuse-conv-0001", "items": [{"a": 1}]})
        yield proc, data
    finally:
        rc = proc.stop()
        assert rc == 0, proc.log()


def _alive(proc: ServerProcess) -> None:
    assert proc.proc.poll() is None, f"the server died:\n{proc.log()[-3000:]}"
    with httpx2.Client(timeout=30) as http:
        assert http.get(proc.base + "/healthz").status_code == 200
        res = _server.call(http, proc.url, "recall_memory", {"conversation_id": "abuse-conv-0001"})
        assert [it["payload"] for it in res["structuredContent"]["items"]] == [{"a": 1}]


MALFORMED: list[bytes] = [
    b"",
    b"{",
    b"[]",
    b"null",
    b"0",
    b'"text"',
    b'{"jsonrpc":"2.0"}',
    b'{"jsonrpc":"2.0","id":1,"method":"tools/call"}',
    b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":[]}',
    b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":null}}',
    b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"recall_memory","arguments":"x"}}',
    b'{"jsonrpc":"2.0","id":{"a":1},"method":"tools/call","params":{}}',
    b'{"jsonrpc":"1.0","id":1,"method":"tools/list"}',
    b'{"jsonrpc":"2.0","id":1,"id":2,"method":"tools/list","method":"ping"}',
    b'{"jsonrpc":"2.0","id":1e999999,"method":"tools/list"}',
    b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"recall_memory","arguments":{"conversation_id":"abuse-conv-0001","count":1e999999}}}',
    b"\x00" * 1000,
    b"\xff\xfe{\x00}\x00",
    b"[" + b",".join([b'{"jsonrpc":"2.0","id":1,"method":"tools/list"}'] * 2000) + b"]",
    b"[" * 1_000_000,
    b'{"a":' * 200_000 + b"1" + b"}" * 200_000,
    b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"recall_memory","arguments":{'
    + b",".join(b'"k%d":%d' % (i, i) for i in range(100_000))
    + b"}}}",
]


@pytest.mark.parametrize("index", range(len(MALFORMED)))
def test_malformed_bodies(server: tuple[ServerProcess, Path], index: int) -> None:
    proc, data = server
    before = _server.data_files(data)
    with httpx2.Client(timeout=60) as http:
        r = http.post(proc.url, content=MALFORMED[index], headers=_server.headers())
        assert r.status_code < 500, (r.status_code, r.text[:300])
        for content_type in ("text/plain", "application/x-www-form-urlencoded"):
            h = _server.headers() | {"Content-Type": content_type}
            assert http.post(proc.url, content=MALFORMED[index], headers=h).status_code < 500
        h = {k: v for k, v in _server.headers().items() if k != "Accept"}
        assert http.post(proc.url, content=MALFORMED[index], headers=h).status_code < 500
    for method in ("GET", "PUT", "DELETE", "PATCH"):
        # Streamed: a GET may open a server-sent-event stream that never ends by itself.
        with httpx2.Client(timeout=60) as http, http.stream(method, proc.url, headers=_server.headers()) as r:
            assert r.status_code < 500
    STATS["bad inputs"] += 8
    assert _server.data_files(data) == before
    _alive(proc)


def _stream(total: int, chunk: int = 64 * 1024) -> Iterator[bytes]:
    head = b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"append_memory","arguments":{"x":"'
    yield head
    block = b"z" * chunk
    sent = len(head)
    while sent < total:
        yield block
        sent += chunk


def test_oversized_bodies_do_not_exhaust_memory(server: tuple[ServerProcess, Path]) -> None:
    proc, data = server
    before = _server.data_files(data)
    base_rss = _server.rss_kib(proc.proc.pid)
    statuses: list[int | str] = []

    def upload(total: int) -> None:
        try:
            with httpx2.Client(timeout=120) as http:
                r = http.post(proc.url, content=_stream(total), headers=_server.headers())
                statuses.append(r.status_code)
        except httpx2.TransportError as exc:  # the server may close the connection mid-upload
            statuses.append(type(exc).__name__)

    for _round in range(3):
        threads = [threading.Thread(target=upload, args=(48 * 1024 * 1024,)) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=300)
        STATS["bad inputs"] += len(threads)
    # A body with a lying Content-Length: far larger than what is sent.
    with socket.create_connection(("127.0.0.1", int(proc.base.rsplit(":", 1)[1])), timeout=30) as s:
        s.sendall(
            b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Accept: application/json, text/event-stream\r\nContent-Length: 10000000000\r\n\r\n{}"
        )
        reply = s.recv(4096)
        assert not reply or not reply.startswith(b"HTTP/1.1 5"), reply[:200]
    assert all(st == 413 or isinstance(st, str) for st in statuses), statuses
    assert 413 in statuses, f"no upload got a 413: {statuses}"
    grown = _server.rss_kib(proc.proc.pid) - base_rss
    assert grown < RSS_SLACK_KIB, f"the server grew by {grown} KiB after oversized uploads"
    assert _server.data_files(data) == before
    _alive(proc)


def test_slow_clients_do_not_block_others(server: tuple[ServerProcess, Path]) -> None:
    proc, _data = server
    port = int(proc.base.rsplit(":", 1)[1])
    held: list[socket.socket] = []
    try:
        for i in range(150):
            # From another loopback address than the checks below: one address may hold only so many connections.
            s = socket.create_connection(("127.0.0.1", port), timeout=30, source_address=(ATTACKER, 0))
            held.append(s)
            with contextlib.suppress(OSError):  # beyond the per-address cap the server drops the connection
                if i % 3 == 0:
                    s.sendall(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # headers never finished
                elif i % 3 == 1:
                    s.sendall(
                        b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                        b"Accept: application/json, text/event-stream\r\nContent-Length: 100000\r\n\r\n"
                        b'{"jsonrpc":"2.0",'  # body never finished
                    )
            # (and every third one sends nothing at all)
        STATS["bad inputs"] += len(held)
        _alive(proc)  # served while all of those are hanging
    finally:
        for s in held:
            s.close()
    _alive(proc)


def test_get_streams_are_not_held_open(server: tuple[ServerProcess, Path]) -> None:
    """A stateless server has nothing to push: a GET must not hold a connection (and its memory) open.

    Held open, every such stream costs the server memory, so any client
    (no credentials needed) can exhaust it by opening enough of them.
    """
    proc, _data = server
    port = int(proc.base.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(
            b"GET /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: text/event-stream\r\n"
            b"MCP-Protocol-Version: 2025-06-18\r\nConnection: close\r\n\r\n"
        )
        STATS["bad inputs"] += 1
        head = s.recv(4096)
        assert head.startswith(b"HTTP/1.1 "), head[:100]
        if head.startswith(b"HTTP/1.1 200") and b"text/event-stream" in head.lower():
            # An event stream: it must end by itself (it has nothing to carry).
            data = head
            while True:
                try:
                    chunk = s.recv(4096)
                except TimeoutError:
                    pytest.fail("GET /mcp opened an event stream that stays open with nothing to send")
                if not chunk:
                    break
                data += chunk


def _client(source: str, timeout: float = 60) -> httpx2.Client:
    return httpx2.Client(timeout=timeout, transport=httpx2.HTTPTransport(local_address=source))


def _timed_recall(http: httpx2.Client, url: str, authorization: str) -> float:
    started = time.perf_counter()
    res = _server.call(http, url, "recall_memory", {"conversation_id": "victim-conv-001"}, authorization)
    elapsed = time.perf_counter() - started
    assert not res.get("isError"), res
    assert [it["payload"] for it in res["structuredContent"]["items"]] == [{"v": 1}]
    return elapsed


@pytest.fixture
def small_allowance_server(tmp_path: Path) -> Iterator[ServerProcess]:
    """A server allowing each address 4 failed logins (one more per 10 s), so the test reaches the limit quickly."""
    proc = _server.start(tmp_path / "data", "--login-failures-per-address", "4", "--login-refill-per-address", "0.1")
    try:
        yield proc
    finally:
        assert proc.stop() == 0, proc.log()[-3000:]


def test_an_attack_from_one_address_leaves_another_sites_client_served(small_allowance_server: ServerProcess) -> None:
    """Wrong passwords, big unauthenticated bodies and 200 slow connections, all from one address.

    A client of another site, from another address, keeps being served: its
    median latency during the attack stays within a small factor of its
    median latency just before, and the server's memory stays bounded.
    """
    proc = small_allowance_server
    port = int(proc.base.rsplit(":", 1)[1])
    victim_auth = _server.auth(_server.OTHER_SITE, _server.OTHER_PASSWORD)
    with _client(VICTIM) as http:
        r = _server.call(
            http, proc.url, "append_memory", {"conversation_id": "victim-conv-001", "items": [{"v": 1}]}, victim_auth
        )
        assert not r.get("isError"), r
        baseline = [_timed_recall(http, proc.url, victim_auth) for _ in range(40)]
    base_rss = _server.rss_kib(proc.proc.pid)
    stop = threading.Event()
    outcomes: dict[str, int] = {}
    lock = threading.Lock()

    def note(kind: str) -> None:
        with lock:
            outcomes[kind] = outcomes.get(kind, 0) + 1

    def guess_passwords(worker: int) -> None:
        with _client(ATTACKER, timeout=30) as http:
            for i in range(40):
                if stop.is_set():
                    return
                try:
                    res = _server.call(
                        http, proc.url, "list_conversations", {}, _server.auth(_server.SITE, f"guess-{worker}-{i}")
                    )
                    note(res["_meta"]["convmem/error"]["code"])
                except (httpx2.TransportError, AssertionError):
                    note("refused")

    def big_bodies() -> None:
        body = b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"x":"' + b"q" * 3_000_000 + b'"}}'
        with _client(ATTACKER, timeout=30) as http:
            for _ in range(5):
                if stop.is_set():
                    return
                try:
                    h = {k: v for k, v in _server.headers().items() if k != "Authorization"}
                    note(f"big-{http.post(proc.url, content=body, headers=h).status_code}")
                except httpx2.TransportError:
                    note("refused")

    peak = [base_rss]

    def sample_rss() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], _server.rss_kib(proc.proc.pid))
            time.sleep(0.05)

    held: list[socket.socket] = []
    threads = [threading.Thread(target=guess_passwords, args=(w,)) for w in range(8)]
    threads += [threading.Thread(target=big_bodies) for _ in range(6)]
    threads.append(threading.Thread(target=sample_rss))
    try:
        for t in threads:
            t.start()
        time.sleep(1.0)  # the guessing and the uploads get going before the slow connections fill the address's quota
        for _ in range(200):
            with contextlib.suppress(OSError):
                s = socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(ATTACKER, 0))
                held.append(s)
                with contextlib.suppress(OSError):
                    s.sendall(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # and never more
        during: list[float] = []
        ends = time.monotonic() + 6.0  # long enough for the guesser to exhaust its failed-login allowance
        with _client(VICTIM) as http:
            while len(during) < 40 or time.monotonic() < ends:
                during.append(_timed_recall(http, proc.url, victim_auth))
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=120)
        for s in held:
            s.close()
    STATS["bad inputs"] += sum(outcomes.values()) + len(held)
    normal, attacked = statistics.median(baseline), statistics.median(during)
    print(
        f"victim median latency {normal * 1000:.1f} ms before, {attacked * 1000:.1f} ms during; "
        f"server RSS peak +{(peak[0] - base_rss) // 1024} MiB; {outcomes}"
    )
    assert outcomes.get("Throttled", 0) > 0, outcomes
    assert outcomes.get("big-413", 0) > 0, outcomes
    assert not any(k.startswith("big-") and k != "big-413" for k in outcomes), outcomes
    # A generous factor: the machine is shared, but a starved event loop or KDF queue costs 100x and more.
    assert attacked < 10 * normal + 0.05, (normal, attacked)
    grown_peak = peak[0] - base_rss
    # Two KDF runs at once may take 2 x 128 MiB; the 3 MB bodies must add nothing like 6 x 3 MB x parse overhead.
    assert grown_peak < 400 * 1024, f"the server grew by {grown_peak} KiB during the attack"
    assert proc.proc.poll() is None, proc.log()[-3000:]
    with _client(VICTIM) as http:
        _timed_recall(http, proc.url, victim_auth)
