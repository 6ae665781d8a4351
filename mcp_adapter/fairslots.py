"""A few slots shared fairly: round robin over claimed sites, and within a site over client addresses.

The password checks (:mod:`.auth`) run through these slots. A plain FIFO
queue lets whoever sends the most requests decide how long everyone waits: 48
wrong passwords queued ahead of a correct login delay it by 24 KDF runs.
Here a waiter is filed under two keys, the site it claims and its client
address; when a slot frees, the next site in turn is chosen, then the next
address in turn within that site, then that address's oldest waiter. A login
for a site nobody is attacking is therefore admitted after at most one check
per busy site ahead of it in the rotation, however long the flood's queue is,
and within an attacked site a client address gets its turn between the
attacker's.

Only the event loop touches an instance (no locks); waiting is cancellable,
and a cancelled waiter that had just been granted a slot passes it on.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict, deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager


class FairSlots:
    """``capacity`` slots granted round robin by (site, address)."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError("FairSlots needs at least one slot")
        self.capacity = capacity
        self._busy = 0
        # site -> address -> waiters, each level in its turn order (front: next to be served)
        self._queues: OrderedDict[str, OrderedDict[str, deque[asyncio.Future[None]]]] = OrderedDict()

    @property
    def waiting(self) -> int:
        """How many callers wait for a slot."""
        return sum(len(q) for by_address in self._queues.values() for q in by_address.values())

    @asynccontextmanager
    async def slot(self, site: str, address: str | None) -> AsyncIterator[None]:
        """Hold one slot for the block; wait for it in (site, address)'s turn."""
        await self._acquire(site, address or "")
        try:
            yield
        finally:
            self._release()

    async def _acquire(self, site: str, address: str) -> None:
        if self._busy < self.capacity and not self._queues:
            self._busy += 1
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queues.setdefault(site, OrderedDict()).setdefault(address, deque()).append(waiter)
        try:
            await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled():
                self._release()  # granted just as we were cancelled: pass the slot on
            else:
                self._forget(site, address, waiter)
            raise

    def _release(self) -> None:
        self._busy -= 1
        while self._busy < self.capacity and self._queues:
            waiter = self._next()
            if not waiter.done():
                self._busy += 1
                waiter.set_result(None)

    def _next(self) -> asyncio.Future[None]:
        """Pop the next waiter in turn; the site and the address move to the back of their rotations."""
        site, by_address = next(iter(self._queues.items()))
        address, waiters = next(iter(by_address.items()))
        waiter = waiters.popleft()
        if waiters:
            by_address.move_to_end(address)
        else:
            del by_address[address]
        if by_address:
            self._queues.move_to_end(site)
        else:
            del self._queues[site]
        return waiter

    def _forget(self, site: str, address: str, waiter: asyncio.Future[None]) -> None:
        by_address = self._queues.get(site)
        waiters = by_address.get(address) if by_address is not None else None
        if by_address is None or waiters is None:
            return
        try:
            waiters.remove(waiter)
        except ValueError:
            return
        if not waiters:
            del by_address[address]
            if not by_address:
                del self._queues[site]
