"""Connection-level limits uvicorn lacks: a deadline for request headers, and connections per address.

uvicorn's own limits (``limit_concurrency``, the keep-alive timeout) do not
stop a client that opens many connections and sends its request headers a
byte at a time ("slowloris"): such connections are held for ever and count
against ``limit_concurrency``, so every other client is then answered 503.
:func:`guarded_h11_protocol` and :func:`guarded_httptools_protocol` build
HTTP/1.1 protocol classes (uvicorn's pure-Python h11 one, or its httptools
one, a C parser: :func:`guarded_protocol` picks httptools when it is
installed) that

* close a connection whose request line and headers have not all arrived
  within ``header_timeout`` seconds of the connection opening (or of the
  previous response, on a kept-alive connection),
* close at once a new connection from an address that already holds
  ``max_per_address`` connections, and
* answer 400 (and close) a request whose line and headers exceed
  :data:`MAX_HEAD_BYTES`: h11 does so itself; httptools has no such limit,
  so its guard counts the bytes.

The body of a request is bounded separately, by the ASGI middleware in
:mod:`.http` (size and read deadline).
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

try:  # the C parser of uvicorn[standard]; h11 where it does not install
    import httptools
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
except ImportError:  # pragma: no cover - httptools is a dependency where it installs
    HttpToolsProtocol = None  # type: ignore[assignment,misc]

from .limits import DEFAULT_HEADER_TIMEOUT, DEFAULT_MAX_CONNECTIONS_PER_ADDRESS

logger = logging.getLogger("convmem.http")

#: Most bytes of request line and headers (h11's own default limit, kept for httptools).
MAX_HEAD_BYTES = 16 * 1024
#: What uvicorn answers a malformed request (the same text for an oversized head with h11).
_INVALID = "Invalid HTTP request received."


class AddressTable:
    """How many connections each client address holds, and the cap on that number.

    One table per listening server; the HTTP protocols and the TLS handshake
    gate count in the same table. Touched only from the event loop.
    """

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self._held: Counter[str] = Counter()

    def admit(self, address: str | None, transport: asyncio.Transport) -> bool:
        """Count a new connection from ``address``; when the address is at its cap, abort it and return False.

        A connection without a known address (a Unix socket) is admitted and not counted.
        """
        if address is None:
            return True
        if self._held[address] >= self.cap:
            logger.warning("refused a connection from %s: it already holds %d", address, self.cap)
            transport.abort()
            return False
        self._held[address] += 1
        return True

    def release(self, address: str | None) -> None:
        """Stop counting one connection of ``address`` (None: nothing was counted)."""
        if address is None:
            return
        self._held[address] -= 1
        if self._held[address] <= 0:
            del self._held[address]

    def held(self, address: str) -> int:
        """Connections ``address`` holds now."""
        return self._held[address]


def guarded_protocol(
    header_timeout: float = DEFAULT_HEADER_TIMEOUT,
    max_per_address: int = DEFAULT_MAX_CONNECTIONS_PER_ADDRESS,
) -> type[asyncio.Protocol]:
    """The guarded httptools protocol when httptools is installed, else the guarded h11 one."""
    if HttpToolsProtocol is not None:
        return guarded_httptools_protocol(header_timeout, max_per_address)
    return guarded_h11_protocol(header_timeout, max_per_address)  # pragma: no cover


def guarded_h11_protocol(
    header_timeout: float = DEFAULT_HEADER_TIMEOUT,
    max_per_address: int = DEFAULT_MAX_CONNECTIONS_PER_ADDRESS,
) -> type[H11Protocol]:
    """An :class:`H11Protocol` subclass enforcing the limits above (one address table per call)."""
    table = AddressTable(max_per_address)

    class GuardedH11Protocol(H11Protocol):
        #: The address table, shared with the TLS handshake gate (:mod:`.tlsgate`).
        address_table = table
        _header_timer: asyncio.TimerHandle | None = None
        _counted: str | None = None

        # The signature of uvicorn's H11Protocol, which narrows asyncio.Protocol's BaseTransport the same way.
        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            address = self.client[0] if self.client else None
            if not table.admit(address, transport):
                return
            self._counted = address
            self._arm_header_timer()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm_header_timer()
            table.release(self._counted)
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


class HeadHolder:
    """The transport as one response sees it: the status line and headers go out with the first body bytes.

    uvicorn writes a response's head as soon as the app starts the response,
    and its body when it comes: two writes, and on loopback two wake-ups of a
    client that reads the head and then waits for the body. Here the head
    waits (it is never a ``100 Continue``, which must go out at once) and
    leaves in one vectored write with the body, or when the connection
    closes. A HEAD response, which writes no body, is not held.
    """

    __slots__ = ("held", "transport")

    def __init__(self, transport: asyncio.Transport) -> None:
        self.transport = transport
        self.held: bytes | None = None

    def write(self, data: bytes) -> None:
        if self.held is not None:
            held, self.held = self.held, None
            self.transport.writelines([held, data])
        elif data.startswith(b"HTTP/1.1 ") and not data.startswith(b"HTTP/1.1 1"):
            self.held = data
        else:
            self.transport.write(data)

    def close(self) -> None:
        if self.held is not None:
            held, self.held = self.held, None
            self.transport.write(held)
        self.transport.close()

    def __getattr__(self, name: str) -> object:
        return getattr(self.transport, name)


def guarded_httptools_protocol(
    header_timeout: float = DEFAULT_HEADER_TIMEOUT,
    max_per_address: int = DEFAULT_MAX_CONNECTIONS_PER_ADDRESS,
    max_head_bytes: int = MAX_HEAD_BYTES,
) -> type[asyncio.Protocol]:
    """An httptools protocol class enforcing the limits above (one address table per call).

    A head is "awaited" from the connection's start, and after each response
    while no next request has completed its head; the header deadline runs
    while one is awaited. Its size is counted two ways, either of which
    refuses it past ``max_head_bytes``: the URL and header bytes the parser
    hands over, and every received chunk that began and ended inside a head
    (httptools buffers an unfinished header field itself, unbounded).
    """
    assert HttpToolsProtocol is not None
    table = AddressTable(max_per_address)

    class GuardedHttpToolsProtocol(HttpToolsProtocol):
        #: The address table, shared with the TLS handshake gate (:mod:`.tlsgate`).
        address_table = table
        _header_timer: asyncio.TimerHandle | None = None
        _counted: str | None = None
        _in_head = False
        _head_bytes = 0
        _heads_done = 0

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            address = self.client[0] if self.client else None
            if not table.admit(address, transport):
                return
            self._counted = address
            self._await_head()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm_header_timer()
            table.release(self._counted)
            self._counted = None
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            inside, done = self._in_head, self._heads_done
            super().data_received(data)
            if inside and self._in_head and done == self._heads_done:  # the whole chunk was head
                self._head_bytes += len(data)
            self._check_head()

        def on_message_begin(self) -> None:
            self._in_head = True
            super().on_message_begin()

        def on_url(self, url: bytes) -> None:
            self._count_head(len(url))
            super().on_url(url)

        def on_header(self, name: bytes, value: bytes) -> None:
            self._count_head(len(name) + len(value) + 4)
            super().on_header(name, value)

        def _count_head(self, size: int) -> None:
            """Count head bytes the parser handed over; past the limit, make it fail (uvicorn answers 400)."""
            self._head_bytes += size
            if self._head_bytes > max_head_bytes:
                raise httptools.HttpParserError("request head too large")

        def on_headers_complete(self) -> None:
            self._in_head = False
            self._head_bytes = 0
            self._heads_done += 1
            self._disarm_header_timer()
            super().on_headers_complete()
            cycle = self.cycle
            if cycle is not None and self.scope.get("method") != "HEAD":
                cycle.transport = HeadHolder(self.transport)  # type: ignore[assignment]

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing() and (self.cycle is None or self.cycle.response_complete):
                self._await_head()

        def _await_head(self) -> None:
            if not self._in_head:  # a pipelined head already under way keeps its count
                self._in_head = True
                self._head_bytes = 0
            self._disarm_header_timer()
            self._header_timer = self.loop.call_later(header_timeout, self._headers_too_slow)

        def _check_head(self) -> None:
            if self._in_head and self._head_bytes > max_head_bytes and not self.transport.is_closing():
                self._in_head = False
                self._disarm_header_timer()
                self.logger.warning(_INVALID)
                self.send_400_response(_INVALID)

        def _disarm_header_timer(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _headers_too_slow(self) -> None:
            self._header_timer = None
            if self._in_head and not self.transport.is_closing():
                self.transport.close()

    return GuardedHttpToolsProtocol
