"""convmem.client: a Python client of a convmem server's conversation log, for agent code.

* :class:`MemoryClient` (blocking) and :class:`AsyncMemoryClient` (asyncio):
  ``append`` (with optional ``idempotency_key`` and ``expected_next_seq``),
  ``recall``, ``replay`` (an iterator over a whole conversation),
  ``conversations`` (an iterator over the listing) and ``follow`` (an
  iterator that waits for new items with replay_memory's ``wait_ms``).
* :class:`Appender`: a background appender whose ``add()`` never blocks (see
  :mod:`convmem.client._appender`).

Failed calls raise :class:`ToolError` (the server's error, with ``code`` and
``retryable``) or :class:`ConnectionLost` (retryable).
"""

from __future__ import annotations

from ._appender import Appender
from ._async import AsyncMemoryClient, ConnectionLost, ToolError
from ._sync import MemoryClient

__all__ = ["Appender", "AsyncMemoryClient", "ConnectionLost", "MemoryClient", "ToolError"]
