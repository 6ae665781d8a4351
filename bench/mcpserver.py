"""Start a real ``convmem serve`` on loopback and connect the MCP SDK's client to it."""

from __future__ import annotations

import base64
import contextlib
import os
import re
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SITE = "bench-mcp-site"
PASSWORD = "bench-password-0123456789"


def available() -> str | None:
    """None when the MCP server and SDK client can be used; else why not."""
    try:
        import httpx2  # noqa: F401
        from mcp import Client  # noqa: F401
        from mcp.client.streamable_http import streamable_http_client  # noqa: F401

        import convmem.cli  # noqa: F401
    except ImportError as exc:
        return f"MCP server or client not importable: {exc}"
    return None


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONVMEM_")}
    env["PYTHONPATH"] = os.pathsep.join([ROOT, *[p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]])
    return env


def _cmd(*args: str) -> list[str]:
    return [sys.executable, "-c", "import sys; from convmem.cli import main; sys.exit(main())", *args]


def add_site(data_dir: str) -> None:
    """Create the bench site; one that already exists is fine, any other refusal is an error.

    Call it before writing the site's data: ``site add`` refuses a name whose data is already
    on disk without credentials (a removed site's leftovers must never reach a new owner).
    """
    done = subprocess.run(
        _cmd("site", "add", SITE, "--password-stdin", "--data-dir", data_dir),
        input=PASSWORD + "\n", capture_output=True, text=True, env=_env(), timeout=120,
    )
    if done.returncode != 0 and "already exists" not in done.stderr:
        raise RuntimeError(f"convmem site add {SITE} failed: {done.stderr.strip()}")


class Server:
    """A ``convmem serve`` child process on 127.0.0.1 with a free port."""

    def __init__(self, data_dir: str, noop_payload: str | None = None, python_args: Sequence[str] = (),
                 extra_args: Sequence[str] = (), bare: bool = False) -> None:
        """``noop_payload``: serve the bench's extra ``bench_noop`` tool, answering that file's result.

        ``python_args`` go to the interpreter before the server's module (a profiler's ``-m pyinstrument ...``);
        ``extra_args`` are more ``convmem serve`` options. ``bare``: the bare ASGI app of
        :mod:`bench.noopserver` instead of convmem (the floor; ``data_dir`` only holds its log;
        ``python_args`` apply, ``extra_args`` do not).
        """
        os.makedirs(data_dir, exist_ok=True)
        if not bare:
            add_site(data_dir)
        self.log = open(os.path.join(os.path.dirname(data_dir), "server.log"), "a")
        args = ("serve", "--data-dir", data_dir, "--host", "127.0.0.1", "--port", "0", *extra_args)
        if bare:
            cmd = [sys.executable, *python_args, "-m", "bench.noopserver", "--bare"]
        elif noop_payload:
            cmd = [sys.executable, *python_args, "-m", "bench.noopserver", noop_payload, *args]
        elif python_args:
            cmd = [sys.executable, *python_args, "-m", "convmem", *args]
        else:
            cmd = _cmd(*args)
        self.proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE, stderr=self.log, text=True, env=_env(),
        )
        assert self.proc.stdout is not None
        banner = ""
        while not banner.endswith("stop.\n"):
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"convmem serve did not start: {banner}")
            banner += line
        match = re.search(r"(http://127\.0\.0\.1:\d+/mcp)", banner)
        if not match:
            raise RuntimeError(f"no MCP URL in the banner: {banner}")
        self.url = match.group(1)
        self.pid = self.proc.pid

    def status(self, field: str) -> int:
        """A ``/proc/PID/status`` figure in bytes (e.g. ``VmRSS``, ``VmHWM``)."""
        with open(f"/proc/{self.pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
        raise KeyError(field)

    def reset_peak(self) -> bool:
        """Reset the peak-RSS mark (``VmHWM``); False when the kernel does not allow it."""
        try:
            with open(f"/proc/{self.pid}/clear_refs", "w") as f:
                f.write("5")
            return True
        except OSError:
            return False

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stdout:
            self.proc.stdout.close()
        self.log.close()


def auth_header() -> str:
    return "Basic " + base64.b64encode(f"{SITE}:{PASSWORD}".encode()).decode()


def mcp_headers() -> dict[str, str]:
    """The headers of a raw JSON-RPC POST to the MCP endpoint as the bench site."""
    return {"Authorization": auth_header(), "Content-Type": "application/json",
            "Accept": "application/json, text/event-stream", "MCP-Protocol-Version": "2025-06-18"}


@contextlib.asynccontextmanager
async def client(url: str, on_response: Callable[[Any], Any] | None = None) -> AsyncIterator[Any]:
    """The MCP SDK client over streamable HTTP, authenticated as the bench site."""
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    hooks = {"response": [on_response]} if on_response else {}
    http = httpx2.AsyncClient(headers={"Authorization": auth_header()}, timeout=httpx2.Timeout(600),
                              event_hooks=hooks)
    async with http, Client(streamable_http_client(url, http_client=http), mode="legacy") as c:
        yield c


def wait(seconds: float) -> None:
    time.sleep(seconds)
