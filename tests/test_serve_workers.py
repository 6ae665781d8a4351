"""``convmem serve --workers 2``: two processes on one port and one data directory, driven together."""

from __future__ import annotations

import collections
import concurrent.futures
import http.client
import json
import os
import signal
import ssl
import time
import urllib.parse
from pathlib import Path

import httpx2
import pytest
import trustme
from coherence_support import auth, call, error_code
from mcp_helpers import ServerProcess

from convmem.logstore.site_credentials import CredentialFile
from convmem.mcp_adapter.workers import WORKER_HEADER

SITE, PASSWORD = "workers-site", "workers-password-0123456789"


def _children(pid: int) -> set[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return {int(p) for p in f.read().split()}


@pytest.mark.timeout(120)
def test_two_workers_share_the_port_and_the_data_directory_over_tls(tmp_path: Path) -> None:
    # Over TLS: the handed connections go through each worker's TLS gate like ones it accepted.
    data = tmp_path / "data"
    CredentialFile(data).add(SITE, PASSWORD)
    who = auth(SITE, PASSWORD)
    ca = trustme.CA()
    issued = ca.issue_cert("127.0.0.1")
    cert, key = tmp_path / "server.pem", tmp_path / "server.key"
    issued.private_key_pem.write_to_path(str(key))
    issued.cert_chain_pems[0].write_to_path(str(cert))
    trust = ssl.create_default_context()
    ca.configure_trust(trust)
    server = ServerProcess(data, "--workers", "2", "--tls-cert", str(cert), "--tls-key", str(key), verify=trust)
    assert server.url.startswith("https://")
    try:
        deadline = time.monotonic() + 30
        while len(_children(server.proc.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        workers = _children(server.proc.pid)
        assert len(workers) == 2, workers

        def append(i: int) -> tuple[int, str | None]:
            # A new connection per call: the supervisor hands each to the worker holding the fewest.
            with httpx2.Client(timeout=60, verify=trust) as http:
                cid = f"workers-conv-{i % 4:02d}"
                body = {
                    "jsonrpc": "2.0",
                    "id": 1,
                    "method": "tools/call",
                    "params": {"name": "append_memory", "arguments": {"conversation_id": cid, "items": [{"i": i}]}},
                }
                r = http.post(
                    server.url,
                    json=body,
                    headers={
                        "Accept": "application/json, text/event-stream",
                        "MCP-Protocol-Version": "2025-06-18",
                        "Authorization": who,
                    },
                )
                assert r.status_code == 200, r.text[:300]
                result = r.json()["result"]
                return int(r.headers[WORKER_HEADER.decode()]), error_code(result)

        answered: set[int] = set()
        rounds = 0
        # Until both answered: a worker takes connections once it is serving, which a loaded machine can
        # delay by seconds after its process exists (at most 60 rounds: 960 items, all recalled below).
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            while answered != workers and rounds < 60:
                if rounds:
                    time.sleep(0.5)
                results = list(pool.map(append, range(rounds * 16, rounds * 16 + 16)))
                rounds += 1
                assert [code for _pid, code in results if code is not None] == []
                answered.update(pid for pid, _code in results)
        assert answered == workers, (answered, workers)
        sent = rounds * 16
        with httpx2.Client(timeout=30, verify=trust) as http:
            items = 0
            for c in range(4):
                got = call(
                    http, server.url, who, "recall_memory", {"conversation_id": f"workers-conv-{c:02d}", "count": 250}
                )
                assert error_code(got) is None, got
                items += len(got["structuredContent"]["items"])
            assert items == sent
    finally:
        assert server.stop(signal.SIGINT) == 0, server.log()[-3000:]
    for pid in workers:
        assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] == "Z"


def _kept_alive(server: ServerProcess, who: str, cid: str) -> tuple[http.client.HTTPConnection, int]:
    """A new kept-alive connection that has made one append; and the worker that holds it."""
    conn = http.client.HTTPConnection("127.0.0.1", urllib.parse.urlsplit(server.url).port, timeout=60)
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                       "params": {"name": "append_memory", "arguments": {"conversation_id": cid, "items": [{"k": 1}]}}})
    conn.request("POST", "/mcp", body=body, headers={
        "Content-Type": "application/json", "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": "2025-06-18", "Authorization": who})
    response = conn.getresponse()
    data = response.read()
    assert response.status == 200 and b'"isError":true' not in data, data[:300]
    return conn, int(response.headers[WORKER_HEADER.decode()])


