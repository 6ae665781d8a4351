"""HTTP Basic authentication of tool calls: the user name is the site.

Verifying a password costs one scrypt run, far too much for every call, so a
verified ``Authorization`` header is remembered for a short time in memory.
The cache key is an HMAC of the header under a random per-process key: the
cache never holds a password or anything a password could be recovered from
without that key. A failed header is remembered too, briefly, so repeating a
wrong password cannot keep the KDF busy, and failed checks are rate-limited
per client address and per site (:mod:`.throttle`).

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
import secrets
import threading
import time
from collections import OrderedDict

import anyio
import anyio.to_thread

from convmem.logstore import InvalidConversationId, SiteName, Unavailable

from . import metrics
from .credentials import DUMMY_HASH, CredentialError, CredentialFile, PasswordHash
from .errors import ToolFailure, from_store_error, throttled, unauthenticated
from .throttle import LoginThrottle

logger = logging.getLogger("convmem.auth")

#: How long a verified header is trusted without running the KDF again (seconds).
DEFAULT_TTL = 60.0
#: How long a rejected header is answered from memory (seconds).
NEGATIVE_TTL = 5.0
#: Most headers remembered at once (least recently used evicted first).
MAX_ENTRIES = 4096
#: At most this many KDF runs at the same time.
KDF_CONCURRENCY = 2


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
    * The cache evicts the least recently used entry.
    * Concurrent checks of the same header share one KDF run.
    """

    def __init__(
        self,
        credentials: CredentialFile,
        *,
        ttl: float = DEFAULT_TTL,
        negative_ttl: float = NEGATIVE_TTL,
        max_entries: int = MAX_ENTRIES,
        throttle: LoginThrottle | None = None,
    ) -> None:
        self._credentials = credentials
        self._ttl = ttl
        self._negative_ttl = negative_ttl
        self._max_entries = max_entries
        self._key = secrets.token_bytes(32)
        self._lock = threading.Lock()
        # digest -> (site or None for a rejected header, expiry on the monotonic clock, generation)
        self._cache: OrderedDict[bytes, tuple[str | None, float, int]] = OrderedDict()
        self._stamp: tuple[int, ...] | None = None
        self._generation = 0
        self._hashes: dict[str, PasswordHash] = {}
        self._kdf_limiter = anyio.CapacityLimiter(KDF_CONCURRENCY)
        #: Headers whose KDF run is in progress (touched only from the event loop).
        self._inflight: dict[bytes, anyio.Event] = {}
        self.throttle = throttle or LoginThrottle()

    def _digest(self, header: str) -> bytes:
        return hmac.new(self._key, header.encode("utf-8", "surrogatepass"), hashlib.sha256).digest()

    def _refresh(self) -> int:
        """Reload the credential file if it changed since the last look; the current generation.

        A reload drops the cache and starts a new generation. Raises
        ``Unavailable`` (retryable) when the whole ``auth/`` directory is
        gone, e.g. the data directory was unmounted: that is an outage, not a
        wrong password.
        """
        stamp = self._credentials.stamp()
        if stamp is None and not self._credentials.auth_dir.is_dir():
            with self._lock:
                self._cache.clear()
                self._stamp = None
                self._hashes = {}
                self._generation += 1
            raise from_store_error(Unavailable("the credential store in the data directory is not available"))
        with self._lock:
            if stamp == self._stamp:
                return self._generation
        hashes = self._credentials.load()
        with self._lock:
            if stamp != self._stamp:
                self._hashes = hashes
                self._stamp = stamp
                self._cache.clear()
                self._generation += 1
            return self._generation

    def _cached(self, key: bytes, generation: int) -> tuple[bool, str | None]:
        """(hit, site) from the cache; a hit with site None is a remembered rejection."""
        with self._lock:
            entry = self._cache.get(key)
            if entry is None:
                return False, None
            site, expiry, gen = entry
            if expiry < time.monotonic() or gen != generation or gen != self._generation:
                del self._cache[key]
                return False, None
            self._cache.move_to_end(key)
            return True, site

    def _remember(self, key: bytes, site: str | None, generation: int) -> None:
        """Cache a result computed under ``generation``; dropped when the credentials changed since."""
        ttl = self._ttl if site is not None else self._negative_ttl
        with self._lock:
            if generation != self._generation:
                return
            self._cache[key] = (site, time.monotonic() + ttl, generation)
            self._cache.move_to_end(key)
            while len(self._cache) > self._max_entries:
                self._cache.popitem(last=False)

    def _verify(self, user: str, password: str, entry: PasswordHash | None) -> str | None:
        """Run the KDF; the site name on success. Unknown sites cost the same as wrong passwords.

        A hash made with weaker parameters than today's is replaced after a
        successful check (the password is at hand only now).
        """
        if entry is None:
            DUMMY_HASH.verify(password)
            return None
        if not entry.verify(password):
            return None
        if entry.needs_rehash():
            try:
                self._credentials.rehash(user, password, entry)
            except (OSError, CredentialError) as exc:
                logger.warning("could not upgrade the password hash of site %r: %s", user, exc)
        return user

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
            generation = self._refresh()
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
            wait = self.throttle.acquire(client, user)
            if wait > 0:
                metrics.record_throttle()
                raise throttled(wait)
            with self._lock:
                entry = self._hashes.get(user)
            done = self._inflight[key] = anyio.Event()
            try:
                site = await anyio.to_thread.run_sync(self._verify, user, password, entry, limiter=self._kdf_limiter)
                kdf_runs += 1
                if site is not None:
                    self.throttle.refund(client, user)
                if self._refresh() == generation:
                    self._remember(key, site, generation)
                    break
                # The credentials changed while the KDF ran: check again against the new ones.
            finally:
                del self._inflight[key]
                done.set()
        if site is None:
            raise unauthenticated()
        return site


def check_password(credentials: CredentialFile, site: str, password: str) -> None:
    """Verify a site's password once (stdio start-up). Raises ToolFailure when wrong."""
    if not credentials.verify(site, password):
        raise ToolFailure("Unauthenticated", "the site name or password is wrong")
