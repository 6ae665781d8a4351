"""Per-site quotas: what a site's directory takes on disk, in bytes and in files, and its conversations.

A site's *usage* is what the disk holds for it: the allocated size
(``st_blocks * 512``: preallocated, zero-filled space included) and the number
of every file and directory below ``sites/<site-hex>/`` (logs, indexes,
manifests, lock files, the pool of ready conversation directories, long-term
memories), plus the number of its conversations that hold a segment.
:func:`site_usage` measures it from disk, by a walk that follows no link;
``convmem stats`` shows it.

Enforcement must not walk the tree per append. Each site has a running
*account* shared by every process on the data directory: the file
``sites/<site-hex>/usage.acct`` (FORMAT.md section 1), mapped into memory and
updated under its ``flock`` (and a thread lock), so a check is a lock, a few
loads and stores, and an ``fstat`` (which notices the site was removed). The
account is set from a walk when first needed (it is missing, unreadable, or
was written before the machine last booted: it is never synced, so a power
cut may have lost its last updates) and kept by every append after:

* before the write, the append is charged an estimate (its record, the
  manifest entries it writes, and for a new conversation what one takes:
  directories, lock and segment files, its share of the pool and of the
  fan-out directories); over the quota, it is refused with
  :class:`QuotaExceeded` and nothing is written;
* after it, the growth of the conversation's active segment and index that
  the write itself allocated (``fstat`` of their descriptors) is added.

So the account can fall behind the disk only by what grew outside an append
(a background extend-ahead of a segment, segment rolls, the pool's first
fill) and run ahead by estimates larger than the truth. Both are corrected by
a new walk, taken (outside the lock; what was charged meanwhile is added
back) whenever the charges since the last walk reach an eighth of a limit, and
before any refusal whose account is older than the recount interval. The disk
may therefore pass a byte quota by what one append's preallocation allocates
(at most ``zerofill.CHUNK_MAX``, 1 MiB, per conversation written at once);
the next append is then refused.
"""

from __future__ import annotations

import mmap
import os
import stat
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from . import convpool, fileio, layout
from .errors import QuotaExceeded
from .frame import RECORD_OVERHEAD

#: The quota ``convmem serve`` applies to every site unless told otherwise (``--quota-bytes``,
#: ``--quota-files``; 0 lifts a limit): 10 GiB on disk and a million files and directories.
DEFAULT_MAX_BYTES = 10 * 1024**3
DEFAULT_MAX_FILES = 1_000_000

#: The shared account's file in the site directory.
ACCOUNT_FILE = "usage.acct"
#: An append's estimate: its manifest entries (intent and commit) ...
MANIFEST_BYTES_PER_APPEND = 160
#: ... and for a new conversation at most what one takes on disk: its directory, lock and
#: first segment, the pool entry that replaces the one it claimed, and new fan-out
#: directories and their spares (measured on ext4 with 4 KiB entry segments: 8 blocks for the
#: first ones of a site, about 17.5 KiB and 5.3 entries on average over its first 200; an
#: entry's segment is convpool.ENTRY_BYTES now, 8 KiB more in the claimed entry and in its
#: replacement, and the claimed one's zeros past its data are given back at its close).
NEW_CONVERSATION_BYTES = 56 * 1024
NEW_CONVERSATION_FILES = 8
#: A walk counts the site's pool of ready conversation directories as full (convpool.TARGET
#: entries): a missing entry is built in the background, where no append is charged for it.
POOL_ENTRY_BYTES = 2 * 4096 + 12 * 1024  # its directory, lock file and segment (convpool.ENTRY_BYTES)
POOL_ENTRY_FILES = 3
#: A walk is taken when the charges since the last one reach this fraction of a limit ...
RECOUNT_FRACTION = 8
#: ... and before a refusal when the last one is older than this many seconds (or than
#: RECOUNT_COST times the last walk's duration, for a site so large a walk is slow).
RECOUNT_INTERVAL_S = 2.0
RECOUNT_COST = 20


