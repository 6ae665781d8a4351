"""The HTTP front door of a real ``convmem serve``: what it admits before any credential is proven.

Every test talks to the server process over loopback sockets (raw sockets
where the exact bytes and timing matter).
"""

from __future__ import annotations

import base64
import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest
from mcp_helpers import ServerProcess, convmem_cmd, subprocess_env

from convmem.logstore.site_credentials import CredentialFile

SITE = "front-door-site"
PASSWORD = "front-door-password-01"
PROTOCOL = "2025-06-18"


def auth(site: str = SITE, password: str = PASSWORD) -> str:
    return "Basic " + base64.b64encode(f"{site}:{password}".encode()).decode()


def call_body(tool: str, arguments: object) -> bytes:
    msg = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": tool, "arguments": arguments}}
    return json.dumps(msg).encode()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    data = tmp_path_factory.mktemp("front") / "data"
    CredentialFile(data).add(SITE, PASSWORD)
    proc = ServerProcess(
        data,
        "--header-timeout",
        "1",
        "--body-timeout",
        "1",
        "--max-connections-per-address",
        "8",
        "--allowed-host",
        "memory.example.test",
    )
    try:
        yield proc
    finally:
        assert proc.stop() == 0, proc.log()[-3000:]


def _address(proc: ServerProcess) -> tuple[str, int]:
    host, port = proc.base.removeprefix("http://").rsplit(":", 1)
    return host, int(port)


def _raw(proc: ServerProcess, request: bytes, *, source: str = "127.0.0.1", timeout: float = 10) -> bytes:
    """Send ``request`` on a fresh connection; everything the server answers until it closes or goes quiet."""
    with socket.create_connection(_address(proc), timeout=timeout, source_address=(source, 0)) as sock:
        sock.sendall(request)
        out = b""
        try:
            while chunk := sock.recv(65536):
                out += chunk
                if b"\r\n\r\n" in out and b"Connection: close" not in out and b"connection: close" not in out:
                    head, _, rest = out.partition(b"\r\n\r\n")
                    length = next(
                        (int(x.split(b":")[1]) for x in head.split(b"\r\n") if x.lower().startswith(b"content-length")),
                        None,
                    )
                    if length is not None and len(rest) >= length:
                        break
        except (ConnectionResetError, TimeoutError):
            pass
        return out


def _post_head(proc: ServerProcess, length: int | None, authorization: list[str], host: str = "") -> bytes:
    h, p = _address(proc)
    lines = [
        "POST /mcp HTTP/1.1",
        f"Host: {host or f'{h}:{p}'}",
        "Content-Type: application/json",
        "Accept: application/json, text/event-stream",
        f"MCP-Protocol-Version: {PROTOCOL}",
        *(f"Authorization: {a}" for a in authorization),
        f"Content-Length: {length}" if length is not None else "Transfer-Encoding: chunked",
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def test_two_authorization_headers_are_refused(server: ServerProcess) -> None:
    body = call_body("list_conversations", {})
    reply = _raw(server, _post_head(server, len(body), [auth(), auth("someone-else", "x" * 12)]) + body)
    assert reply.startswith(b"HTTP/1.1 400"), reply[:300]
    with httpx2.Client(timeout=30) as http:
        ok = http.post(
            server.url,
            content=body,
            headers={
                "Authorization": auth(),
                "Content-Type": "application/json",
                "Accept": "application/json, text/event-stream",
            },
        )
        assert ok.status_code == 200 and not ok.json()["result"].get("isError")


def test_a_large_unauthenticated_body_is_refused_before_it_is_sent(server: ServerProcess) -> None:
    # Only the headers go out: the answer must come without the server waiting for 3 MB.
    started = time.monotonic()
    reply = _raw(server, _post_head(server, 3_000_000, []))
    assert reply.startswith(b"HTTP/1.1 413"), reply[:300]
    reply = _raw(server, _post_head(server, 3_000_000, [auth(SITE, "not-the-password-00")]))
    assert reply.startswith(b"HTTP/1.1 413"), reply[:300]
    assert time.monotonic() - started < 30


def test_a_chunked_unauthenticated_body_is_cut_off_at_the_small_cap(server: ServerProcess) -> None:
    chunk = b"x" * 32768
    payload = b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for _ in range(8))  # 256 KiB, no end
    reply = _raw(server, _post_head(server, None, []) + payload)
    assert reply.startswith(b"HTTP/1.1 413"), reply[:300]


