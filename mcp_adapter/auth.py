"""HTTP Basic authentication of tool calls: the user name is the site.

Verifying a password costs one scrypt run, far too much for every call, so a
verified ``Authorization`` header is remembered in memory: for
:data:`DEFAULT_TTL` seconds after its last use (a client calling steadily
never meets the KDF again), and never longer than :data:`MAX_LOGIN_AGE`
seconds after its check. The cache key is an HMAC of the header under a
random per-process key: the cache never holds a password or anything a
password could be recovered from without that key. A failed header is
remembered too, briefly and in a table of its own (so a flood of wrong
passwords cannot evict the good logins), and failed checks are rate-limited
per client address and per site (:mod:`.throttle`).

Logins under attack: the KDF runs through :data:`KDF_CONCURRENCY` slots
shared round robin by claimed site and, within a site, by client address
(:mod:`.fairslots`), so a correct login waits for at most one check per
other busy site, not for a flood's whole queue; and checks for a site that
has failed logins lately (its throttle bucket is not full) share all slots
but one, which stays free for the sites nobody is guessing at. A check for a site name that
does not exist runs no KDF at all: it takes its turn in the same queue, then
waits as long as a check takes here (a running measurement of the real
ones, with some jitter), so it costs no CPU and still answers like a wrong
password, and a flood of invented names never occupies the slots.

The credential file is re-read (and the cache dropped) as soon as it changes on
disk, so ``convmem site passwd`` and ``site remove`` take effect on the next
call without restarting the server.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import logging
import random
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import anyio
import anyio.to_thread

from convmem.logstore import InvalidConversationId, SiteName, Unavailable
from convmem.logstore.site_credentials import (
    DUMMY_HASH,
    CredentialError,
    CredentialFile,
    CredentialFileDamaged,
    PasswordHash,
)

from . import metrics
from .errors import ToolFailure, from_store_error, throttled, unauthenticated
from .fairslots import FairSlots
from .throttle import LoginThrottle

logger = logging.getLogger("convmem.auth")

#: How long a verified header stays trusted after its last use without running the KDF again (seconds).
DEFAULT_TTL = 60.0
#: How long a verified header is trusted at most after its check, however often it is used (seconds).
MAX_LOGIN_AGE = 900.0
#: How long a rejected header is answered from memory (seconds).
NEGATIVE_TTL = 5.0
#: Most verified headers remembered at once (least recently used evicted first); as many rejected ones.
MAX_ENTRIES = 4096
#: At most this many KDF runs at the same time.
KDF_CONCURRENCY = 2
#: Weight of the newest KDF run in the running measurement of how long one takes.
_KDF_EWMA_WEIGHT = 0.2


def parse_basic(header: str | None) -> tuple[str, str]:
    """Split a ``Basic`` header into (user, password).

    Raises :class:`ToolFailure` (``Unauthenticated``) when the header is absent,
    uses another scheme (Bearer gets its own message) or is malformed.
    """
    if not header:
        raise unauthenticated()
    scheme, _, value = header.strip().partition(" ")
    if scheme.lower() == "bearer":
        raise unauthenticated(bearer=True)
    if scheme.lower() != "basic":
        raise unauthenticated()
    try:
        decoded = base64.b64decode(value.strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise unauthenticated() from None
    user, sep, password = decoded.partition(":")
    if not sep:
        raise unauthenticated()
    return user, password


class Authenticator:
    """Maps an ``Authorization`` header to a verified site name, with a short-lived cache.

    Invariants:

    * Every cached result carries the *generation* of the credential file it
      was computed from; a result is used only while that generation is
      current, and stored only if it still is when the KDF finishes. A check
      that started before ``site passwd``/``site remove`` landed can therefore
      never put a stale answer into the cache.
    * A password check (KDF run) is only started when the client's address and
      the claimed site both have failed-login tokens left (:mod:`.throttle`);
      otherwise the caller gets ``Throttled`` (retryable, with a retry-after
      hint) at the cost of a dictionary lookup.
    * The cache evicts the least recently used entry; verified and rejected
      headers are kept in separate tables of ``max_entries`` each.
    * A verified header is trusted for ``ttl`` seconds after its last use and
      ``max_age`` seconds after its check at most; :meth:`forget_site` drops
      a site's entries at once.
    * Concurrent checks of the same header share one KDF run.
    * Checks wait for the KDF slots in turn by (site, address), and a check
      for an unknown site never holds a slot while it waits out its time.
    """

    def __init__(
        self,
        credentials: CredentialFile,
        *,
        ttl: float = DEFAULT_TTL,
        max_age: float = MAX_LOGIN_AGE,
        negative_ttl: float = NEGATIVE_TTL,
        max_entries: int = MAX_ENTRIES,
        throttle: LoginThrottle | None = None,
        kdf_concurrency: int = KDF_CONCURRENCY,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._credentials = credentials
        self._clock = clock
        self._ttl = ttl
        self._max_age = max(max_age, ttl)
        self._negative_ttl = negative_ttl
        self._max_entries = max_entries
        self._key = secrets.token_bytes(32)
        self._lock = threading.Lock()
        # digest -> (site, expiry, latest expiry however often used, generation): verified headers
        self._cache: OrderedDict[bytes, tuple[str, float, float, int]] = OrderedDict()
        # digest -> (expiry, generation): rejected headers
        self._rejected: OrderedDict[bytes, tuple[float, int]] = OrderedDict()
        self._stamp: tuple[int, ...] | None = None
        self._generation = 0
        self._hashes: dict[str, PasswordHash] = {}
        self._kdf_limiter = anyio.CapacityLimiter(kdf_concurrency)
        #: The KDF slots, shared round robin by (site, address) (touched only from the event loop).
        self.slots = FairSlots(kdf_concurrency)
        #: Seconds one KDF run takes here, measured (None until the first run).
        self._kdf_seconds: float | None = None
        self._measuring: anyio.Event | None = None
        #: Headers whose KDF run is in progress (touched only from the event loop).
        self._inflight: dict[bytes, anyio.Event] = {}
        self.throttle = throttle or LoginThrottle()

    def _digest(self, header: str) -> bytes:
        return hmac.new(self._key, header.encode("utf-8", "surrogatepass"), hashlib.sha256).digest()

    def _forget_everyone(self) -> None:
        """Drop every cached login and hash and start a new generation: nobody is let in on what was read before."""
        with self._lock:
            self._cache.clear()
            self._rejected.clear()
            self._stamp = None
            self._hashes = {}
            self._generation += 1

    def _refresh(self) -> int:
        """Reload the credential file if it changed since the last look; the current generation.

        A reload drops the cache and starts a new generation. Raises
        ``Unavailable`` (retryable) when the whole ``auth/`` directory is
        gone, e.g. the data directory was unmounted: that is an outage, not a
        wrong password.
        """
        stamp = self._credentials.stamp()
        if stamp is None and not self._credentials.auth_dir.is_dir():
            self._forget_everyone()
            raise from_store_error(Unavailable("the credential store in the data directory is not available"))
        with self._lock:
            if stamp == self._stamp:
                return self._generation
        try:
            hashes = self._credentials.load()
        except CredentialFileDamaged as exc:
            self._forget_everyone()  # never the hashes read before: a removed site would keep its access
            logger.error("%s", exc)
            damaged = Unavailable("the site credential file is damaged; an operator must restore it")
            raise from_store_error(damaged) from None
        with self._lock:
            if stamp != self._stamp:
                self._hashes = hashes
                self._stamp = stamp
                self._cache.clear()
                self._rejected.clear()
                self._generation += 1
            return self._generation

    def _cached(self, key: bytes, generation: int) -> tuple[bool, str | None]:
        """(hit, site) from the cache; a hit with site None is a remembered rejection.

        A verified header's lifetime slides: each hit trusts it for another
        ``ttl`` seconds, up to its latest expiry.
        """
        now = self._clock()
        with self._lock:
            if generation != self._generation:
                return False, None
            entry = self._cache.get(key)
            if entry is not None:
                site, expiry, latest, gen = entry
                if expiry < now or gen != generation:
                    del self._cache[key]
                    return False, None
                self._cache[key] = (site, min(now + self._ttl, latest), latest, gen)
                self._cache.move_to_end(key)
                return True, site
            rejected = self._rejected.get(key)
            if rejected is None:
                return False, None
            if rejected[0] < now or rejected[1] != generation:
                del self._rejected[key]
                return False, None
            return True, None

    def _remember(self, key: bytes, site: str | None, generation: int) -> None:
        """Cache a result computed under ``generation``; dropped when the credentials changed since."""
        now = self._clock()
        with self._lock:
            if generation != self._generation:
                return
            if site is None:
                self._rejected[key] = (now + self._negative_ttl, generation)
                table: OrderedDict[bytes, Any] = self._rejected
            else:
                self._rejected.pop(key, None)
                self._cache[key] = (site, now + self._ttl, now + self._max_age, generation)
                table = self._cache
            table.move_to_end(key)
            while len(table) > self._max_entries:
                table.popitem(last=False)

    def forget_site(self, site: str) -> int:
        """Drop every cached login of ``site`` (its removal or new password is known); how many were dropped.

        The next request for the site runs a full check against the
        credentials as they are then.
        """
        with self._lock:
            stale = [key for key, entry in self._cache.items() if entry[0] == site]
            for key in stale:
                del self._cache[key]
            return len(stale)

    def _verify(self, user: str, password: str, entry: PasswordHash) -> str | None:
        """Run the KDF; the site name on success.

        A hash made with weaker parameters than today's is replaced after a
        successful check (the password is at hand only now).
        """
        started = time.perf_counter()
        matched = entry.verify(password)
        self._measured(time.perf_counter() - started)
        if not matched:
            return None
        if entry.needs_rehash():
            try:
                self._credentials.rehash(user, password, entry)
            except (OSError, CredentialError) as exc:
                logger.warning("could not upgrade the password hash of site %r: %s", user, exc)
        return user

    def _measured(self, seconds: float) -> None:
        previous = self._kdf_seconds
        self._kdf_seconds = seconds if previous is None else previous + _KDF_EWMA_WEIGHT * (seconds - previous)

    async def _check(
        self, user: str, password: str, entry: PasswordHash | None, client: str | None, suspect: bool
    ) -> str | None:
        """One password check in its turn: the site on success, None for a wrong password or an unknown site."""
        if entry is not None:
            async with self.slots.slot(user, client, suspect=suspect):
                return await anyio.to_thread.run_sync(self._verify, user, password, entry, limiter=self._kdf_limiter)
        async with self.slots.slot(user, client, suspect=suspect):
            pass  # wait the same turn a real check would, without holding a slot for the KDF's time
        await anyio.sleep(await self._kdf_time() * (0.9 + 0.2 * random.random()))
        return None

    async def _kdf_time(self) -> float:
        """How long one KDF run takes here; measured with the dummy hash when no real run has been made yet."""
        while self._kdf_seconds is None:
            if self._measuring is not None:
                await self._measuring.wait()
                continue
            self._measuring = anyio.Event()
            try:
                async with self.slots.slot("", None):
                    seconds = await anyio.to_thread.run_sync(_time_dummy_check, limiter=self._kdf_limiter)
                if self._kdf_seconds is None:
                    self._measured(seconds)
            finally:
                self._measuring.set()
                self._measuring = None
        return self._kdf_seconds

    async def _current(self) -> int:
        """:meth:`_refresh`, off the event loop when the credentials live in a database."""
        if self._credentials.remote:
            return await anyio.to_thread.run_sync(self._refresh)
        return self._refresh()

    async def authenticate(self, header: str | None, client: str | None = None) -> str:
        """The site the header proves, or raise ``Unauthenticated`` (or ``Throttled``).

        ``client`` is the caller's network address, for the failed-login
        limits. Never reveals whether a site exists: an unknown site and a
        wrong password give the same answer.
        """
        user, password = parse_basic(header)
        try:
            SiteName(user)
        except InvalidConversationId:
            raise unauthenticated() from None
        assert header is not None
        key = self._digest(header)
        kdf_runs = 0
        while True:
            generation = await self._current()
            hit, site = self._cached(key, generation)
            if hit:
                break
            running = self._inflight.get(key)
            if running is not None:
                # The same header is being checked right now: share that KDF run's answer.
                await running.wait()
                continue
            if kdf_runs == 2:
                break  # the credentials changed twice during our checks: answer from the last one
            suspect = self.throttle.suspect(user)  # before this check takes its own token
            wait = self.throttle.acquire(client, user)
            if wait > 0:
                metrics.record_throttle()
                raise throttled(wait)
            with self._lock:
                entry = self._hashes.get(user)
            done = self._inflight[key] = anyio.Event()
            try:
                site = await self._check(user, password, entry, client, suspect)
                kdf_runs += 1
                if site is not None:
                    self.throttle.refund(client, user)
                if await self._current() == generation:
                    self._remember(key, site, generation)
                    break
                # The credentials changed while the KDF ran: check again against the new ones.
            finally:
                del self._inflight[key]
                done.set()
        if site is None:
            raise unauthenticated()
        return site


def _time_dummy_check() -> float:
    started = time.perf_counter()
    DUMMY_HASH.verify("not a password")
    return time.perf_counter() - started


def check_password(credentials: CredentialFile, site: str, password: str) -> None:
    """Verify a site's password once (stdio start-up). Raises ToolFailure when wrong."""
    if not credentials.verify(site, password):
        raise ToolFailure("Unauthenticated", "the site name or password is wrong")
