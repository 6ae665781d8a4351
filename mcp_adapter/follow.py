"""replay_memory's ``wait_ms``: waiting for a conversation to grow, bounded, off the storage workers.

A waiting call holds no storage worker: it waits in a thread of its own
capacity limiter (:attr:`FollowLimits.limiter`), so the calls of every other
client run as before. Waiting calls are bounded per server
(:data:`MAX_WAITING`) and per site (:data:`MAX_WAITING_PER_SITE`); a call
over either bound does not wait and answers at once, exactly as without
``wait_ms`` (the client's next call may wait).
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import anyio
import anyio.to_thread

from convmem.logstore import MemoryStore, Range, RawMemoryItem

#: Waiting replay_memory calls one server holds at most ...
MAX_WAITING = 64
#: ... and of them, at most this many for one site.
MAX_WAITING_PER_SITE = 16


@dataclass
class FollowLimits:
    """How many replay_memory calls wait, in all and per site."""

    max_waiting: int = MAX_WAITING
    max_per_site: int = MAX_WAITING_PER_SITE
    limiter: anyio.CapacityLimiter = field(init=False)
    _sites: Counter[str] = field(init=False, default_factory=Counter)
    _lock: threading.Lock = field(init=False, default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.limiter = anyio.CapacityLimiter(self.max_waiting)

    def take(self, site: str) -> bool:
        """A waiting slot for ``site``, if both bounds allow one (release it with :meth:`give_back`)."""
        with self._lock:
            if self._sites[site] >= self.max_per_site or sum(self._sites.values()) >= self.max_waiting:
                return False
            self._sites[site] += 1
            return True

    def give_back(self, site: str) -> None:
        with self._lock:
            self._sites[site] -= 1
            if self._sites[site] <= 0:
                del self._sites[site]


async def replay_waiting(
    run: Callable[..., Awaitable[list[RawMemoryItem]]],
    limits: FollowLimits,
    store: MemoryStore,
    site: str,
    conversation_id: str,
    offset: int,
    limit: int,
    wait_ms: int,
) -> list[RawMemoryItem]:
    """The page of replay_memory; when it is empty, first wait up to ``wait_ms`` for an item at ``offset``.

    ``run`` runs a blocking storage call on the server's storage workers.
    """
    selector = Range(offset, limit)
    items = await run(store.read_raw, site, conversation_id, selector)
    if items or limit == 0 or wait_ms <= 0 or not limits.take(site):
        return items
    try:
        arrived = await anyio.to_thread.run_sync(
            store.wait_for_items, site, conversation_id, offset, wait_ms / 1000, limiter=limits.limiter,
            abandon_on_cancel=True,  # the waiting thread ends by itself within wait_ms
        )
    finally:
        limits.give_back(site)
    if not arrived:
        return items
    return await run(store.read_raw, site, conversation_id, selector)
