"""Helpers for the ops tests: a real ``convmem serve`` child over HTTP or HTTPS, and site set-up."""

from __future__ import annotations

import contextlib
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp_helpers import ServerProcess, run_convmem


def add_site(data_dir: Path, site: str, password: str) -> None:
    res = run_convmem("site", "add", site, "--data-dir", str(data_dir), "--password-stdin", input=password + "\n")
    assert res.returncode == 0, res.stderr


#: ``convmem serve`` on 127.0.0.1, port 0, with extra options (HTTPS too: pass ``verify``).
OpsServer = ServerProcess


@contextlib.asynccontextmanager
async def connect(
    url: str, authorization: str | None, *, verify: ssl.SSLContext | bool = True, **headers: str
) -> AsyncIterator[Client]:
    """An SDK client for ``url`` sending ``authorization`` (and ``headers``) on every request."""
    all_headers: dict[str, Any] = dict(headers)
    if authorization:
        all_headers["Authorization"] = authorization
    http = httpx2.AsyncClient(headers=all_headers, timeout=httpx2.Timeout(60), verify=verify)
    async with http, Client(streamable_http_client(url, http_client=http)) as client:
        yield client
