"""Floods against a real ``convmem serve``, driven the way an attacker would.

* slow unauthenticated chunked uploads must not take the large-body slots a
  legitimate large append needs;
* a wrong-password flood (many invented site names and spoofed addresses
  through ``--trust-proxy``, and guesses at one site) must not queue a
  correct login of another site behind it;
* TLS handshakes that never finish count against the per-address connection
  cap and are dropped after ``--tls-handshake-timeout``.

No test asserts a speed: each asserts the order of events that the defence
guarantees (``python -m bench.probes.login_flood`` measures the latency).
"""

from __future__ import annotations

import base64
import json
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest
import trustme
from mcp_helpers import ServerProcess

from convmem.logstore.site_credentials import CredentialFile

pytestmark = pytest.mark.timeout(300)

SITE, PASSWORD = "flood-site-01", "flood-password-0001"
QUIET, QUIET_PASSWORD = "quiet-site-01", "quiet-password-0001"
PROTOCOL = "2025-06-18"


def auth(site: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{site}:{password}".encode()).decode()


def call_body(tool: str, arguments: object) -> bytes:
    msg = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": tool, "arguments": arguments}}
    return json.dumps(msg).encode()


def headers(authorization: str, **extra: str) -> dict[str, str]:
    return {
        "Authorization": authorization,
        "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": PROTOCOL,
        **extra,
    }


def _address(proc: ServerProcess) -> tuple[str, int]:
    host, port = proc.base.split("://", 1)[1].rsplit(":", 1)
    return host, int(port)


def _data(tmp_path: Path) -> Path:
    data = tmp_path / "data"
    creds = CredentialFile(data)
    creds.add(SITE, PASSWORD)
    creds.add(QUIET, QUIET_PASSWORD)
    return data


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    proc = ServerProcess(
        _data(tmp_path),
        "--trust-proxy",
        "127.0.0.1",
        "--login-failures-per-site",
        "1000",
        "--login-failures-per-address",
        "1000",
        "--body-timeout",
        "20",
    )
    try:
        yield proc
    finally:
        assert proc.stop() == 0, proc.log()[-3000:]


class SlowChunkedUpload(threading.Thread):
    """A ``POST /mcp`` without credentials or Content-Length, its chunked body sent a byte at a time."""

    def __init__(self, proc: ServerProcess) -> None:
        super().__init__(daemon=True)
        self.sock = socket.create_connection(_address(proc), timeout=60, source_address=("127.0.0.2", 0))
        head = (
            "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            "Accept: application/json, text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
        )
        self.sock.sendall(head.encode())
        self.stop = threading.Event()
        self.answer = b""

    def run(self) -> None:
        self.sock.settimeout(0.5)
        try:
            while not self.stop.is_set():
                self.sock.sendall(b"1\r\nx\r\n")
                try:
                    got = self.sock.recv(4096)
                except TimeoutError:
                    continue
                self.answer += got
                if not got or self.answer:
                    return
        except OSError:
            return
        finally:
            self.sock.close()


def test_slow_unauthenticated_chunked_uploads_leave_the_large_body_slots_free(server: ServerProcess) -> None:
    uploads = [SlowChunkedUpload(server) for _ in range(6)]  # more than the four large-body slots
    for upload in uploads:
        upload.start()
    try:
        time.sleep(1.0)  # every upload is being read now
        items = [{"text": "z" * 1010} for _ in range(100)]
        body = call_body("append_memory", {"conversation_id": "big-append-0001", "items": items})
        assert len(body) > 100_000
        with httpx2.Client(timeout=120) as http:
            r = http.post(server.url, content=body, headers=headers(auth(SITE, PASSWORD)))
        assert r.status_code == 200, r.text[:300]
        assert r.json()["result"]["structuredContent"] == {"first_seq": 0, "last_seq": 99}
        # The append did not wait for the slow uploads to be cut off: they are all still being read.
        assert [u.answer for u in uploads] == [b""] * len(uploads)
        assert all(u.is_alive() for u in uploads)
    finally:
        for upload in uploads:
            upload.stop.set()
        for upload in uploads:
            upload.join(30)


def test_a_correct_login_is_served_ahead_of_a_wrong_password_flood(server: ServerProcess) -> None:
    """48 wrong passwords at once: 24 for invented site names, 24 for a real site, all from spoofed addresses.

    The quiet site's first call must finish before most of the flood's
    checks of the real site do (with one queue it finished after all of them).
    """
    finished: list[str] = []
    lock = threading.Lock()
    body = call_body("list_conversations", {})
    start = threading.Barrier(49)

    def guess(kind: str, i: int) -> None:
        user = f"invented-name-{i:04d}" if kind == "invented" else SITE
        with httpx2.Client(timeout=180) as http:
            start.wait()
            r = http.post(
                server.url,
                content=body,
                headers=headers(auth(user, f"guess-{i:06d}"), **{"X-Forwarded-For": f"198.18.{i // 250}.{i % 250}"}),
            )
        assert r.status_code == 200 and b"Unauthenticated" in r.content, r.text[:300]
        with lock:
            finished.append(kind)

    threads = [threading.Thread(target=guess, args=(kind, i)) for kind in ("invented", "real") for i in range(24)]
    for t in threads:
        t.start()
    start.wait()
    time.sleep(0.3)  # the flood's checks are queued now
    with httpx2.Client(timeout=180) as http:
        r = http.post(
            server.url,
            content=body,
            headers=headers(auth(QUIET, QUIET_PASSWORD), **{"X-Forwarded-For": "192.0.2.200"}),
        )
    with lock:
        real_before = finished.count("real")
    assert r.status_code == 200 and "conversations" in r.json()["result"]["structuredContent"], r.text[:300]
    for t in threads:
        t.join(180)
    assert finished.count("real") == 24 and finished.count("invented") == 24
    assert real_before < 12, f"the correct login finished after {real_before} of the flood's 24 real checks"


def _issue(tmp_path: Path) -> tuple[trustme.CA, Path, Path]:
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    cert_path, key_path = tmp_path / "server.pem", tmp_path / "server.key"
    cert.private_key_pem.write_to_path(str(key_path))
    cert.cert_chain_pems[0].write_to_path(str(cert_path))
    for extra in cert.cert_chain_pems[1:]:
        extra.write_to_path(str(cert_path), append=True)
    return ca, cert_path, key_path


def _tls_healthz(proc: ServerProcess, trust: ssl.SSLContext, source: str) -> bytes:
    with socket.create_connection(_address(proc), timeout=30, source_address=(source, 0)) as raw:
        with trust.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            tls.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            out = b""
            while chunk := tls.recv(4096):
                out += chunk
            return out


def _closed_by_server(sock: socket.socket) -> bool:
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def test_unfinished_tls_handshakes_count_against_the_address_cap_and_time_out(tmp_path: Path) -> None:
    ca, cert, key = _issue(tmp_path)
    trust = ssl.create_default_context()
    ca.configure_trust(trust)
    proc = ServerProcess(
        _data(tmp_path),
        "--tls-cert",
        str(cert),
        "--tls-key",
        str(key),
        "--max-connections-per-address",
        "4",
        "--tls-handshake-timeout",
        "2",
        verify=trust,
    )
    held: list[socket.socket] = []
    try:
        # Four connections that never start their handshake: the address's whole allowance.
        held = [socket.create_connection(_address(proc), timeout=30, source_address=("127.0.0.7", 0)) for _ in range(4)]
        time.sleep(0.3)
        with pytest.raises((ssl.SSLError, OSError)):
            _tls_healthz(proc, trust, "127.0.0.7")  # a fifth is refused before its handshake
        assert _tls_healthz(proc, trust, "127.0.0.8").startswith(b"HTTP/1.1 200")  # another address is served
        # The unfinished handshakes are dropped after the deadline, and the address may connect again.
        for sock in held:
            sock.settimeout(30)
            assert _closed_by_server(sock)
        # The server releases their places just after closing them: allow it a moment (generous bound).
        deadline = time.monotonic() + 10
        while True:
            try:
                assert _tls_healthz(proc, trust, "127.0.0.7").startswith(b"HTTP/1.1 200")
                break
            except (ssl.SSLError, OSError):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
    finally:
        for sock in held:
            sock.close()
        assert proc.stop() == 0, proc.log()[-3000:]
