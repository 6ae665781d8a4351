"""``convmem serve --workers 2``: two processes on one port and one data directory, driven together."""

from __future__ import annotations

import concurrent.futures
import os
import signal
import time
from pathlib import Path

import httpx2
import pytest
from coherence_support import auth, call, error_code
from mcp_helpers import ServerProcess

from convmem.logstore.site_credentials import CredentialFile
from convmem.mcp_adapter.workers import WORKER_HEADER

SITE, PASSWORD = "workers-site", "workers-password-0123456789"


def _children(pid: int) -> set[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return {int(p) for p in f.read().split()}


@pytest.mark.timeout(120)
def test_two_workers_share_the_port_and_the_data_directory(tmp_path: Path) -> None:
    data = tmp_path / "data"
    CredentialFile(data).add(SITE, PASSWORD)
    who = auth(SITE, PASSWORD)
    server = ServerProcess(data, "--workers", "2")
    try:
        deadline = time.monotonic() + 30
        while len(_children(server.proc.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        workers = _children(server.proc.pid)
        assert len(workers) == 2, workers

        def append(i: int) -> tuple[int, str | None]:
            # A new connection per call: the kernel hands each to whichever worker accepts first.
            with httpx2.Client(timeout=60) as http:
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
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            for _round in range(10):
                results = list(pool.map(append, range(_round * 16, _round * 16 + 16)))
                assert [code for _pid, code in results if code is not None] == []
                answered.update(pid for pid, _code in results)
                if answered == workers:
                    break
        assert answered == workers, (answered, workers)
        sent = (_round + 1) * 16
        with httpx2.Client(timeout=30) as http:
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
