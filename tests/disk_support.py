"""Helpers for the storage-security tests: JSON-RPC tool calls to a running ``convmem serve``."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import httpx2
from mcp_helpers import basic


class ToolCaller:
    """Calls one site's tools on a running server, one plain JSON-RPC POST each (as an attacker would)."""

    def __init__(self, url: str, site: str, password: str) -> None:
        self.url = url
        self.http = httpx2.Client(timeout=60)
        self.headers = {
            "Authorization": basic(site, password),
            "Content-Type": "application/json",
            "Accept": "application/json, text/event-stream",
        }

    def call(self, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
        """The tool's result object (``isError`` set on failure)."""
        body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": tool, "arguments": arguments}}
        r = self.http.post(self.url, content=json.dumps(body), headers=self.headers)
        assert r.status_code == 200, r.text
        result: dict[str, Any] = r.json()["result"]
        return result

    def ok(self, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
        result = self.call(tool, arguments)
        assert not result.get("isError"), result
        structured: dict[str, Any] = result["structuredContent"]
        return structured

    def error(self, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
        """The ``convmem/error`` object of a call that must fail."""
        result = self.call(tool, arguments)
        assert result.get("isError") is True, result
        error: dict[str, Any] = result["_meta"]["convmem/error"]
        return error

    def close(self) -> None:
        self.http.close()


def tree(root: Path) -> dict[str, tuple[int, int, int]]:
    """Every entry under ``root`` (not following links): relative path -> (mode, size, allocated bytes).

    An entry renamed or removed between the walk's listing and its ``lstat`` (a pool
    fill's temporary entry moving into place) is left out: the tree is changing, which
    the next snapshot shows.
    """
    out: dict[str, tuple[int, int, int]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                continue
            out[os.path.relpath(path, root)] = (st.st_mode, st.st_size, st.st_blocks * 512)
    return out


def memory_fields(subject: str, summary: str) -> dict[str, Any]:
    return {"category": "fact", "subject": subject, "summary": summary, "details": "", "tags": []}
