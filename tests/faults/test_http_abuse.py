"""Oversized and malformed HTTP bodies, and slow clients, against the running server.

None may take the server down, make it answer 5xx, change the data
directory, or make it hold the bodies in memory: its resident memory after
many oversized uploads (several at once) stays within a fixed bound, and
ordinary calls keep being served while slow clients hold connections open.
"""

from __future__ import annotations

import socket
import threading
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
            s = socket.create_connection(("127.0.0.1", port), timeout=30)
            if i % 3 == 0:
                s.sendall(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # headers never finished
            elif i % 3 == 1:
                s.sendall(
                    b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                    b"Accept: application/json, text/event-stream\r\nContent-Length: 100000\r\n\r\n"
                    b'{"jsonrpc":"2.0",'  # body never finished
                )
            held.append(s)  # (and every third one sends nothing at all)
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
