"""Site passwords: their salted scrypt hashes, the checks every credential store shares, and the file store.

The server authenticates with them (:mod:`convmem.mcp_adapter.auth` keeps the
HTTP Basic parsing and the login cache); ``convmem site`` and the operator
tools read and change them. :class:`CredentialFile` keeps them in
``DATA_DIR/auth/sites.json``; :class:`convmem.logstore.postgres.PgCredentials`
keeps the same hashes in the database.

Each site (tenant) has one password, stored only as a salted scrypt hash::

    {"version": 1, "sites": {"team-alpha": {"kdf": "scrypt", "n": 131072, "r": 8, "p": 1,
                                            "salt": "<base64>", "hash": "<base64>",
                                            "created_at": "2026-01-01T00:00:00Z"}}}

The directory is mode 0700 and every file in it 0600. Writers take an
exclusive ``flock`` on ``auth/.lock`` and replace the file atomically
(write, fsync, rename), so concurrent ``convmem site`` commands and a running
server never see a half-written file.
"""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import fcntl
import hashlib
import hmac
import json
import os
import secrets
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from .ids import SiteName

AUTH_DIRNAME = "auth"
SITES_FILENAME = "sites.json"
DEMO_PASSWORD_FILENAME = "demo-site.password"
#: The site ``convmem serve --demo-site`` creates; its password is remembered (``read_demo_password``).
DEMO_SITE = "demo-site"

#: scrypt cost, OWASP's current recommendation (Password Storage Cheat Sheet): N=2**17, r=8, p=1,
#: about 128 MiB and a few hundred milliseconds per run. Hashes made with weaker parameters are
#: replaced on the next successful login (:meth:`CredentialFile.rehash`).
SCRYPT_N = 2**17
SCRYPT_R = 8
SCRYPT_P = 1
_HASH_BYTES = 32


@runtime_checkable
class SharedSecrets(Protocol):
    """An optional credential-store capability: secrets shared by every server on one store.

    A database keeps them for servers that share no directory
    (:class:`convmem.logstore.postgres.PgCredentials`); servers on one data
    directory derive theirs from the directory's own secret instead.
    """

    def shared_secret(self, key: str) -> bytes: ...


class CredentialError(Exception):
    """A site-management command cannot be carried out (message says why)."""


class CredentialFileDamaged(CredentialError):
    """``auth/sites.json`` exists but does not hold a credential document (message names the file)."""


@dataclass(frozen=True, slots=True)
class PasswordHash:
    """One site's salted scrypt hash and its parameters."""

    salt: bytes
    digest: bytes
    n: int = SCRYPT_N
    r: int = SCRYPT_R
    p: int = SCRYPT_P

    @classmethod
    def create(cls, password: str) -> PasswordHash:
        """Hash ``password`` with a fresh random salt."""
        salt = secrets.token_bytes(16)
        return cls(salt, _scrypt(password, salt, SCRYPT_N, SCRYPT_R, SCRYPT_P))

    def verify(self, password: str) -> bool:
        """True when ``password`` matches (constant-time comparison)."""
        return hmac.compare_digest(_scrypt(password, self.salt, self.n, self.r, self.p), self.digest)

    def needs_rehash(self) -> bool:
        """True when this hash was made with weaker parameters than today's."""
        return self.n < SCRYPT_N or self.r < SCRYPT_R or self.p < SCRYPT_P

    def to_json(self) -> dict[str, Any]:
        return {
            "kdf": "scrypt",
            "n": self.n,
            "r": self.r,
            "p": self.p,
            "salt": base64.b64encode(self.salt).decode(),
            "hash": base64.b64encode(self.digest).decode(),
        }

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> PasswordHash:
        if obj.get("kdf") != "scrypt":
            raise ValueError(f"unsupported kdf {obj.get('kdf')!r}")
        return cls(
            salt=base64.b64decode(obj["salt"]),
            digest=base64.b64decode(obj["hash"]),
            n=int(obj["n"]),
            r=int(obj["r"]),
            p=int(obj["p"]),
        )