def _sockets_of(pid: int) -> int:
    count = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            count += os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:")
        except OSError:
            pass
    return count


def _wait_workers(server: ServerProcess, n: int) -> set[int]:
    deadline = time.monotonic() + 30
    while len(_children(server.proc.pid)) < n and time.monotonic() < deadline:
        time.sleep(0.05)
    found = _children(server.proc.pid)
    assert len(found) == n, found
    return found


@pytest.mark.timeout(180)
def test_connections_go_to_the_worker_holding_fewest_and_survive_a_worker_kill(tmp_path: Path) -> None:
    # The kernel's SO_REUSEPORT hash split 8 connections 1/7 in one trial of eight; the supervisor's
    # hand-off gives each new connection to the worker holding the fewest.
    data = tmp_path / "data"
    CredentialFile(data).add(SITE, PASSWORD)
    who = auth(SITE, PASSWORD)
    server = ServerProcess(data, "--workers", "2")
    conns: list[tuple[http.client.HTTPConnection, int]] = []
    try:
        workers = _wait_workers(server, 2)
        conns = [_kept_alive(server, who, f"spread-conv-{i:02d}") for i in range(8)]
        held = collections.Counter(pid for _c, pid in conns)
        assert set(held) == workers and sorted(held.values()) == [4, 4], held
        # Close three of one worker's connections: the next three new ones go to that worker.
        emptied = next(iter(workers))
        before = _sockets_of(emptied)
        mine = [c for c in conns if c[1] == emptied][:3]
        for conn, _pid in mine:
            conn.close()
            conns.remove((conn, _pid))
        deadline = time.monotonic() + 30
        while _sockets_of(emptied) > before - 3 and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.2)  # the worker reports each close right after closing the socket
        fresh = [_kept_alive(server, who, f"spread-new-{i:02d}") for i in range(3)]
        conns += fresh
        assert [pid for _c, pid in fresh] == [emptied] * 3, (fresh, emptied)
        # Kill a worker: those it held are lost with it, nothing else.
        victim = next(iter(workers - {emptied}))
        survivor = next(iter(workers - {victim}))
        os.kill(victim, signal.SIGKILL)
        # Straight after the kill: a connection handed while the victim was dying comes back to the
        # supervisor, untouched, and goes to the survivor; none is lost.
        for i in range(6):
            conn, pid = _kept_alive(server, who, f"killed-new-{i:02d}")
            conns.append((conn, pid))
            assert pid == survivor
        # The survivor's older connections are still served.
        for c, p in conns[:-6]:
            if p == survivor:
                c.request("GET", "/healthz")
                assert c.getresponse().read()
        deadline = time.monotonic() + 30
        while (len(_children(server.proc.pid) - {victim}) < 2) and time.monotonic() < deadline:
            time.sleep(0.05)
        replacement = _children(server.proc.pid) - workers
        assert len(replacement) == 1, replacement
        # The replacement holds nothing, so once it serves it takes the next connections; until then
        # the survivor answers (no client waits for a worker's start-up).
        deadline = time.monotonic() + 60
        while True:
            conn, pid = _kept_alive(server, who, "killed-after")
            conns.append((conn, pid))
            if pid in replacement or time.monotonic() > deadline:
                break
            assert pid == survivor
            time.sleep(0.1)
        assert pid in replacement
    finally:
        for conn, _pid in conns:
            conn.close()
        assert server.stop(signal.SIGINT) == 0, server.log()[-3000:]