def test_an_authenticated_client_may_still_send_a_large_append(server: ServerProcess) -> None:
    items = [{"blob": "y" * 200_000} for _ in range(4)]
    body = call_body("append_memory", {"conversation_id": "large-append-01", "items": items})
    assert len(body) > 64 * 1024
    with httpx2.Client(timeout=30) as http:
        r = http.post(
            server.url,
            content=body,
            headers={
                "Authorization": auth(),
                "Content-Type": "application/json",
                "Accept": "application/json, text/event-stream",
            },
        )
    assert r.status_code == 200, r.text[:300]
    assert r.json()["result"]["structuredContent"] == {"first_seq": 0, "last_seq": 3}


def test_slow_headers_are_cut_off(server: ServerProcess) -> None:
    with socket.create_connection(_address(server), timeout=10) as sock:
        sock.sendall(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        sock.settimeout(8)
        try:
            assert sock.recv(1024) == b""  # closed by the server after --header-timeout
        except ConnectionResetError:
            pass


def test_a_slow_body_is_answered_408(server: ServerProcess) -> None:
    reply = _raw(server, _post_head(server, 100, [auth()]) + b'{"jsonrpc":')
    assert reply.startswith(b"HTTP/1.1 408"), reply[:300]


def test_connections_per_address_are_capped(server: ServerProcess) -> None:
    held = [socket.create_connection(_address(server), timeout=10, source_address=("127.0.0.2", 0)) for _ in range(8)]
    try:
        extra = socket.create_connection(_address(server), timeout=10, source_address=("127.0.0.2", 0))
        with extra:
            extra.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            try:
                assert extra.recv(1024) == b""
            except ConnectionResetError:
                pass
        # Another address is served as usual.
        ok = _raw(server, b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n", source="127.0.0.3")
        assert ok.startswith(b"HTTP/1.1 200"), ok[:200]
    finally:
        for s in held:
            s.close()


def test_only_allowed_host_names_reach_the_mcp_endpoint(server: ServerProcess) -> None:
    body = call_body("list_conversations", {})
    good = _raw(server, _post_head(server, len(body), [auth()], host="memory.example.test") + body)
    assert good.startswith(b"HTTP/1.1 200"), good[:300]
    bad = _raw(server, _post_head(server, len(body), [auth()], host="attacker.example.test") + body)
    assert bad.startswith(b"HTTP/1.1 421"), bad[:300]


def test_a_non_loopback_bind_needs_allowed_hosts(tmp_path: Path) -> None:
    import subprocess

    # 192.0.2.1 (TEST-NET-1) is not an address of this machine: the server must refuse before trying to bind.
    out = subprocess.run(
        # --insecure-bind gets past the TLS requirement (tested in test_ops_tls), so this checks the host rule.
        convmem_cmd(
            "serve", "--data-dir", str(tmp_path / "data"), "--host", "192.0.2.1", "--port", "0", "--insecure-bind"
        ),
        capture_output=True,
        text=True,
        timeout=60,
        env=subprocess_env(),
    )
    assert out.returncode == 2
    assert "--allowed-host" in out.stderr, out.stderr


def test_a_throttled_address_is_told_when_to_come_back_before_sending_a_large_body(tmp_path: Path) -> None:
    data = tmp_path / "data"
    CredentialFile(data).add(SITE, PASSWORD)
    proc = ServerProcess(data, "--login-failures-per-address", "1", "--login-refill-per-address", "0.01")
    try:
        body = call_body("list_conversations", {})
        wrong = _raw(proc, _post_head(proc, len(body), [auth(SITE, "wrong-password-000")]) + body, source="127.0.0.4")
        assert wrong.startswith(b"HTTP/1.1 200") and b"Unauthenticated" in wrong, wrong[:300]
        # The address has used its allowance: even the right password is not checked now.
        reply = _raw(proc, _post_head(proc, 2_000_000, [auth()]), source="127.0.0.4")
        assert reply.startswith(b"HTTP/1.1 429"), reply[:300]
        assert b"retry-after:" in reply.lower()
        small = _raw(proc, _post_head(proc, len(body), [auth(SITE, "another-wrong-pass")]) + body, source="127.0.0.4")
        assert b"Throttled" in small and b"retry_after_seconds" in small, small[:600]
        # Another address is unaffected.
        ok = _raw(proc, _post_head(proc, len(body), [auth()]) + body, source="127.0.0.5")
        assert ok.startswith(b"HTTP/1.1 200") and b"conversations" in ok, ok[:300]
    finally:
        assert proc.stop() == 0
