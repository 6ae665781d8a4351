"""Verify tokens: proof that a write was preceded by a ``memory_verify`` of exactly that change.

A token is ``v1.<intent>.<issued_us>.<nonce>.<mac>`` where the MAC is
HMAC-SHA256, keyed with a secret kept in the data directory, over the site,
the intent, the digest of the candidate or memory id, the issue time and the
nonce. A token is accepted by :meth:`TokenBook.check` only for the same site,
intent and digest, at most ``VERIFY_TOKEN_TTL_SECONDS`` old, and only if its
nonce is not in the site's used-token log. Writers record the nonce in that
log (synced) under the site's exclusive lock before they write, so a token is
used at most once across restarts and across processes sharing the directory.

Nothing in a token or in the used-token log is memory content: the digest is
a SHA-256 and only the nonce is stored.
"""

from __future__ import annotations

import base64
import errno
import hashlib
import hmac
import os
import threading
from collections.abc import Callable, Mapping
from typing import Any

import msgspec

from .. import fileio, links
from ..errors import Unavailable
from .errors import VerifyRequired
from .limits import VERIFY_TOKEN_TTL_SECONDS

SECRET_FILE = "memory-token.key"
USED_FILE = "used-tokens"
INTENTS = ("create", "update", "delete")
_SECRET_BYTES = 32
#: A token dated further ahead than this (clock steps between processes) is refused.
_FUTURE_SLACK_US = 60_000_000
_TTL_US = VERIFY_TOKEN_TTL_SECONDS * 1_000_000
#: How long a used nonce must be remembered: as long as a token carrying it could still be accepted.
USED_KEPT_US = _TTL_US + _FUTURE_SLACK_US


def digest(intent: str, memory_id: str | None, candidate: Mapping[str, Any] | None, force: bool = False) -> str:
    """What a token binds besides site and intent: the memory id and/or the candidate's fields.

    A delete's token also binds ``force``: one asked for a soft delete cannot
    erase, and one asked for an erasure cannot soft-delete.
    """
    what: dict[str, Any] = {"intent": intent, "id": memory_id, "candidate": candidate}
    if intent == "delete":
        what["force"] = force
    return hashlib.sha256(msgspec.json.encode(what, order="sorted")).hexdigest()


def load_secret(root: str) -> bytes:
    """The data directory's token secret, created on first use (atomically, race-free across processes)."""
    path = os.path.join(root, SECRET_FILE)
    try:
        secret = links.read_nofollow(path)
        if len(secret) == _SECRET_BYTES:
            return secret
        raise OSError(errno.EINVAL, f"{path} does not hold a {_SECRET_BYTES}-byte secret")
    except FileNotFoundError:
        pass
    tmp = f"{path}.tmp.{os.getpid()}"
    fd = fileio.open_create(tmp, os.O_WRONLY | os.O_TRUNC)
    try:
        fileio.pwrite_all(fd, os.urandom(_SECRET_BYTES), 0)
        fileio.fsync(fd)
    finally:
        os.close(fd)
    try:
        fileio.link(tmp, path)  # fails if another process created it first; then theirs is the secret
    except FileExistsError:
        pass
    finally:
        fileio.unlink(tmp)
    fileio.fsync_dir(root)
    return links.read_nofollow(path)