def _scrypt(password: str, salt: bytes, n: int, r: int, p: int) -> bytes:
    return hashlib.scrypt(
        password.encode("utf-8"), salt=salt, n=n, r=r, p=p, maxmem=256 * n * r + (1 << 20), dklen=_HASH_BYTES
    )


#: A hash checked against when the site does not exist, so that an unknown
#: site costs the same time as a wrong password.
DUMMY_HASH = PasswordHash(salt=b"convmem-no-such-site", digest=b"\0" * _HASH_BYTES)


def generate_password() -> str:
    """A strong random password (32 URL-safe characters, 192 bits)."""
    return secrets.token_urlsafe(24)


def _write_private(path: Path, data: bytes) -> None:
    """Atomically replace ``path`` with ``data``, mode 0600."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


class PasswordChecks:
    """Password checks shared by every credential source: ``load()`` gives the hashes, ``rehash()`` upgrades one.

    An unknown site costs the same KDF run as a wrong password, so a caller cannot
    tell the two apart by timing.
    """

    #: True when ``stamp()`` and ``load()`` ask a database server: the authenticator
    #: then calls them from a worker thread, never from the event loop, so a slow or
    #: unreachable database cannot stall the server's other requests (health checks
    #: included). A local file's ``stat`` is cheaper than the thread hop.
    remote: bool = False

    def load(self) -> dict[str, PasswordHash]:
        raise NotImplementedError

    def rehash(self, site: str, password: str, old: PasswordHash) -> bool:
        raise NotImplementedError

    def verify(self, site: str, password: str) -> bool:
        """True when ``site`` exists and ``password`` is its password."""
        entry = self.load().get(site)
        if entry is None:
            DUMMY_HASH.verify(password)
            return False
        return entry.verify(password)

    def login(self, site: str, password: str) -> bool:
        """:meth:`verify`, and on success replace a hash made with weaker parameters than today's."""
        entry = self.load().get(site)
        if entry is None:
            DUMMY_HASH.verify(password)
            return False
        if not entry.verify(password):
            return False
        if entry.needs_rehash():
            self.rehash(site, password, entry)  # best effort: the login stands either way
        return True


