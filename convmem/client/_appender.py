"""The background appender: ``add()`` never blocks the agent; batches are sent, retried and counted.

Items wait in a bounded buffer. A thread takes them in batches within the
limits (at most 250 items and 1 MiB of compact JSON, one item per batch when
it is larger than that allows) and sends each batch under an idempotency key
minted for it, retrying retryable failures (and a lost server) with
exponential backoff under the same key, so a batch whose acknowledgement was
lost is never stored twice. A batch the server refuses for good (a
validation error) is counted in ``failed``, never retried. When the buffer is
full, ``add()`` refuses the item and counts it in ``dropped`` (and logs a
warning the first time): no item is ever lost silently. :meth:`close` (also
run at interpreter exit) flushes what is buffered, within a timeout; what
could not be sent by then is counted in ``unsent`` and logged.
"""

from __future__ import annotations

import atexit
import collections
import logging
import threading
import time
import uuid
from collections.abc import Mapping
from typing import Any

import msgspec

from ._async import ConnectionLost, ToolError
from ._sync import MemoryClient

logger = logging.getLogger("convmem.client")

MAX_BATCH_ITEMS = 250
#: A little under the server's 1 MiB per batch (item sizes are measured as the server measures them).
MAX_BATCH_BYTES = 1 << 20
_encoder = msgspec.json.Encoder()


class Appender:
    """Appends items to one conversation in the background (see the module doc)."""

    def __init__(
        self,
        client: MemoryClient,
        conversation_id: str,
        *,
        max_buffer: int = 10_000,
        retry_initial: float = 0.1,
        retry_max: float = 5.0,
        exit_timeout: float = 10.0,
    ) -> None:
        self.client = client
        self.conversation_id = conversation_id
        self.max_buffer = max_buffer
        self.retry_initial = retry_initial
        self.retry_max = retry_max
        self.exit_timeout = exit_timeout
        #: Items sent and acknowledged, refused by the server, refused by add() (buffer full), left at close.
        self.sent = 0
        self.failed = 0
        self.dropped = 0
        self.unsent = 0
        #: ``(idempotency_key, first_seq, last_seq)`` of every acknowledged batch, in order.
        self.acknowledged: list[tuple[str, int, int]] = []
        self._buf: collections.deque[tuple[dict[str, Any], int]] = collections.deque()
        self._inflight = 0
        self._closing = False
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="convmem-appender", daemon=True)
        self._thread.start()
        atexit.register(self.close)

    def add(self, item: Mapping[str, Any]) -> bool:
        """Queue one item (a JSON object); False, counted in ``dropped``, when the buffer is full or closed."""
        size = len(_encoder.encode(item))
        with self._cond:
            if self._closing or len(self._buf) >= self.max_buffer:
                self.dropped += 1
                if self.dropped == 1:
                    logger.warning("convmem appender: buffer full (%d items); dropping and counting", self.max_buffer)
                return False
            self._buf.append((dict(item), size))
            self._cond.notify_all()
        return True

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every item added so far was sent (or refused); False on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while self._buf or self._inflight:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._cond.wait(left)
        return True

    def close(self, timeout: float | None = None) -> None:
        """Flush (within ``timeout``, default ``exit_timeout``), then stop; items left are counted in ``unsent``."""
        atexit.unregister(self.close)
        self.flush(self.exit_timeout if timeout is None else timeout)
        with self._cond:
            self._closing = True
            self.unsent = len(self._buf) + self._inflight
            self._buf.clear()
            self._cond.notify_all()
        self._thread.join(1.0)
        if self.unsent:
            logger.warning("convmem appender: %d items could not be sent before closing", self.unsent)

    def _take(self) -> list[dict[str, Any]] | None:
        with self._cond:
            while not self._buf and not self._closing:
                self._cond.wait()
            if self._closing:
                return None
            batch: list[dict[str, Any]] = []
            total = 0
            while self._buf and len(batch) < MAX_BATCH_ITEMS:
                item, size = self._buf[0]
                if batch and total + size > MAX_BATCH_BYTES:
                    break
                self._buf.popleft()
                batch.append(item)
                total += size
            self._inflight = len(batch)
            return batch

    def _run(self) -> None:
        while True:
            batch = self._take()
            if batch is None:
                return
            self._send(batch)
            with self._cond:
                self._inflight = 0
                self._cond.notify_all()

    def _send(self, batch: list[dict[str, Any]]) -> None:
        key = uuid.uuid4().hex  # one key per batch, kept by every retry of it
        delay = self.retry_initial
        while True:
            try:
                first, last = self.client.append(self.conversation_id, batch, idempotency_key=key)
            except (ToolError, ConnectionLost) as exc:
                if not exc.retryable:
                    with self._cond:
                        self.failed += len(batch)
                    logger.warning("convmem appender: %d items refused: %s", len(batch), exc)
                    return
                with self._cond:
                    if self._closing:
                        return
                time.sleep(delay)
                delay = min(delay * 2, self.retry_max)
                continue
            with self._cond:
                self.sent += len(batch)
                self.acknowledged.append((key, first, last))
            return