def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class TokenBook:
    """Mints and checks tokens with one data directory's secret (read, or created, on first use).

    ``secret``, when given, is called instead (once, on first use) to get the
    secret from elsewhere: a database shared by many servers.
    """

    def __init__(self, root: str, secret: Callable[[], bytes] | None = None) -> None:
        self._root = root
        self._load = secret
        self._secret: bytes | None = None
        self._lock = threading.Lock()

    def _key(self) -> bytes:
        with self._lock:
            if self._secret is None:
                if self._load is not None:
                    self._secret = self._load()
                    return self._secret
                try:
                    self._secret = load_secret(self._root)
                except OSError as exc:
                    raise Unavailable(f"the verify-token secret in {self._root} is not usable: {exc}") from exc
            return self._secret

    def _mac(self, site: str, intent: str, what: str, issued_us: int, nonce: bytes) -> bytes:
        msg = "\x1f".join(["convmem-verify-v1", site, intent, what, str(issued_us), nonce.hex()])
        return hmac.new(self._key(), msg.encode("utf-8"), hashlib.sha256).digest()

    def mint(self, site: str, intent: str, what: str, now_us: int) -> str:
        nonce = os.urandom(16)
        mac = self._mac(site, intent, what, now_us, nonce)
        return f"v1.{intent}.{now_us}.{_b64(nonce)}.{_b64(mac)}"

    def check_delete(self, token: object, site: str, memory_id: str, force: bool, now_us: int) -> str:
        """:meth:`check` for a delete: the token must have been asked with the same ``force``.

        A token that would authorise the delete with the other ``force`` is
        refused as ``other-force``, saying which it was asked for.
        """
        try:
            return self.check(token, site, "delete", digest("delete", memory_id, None, force), now_us)
        except VerifyRequired as refused:
            if refused.reason != "mismatch":
                raise
            try:
                self.check(token, site, "delete", digest("delete", memory_id, None, not force), now_us)
            except VerifyRequired:
                raise refused from None
            asked, wanted = ("an erasure (force: true)", "a soft delete") if not force else (
                "a soft delete (force: false)", "an erasure"
            )
            raise VerifyRequired(
                "other-force",
                f"verify_token was issued for {asked}, not {wanted}; ask memory_verify for intent delete "
                f"with force: {str(force).lower()}",
            ) from None

    def check(self, token: object, site: str, intent: str, what: str, now_us: int) -> str:
        """The token's nonce (hex) when it authorises this change now; VerifyRequired otherwise.

        Does not consult the used-token log; see :func:`consume`.
        """
        if token is None:
            raise VerifyRequired("missing", "no verify_token was given")
        if not isinstance(token, str):
            raise VerifyRequired("malformed", "verify_token must be the string memory_verify returned")
        parts = token.split(".")
        try:
            if len(parts) != 5 or parts[0] != "v1":
                raise ValueError
            _, tok_intent, issued_text, nonce_text, mac_text = parts
            issued_us = int(issued_text)
            nonce, mac = _unb64(nonce_text), _unb64(mac_text)
            if len(nonce) != 16 or len(mac) != 32:
                raise ValueError
        except ValueError:
            raise VerifyRequired("malformed", "verify_token is not a token memory_verify issued") from None
        if tok_intent != intent:
            raise VerifyRequired("other-intent", f"verify_token was issued for intent {tok_intent!r}, not {intent!r}")
        if not hmac.compare_digest(mac, self._mac(site, intent, what, issued_us, nonce)):
            raise VerifyRequired("mismatch", "verify_token was issued for another change (site, memory or candidate)")
        if issued_us > now_us + _FUTURE_SLACK_US or now_us - issued_us > _TTL_US:
            raise VerifyRequired("expired", "verify_token has expired (tokens last 10 minutes)")
        return nonce.hex()


def expires_us(issued_us: int) -> int:
    return issued_us + _TTL_US


def used_nonces(site_dir: str, now_us: int) -> set[str]:
    """Nonces used in the last token lifetime (site lock held)."""
    path = os.path.join(site_dir, USED_FILE)
    try:
        lines = links.read_nofollow(path).decode("ascii", errors="replace").splitlines()
    except FileNotFoundError:
        return set()
    out: set[str] = set()
    for line in lines:
        nonce, _, used_text = line.partition(" ")
        if len(nonce) == 32 and used_text.isdigit() and now_us - int(used_text) <= USED_KEPT_US:
            out.add(nonce)
    return out


def check_unused(site_dir: str, nonce: str, now_us: int) -> None:
    """VerifyRequired when ``nonce`` was already used (site lock held)."""
    if nonce in used_nonces(site_dir, now_us):
        raise VerifyRequired("used", "verify_token was already used (each token authorises one write)")


def consume(site_dir: str, nonce: str, now_us: int) -> None:
    """Record ``nonce`` as used, durably, before the write it authorises (exclusive site lock held).

    Raises VerifyRequired when the nonce was already used. Entries older than
    a token's lifetime are dropped when the file grows past a few hundred lines.
    """
    path = os.path.join(site_dir, USED_FILE)
    live = used_nonces(site_dir, now_us)
    if nonce in live:
        raise VerifyRequired("used", "verify_token was already used (each token authorises one write)")
    line = f"{nonce} {now_us}\n".encode("ascii")
    try:
        size = os.lstat(path).st_size
    except FileNotFoundError:
        size = 0
    if size > 64 * 1024:
        fileio.write_file_atomic(path, b"".join(f"{n} {now_us}\n".encode("ascii") for n in sorted(live)) + line)
        return
    fd = fileio.open_create(path, os.O_WRONLY)
    try:
        fileio.pwrite_all(fd, line, size)
        fileio.fdatasync(fd)
    finally:
        os.close(fd)
    if size == 0:
        fileio.fsync_dir(site_dir)