class CredentialFile(PasswordChecks):
    """Read and change the site credentials under ``data_dir/auth``."""

    def __init__(self, data_dir: str | os.PathLike[str]) -> None:
        self.data_dir = Path(data_dir)
        self.auth_dir = self.data_dir / AUTH_DIRNAME
        self.path = self.auth_dir / SITES_FILENAME
        #: An open descriptor of the file :meth:`stamp` last saw (see there), and its (device, inode).
        self._pinned: tuple[int, int, int] | None = None
        self._pin_lock = threading.Lock()

    # -- reading -----------------------------------------------------------

    def stamp(self) -> tuple[int, int, int, int] | None:
        """A cheap change marker (device, inode, size, mtime) of the file; None when absent.

        Every change replaces the file (a new inode). The file last seen is
        kept open, so its inode number cannot be given to a later version:
        two versions written within one tick of the file system's clock, with
        the same size, still differ here (an authentication cached for a
        removed or re-passworded site never outlives the change).
        """
        with self._pin_lock:
            return self._stamp_locked()

    def _stamp_locked(self) -> tuple[int, int, int, int] | None:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            self._unpin()
            return None
        pinned = self._pinned
        if pinned is None or (pinned[1], pinned[2]) != (st.st_dev, st.st_ino):
            self._unpin()
            try:
                fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW)
            except OSError:
                fd = -1
            if fd >= 0:
                held = os.fstat(fd)
                self._pinned = (fd, held.st_dev, held.st_ino)
                if (held.st_dev, held.st_ino) != (st.st_dev, st.st_ino):
                    st = held  # replaced between the stat and the open: report the file now held
        return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)

    def _unpin(self) -> None:
        if self._pinned is not None:
            with contextlib.suppress(OSError):
                os.close(self._pinned[0])
            self._pinned = None

    def load(self) -> dict[str, PasswordHash]:
        """All sites and their hashes (empty when the file does not exist yet).

        Raises :class:`CredentialFileDamaged` when the file or an entry in it
        cannot be read: nobody is let in, and nothing is written over it.
        """
        return self._hashes(self._load_doc())

    def _hashes(self, doc: dict[str, Any]) -> dict[str, PasswordHash]:
        try:
            return {name: PasswordHash.from_json(entry) for name, entry in doc["sites"].items()}
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            raise CredentialFileDamaged(
                f"{self.path}: an entry is not a password hash ({exc}); restore the file from a backup"
            ) from None

    def _load_doc(self) -> dict[str, Any]:
        """The parsed file, checked to be ``{"sites": {name: {...}}}``; an empty document when absent."""
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return {"version": 1, "sites": {}}
        try:
            doc = json.loads(raw)
        except ValueError as exc:
            raise CredentialFileDamaged(f"{self.path} is not valid JSON ({exc}); restore it from a backup") from None
        if not isinstance(doc, dict) or not isinstance(doc.setdefault("sites", {}), dict):
            raise CredentialFileDamaged(f"{self.path} does not hold a credential document; restore it from a backup")
        return doc

    def sites(self) -> list[str]:
        """Site names, sorted."""
        return sorted(self._load_doc()["sites"])

    # -- writing -----------------------------------------------------------

    def ensure_dir(self) -> None:
        """Create ``auth/`` (mode 0700) if needed."""
        self.auth_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.auth_dir, 0o700)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[dict[str, Any]]:
        """Hold the writer lock; yield the document; write it back on success."""
        self.ensure_dir()
        lock_fd = os.open(self.auth_dir / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX)
            doc = self._load_doc()
            self._hashes(doc)  # never write a damaged document back with a change on top
            before = json.dumps(doc, sort_keys=True)
            yield doc
            if json.dumps(doc, sort_keys=True) != before or not self.path.exists():
                _write_private(self.path, (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode())
        finally:
            os.close(lock_fd)

    def add(self, site: str, password: str) -> None:
        """Create ``site`` with ``password``. Raises CredentialError when it exists."""
        SiteName(site)
        entry = PasswordHash.create(password).to_json()
        entry["created_at"] = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        with self._locked() as doc:
            if site in doc["sites"]:
                raise CredentialError(f"site {site!r} already exists")
            doc["sites"][site] = entry

    def set_password(self, site: str, password: str) -> None:
        """Replace ``site``'s password. Raises CredentialError when it does not exist."""
        entry = PasswordHash.create(password).to_json()
        with self._locked() as doc:
            old = doc["sites"].get(site)
            if old is None:
                raise CredentialError(f"no site named {site!r}")
            entry["created_at"] = old.get("created_at")
            doc["sites"][site] = entry

    def rehash(self, site: str, password: str, old: PasswordHash) -> bool:
        """Replace ``site``'s hash ``old`` by one with today's parameters, for the same ``password``.

        The caller has just verified ``password`` against ``old``. Nothing
        changes (False) when the stored hash is no longer ``old``: the
        password was changed meanwhile and the new one must win.
        """
        entry = PasswordHash.create(password).to_json()
        with self._locked() as doc:
            current = doc["sites"].get(site)
            if current is None or PasswordHash.from_json(current) != old:
                return False
            entry["created_at"] = current.get("created_at")
            doc["sites"][site] = entry
            return True

    def remove(self, site: str) -> None:
        """Delete ``site``'s credentials. Raises CredentialError when it does not exist."""
        with self._locked() as doc:
            if doc["sites"].pop(site, None) is None:
                raise CredentialError(f"no site named {site!r}")

    # -- the demo site's remembered password -------------------------------

    @property
    def demo_password_path(self) -> Path:
        return self.auth_dir / DEMO_PASSWORD_FILENAME

    def read_demo_password(self) -> str | None:
        """The remembered demo password, or None."""
        try:
            return self.demo_password_path.read_text().strip() or None
        except FileNotFoundError:
            return None

    def forget_demo_password(self) -> None:
        """Remove the remembered demo password (the demo site was removed)."""
        self.demo_password_path.unlink(missing_ok=True)

    def write_demo_password(self, password: str) -> None:
        """Remember the demo password (mode 0600, owner only)."""
        self.ensure_dir()
        _write_private(self.demo_password_path, (password + "\n").encode())
