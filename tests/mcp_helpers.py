"""Helpers for the MCP end-to-end tests: a real ``convmem serve`` subprocess and SDK clients.

Nothing here is mocked: the server is the console entry point running in its
own process on a free loopback port, and clients are the MCP SDK's own.
"""

from __future__ import annotations

import base64
import contextlib
import os
import re
import signal
import ssl
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

REPO_ROOT = Path(__file__).resolve().parent.parent


def subprocess_env(**extra: str) -> dict[str, str]:
    """The environment for a child ``convmem``: this interpreter's path plus the repo root."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONVMEM_")}
    parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join([*parts, str(REPO_ROOT)])
    env.update(extra)
    return env


def convmem_cmd(*args: str) -> list[str]:
    """argv running the ``convmem`` CLI with this interpreter."""
    return [sys.executable, "-c", "import sys; from convmem.cli import main; sys.exit(main())", *args]


def run_convmem(*args: str, input: str | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run one ``convmem`` command to completion."""
    return subprocess.run(
        convmem_cmd(*args),
        input=input,
        capture_output=True,
        text=True,
        timeout=60,
        env=subprocess_env(),
        cwd=cwd,
    )


def basic(site: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{site}:{password}".encode()).decode()


class ServerProcess:
    """A ``convmem serve`` child on 127.0.0.1 with a free port; read its URL from the banner."""

    def __init__(
        self,
        data_dir: Path,
        *extra: str,
        verify: ssl.SSLContext | bool = True,
        command: list[str] | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        """``verify``: how ``/healthz`` checks an HTTPS server's certificate; ``command``: the argv that
        runs ``convmem`` (default: this interpreter on the checkout), with ``env`` as its environment."""
        self.data_dir = data_dir
        self.verify = verify
        self.log_path = data_dir.parent / f"server-{os.getpid()}-{time.monotonic_ns()}.log"
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            [
                *(command or convmem_cmd()),
                *("serve", "--data-dir", str(data_dir), "--host", "127.0.0.1", "--port", "0", *extra),
            ],
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
            env=subprocess_env() if env is None else env,
            cwd=data_dir.parent,
        )
        self.banner = self._read_banner()
        match = re.search(r"MCP endpoint \(streamable HTTP\): (https?://\S+)", self.banner)
        assert match, self.banner
        self.url = match.group(1)
        self.base = self.url.removesuffix("/mcp")
        self._wait_healthy()

    def _read_banner(self) -> str:
        assert self.proc.stdout is not None
        lines: list[str] = []
        while True:  # the banner ends with "Press Ctrl+C to stop."
            line = self.proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            if line.startswith("Press Ctrl+C"):
                break
        text = "".join(lines)
        if not text.endswith("stop.\n"):
            self.proc.kill()
            raise RuntimeError(f"server did not start: {text}\n{self.log_path.read_text()}")
        return text

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx2.TransportError):
                if httpx2.get(self.base + "/healthz", timeout=2, verify=self.verify).status_code == 200:
                    return
            time.sleep(0.05)
        raise RuntimeError(f"server never became healthy\n{self.log_path.read_text()}")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> int:
        """Signal the server and return its exit status."""
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
async def connect(url: str, authorization: str | None, *, mode: str = "legacy") -> AsyncIterator[Client]:
    """An SDK client connected to ``url``, sending ``authorization`` on every request."""
    headers = {"Authorization": authorization} if authorization else {}
    http = httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(60))
    async with http, Client(streamable_http_client(url, http_client=http), mode=mode) as client:
        yield client


def error_of(result: Any) -> dict[str, Any]:
    """The ``convmem/error`` object of a failed tool result (asserting it is one)."""
    assert result.is_error, result
    assert result.structured_content is None
    meta = result.meta or {}
    error = meta["convmem/error"]
    assert isinstance(error["retryable"], bool)
    return error
