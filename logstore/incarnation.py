"""Site incarnations: telling a site from an earlier one of the same name (FORMAT.md 1, "Site incarnations").

A process keeps objects per site (listing, pool, open conversations, the
memory store's state and locks). Another process (``convmem site remove
--force`` then ``site add``) can delete the site's directory and create a
new one under the same name; an object of the old site must then never
serve, list or write anything again. So every site directory holds a file
``site.id`` with a random id, published (by ``link``, which never replaces)
before anything else is written there, and:

* every use of a site starts with :meth:`SiteGuard.current` (readers) or
  :meth:`SiteGuard.writing` (anything that may create or change a file
  under the site), which say which incarnation the path names now; a
  per-site object remembers the incarnation it was built for and is
  dropped and rebuilt when that is no longer the one on disk. The check is
  one ``stat`` of ``site.id`` compared with the ``(st_dev, st_ino)`` of the
  descriptor this process keeps open on it: while that descriptor is open
  the inode cannot be reused, so an equal pair proves the same file;
* a writer holds ``site.id``'s ``flock`` shared for the whole operation,
  taken and then checked against the path as above; the remover renames
  ``site.id`` to ``site.id.removing`` (so that no new writer takes it) and
  then takes that file's lock exclusively before it renames the directory
  away. So whatever a writer does by path, under a checked shared lock,
  lands in the incarnation it checked, and the removal waits for the
  writers that were inside: nothing of the old site is written into the new
  one and no write of the new one goes to the old.

Threads of one process share one descriptor per site and therefore one
``flock`` (a second ``LOCK_SH`` on the same open file is a no-op and one
``LOCK_UN`` would release it for all): the holders are counted, and when the
last one leaves the lock is kept as a lease (:mod:`logstore.lease`) until
the site has been unused for ``lease.IDLE`` seconds.

While the lock is held without a break (calls in flight or a lease), a call
needs no ``stat``: a removal renames ``site.id`` and then waits for every
shared holder, so it cannot finish while this process holds the lock, and
what the call writes lands in the incarnation checked when the hold began.
The remover knocks while it waits (an OFD lock, :func:`logstore.lease.knock`);
the reaper sees it within ``lease.TICK`` and from then on every call
``stat`` s the path again, so the first call after the rename closes the
descriptor (letting the lock go) and refuses, and an idle lease is let go at
once. The ``stat`` is also made when the last one is older than
``lease.TERM`` (a directory replaced by hand, outside the protocol, is
noticed within that), and is made before taking the guard's mutex, which is
never held across a system call on the common path. So the next call after
a removal finished (it can only finish once this process let the lock go)
always looks at the path, as does every call of a process that held no lock.
These are plain ``fcntl.flock`` calls
through :mod:`logstore.fileio` (``try_lock``), as every lock of the engine:
portalocker takes the same lock on POSIX but cannot tell us the inode of the
file it locked, which the check needs.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
import time
from collections.abc import Iterator
from typing import NamedTuple

from . import fileio, lease
from .errors import Timeout, Unavailable

#: The site's incarnation id (32 hex digits and a newline); also the site lock (see the module doc).
SITE_ID_FILE = "site.id"
#: ``site.id`` renamed by a removal under way: the site is going, no writer may enter.
RETIRED_ID_FILE = "site.id.removing"


class Incarnation(NamedTuple):
    """One life of a site directory: its id, and the identity of the ``site.id`` file this process holds."""

    id: str
    dev: int
    ino: int


class _Held:
    """This process's open descriptor on one incarnation's ``site.id``, and how many threads hold its lock."""

    __slots__ = ("checked", "fd", "holders", "incarnation", "knocked", "leased", "superseded", "used")

    def __init__(self, fd: int, incarnation: Incarnation) -> None:
        self.fd = fd
        self.incarnation = incarnation
        self.holders = 0
        self.superseded = False
        #: The lock is held with no holder (a lease, see the module doc), since ``used``.
        self.leased = False
        self.used = 0.0
        #: When a ``stat`` last showed the path names this file, and whether the reaper saw a
        #: removal knock since (see SiteGuard.enter).
        self.checked = 0.0
        self.knocked = False


#: What :meth:`SiteGuard.current` appends to a site's path (``os.path.join`` costs more, on every read).
_ID_SUFFIX = os.sep + SITE_ID_FILE


def _stat(path: str) -> os.stat_result | None:
    try:
        return os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None


def _same(st: os.stat_result, inc: Incarnation) -> bool:
    return st.st_ino == inc.ino and st.st_dev == inc.dev


def is_file_at(fd: int, path: str) -> bool:
    """Whether the open file ``fd`` is the one named ``path`` now (same device and inode)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return st.st_ino == held.st_ino and st.st_dev == held.st_dev


