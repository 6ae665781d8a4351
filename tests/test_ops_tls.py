"""HTTPS: the MCP SDK client over TLS, certificate reload on SIGHUP, and no plain HTTP off loopback."""

from __future__ import annotations

import signal
import ssl
import time
from pathlib import Path

import httpx2
import pytest
import trustme
from mcp_helpers import basic, run_convmem
from ops_support import OpsServer, add_site, connect

SITE, PASSWORD = "tls-site-1", "correct horse battery staple"


def _issue(tmp_path: Path, name: str) -> tuple[trustme.CA, Path, Path]:
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    cert_path, key_path = tmp_path / f"{name}.pem", tmp_path / f"{name}.key"
    cert.private_key_pem.write_to_path(str(key_path))
    cert.cert_chain_pems[0].write_to_path(str(cert_path))
    for extra in cert.cert_chain_pems[1:]:
        extra.write_to_path(str(cert_path), append=True)
    return ca, cert_path, key_path


def _client_context(ca: trustme.CA) -> ssl.SSLContext:
    ctx = ssl.create_default_context()
    ca.configure_trust(ctx)
    return ctx


@pytest.mark.anyio
async def test_sdk_client_over_https_and_sighup_reload(tmp_path: Path) -> None:
    data = tmp_path / "data"
    add_site(data, SITE, PASSWORD)
    ca, cert, key = _issue(tmp_path, "server")
    trust = _client_context(ca)
    server = OpsServer(data, "--tls-cert", str(cert), "--tls-key", str(key), verify=trust)
    try:
        assert server.url.startswith("https://127.0.0.1:")
        async with connect(server.url, basic(SITE, PASSWORD), verify=trust) as client:
            ok = await client.call_tool(
                "append_memory", {"conversation_id": "conv-tls-1", "items": [{"text": "over tls"}]}
            )
            assert not ok.is_error, ok
            got = await client.call_tool("recall_memory", {"conversation_id": "conv-tls-1", "count": 5})
            assert got.structured_content["items"][0]["payload"] == {"text": "over tls"}
        # Plain HTTP to the TLS port is not served.
        with pytest.raises(httpx2.TransportError):
            httpx2.get(server.base.replace("https://", "http://") + "/healthz", timeout=5)

        # Renew: a certificate from another CA replaces the files; SIGHUP loads it.
        ca2, cert2, key2 = _issue(tmp_path, "renewed")
        cert.write_bytes(cert2.read_bytes())
        key.write_bytes(key2.read_bytes())
        server.proc.send_signal(signal.SIGHUP)
        trust2 = _client_context(ca2)
        deadline = time.monotonic() + 20
        while "reloaded the TLS certificate" not in server.log():
            assert time.monotonic() < deadline, server.log()
            time.sleep(0.05)
        assert httpx2.get(server.base + "/healthz", timeout=5, verify=trust2).status_code == 200
        with pytest.raises(httpx2.TransportError):
            httpx2.get(server.base + "/healthz", timeout=5, verify=trust)
        async with connect(server.url, basic(SITE, PASSWORD), verify=trust2) as client:
            got = await client.call_tool("recall_memory", {"conversation_id": "conv-tls-1", "count": 5})
            assert not got.is_error

        # A broken renewal is refused and the running certificate stays.
        key.write_text("not a key\n")
        server.proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 20
        while "still using the previous certificate" not in server.log():
            assert time.monotonic() < deadline, server.log()
            time.sleep(0.05)
        assert httpx2.get(server.base + "/healthz", timeout=5, verify=trust2).status_code == 200
    finally:
        assert server.stop() == 0, server.log()


def test_non_loopback_bind_without_tls_is_refused(tmp_path: Path) -> None:
    res = run_convmem("serve", "--data-dir", str(tmp_path / "d"), "--host", "0.0.0.0", "--port", "0")
    assert res.returncode == 2
    assert "not a loopback address" in res.stderr
    assert "--tls-cert FILE --tls-key FILE" in res.stderr and "--insecure-bind" in res.stderr
    assert "--trust-proxy" in res.stderr
    assert not (tmp_path / "d").exists()  # refused before anything was created


def test_tls_options_must_come_in_pairs_and_load(tmp_path: Path) -> None:
    res = run_convmem("serve", "--data-dir", str(tmp_path / "d"), "--port", "0", "--tls-cert", "x.pem")
    assert res.returncode == 2 and "go together" in res.stderr
    bad = tmp_path / "bad.pem"
    bad.write_text("nonsense\n")
    res = run_convmem(
        "serve", "--data-dir", str(tmp_path / "d"), "--port", "0", "--tls-cert", str(bad), "--tls-key", str(bad)
    )
    assert res.returncode == 2 and "cannot load the TLS certificate" in res.stderr
    assert not (tmp_path / "d").exists()


def test_plain_http_stays_on_loopback(tmp_path: Path) -> None:
    server = OpsServer(tmp_path / "data")
    try:
        assert server.url.startswith("http://127.0.0.1:")
    finally:
        assert server.stop() == 0
