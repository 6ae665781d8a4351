"""Helpers for the ops tests: a real ``convmem serve`` child over HTTP or HTTPS, and site set-up."""

from __future__ import annotations

import contextlib
import re
import signal
import ssl
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp_helpers import convmem_cmd, run_convmem, subprocess_env


def add_site(data_dir: Path, site: str, password: str) -> None:
    res = run_convmem("site", "add", site, "--data-dir", str(data_dir), "--password-stdin", input=password + "\n")
    assert res.returncode == 0, res.stderr


class OpsServer:
    """``convmem serve`` on 127.0.0.1, port 0, with extra options; stderr kept in a file."""

    def __init__(self, data_dir: Path, *extra: str, verify: ssl.SSLContext | bool = True) -> None:
        self.data_dir = data_dir
        self.verify = verify
        self.log_path = data_dir.parent / f"server-{time.monotonic_ns()}.log"
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            convmem_cmd("serve", "--data-dir", str(data_dir), "--host", "127.0.0.1", "--port", "0", *extra),
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
            env=subprocess_env(),
            cwd=data_dir.parent,
        )
        assert self.proc.stdout is not None
        lines: list[str] = []
        while not (lines and lines[-1].startswith("Press Ctrl+C")):
            line = self.proc.stdout.readline()
            if not line:
                self.stop()
                raise RuntimeError(f"server did not start: {''.join(lines)}\n{self.log()}")
            lines.append(line)
        self.banner = "".join(lines)
        match = re.search(r"MCP endpoint \(streamable HTTP\): (https?://\S+)", self.banner)
        assert match, self.banner
        self.url = match.group(1)
        self.base = self.url.removesuffix("/mcp")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx2.TransportError):
                if httpx2.get(self.base + "/healthz", timeout=2, verify=verify).status_code == 200:
                    return
            time.sleep(0.05)
        raise RuntimeError(f"server never became healthy\n{self.log()}")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait()
        if self.proc.stdout:
            self.proc.stdout.close()
        self._log.close()
        return rc

    def log(self) -> str:
        return self.log_path.read_text()


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
