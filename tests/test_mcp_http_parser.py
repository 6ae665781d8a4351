"""The C HTTP parser (httptools) keeps the request-head limit h11 had: 16 KiB, then 400 and close.

A real ``convmem serve`` over loopback sockets; the head arrives in one piece,
or a few bytes at a time (httptools buffers an unfinished header itself).
Kept-alive and pipelined requests are still answered in order.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from mcp_helpers import ServerProcess

from convmem.logstore.site_credentials import CredentialFile
from convmem.mcp_adapter import connguard


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    data: Path = tmp_path_factory.mktemp("parser") / "data"
    CredentialFile(data).add("parser-site", "parser-password-01")
    proc = ServerProcess(data)
    try:
        yield proc
    finally:
        assert proc.stop() == 0, proc.log()[-3000:]


def _connect(proc: ServerProcess) -> socket.socket:
    host, port = proc.base.removeprefix("http://").rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=10)


def _read_all(sock: socket.socket) -> bytes:
    out = b""
    try:
        while chunk := sock.recv(65536):
            out += chunk
    except (ConnectionResetError, TimeoutError):
        pass
    return out


def _health(extra: str = "", close: bool = True) -> bytes:
    return (
        f"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n{extra}{'Connection: close' if close else 'X-A: b'}\r\n\r\n"
    ).encode()


def test_the_server_uses_the_guarded_httptools_parser() -> None:
    protocol = connguard.guarded_protocol()
    assert protocol.__name__ == "GuardedHttpToolsProtocol"


def test_a_head_within_the_limit_is_served(server: ServerProcess) -> None:
    with _connect(server) as sock:
        sock.sendall(_health(f"X-Pad: {'p' * 12_000}\r\n"))
        assert _read_all(sock).startswith(b"HTTP/1.1 200")


def test_an_oversized_head_in_one_piece_is_refused(server: ServerProcess) -> None:
    with _connect(server) as sock:
        sock.sendall(_health(f"X-Pad: {'p' * 20_000}\r\n"))
        reply = _read_all(sock)
    assert reply.startswith(b"HTTP/1.1 400"), reply[:200]
    assert b"Invalid HTTP request received." in reply


def test_an_oversized_head_sent_in_small_pieces_is_refused(server: ServerProcess) -> None:
    with _connect(server) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Long: ")
        sent = 0
        try:
            while sent < 200_000:
                sock.sendall(b"q" * 1000)  # one header value growing without end
                sent += 1000
        except (BrokenPipeError, ConnectionResetError):
            pass
        reply = _read_all(sock)
    assert reply.startswith(b"HTTP/1.1 400"), reply[:200]


def test_kept_alive_and_pipelined_requests_are_answered(server: ServerProcess) -> None:
    with _connect(server) as sock:
        sock.sendall(_health(close=False))
        first = sock.recv(65536)
        assert first.startswith(b"HTTP/1.1 200")
        sock.sendall(_health(close=False) + _health())  # two requests in one piece
        reply = _read_all(sock)
    assert reply.count(b"HTTP/1.1 200") == 2, reply[:400]
