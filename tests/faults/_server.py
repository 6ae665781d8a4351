"""A real ``convmem serve`` for the server-level fault tests, and raw JSON-RPC calls to it.

Calls are plain HTTP POSTs (the server runs stateless with JSON responses),
so a test controls every byte of the request body.
"""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path
from typing import Any

import httpx2
from mcp_helpers import ServerProcess

from convmem.logstore.site_credentials import CredentialFile

from ._common import SITE

PASSWORD = "fault-password-0123456789"
OTHER_SITE, OTHER_PASSWORD = "other-site", "other-password-0123456789"
PROTOCOL = "2025-06-18"


def auth(site: str = SITE, password: str = PASSWORD) -> str:
    return "Basic " + base64.b64encode(f"{site}:{password}".encode()).decode()


def start(data_dir: Path, *extra: str) -> ServerProcess:
    """A server on ``data_dir`` knowing the fault site (and a second site)."""
    creds = CredentialFile(data_dir)
    if SITE not in creds.sites():
        creds.add(SITE, PASSWORD)
        creds.add(OTHER_SITE, OTHER_PASSWORD)
    return ServerProcess(data_dir, *extra)


def headers(authorization: str | None = None) -> dict[str, str]:
    return {
        "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": PROTOCOL,
        "Authorization": authorization or auth(),
    }


def body(tool: str, arguments: Any, rid: int = 1) -> bytes:
    msg = {"jsonrpc": "2.0", "id": rid, "method": "tools/call", "params": {"name": tool, "arguments": arguments}}
    return json.dumps(msg, ensure_ascii=False, allow_nan=False).encode("utf-8", "surrogatepass")


def post(client: httpx2.Client, url: str, content: bytes, authorization: str | None = None) -> httpx2.Response:
    return client.post(url, content=content, headers=headers(authorization))


def call(client: httpx2.Client, url: str, tool: str, arguments: Any, authorization: str | None = None) -> Any:
    """The JSON-RPC ``result`` of a tool call (raises on an HTTP or protocol error)."""
    r = post(client, url, body(tool, arguments), authorization)
    assert r.status_code == 200, (r.status_code, r.text[:500])
    msg = r.json()
    assert "result" in msg, msg
    return msg["result"]


def rss_kib(pid: int) -> int:
    """Resident memory of a process in KiB (Linux)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def data_files(data_dir: Path) -> dict[str, bytes]:
    """Every file of the data directory except credentials (for byte-for-byte comparisons).

    A segment is taken up to its data end: the zeros after it are preallocated
    space, which holds nothing (FORMAT.md 2) and which the server's extend-ahead
    job may grow at any moment after an append (not only during one).
    A site's pool of pre-created conversations (built in the background when
    appends pause, logstore.convpool) is no conversation's data: left out.
    """
    out: dict[str, bytes] = {}
    for dirpath, dirs, files in os.walk(data_dir):
        if os.path.basename(os.path.dirname(dirpath)) == "sites" and "pool" in dirs:
            dirs.remove("pool")
        for name in files:
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, data_dir)
            with open(path, "rb") as f:
                data = f.read()
            out[rel] = data.rstrip(b"\0") if name.endswith(".seg") else data
    return out
