"""TLS handshakes under the same per-address cap as HTTP connections, and with a deadline.

When uvicorn does TLS itself, asyncio performs the handshake before the HTTP
protocol hears of the connection: a client that opens connections and never
finishes their handshakes is counted nowhere, and each such connection is
held for asyncio's default 60 s. :func:`tls_gate_protocol` wraps the HTTP
protocol class instead. The listening socket is then plain TCP; for each
accepted connection the gate

* counts it at once against the address's connection cap (the same table the
  HTTP protocol uses, see :mod:`.connguard`), closing it when the address
  already holds its share,
* runs the handshake itself (``loop.start_tls``) within ``handshake_timeout``
  seconds, closing the connection when it does not finish in time, and
* hands the encrypted transport to a fresh HTTP protocol, which counts the
  connection from then on (the gate's count is released at that moment).
"""

from __future__ import annotations

import asyncio
import ssl
from typing import Any, cast

from .connguard import AddressTable
from .limits import DEFAULT_HANDSHAKE_TIMEOUT


def tls_gate_protocol(
    inner: Any,
    context: ssl.SSLContext,
    table: AddressTable,
    handshake_timeout: float = DEFAULT_HANDSHAKE_TIMEOUT,
) -> type[asyncio.Protocol]:
    """A protocol class for uvicorn's ``http`` setting that does the TLS handshake before ``inner`` runs.

    ``inner`` is the HTTP protocol class (called with uvicorn's keyword
    arguments once the handshake is done); ``table`` is the address
    table it counts its connections in.
    """

    class TlsGate(asyncio.Protocol):
        def __init__(self, **uvicorn_kwargs: Any) -> None:
            self._kwargs = uvicorn_kwargs
            self._counted: str | None = None
            self._early: list[bytes] = []  # application data that arrived before the hand-over
            self._task: asyncio.Task[None] | None = None

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            transport = cast(asyncio.Transport, transport)  # uvloop's transports are not asyncio.Transport subclasses
            peer = transport.get_extra_info("peername")
            address = str(peer[0]) if isinstance(peer, tuple) and peer else None
            if not table.admit(address, transport):
                return
            self._counted = address
            self._task = asyncio.get_running_loop().create_task(self._handshake(transport))

        def _release(self) -> None:
            table.release(self._counted)
            self._counted = None

        async def _handshake(self, transport: asyncio.Transport) -> None:
            loop = asyncio.get_running_loop()
            try:
                secure = await loop.start_tls(
                    transport, self, context, server_side=True, ssl_handshake_timeout=handshake_timeout
                )
            except (OSError, ssl.SSLError, TimeoutError, ConnectionError, asyncio.CancelledError):
                self._release()
                transport.abort()
                return
            self._release()
            if secure is None or secure.is_closing():
                return
            protocol: asyncio.Protocol = inner(**self._kwargs)
            secure.set_protocol(protocol)
            protocol.connection_made(secure)
            for data in self._early:
                protocol.data_received(data)
            self._early.clear()

        def data_received(self, data: bytes) -> None:
            self._early.append(data)  # decrypted data between the handshake's end and the hand-over

        def connection_lost(self, exc: Exception | None) -> None:
            self._release()
            if self._task is not None and not self._task.done():
                self._task.cancel()

    return TlsGate
