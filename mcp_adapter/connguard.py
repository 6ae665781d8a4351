"""Connection-level limits uvicorn lacks: a deadline for request headers, and connections per address.

uvicorn's own limits (``limit_concurrency``, the keep-alive timeout) do not
stop a client that opens many connections and sends its request headers a
byte at a time ("slowloris"): such connections are held for ever and count
against ``limit_concurrency``, so every other client is then answered 503.
:func:`guarded_h11_protocol` builds an HTTP/1.1 protocol class that

* closes a connection whose request line and headers have not all arrived
  within ``header_timeout`` seconds of the connection opening (or of the
  previous response, on a kept-alive connection), and
* closes at once a new connection from an address that already holds
  ``max_per_address`` connections.

The body of a request is bounded separately, by the ASGI middleware in
:mod:`.http` (size and read deadline).
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

logger = logging.getLogger("convmem.http")

#: Seconds a client has to send a request's line and headers.
DEFAULT_HEADER_TIMEOUT = 10.0
#: Most connections one client address may hold at once.
DEFAULT_MAX_CONNECTIONS_PER_ADDRESS = 64


def guarded_h11_protocol(
    header_timeout: float = DEFAULT_HEADER_TIMEOUT,
    max_per_address: int = DEFAULT_MAX_CONNECTIONS_PER_ADDRESS,
) -> type[H11Protocol]:
    """An :class:`H11Protocol` subclass enforcing the limits above (one address table per call)."""
    per_address: Counter[str] = Counter()

    class GuardedH11Protocol(H11Protocol):
        _header_timer: asyncio.TimerHandle | None = None
        _counted: str | None = None

        # The signature of uvicorn's H11Protocol, which narrows asyncio.Protocol's BaseTransport the same way.
        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            address = self.client[0] if self.client else None
            if address is not None:
                if per_address[address] >= max_per_address:
                    logger.warning("refused a connection from %s: it already holds %d", address, max_per_address)
                    transport.abort()
                    return
                per_address[address] += 1
                self._counted = address
            self._arm_header_timer()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm_header_timer()
            if self._counted is not None:
                per_address[self._counted] -= 1
                if per_address[self._counted] <= 0:
                    del per_address[self._counted]
                self._counted = None
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self.conn.their_state is not h11.IDLE:
                self._disarm_header_timer()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing() and self.conn.their_state is h11.IDLE:
                self._arm_header_timer()

        def _arm_header_timer(self) -> None:
            self._disarm_header_timer()
            self._header_timer = self.loop.call_later(header_timeout, self._headers_too_slow)

        def _disarm_header_timer(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _headers_too_slow(self) -> None:
            self._header_timer = None
            if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
                self.transport.close()

    return GuardedH11Protocol
