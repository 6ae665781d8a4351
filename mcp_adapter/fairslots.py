"""A few slots shared fairly: round robin over claimed sites, and within a site over client addresses.

The password checks (:mod:`.auth`) run through these slots. A plain FIFO
queue lets whoever sends the most requests decide how long everyone waits: 48
wrong passwords queued ahead of a correct login delay it by 24 KDF runs.
Here a waiter is filed under two keys, the site it claims and its client
address; when a slot frees, the next site in turn is chosen, then the next
address in turn within that site, then that address's oldest waiter. A site
(or, within its site, an address) that joins the rotation while holding no
slot goes to the front of it: it has not been served lately. A login for a
site nobody is attacking is therefore the next check admitted, however long
the flood's queue is, and within an attacked site a client address gets its
turn between the attacker's.

Only the event loop touches an instance (no locks); waiting is cancellable,
and a cancelled waiter that had just been granted a slot passes it on.
"""

from __future__ import annotations

import asyncio
from collections import Counter, OrderedDict, deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any


def _decrement(counter: Counter[Any], key: object) -> None:
    counter[key] -= 1
    if counter[key] <= 0:
        del counter[key]


def _head(by_address: OrderedDict[str, deque[tuple[asyncio.Future[None], bool]]]) -> tuple[asyncio.Future[None], bool]:
    """A site's next waiter: the oldest of the address whose turn it is."""
    return next(iter(by_address.values()))[0]


class FairSlots:
    """``capacity`` slots granted round robin by (site, address).

    A caller may flag itself *suspect* (its site has failed logins lately):
    suspect callers hold at most ``suspect_capacity`` slots together, so at
    least ``capacity - suspect_capacity`` slots stay free for everyone else
    however many suspect callers wait.
    """

    def __init__(self, capacity: int, suspect_capacity: int | None = None) -> None:
        if capacity < 1:
            raise ValueError("FairSlots needs at least one slot")
        self.capacity = capacity
        self.suspect_capacity = max(1, capacity - 1) if suspect_capacity is None else suspect_capacity
        self._busy = 0
        self._suspect_busy = 0
        self._active: Counter[str] = Counter()  # slots held per site
        self._active_addresses: Counter[tuple[str, str]] = Counter()  # slots held per (site, address)
        # site -> address -> (waiter, suspect), each level in its turn order (front: next to be served)
        self._queues: OrderedDict[str, OrderedDict[str, deque[tuple[asyncio.Future[None], bool]]]] = OrderedDict()

    @property
    def waiting(self) -> int:
        """How many callers wait for a slot."""
        return sum(len(q) for by_address in self._queues.values() for q in by_address.values())

    @asynccontextmanager
    async def slot(self, site: str, address: str | None, *, suspect: bool = False) -> AsyncIterator[None]:
        """Hold one slot for the block; wait for it in (site, address)'s turn."""
        key = (site, address or "")
        await self._acquire(key, suspect)
        try:
            yield
        finally:
            self._release(key, suspect)

    def _may_grant(self, suspect: bool) -> bool:
        return self._busy < self.capacity and (not suspect or self._suspect_busy < self.suspect_capacity)

    async def _acquire(self, key: tuple[str, str], suspect: bool) -> None:
        if not self._queues and self._may_grant(suspect):
            self._grant(key, suspect)
            return
        site, address = key
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        by_address = self._queues.get(site)
        if by_address is None:
            by_address = self._queues[site] = OrderedDict()
            if not self._active[site]:
                self._queues.move_to_end(site, last=False)
        waiters = by_address.get(address)
        if waiters is None:
            waiters = by_address[address] = deque()
            if not self._active_addresses[key]:
                by_address.move_to_end(address, last=False)
        waiters.append((waiter, suspect))
        self._dispatch()  # a slot may be free for this one although others wait (they are suspect)
        try:
            await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled():
                self._release(key, suspect)  # granted just as we were cancelled: pass the slot on
            else:
                self._forget(site, address, waiter)
            raise

    def _grant(self, key: tuple[str, str], suspect: bool) -> None:
        self._busy += 1
        self._suspect_busy += suspect
        self._active[key[0]] += 1
        self._active_addresses[key] += 1

    def _release(self, key: tuple[str, str], suspect: bool) -> None:
        self._busy -= 1
        self._suspect_busy -= suspect
        _decrement(self._active, key[0])
        _decrement(self._active_addresses, key)
        self._dispatch()

    def _dispatch(self) -> None:
        """Grant free slots to waiters, in turn."""
        while self._busy < self.capacity:
            chosen = self._next()
            if chosen is None:
                return
            granted, waiter, flagged = chosen
            if not waiter.done():
                self._grant(granted, flagged)
                waiter.set_result(None)

    def _next(self) -> tuple[tuple[str, str], asyncio.Future[None], bool] | None:
        """Pop the next waiter that may have a slot now, in turn; its site and address go to the back."""
        site = next((s for s, by in self._queues.items() if self._may_grant(_head(by)[1])), None)
        if site is None:
            return None
        by_address = self._queues[site]
        address, waiters = next(iter(by_address.items()))
        waiter, suspect = waiters.popleft()
        if waiters:
            by_address.move_to_end(address)
        else:
            del by_address[address]
        if by_address:
            self._queues.move_to_end(site)
        else:
            del self._queues[site]
        return (site, address), waiter, suspect

    def _forget(self, site: str, address: str, waiter: asyncio.Future[None]) -> None:
        by_address = self._queues.get(site)
        waiters = by_address.get(address) if by_address is not None else None
        if by_address is None or waiters is None:
            return
        for entry in waiters:
            if entry[0] is waiter:
                waiters.remove(entry)
                break
        else:
            return
        if not waiters:
            del by_address[address]
            if not by_address:
                del self._queues[site]
