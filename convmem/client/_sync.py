"""The synchronous client: :class:`AsyncMemoryClient` run on an event loop in a background thread."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from typing import Any, TypeVar

from anyio.from_thread import BlockingPortal, start_blocking_portal

from ._async import AsyncMemoryClient

_T = TypeVar("_T")


class MemoryClient:
    """The conversation-log tools of a convmem server, for one site, as blocking calls (thread-safe)."""

    def __init__(self, url: str, site: str, password: str, *, timeout: float = 60.0) -> None:
        self._portal_cm = start_blocking_portal()
        self._portal: BlockingPortal = self._portal_cm.__enter__()
        self._client = AsyncMemoryClient(url, site, password, timeout=timeout)

    def append(
        self,
        conversation_id: str,
        items: Sequence[Mapping[str, Any]],
        *,
        idempotency_key: str | None = None,
        expected_next_seq: int | None = None,
    ) -> tuple[int, int]:
        """Append one batch; ``(first_seq, last_seq)``. Raises ToolError or ConnectionLost."""

        async def go() -> tuple[int, int]:
            return await self._client.append(
                conversation_id, items, idempotency_key=idempotency_key, expected_next_seq=expected_next_seq
            )

        return self._portal.call(go)

    def recall(self, conversation_id: str, count: int = 50) -> list[dict[str, Any]]:
        return self._portal.call(self._client.recall, conversation_id, count)

    def replay_page(
        self, conversation_id: str, offset: int = 0, limit: int = 1000, wait_ms: int = 0
    ) -> list[dict[str, Any]]:
        return self._portal.call(self._client.replay_page, conversation_id, offset, limit, wait_ms)

    def replay(self, conversation_id: str, offset: int = 0, page: int = 1000) -> Iterator[dict[str, Any]]:
        """Every item from ``offset`` to the end."""
        return self._iterate(self._client.replay(conversation_id, offset, page))

    def follow(
        self, conversation_id: str, offset: int = 0, wait_ms: int = 20_000, page: int = 1000
    ) -> Iterator[dict[str, Any]]:
        """Every item from ``offset`` on, waiting for new ones; never ends by itself."""
        return self._iterate(self._client.follow(conversation_id, offset, wait_ms, page))

    def conversations(self, page: int = 100) -> Iterator[dict[str, Any]]:
        """The site's whole listing, most recently active first."""
        return self._iterate(self._client.conversations(page))

    def _iterate(self, agen: AsyncIterator[_T]) -> Iterator[_T]:
        while True:
            try:
                yield self._portal.call(agen.__anext__)
            except StopAsyncIteration:
                return

    def close(self) -> None:
        try:
            self._portal.call(self._client.aclose)
        finally:
            self._portal_cm.__exit__(None, None, None)

    def __enter__(self) -> MemoryClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
