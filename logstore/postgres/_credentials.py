"""Site credentials kept in PostgreSQL, so every server process sees the same sites.

The same salted scrypt hashes as :mod:`convmem.logstore.site_credentials`, one row
per site in ``<schema>.site_credentials``. It offers the methods of
:class:`~convmem.logstore.site_credentials.CredentialFile` that the server and ``convmem site``
use. ``stamp()`` is a cheap change marker (the number of sites and the
latest change number), so the authenticator reloads the hashes, and drops its
cache, as soon as another process adds a site, changes a password or removes
one. A database failure surfaces as the store's ``Unavailable`` (retryable),
never as a wrong password.
"""

from __future__ import annotations

import datetime as dt
import secrets
from typing import Any

from ..ids import SiteName
from ..site_credentials import CredentialError, PasswordChecks, PasswordHash
from ._store import PgStore

_DEMO_KEY = "demo-site.password"


class PgCredentials(PasswordChecks):
    """Read and change site credentials stored in the database of ``store``."""

    remote = True

    def __init__(self, store: PgStore) -> None:
        self.store = store
        s = store.schema.replace('"', '""')
        self._t = f'"{s}".site_credentials'
        self._seq = f'"{s}".credential_changes'
        self._settings = f'"{s}".settings'
        #: Where the demo password lives, for messages.
        self.location = f"the PostgreSQL table {s}.settings"

    def _rows(self, query: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        with self.store._conn() as conn:
            return list(conn.execute(query.encode(), params).fetchall())

    # -- reading -----------------------------------------------------------

    def stamp(self) -> tuple[int, int, int]:
        """Changes whenever a site is added, re-keyed or removed."""
        row = self._rows(f"SELECT count(*), coalesce(max(changed), 0) FROM {self._t}")[0]
        return (int(row[0]), int(row[1]), 0)

    def load(self) -> dict[str, PasswordHash]:
        rows = self._rows(f"SELECT site, kdf, n, r, p, salt, hash FROM {self._t}")
        out: dict[str, PasswordHash] = {}
        for site, kdf, n, r, p, salt, digest in rows:
            if kdf != "scrypt":
                continue  # unknown KDF: the site cannot log in until its password is set again
            out[str(site)] = PasswordHash(bytes(salt), bytes(digest), int(n), int(r), int(p))
        return out

    def sites(self) -> list[str]:
        return [str(r[0]) for r in self._rows(f"SELECT site FROM {self._t} ORDER BY site")]

    # -- writing -----------------------------------------------------------

    def ensure_dir(self) -> None:
        """Nothing to create: the table exists once the store has opened."""

    def add(self, site: str, password: str) -> None:
        SiteName(site)
        h = PasswordHash.create(password)
        created = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        rows = self._rows(
            f"INSERT INTO {self._t} (site, kdf, n, r, p, salt, hash, created_at, changed) "
            f"VALUES (%s, 'scrypt', %s, %s, %s, %s, %s, %s, nextval('{self._seq}')) "
            "ON CONFLICT (site) DO NOTHING RETURNING site",
            (site, h.n, h.r, h.p, h.salt, h.digest, created),
        )
        if not rows:
            raise CredentialError(f"site {site!r} already exists")

    def put_hash(self, site: str, h: PasswordHash, created_at: str | None = None) -> None:
        """Store an existing hash for a new site (migration); an existing site is left as it is."""
        SiteName(site)
        self._rows(
            f"INSERT INTO {self._t} (site, kdf, n, r, p, salt, hash, created_at, changed) "
            f"VALUES (%s, 'scrypt', %s, %s, %s, %s, %s, %s, nextval('{self._seq}')) "
            "ON CONFLICT (site) DO NOTHING RETURNING site",
            (site, h.n, h.r, h.p, h.salt, h.digest, created_at),
        )

    def set_password(self, site: str, password: str) -> None:
        h = PasswordHash.create(password)
        rows = self._rows(
            f"UPDATE {self._t} SET kdf = 'scrypt', n = %s, r = %s, p = %s, salt = %s, hash = %s, "
            f"changed = nextval('{self._seq}') WHERE site = %s RETURNING site",
            (h.n, h.r, h.p, h.salt, h.digest, site),
        )
        if not rows:
            raise CredentialError(f"no site named {site!r}")

    def rehash(self, site: str, password: str, old: PasswordHash) -> bool:
        """Replace ``site``'s hash ``old`` by one with today's parameters, for the same ``password``.

        The caller has just verified ``password`` against ``old``. The update
        only matches while the stored hash is still ``old`` (False otherwise:
        the password was changed meanwhile and the new one must win). It takes
        a new change number, so every server drops its cached answers.
        """
        h = PasswordHash.create(password)
        rows = self._rows(
            f"UPDATE {self._t} SET kdf = 'scrypt', n = %s, r = %s, p = %s, salt = %s, hash = %s, "
            f"changed = nextval('{self._seq}') "
            "WHERE site = %s AND kdf = 'scrypt' AND n = %s AND r = %s AND p = %s AND salt = %s AND hash = %s "
            "RETURNING site",
            (h.n, h.r, h.p, h.salt, h.digest, site, old.n, old.r, old.p, old.salt, old.digest),
        )
        return bool(rows)

    def remove(self, site: str) -> None:
        rows = self._rows(f"DELETE FROM {self._t} WHERE site = %s RETURNING site", (site,))
        if not rows:
            raise CredentialError(f"no site named {site!r}")

    # -- the demo site's remembered password -------------------------------

    def read_demo_password(self) -> str | None:
        rows = self._rows(f"SELECT value FROM {self._settings} WHERE key = %s", (_DEMO_KEY,))
        return str(rows[0][0]) if rows else None

    def write_demo_password(self, password: str) -> None:
        self._rows(
            f"INSERT INTO {self._settings} (key, value) VALUES (%s, %s) "
            "ON CONFLICT (key) DO UPDATE SET value = excluded.value RETURNING key",
            (_DEMO_KEY, password),
        )

    def shared_secret(self, key: str) -> bytes:
        """A random 32-byte secret kept under ``key`` in the settings table, made by whoever asks first."""
        self._rows(
            f"INSERT INTO {self._settings} (key, value) VALUES (%s, %s) ON CONFLICT (key) DO NOTHING RETURNING key",
            (key, secrets.token_hex(32)),
        )
        rows = self._rows(f"SELECT value FROM {self._settings} WHERE key = %s", (key,))
        return bytes.fromhex(str(rows[0][0]))

    def forget_demo_password(self) -> None:
        self._rows(f"DELETE FROM {self._settings} WHERE key = %s RETURNING key", (_DEMO_KEY,))