def read_id(site_path: str) -> str | None:
    """The incarnation id of the site directory ``site_path``; None without one (absent, legacy, or going)."""
    try:
        with open(os.path.join(site_path, SITE_ID_FILE), "rb") as f:
            return f.read().decode("ascii").strip() or None
    except (FileNotFoundError, NotADirectoryError, UnicodeDecodeError):
        return None


def publish_id(site_path: str) -> None:
    """Give the existing directory ``site_path`` an incarnation id unless it has one (first writer wins).

    The id is written to a temporary file, synced, and linked as ``site.id``
    (``link`` fails when the name exists: another process was first), then
    the directory is synced.
    """
    target = os.path.join(site_path, SITE_ID_FILE)
    tmp = f"{target}.tmp.{os.getpid()}.{threading.get_ident()}"
    fd = fileio.open_create(tmp, os.O_WRONLY | os.O_TRUNC)
    try:
        fileio.pwrite_all(fd, os.urandom(16).hex().encode("ascii") + b"\n", 0)
        fileio.fsync(fd)
    finally:
        os.close(fd)
    try:
        fileio.link(tmp, target)
    except FileExistsError:
        pass
    finally:
        fileio.unlink(tmp)
    fileio.fsync_dir(site_path)


class SiteGuard(lease.Leased):
    """Which incarnation each site of a data directory is, for the objects one store keeps (thread-safe)."""

    def __init__(self, sites_dir: str, lock_timeout: float) -> None:
        self._sites_dir = sites_dir
        self._lock_timeout = lock_timeout
        self._mutex = threading.Lock()
        self._held: dict[str, _Held] = {}
        #: Set by :meth:`close`: from then on a descriptor is closed as soon as its use ends.
        self._closed = False
        self._watched = False  # the lease reaper looks at this guard

    def _paths(self, site_path: str) -> tuple[str, str]:
        return os.path.join(site_path, SITE_ID_FILE), os.path.join(site_path, RETIRED_ID_FILE)

    def _open_locked(self, site_path: str, write: bool, create: bool = False) -> _Held | None:
        """The held descriptor of the incarnation now at ``site_path`` (mutex held); None when there is none.

        ``write``: the caller will lock it, so a directory without an id (made
        before incarnations existed) is given one; a reader leaves it as it is
        and knows it by the directory's own inode. ``create`` (with ``write``):
        make a missing directory. Raises ``_Going`` while a removal is under way.
        """
        id_path, retired = self._paths(site_path)
        try:
            st = os.stat(id_path)
        except FileNotFoundError:
            st = None
        except NotADirectoryError:
            return None
        held = self._held.get(site_path)
        if held is not None and st is not None and _same(st, held.incarnation):
            return held
        if held is not None and held.incarnation.id:
            self._supersede_locked(site_path)  # not the file at the path any more: let its lock go now
        if st is None:
            if os.path.lexists(retired):
                raise _Going()
            if not write:
                try:
                    dir_st = os.stat(site_path)
                except (FileNotFoundError, NotADirectoryError):
                    return None
                if held is not None and not held.incarnation.id and _same(dir_st, held.incarnation):
                    return held  # the directory without an id, held already
                id_path = site_path
            else:
                if not os.path.isdir(site_path):
                    if not create:
                        return None
                    fileio.makedirs_durable(site_path)
                publish_id(site_path)
        try:
            fd = os.open(id_path, os.O_RDONLY | os.O_NOFOLLOW)
        except FileNotFoundError:
            raise _Going() from None  # retired (or removed) since we looked
        try:
            st = os.fstat(fd)
            ident = "" if id_path == site_path else os.pread(fd, 64, 0).decode("ascii", "replace").strip()
        except BaseException:
            os.close(fd)
            raise
        self._supersede_locked(site_path)
        new = self._held[site_path] = _Held(fd, Incarnation(ident, st.st_dev, st.st_ino))
        return new

    def _supersede_locked(self, site_path: str) -> None:
        old = self._held.pop(site_path, None)
        if old is None:
            return
        old.superseded = True
        if old.holders == 0:
            os.close(old.fd)

    def close(self) -> None:
        """Close every ``site.id`` descriptor this guard holds (its store is closing).

        A descriptor still locked by a call in flight is closed by that call's
        :meth:`leave` (it is marked superseded); a later use opens the file again.
        """
        with self._mutex:
            self._closed = True
            for site_path in list(self._held):
                self._supersede_locked(site_path)

    def forget(self, site_path: str) -> None:
        """Close the descriptor held for ``site_path`` (at the end of its use if one is in flight).

        For a store letting go of a site it has not used lately; the next use opens the file again.
        """
        with self._mutex:
            self._supersede_locked(site_path)

    def current(self, site_path: str) -> Incarnation | None:
        """The incarnation the path names now (one ``stat`` when it is the one this process holds); None when absent.

        A site being removed reads as absent.
        """
        st = _stat(site_path + _ID_SUFFIX)  # outside the mutex (see the module doc)
        with self._mutex:
            held = self._held.get(site_path)
            if held is not None and st is not None and _same(st, held.incarnation) and not self._closed:
                return held.incarnation
            try:
                held = self._open_locked(site_path, write=False)
            except _Going:
                return None
            if held is None:
                return None
            if self._closed and held.holders == 0:
                self._supersede_locked(site_path)  # a late use of a closed store keeps nothing open
            return held.incarnation

    @contextlib.contextmanager
    def writing(self, site_path: str, create: bool = True) -> Iterator[Incarnation | None]:
        """Hold the site's lock shared, checked against the path; yield its incarnation (None: absent, not created).

        ``create`` makes a missing site directory (with its id). While a
        removal is under way this raises ``Unavailable`` (retryable) at once:
        the call began before the removal ended, and must neither write into
        the site going away nor create its next incarnation.
        """
        held = self.enter(site_path, create)
        try:
            yield None if held is None else held.incarnation
        finally:
            if held is not None:
                self.leave(site_path, held)

    def enter(self, site_path: str, create: bool = True) -> _Held | None:
        """What :meth:`writing` does on entry, without a generator (the append path): the hold, or None.

        The caller passes a hold it got to :meth:`leave` exactly once, in a
        ``finally``; ``hold.incarnation`` is what :meth:`writing` yields.
        """
        started = time.monotonic()
        with self._mutex:
            # Held without a break since a stat proved it the file at the path (less than
            # lease.TERM ago) and no removal knocks: a removal cannot have finished, so the
            # path still names this incarnation for all a writer does (see the module doc).
            held = self._held.get(site_path)
            if (held is not None and (held.holders > 0 or held.leased) and not held.knocked
                    and started - held.checked < lease.TERM):
                held.holders += 1
                held.leased = False
                return held
        return self._enter_checked(site_path, create, started)

    def _enter_checked(self, site_path: str, create: bool, started: float) -> _Held | None:
        """:meth:`enter` when the hold must be checked against the path (a ``stat``), or taken."""
        delay = 0.0005
        id_path = os.path.join(site_path, SITE_ID_FILE)
        while True:
            with self._mutex:
                held = self._held.get(site_path)
                if (held is not None and (held.holders > 0 or held.leased) and not held.knocked
                        and time.monotonic() - held.checked < lease.TERM):
                    held.holders += 1
                    held.leased = False
                    return held
            # Held and still the file at the path: a counter changes. The stat is made first,
            # outside the mutex (see the module doc).
            st = _stat(id_path)
            with self._mutex:
                held = self._held.get(site_path)
                if held is not None and st is not None and (held.holders > 0 or held.leased):
                    if _same(st, held.incarnation):
                        held.holders += 1
                        held.leased = False
                        held.checked = time.monotonic()
                        held.knocked = False  # (seen again next tick if a removal still knocks)
                        return held
                try:
                    held = self._open_locked(site_path, write=True, create=create)
                    if held is None:
                        return None
                    if held.holders > 0 or fileio.try_lock(held.fd, False):
                        if held.holders == 0:
                            # Locked now: check it is still the file at the path (a remover renames it
                            # away before taking it exclusively, so no new holder may keep it).
                            st = _stat(id_path)
                            if st is None or not _same(st, held.incarnation):
                                fileio.unlock(held.fd)
                                self._supersede_locked(site_path)
                                continue
                            held.checked = time.monotonic()
                            held.knocked = False
                        held.holders += 1
                        return held
                except _Going:
                    # Never waited out: a call that began before the removal must not make the
                    # next incarnation (its caller's credentials were revoked before the removal).
                    raise Unavailable(
                        f"site directory {os.path.basename(site_path)} is being removed ({RETIRED_ID_FILE} is "
                        "there); if no `convmem site remove` is running, "
                        "`convmem site add NAME --purge-data` finishes it"
                    ) from None
            waited = time.monotonic() - started
            if waited > self._lock_timeout:
                raise Timeout(waited)
            time.sleep(delay)
            delay = min(delay * 2, 0.02)

    def leave(self, site_path: str, held: _Held) -> None:
        """End a hold :meth:`enter` returned."""
        with self._mutex:
            held.holders -= 1
            if held.holders == 0:
                if not held.superseded and not self._closed and lease.SUPPORTED:
                    held.leased = True  # kept until idle (reap) or superseded
                    held.used = time.monotonic()
                    if not self._watched:
                        self._watched = True
                        lease.reaper.watch(self)
                    return
                fileio.unlock(held.fd)
                if held.superseded:
                    os.close(held.fd)
                elif self._closed and self._held.get(site_path) is held:
                    self._supersede_locked(site_path)  # closes it: a late use of a closed store keeps nothing open

    def reap(self, now: float) -> bool:
        """The reaper's look (:class:`logstore.lease.Leased`), every ``lease.TICK`` while a site lock is held.

        Notes a removal's knock on a held lock (the next call then looks at the
        path) and lets the leases unused for ``lease.IDLE``, or knocked, go.
        Never blocks (the mutex taken means: look again next tick).
        """
        if not self._mutex.acquire(blocking=False):
            return False
        try:
            looked = [h for h in self._held.values() if h.holders > 0 or h.leased]
        finally:
            self._mutex.release()
        for held in looked:  # outside the mutex: a closed descriptor only gives a wrong answer once
            try:
                if lease.knocked(held.fd):
                    held.knocked = True  # a removal waits: the next call looks at the path
            except OSError:
                pass
        if not self._mutex.acquire(blocking=False):
            return False
        try:
            left = False
            for held in self._held.values():
                if held.holders > 0:
                    left = True  # in use: looked at again for a knock next tick
                elif held.leased:
                    if now - held.used >= lease.IDLE or held.knocked:
                        held.leased = False
                        fileio.unlock(held.fd)
                    else:
                        left = True
            self._watched = left
            return not left
        finally:
            self._mutex.release()

    @contextlib.contextmanager
    def removing(self, site_path: str) -> Iterator[None]:
        """Retire the site's incarnation and hold it exclusively, for the caller to move the directory away.

        Renames ``site.id`` to ``site.id.removing`` (a legacy directory is
        given an id first), then waits up to the lock timeout for the writers
        inside to leave. On a timeout the id is put back. A removal left
        unfinished by a dead process is taken over.
        """
        id_path, retired = self._paths(site_path)
        if not os.path.isdir(site_path):
            yield
            return
        if not os.path.lexists(retired):
            if not os.path.lexists(id_path):
                publish_id(site_path)
            fd = os.open(id_path, os.O_RDONLY | os.O_NOFOLLOW)
            try:
                fileio.rename(id_path, retired)
            except FileNotFoundError:
                os.close(fd)
                raise Unavailable("another process is removing this site") from None
            put_back = True
        else:
            fd = os.open(retired, os.O_RDONLY | os.O_NOFOLLOW)
            put_back = False
        try:
            with self._mutex:
                self._supersede_locked(site_path)  # our own lease, if any, first
            started = time.monotonic()
            try:
                # Knocking while it waits: a process keeping the lock as a lease lets it go.
                lease.wait_lock(functools.partial(fileio.try_lock, fd, True), fd,
                                started + self._lock_timeout, started)
            except Timeout:
                if put_back:
                    with contextlib.suppress(OSError):
                        fileio.link(retired, id_path)
                        fileio.unlink(retired)
                raise
            with self._mutex:
                self._supersede_locked(site_path)
            yield
        finally:
            os.close(fd)


class _Going(Exception):
    """A removal of the site is under way (``site.id.removing`` is there)."""
