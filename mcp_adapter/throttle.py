"""Token buckets that limit failed logins, per client address and per site name.

Every password check takes one token from the bucket of the client's address
and one from the bucket of the site name it claimed, before it runs; a check
that succeeds gives them back, so only failures count. A check is only run
(and its KDF paid for) when both buckets still hold a token; otherwise the
caller is told to come back after the time the emptier bucket needs to refill
one token.

The tables are bounded: beyond ``max_keys`` entries the least recently used
bucket is forgotten (a forgotten bucket is full again, which is the lenient
direction, so an attacker gains nothing by evicting other buckets that he
could not gain by waiting).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import dataclass

#: Failed attempts one client address may make in a burst, and how fast it refills (per second).
DEFAULT_ADDRESS_BURST = 10
DEFAULT_ADDRESS_RATE = 0.5
#: Failed attempts against one site name in a burst (from every address together), and the refill rate.
DEFAULT_SITE_BURST = 30
DEFAULT_SITE_RATE = 1.0
#: Tokens a site's bucket must lack for its checks to count as suspect (see :class:`.fairslots.FairSlots`).
SUSPECT_MISSING = 2.0
#: Most buckets kept per table.
DEFAULT_MAX_KEYS = 65_536


@dataclass(frozen=True)
class ThrottleSettings:
    """How many failed logins are tolerated; ``burst`` tokens refilling at ``rate`` per second."""

    address_burst: int = DEFAULT_ADDRESS_BURST
    address_rate: float = DEFAULT_ADDRESS_RATE
    site_burst: int = DEFAULT_SITE_BURST
    site_rate: float = DEFAULT_SITE_RATE
    max_keys: int = DEFAULT_MAX_KEYS

    def __post_init__(self) -> None:
        if self.address_burst < 1 or self.site_burst < 1:
            raise ValueError("a throttle burst must be at least 1")
        if self.address_rate <= 0 or self.site_rate <= 0:
            raise ValueError("a throttle rate must be positive")


class _Buckets:
    """One table of token buckets: key -> (tokens, time of last update)."""

    def __init__(self, burst: int, rate: float, max_keys: int) -> None:
        self.burst = float(burst)
        self.rate = rate
        self.max_keys = max_keys
        self._table: OrderedDict[str, tuple[float, float]] = OrderedDict()

    def _level(self, key: str, now: float) -> float:
        entry = self._table.get(key)
        if entry is None:
            return self.burst
        tokens, stamp = entry
        return min(self.burst, tokens + (now - stamp) * self.rate)

    def wait(self, key: str, now: float) -> float:
        """Seconds until ``key`` has a whole token (0 when it has one now)."""
        level = self._level(key, now)
        return 0.0 if level >= 1.0 else (1.0 - level) / self.rate

    def missing(self, key: str, now: float) -> float:
        """How many tokens ``key``'s bucket lacks (0 when full, or never touched)."""
        return self.burst - self._level(key, now)

    def give(self, key: str, now: float) -> None:
        if key in self._table:
            self._table[key] = (min(self._level(key, now) + 1.0, self.burst), now)

    def take(self, key: str, now: float) -> None:
        self._table[key] = (max(self._level(key, now) - 1.0, 0.0), now)
        self._table.move_to_end(key)
        while len(self._table) > self.max_keys:
            self._table.popitem(last=False)


class LoginThrottle:
    """Failed-login limits per client address and per site. Thread-safe."""

    def __init__(self, settings: ThrottleSettings | None = None) -> None:
        self.settings = settings or ThrottleSettings()
        s = self.settings
        self._lock = threading.Lock()
        self._addresses = _Buckets(s.address_burst, s.address_rate, s.max_keys)
        self._sites = _Buckets(s.site_burst, s.site_rate, s.max_keys)

    def acquire(self, address: str | None, site: str) -> float:
        """Reserve one failed attempt for a password check about to run.

        Returns 0 when the check may run (a token was taken from both
        buckets: concurrent checks can never overrun the burst), else the
        seconds to wait, and nothing is taken. Call :meth:`refund` when the
        check succeeds.
        """
        now = time.monotonic()
        with self._lock:
            wait = self._sites.wait(site, now)
            if address is not None:
                wait = max(wait, self._addresses.wait(address, now))
            if wait > 0:
                return wait
            self._sites.take(site, now)
            if address is not None:
                self._addresses.take(address, now)
        return 0.0

    def suspect(self, site: str) -> bool:
        """True when ``site`` has had failed logins lately: two or more tokens short of a full bucket.

        (One token short is a check in progress, or one mistyped password.)
        """
        now = time.monotonic()
        with self._lock:
            return self._sites.missing(site, now) >= SUSPECT_MISSING

    def refund(self, address: str | None, site: str) -> None:
        """Give back the token :meth:`acquire` took: the check succeeded."""
        now = time.monotonic()
        with self._lock:
            self._sites.give(site, now)
            if address is not None:
                self._addresses.give(address, now)