@dataclass(frozen=True)
class SiteQuota:
    """Limits applied to every site; None means unlimited."""

    max_bytes: int | None = None
    max_conversations: int | None = None
    max_files: int | None = None

    def __post_init__(self) -> None:
        for name in ("max_bytes", "max_conversations", "max_files"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be a positive integer or None, not {value!r}")

    @property
    def active(self) -> bool:
        return self.max_bytes is not None or self.max_conversations is not None or self.max_files is not None

    @classmethod
    def from_options(cls, max_bytes: int | None, max_files: int | None, max_conversations: int | None) -> SiteQuota:
        """The quota of command-line options: None takes the default, 0 lifts the limit."""

        def pick(value: int | None, default: int | None) -> int | None:
            return default if value is None else (value or None)

        return cls(
            max_bytes=pick(max_bytes, DEFAULT_MAX_BYTES),
            max_conversations=pick(max_conversations, None),
            max_files=pick(max_files, DEFAULT_MAX_FILES),
        )


@dataclass
class Usage:
    """What a site takes: bytes allocated on disk, conversations holding a segment, files and directories."""

    bytes: int = 0
    conversations: int = 0
    files: int = 0


def site_usage(root: str, site: str) -> Usage:
    """Measure ``site``'s usage from disk: a walk of its directory that follows no symbolic link."""
    usage = Usage()
    top = layout.site_dir(root, site)
    try:
        st = os.lstat(top)
    except FileNotFoundError:
        return usage
    if not stat.S_ISDIR(st.st_mode):
        return usage
    usage.bytes += st.st_blocks * 512
    conversations = os.path.join(top, layout.CONVERSATIONS_DIR)
    stack = [top]
    while stack:
        directory = stack.pop()
        try:
            entries = list(os.scandir(directory))
        except (FileNotFoundError, NotADirectoryError):
            continue  # removed while we walked (a live site)
        holds_segment = False
        for entry in entries:
            try:
                est = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            usage.files += 1
            usage.bytes += est.st_blocks * 512
            if stat.S_ISDIR(est.st_mode):
                stack.append(entry.path)
            elif layout.parse_segment_name(entry.name) is not None:
                holds_segment = True
        if holds_segment and os.path.dirname(os.path.dirname(os.path.dirname(directory))) == conversations:
            usage.conversations += 1
    return usage


def accountable_usage(root: str, site: str) -> Usage:
    """:func:`site_usage`, with the site's pool counted as full (what the account starts from).

    An entry being built (``t-``) counts as one of the pool's entries, as a ready
    one (``e-``) does: the walk counts what it holds so far, and it is not
    estimated a second time. The pool is listed before the walk, so that an entry
    listed as being built and found ready by the walk is counted once.
    """
    try:
        names = os.listdir(layout.pool_dir(layout.site_dir(root, site)))
    except (FileNotFoundError, NotADirectoryError):
        names = []
    usage = site_usage(root, site)
    prefixes = (layout.POOL_READY_PREFIX, layout.POOL_BUILDING_PREFIX)
    missing = max(0, convpool.TARGET - sum(n.startswith(prefixes) for n in names))
    usage.bytes += missing * POOL_ENTRY_BYTES
    usage.files += missing * POOL_ENTRY_FILES
    return usage


def record_cost(body_len: int, new_conversation: bool) -> tuple[int, int]:
    """The estimate charged before an append of ``body_len`` bytes: (bytes, files)."""
    cost = body_len + RECORD_OVERHEAD + MANIFEST_BYTES_PER_APPEND
    if new_conversation:
        return cost + NEW_CONVERSATION_BYTES, NEW_CONVERSATION_FILES
    return cost, 0


# --------------------------------------------------------------------------- the shared account

_MAGIC = b"cmacct1\n"
#: magic, boot id, then bytes, files, conversations (the account), then the same three charged
#: since the last walk (net of refunds), the time of the last walk (us since the epoch) and its
#: duration (us).
_LAYOUT = struct.Struct("<8s16s8q")
_FIELDS = 8


def _boot_id() -> bytes:
    """This boot of the machine (Linux); zeros where unknown (each process then measures once)."""
    try:
        with open("/proc/sys/kernel/random/boot_id", "rb") as f:
            return bytes.fromhex(f.read().decode("ascii").strip().replace("-", ""))[:16].ljust(16, b"\0")
    except (OSError, ValueError):
        return bytes(16)


_BOOT_ID = _boot_id()


class _Account:
    """One site's account in one process: the mapped file, its descriptor, a thread lock."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.fd = fileio.open_create(path)
        try:
            if os.fstat(self.fd).st_size < _LAYOUT.size:  # new: sized under the flock (another may fill it)
                _flock(self.fd)
                try:
                    if os.fstat(self.fd).st_size < _LAYOUT.size:
                        fileio.pwrite_all(self.fd, bytes(_LAYOUT.size), 0)
                finally:
                    fileio.unlock(self.fd)
            self.map = mmap.mmap(self.fd, _LAYOUT.size)
        except BaseException:
            os.close(self.fd)
            raise
        self.lock = threading.Lock()
        #: This process trusts the file's figures only after checking them once under its flock.
        self.checked = _BOOT_ID != bytes(16)

    def gone(self) -> bool:
        """True when the file was removed (the site was deleted, perhaps by another process)."""
        return os.fstat(self.fd).st_nlink == 0

    def read(self) -> list[int] | None:
        """The eight figures, or None when the file does not hold a valid account of this boot."""
        magic, boot, *figures = _LAYOUT.unpack_from(self.map, 0)
        if magic != _MAGIC or boot != _BOOT_ID or not self.checked:
            return None
        return figures

    def write(self, figures: list[int]) -> None:
        _LAYOUT.pack_into(self.map, 0, _MAGIC, _BOOT_ID, *figures)
        self.checked = True

    def close(self) -> None:
        self.map.close()
        os.close(self.fd)


class _Locked:
    """Holds an account's thread lock and ``flock`` (a context manager)."""

    def __init__(self, account: _Account) -> None:
        self.account = account

    def __enter__(self) -> _Account:
        self.account.lock.acquire()
        try:
            _flock(self.account.fd)
        except BaseException:
            self.account.lock.release()
            raise
        return self.account

    def __exit__(self, *exc: object) -> None:
        try:
            fileio.unlock(self.account.fd)
        finally:
            self.account.lock.release()


def _flock(fd: int) -> None:
    """Wait for the account's exclusive ``flock`` (held only for a few loads and stores, or one walk)."""
    delay = 0.0001
    while not fileio.try_lock(fd, True):
        time.sleep(delay)
        delay = min(delay * 2, 0.005)


class UsageTracker:
    """Refuses appends beyond the quota, against each site's shared account. Thread- and process-safe."""

    def __init__(self, root: str, quota: SiteQuota, measure: Callable[[str, str], Usage] | None = None) -> None:
        self.root = root
        self.quota = quota
        self._measure = measure or accountable_usage
        self._lock = threading.Lock()
        self._accounts: dict[str, _Account] = {}
        #: Byte corrections of settled appends not yet in the account, per site: folded into the
        #: next charge's update (one locked update per append instead of two).
        self._pending: dict[str, int] = {}

    # ------------------------------------------------------------ accounts

    def _account(self, site: str, create: bool = True) -> _Account | None:
        """The site's account, opened (or re-opened after the site was removed) as needed.

        With ``create``, a site with no directory yet gets one here, before its
        first append is charged: every charge, the first included, is then
        made in the account all processes share. Without, None for such a site.
        """
        with self._lock:
            account = self._accounts.get(site)
        if account is not None and not account.gone():
            return account
        site_path = layout.site_dir(self.root, site)
        if create:
            fileio.makedirs_durable(site_path)
        elif not os.path.isdir(site_path):
            return None
        fresh = _Account(os.path.join(site_path, ACCOUNT_FILE))
        with self._lock:
            old = self._accounts.get(site)
            if old is account:
                self._accounts[site] = fresh
                if old is not None:
                    old.close()
                return fresh
        fresh.close()  # another thread re-opened it first
        return self._account(site, create)

    def _figures(self, account: _Account, site: str) -> list[int]:
        """The account's figures (flock held), measured from disk first when the file holds none."""
        figures = account.read()
        if figures is None:
            started = time.monotonic()
            usage = self._measure(self.root, site)
            took = int((time.monotonic() - started) * 1e6)
            figures = [usage.bytes, usage.files, usage.conversations, 0, 0, 0, _now_us(), took]
            account.write(figures)
        return figures

    # ------------------------------------------------------------ the append path

    def charge(self, site: str, body_len: int, new_conversation: bool, ahead: int = 0) -> tuple[int, int]:
        """Charge the estimate of an append about to be written; the charge (bytes, files), for :meth:`refund`.

        ``ahead``: bytes its conversation's files may grow by beyond the record
        (preallocation, see ``Preallocated.growth_bound``), charged with it.

        Raises QuotaExceeded (and charges nothing) when it would take the site
        past a limit, after one walk when the account is older than the
        recount interval.
        """
        nbytes, files = record_cost(body_len, new_conversation)
        cost = (nbytes + ahead, files)
        recounted = False
        while True:
            account = self._account(site)
            assert account is not None
            with _Locked(account) as a:
                figures = self._figures(a, site)
                self._fold(site, figures)
                refusal = self._refusal(figures, cost, new_conversation)
                # A walk due is taken before this charge is added: it must not be lost in the recount.
                due = not recounted and self._recount_due(figures, cost)
                if refusal is None and not due:
                    self._add(figures, cost[0], cost[1], int(new_conversation))
                    a.write(figures)
                    return cost
                stale = _now_us() - figures[6] > max(RECOUNT_INTERVAL_S * 1e6, RECOUNT_COST * figures[7])
            if refusal is not None and (recounted or not (stale or due)):
                raise refusal
            self.recount(site)
            recounted = True

    def _refusal(self, figures: list[int], cost: tuple[int, int], new: bool) -> QuotaExceeded | None:
        q = self.quota
        if new and q.max_conversations is not None and figures[2] + 1 > q.max_conversations:
            return QuotaExceeded("conversations", q.max_conversations, figures[2] + 1)
        if q.max_bytes is not None and figures[0] + cost[0] > q.max_bytes:
            return QuotaExceeded("bytes", q.max_bytes, figures[0] + cost[0])
        if cost[1] and q.max_files is not None and figures[1] + cost[1] > q.max_files:
            return QuotaExceeded("files", q.max_files, figures[1] + cost[1])
        return None

    @staticmethod
    def _add(figures: list[int], nbytes: int, files: int, conversations: int) -> None:
        for i, delta in enumerate((nbytes, files, conversations)):
            figures[i] += delta
            figures[3 + i] += delta

    def _recount_due(self, figures: list[int], cost: tuple[int, int]) -> bool:
        """True when the charges since the last walk, this one included, reach a fraction of a limit."""
        q = self.quota
        return (q.max_bytes is not None and (figures[3] + cost[0]) * RECOUNT_FRACTION >= q.max_bytes) or (
            q.max_files is not None and (figures[4] + cost[1]) * RECOUNT_FRACTION >= q.max_files
        )

    def settle(self, site: str, correction: int) -> None:
        """Replace an append's estimated record bytes by what its conversation's files grew (may be negative).

        Kept in this process until the site's next charge, recount or :meth:`close`.
        """
        if correction:
            with self._lock:
                self._pending[site] = self._pending.get(site, 0) + correction

    def _fold(self, site: str, figures: list[int]) -> None:
        """Add the site's pending corrections to ``figures`` (the account's flock held)."""
        if self._pending:
            with self._lock:
                correction = self._pending.pop(site, 0)
            if correction:
                self._add(figures, correction, 0, 0)

    def refund(self, site: str, cost: tuple[int, int], new_conversation: bool) -> None:
        """Undo :meth:`charge` for an append that was not written."""
        self._adjust(site, -cost[0], -cost[1], -int(new_conversation))

    def adjust_conversations(self, site: str, delta: int) -> None:
        """Correct the conversation count after an append showed whether its conversation was new."""
        self._adjust(site, 0, 0, delta)

    def _adjust(self, site: str, nbytes: int, files: int, conversations: int) -> None:
        account = self._account(site, create=False)
        if account is None:
            return  # the site was removed meanwhile: nothing to correct
        with _Locked(account) as a:
            figures = self._figures(a, site)
            self._fold(site, figures)
            self._add(figures, nbytes, files, conversations)
            a.write(figures)

    # ------------------------------------------------------------ walks

    def recount(self, site: str) -> Usage:
        """Measure the site from disk and set its account to that, plus what was charged during the walk."""
        account = self._account(site, create=False)
        if account is None:
            return Usage()
        with _Locked(account) as a:
            figures = self._figures(a, site)
            self._fold(site, figures)
            a.write(figures)
            before = figures[3:6]
        started = time.monotonic()
        usage = self._measure(self.root, site)
        took = int((time.monotonic() - started) * 1e6)
        with _Locked(account) as a:
            now = self._figures(a, site)
            since = [n - b for n, b in zip(now[3:6], before, strict=True)]
            figures = [usage.bytes + since[0], usage.files + since[1], usage.conversations + since[2]]
            a.write([*figures, *since, _now_us(), took])
        return usage

    def forget(self, site: str) -> None:
        """Drop what is known of ``site`` (this process deleted it); measured again when next needed."""
        with self._lock:
            self._pending.pop(site, None)
            account = self._accounts.pop(site, None)
        if account is not None:
            account.close()

    def close(self) -> None:
        """Write what is pending into the accounts, and close them."""
        with self._lock:
            pending = list(self._pending)
        for site in pending:
            self._adjust(site, 0, 0, 0)
        with self._lock:
            accounts = list(self._accounts.values())
            self._accounts.clear()
        for account in accounts:
            account.close()


def _now_us() -> int:
    return time.time_ns() // 1000


__all__ = [
    "ACCOUNT_FILE",
    "DEFAULT_MAX_BYTES",
    "DEFAULT_MAX_FILES",
    "SiteQuota",
    "Usage",
    "UsageTracker",
    "record_cost",
    "site_usage",
]
