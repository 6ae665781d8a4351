"""Sealed listing cursors: what ``list_conversations`` hands out as ``next_cursor``.

A cursor names a position in a site's listing (the last conversation of a
page and its last-appended time). A client needs nothing of that: it only
passes the token back. So the token shows nothing but its version, and
carries proof of who issued it to whom::

    c1<base64url(tag[16] || ciphertext)>

``tag`` is HMAC-SHA256 (cut to 16 bytes), keyed with a secret of this data
directory, over the version, the site and the position; the position is
encrypted with a keystream of HMAC-SHA256 blocks keyed with a second key
derived from the same secret, the tag serving as nonce (a synthetic-IV
construction: the same position for the same site always gives the same
token, and no token can be made or altered without the key). A cursor that
was tampered with, made up, cut short, or issued to another site is refused
with ``InvalidCursor``, like any other cursor this listing did not issue.

The secret is the data directory's ``memory-token.key`` (or, for a
PostgreSQL store without a data directory, a secret kept in the database),
so every server process on the same store accepts the others' cursors; the
keys are derived from it for this one use.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import threading
from collections.abc import Callable

import msgspec

from convmem.logstore import ConversationId, InvalidCursor, ListCursor
from convmem.logstore.memories.tokens import load_secret
from convmem.logstore.timefmt import format_us, parse_rfc3339

_VERSION = "c1"
_TAG_BYTES = 16
#: The settings key of the secret kept in PostgreSQL.
CURSOR_SECRET_KEY = "list-cursor.key"
#: Longer tokens are refused before any work (a real one is well under 200 characters).
MAX_TOKEN_CHARS = 256


def _derive(secret: bytes, purpose: bytes) -> bytes:
    return hmac.new(secret, b"convmem/list-cursor/" + purpose, hashlib.sha256).digest()


class CursorSeal:
    """Seals and opens listing cursors with keys derived from one secret."""

    def __init__(self, secret: bytes) -> None:
        if len(secret) < 16:
            raise ValueError("a cursor secret needs at least 16 bytes")
        self._mac_key = _derive(secret, b"mac")
        self._enc_key = _derive(secret, b"enc")

    @classmethod
    def random(cls) -> CursorSeal:
        """A seal whose cursors only this object accepts (tests, single-process tools)."""
        return cls(os.urandom(32))

    def _tag(self, site: str, plain: bytes) -> bytes:
        mac = hmac.new(self._mac_key, _VERSION.encode() + site.encode("utf-8") + b"\0" + plain, hashlib.sha256)
        return mac.digest()[:_TAG_BYTES]

    def _keystream_xor(self, tag: bytes, data: bytes) -> bytes:
        out = bytearray()
        for counter in range(0, (len(data) + 31) // 32):
            block = hmac.new(self._enc_key, tag + counter.to_bytes(4, "big"), hashlib.sha256).digest()
            out += block
        return bytes(a ^ b for a, b in zip(data, out, strict=False))

    def seal(self, cursor: ListCursor, site: str) -> str:
        """The opaque token for ``cursor``, valid for ``site`` only."""
        plain = msgspec.json.encode([parse_rfc3339(cursor.last_appended_at), str(cursor.conversation_id)])
        tag = self._tag(site, plain)
        sealed = tag + self._keystream_xor(tag, plain)
        return _VERSION + base64.urlsafe_b64encode(sealed).decode("ascii").rstrip("=")

    def open(self, token: str, site: str) -> ListCursor:
        """The cursor ``token`` seals for ``site``; :class:`InvalidCursor` for anything else."""
        if not isinstance(token, str) or not 0 < len(token) <= MAX_TOKEN_CHARS or not token.startswith(_VERSION):
            raise InvalidCursor("the cursor is not one this listing issued")
        body = token[len(_VERSION) :]
        try:
            sealed = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))
            canonical = base64.urlsafe_b64encode(sealed).decode("ascii").rstrip("=") == body
        except (binascii.Error, ValueError):
            canonical = False
        if not canonical:  # also refuses the variants of the last character that decode to the same bytes
            raise InvalidCursor("the cursor is malformed")
        tag, encrypted = sealed[:_TAG_BYTES], sealed[_TAG_BYTES:]
        plain = self._keystream_xor(tag, encrypted)
        if len(tag) != _TAG_BYTES or not hmac.compare_digest(tag, self._tag(site, plain)):
            raise InvalidCursor("the cursor was not issued to this site by this server, or was changed")
        try:
            ts, conv = msgspec.json.decode(plain, type=tuple[int, str])
            ConversationId(conv)
            stamp = format_us(ts)
        except (msgspec.DecodeError, ValueError, OverflowError, InvalidCursor, Exception) as exc:
            raise InvalidCursor("the cursor is malformed") from exc
        return ListCursor(stamp, conv)


class LazySeal:
    """A :class:`CursorSeal` whose secret is read on first use (from ``load``, once, thread-safe)."""

    def __init__(self, load: Callable[[], bytes]) -> None:
        self._load = load
        self._seal: CursorSeal | None = None
        self._lock = threading.Lock()

    def _get(self) -> CursorSeal:
        if self._seal is None:
            with self._lock:
                if self._seal is None:
                    self._seal = CursorSeal(self._load())
        return self._seal

    def seal(self, cursor: ListCursor, site: str) -> str:
        return self._get().seal(cursor, site)

    def open(self, token: str, site: str) -> ListCursor:
        return self._get().open(token, site)


def seal_for(data_dir: str, database_secret: Callable[[], bytes] | None = None) -> LazySeal:
    """The seal every process serving this store shares: keyed from ``data_dir``'s secret, else the database's.

    With neither (a PostgreSQL store served without a data directory and no
    ``database_secret``), cursors are only valid within this process.
    """
    if data_dir:
        return LazySeal(lambda: load_secret(data_dir))
    if database_secret is not None:
        return LazySeal(database_secret)
    secret = os.urandom(32)
    return LazySeal(lambda: secret)
