"""The asynchronous client: one MCP session over streamable HTTP, the log tools as methods.

A failed tool call raises :class:`ToolError` with the server's machine-
readable error (``code``, ``retryable``, details). A lost connection or a
server that went away raises :class:`ConnectionLost` (retryable).
"""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client


class ToolError(Exception):
    """A tool call the server refused: ``code``, ``retryable`` and the details of ``_meta["convmem/error"]``."""

    def __init__(self, error: Mapping[str, Any], text: str) -> None:
        self.code = str(error.get("code", "InternalError"))
        self.retryable = bool(error.get("retryable", False))
        self.details = dict(error)
        super().__init__(text or self.code)


class ConnectionLost(Exception):
    """The server could not be reached or the session broke; retryable (a new session is opened)."""

    retryable = True


class AsyncMemoryClient:
    """The conversation-log tools of a convmem server, for one site (HTTP Basic credentials)."""

    def __init__(self, url: str, site: str, password: str, *, timeout: float = 60.0) -> None:
        self.url = url
        token = base64.b64encode(f"{site}:{password}".encode()).decode()
        self._headers = {"Authorization": f"Basic {token}"}
        self._timeout = timeout

    async def call(self, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
        """One tool call; its structured result. Raises ToolError or ConnectionLost.

        Each call has a session of its own: the SDK's session lives in task
        groups that must be entered and left by one task, and a session per
        call also means a server that restarted needs no reconnection logic.
        """
        try:
            async with (
                httpx2.AsyncClient(headers=self._headers, timeout=httpx2.Timeout(self._timeout)) as http,
                Client(streamable_http_client(self.url, http_client=http)) as client,
            ):
                result = await client.call_tool(tool, arguments)
        except Exception as exc:
            raise ConnectionLost(f"{tool}: {type(exc).__name__}: {exc}") from exc
        if result.is_error:
            meta = result.meta or {}
            text = result.content[0].text if result.content and hasattr(result.content[0], "text") else ""
            raise ToolError(meta.get("convmem/error", {}), text)
        return dict(result.structured_content or {})

    async def append(
        self,
        conversation_id: str,
        items: Sequence[Mapping[str, Any]],
        *,
        idempotency_key: str | None = None,
        expected_next_seq: int | None = None,
    ) -> tuple[int, int]:
        """Append one batch; ``(first_seq, last_seq)``."""
        args: dict[str, Any] = {"conversation_id": conversation_id, "items": [dict(i) for i in items]}
        if idempotency_key is not None:
            args["idempotency_key"] = idempotency_key
        if expected_next_seq is not None:
            args["expected_next_seq"] = expected_next_seq
        out = await self.call("append_memory", args)
        return int(out["first_seq"]), int(out["last_seq"])

    async def recall(self, conversation_id: str, count: int = 50) -> list[dict[str, Any]]:
        """The last ``count`` items (oldest first)."""
        out = await self.call("recall_memory", {"conversation_id": conversation_id, "count": count})
        return list(out["items"])

    async def replay_page(
        self, conversation_id: str, offset: int = 0, limit: int = 1000, wait_ms: int = 0
    ) -> list[dict[str, Any]]:
        """One page of replay_memory (waiting up to ``wait_ms`` at the end of the log)."""
        args: dict[str, Any] = {"conversation_id": conversation_id, "offset": offset, "limit": limit}
        if wait_ms:
            args["wait_ms"] = wait_ms
        out = await self.call("replay_memory", args)
        return list(out["items"])

    async def replay(self, conversation_id: str, offset: int = 0, page: int = 1000) -> AsyncIterator[dict[str, Any]]:
        """Every item from ``offset`` to the end, page by page."""
        while True:
            items = await self.replay_page(conversation_id, offset, page)
            for item in items:
                yield item
            if len(items) < page:
                return
            offset = items[-1]["seq"] + 1

    async def follow(
        self, conversation_id: str, offset: int = 0, wait_ms: int = 20_000, page: int = 1000
    ) -> AsyncIterator[dict[str, Any]]:
        """Every item from ``offset`` on, waiting for new ones (``wait_ms`` per call); never ends by itself."""
        while True:
            items = await self.replay_page(conversation_id, offset, page, wait_ms)
            for item in items:
                yield item
            if items:
                offset = items[-1]["seq"] + 1

    async def conversations(self, page: int = 100) -> AsyncIterator[dict[str, Any]]:
        """The site's whole listing, most recently active first."""
        cursor: str | None = None
        while True:
            args: dict[str, Any] = {"limit": page}
            if cursor is not None:
                args["cursor"] = cursor
            out = await self.call("list_conversations", args)
            for summary in out["conversations"]:
                yield summary
            cursor = out.get("next_cursor")
            if cursor is None:
                return

    async def aclose(self) -> None:
        """Nothing to release (sessions are per call); for symmetry with the context manager."""

    async def __aenter__(self) -> AsyncMemoryClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
