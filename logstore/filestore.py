"""The file-based store: a data directory of sites, conversations and manifests."""

from __future__ import annotations

import errno
import functools
import itertools
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

import msgspec

from . import convpool, fileio, follow, layout, links, observe, poolclaims
from .codec import encode_batch
from .conversation import Conversation, Options, Tip
from .errors import Io, StoreError, Timeout, Unavailable
from .frame import RECORD_OVERHEAD
from .ids import ConversationId, SiteName, check_expected_next_seq, check_idempotency_key
from .incarnation import Incarnation, SiteGuard
from .layout import FORMAT_NAME, FORMAT_VERSION, READABLE_VERSIONS
from .manifest import SiteManifest
from .model import (
    ConversationListing,
    ConversationSummary,
    ListCursor,
    ListSelector,
    MemoryItem,
    Range,
    RawMemoryItem,
    ReadSelector,
    SeqRange,
    Tail,
)
from .preallocation import first_chunk, wait_for_extensions
from .quota import MANIFEST_BYTES_PER_APPEND, SiteQuota, UsageTracker
from .store import MemoryStore
from .timefmt import format_us, parse_rfc3339

_Item = TypeVar("_Item", MemoryItem, RawMemoryItem)

#: At most this many site directories are remembered by name (:meth:`FileStore._site_dir`); past it each is computed.
_SITE_DIRS_KEPT = 1024



def _bounds(selector: ReadSelector) -> tuple[int | None, int]:
    """``(start, limit)`` of a selector; start None for a tail."""
    if isinstance(selector, Tail):
        return None, selector.count
    if isinstance(selector, Range):
        return selector.start, selector.limit
    raise TypeError(f"selector must be Tail or Range, not {type(selector).__name__}")


def _io(exc: OSError, what: str) -> Io:
    return Io(f"{what}: {os.strerror(exc.errno) if exc.errno else exc}", exc.errno)


class FileStore(MemoryStore):
    """A :class:`MemoryStore` on a local data directory.

    Safe for many threads, and for several processes sharing one directory.
    At most ``max_open`` conversations keep descriptors open (three each);
    the least recently used are closed beyond that. With
    ``conversation_pool`` (the default) a first append takes a directory made
    ahead of need from the site's pool (:mod:`logstore.convpool`), refilled
    by a background job; the entries a process built stay open (two
    descriptors each, at most ``convpool.MAX_HELD`` entries over all sites).
    ``conversation_pool=False`` creates every new conversation in place, on
    the append's path.

    Every call checks which incarnation of its site is on disk
    (:mod:`logstore.incarnation`, one ``stat``) and drops what this store kept
    for an earlier one (removed, perhaps re-created, by another process);
    every write holds the site's lock shared, so a removal waits for it.
    """

    def __init__(
        self,
        data_dir: str | os.PathLike[str],
        *,
        lock_timeout: float = 5.0,
        segment_bytes: int = 16 * 1024 * 1024,
        index_interval: int = 4096,
        max_open: int = 256,
        quota: SiteQuota | None = None,
        conversation_pool: bool = True,
    ) -> None:
        self.root = os.path.abspath(os.fspath(data_dir))
        self.options = Options(lock_timeout=lock_timeout, segment_bytes=segment_bytes, index_interval=index_interval)
        self._max_open = max_open
        self._lock = threading.Lock()
        self._convs: OrderedDict[tuple[str, str], Conversation] = OrderedDict()
        self._manifests: dict[str, SiteManifest] = {}
        #: Site directories by site name (``layout.site_dir``, computed once per site).
        self._site_dirs: dict[str, str] = {}
        #: Pools of pre-created conversation directories, per site (logstore.convpool).
        self._pools: dict[str, convpool.SitePool] = {}
        #: False: every new conversation is created in place (no pool, no spare directories).
        self._use_pool = conversation_pool
        self._closed = False
        #: Sites whose claims a power cut left unmoved were settled in (see _settle_claims), by incarnation.
        self._settled: dict[str, Incarnation] = {}
        self._settle_lock = threading.Lock()
        #: Which incarnation of each site the per-site objects above were built for (logstore.incarnation).
        self._guard = SiteGuard(os.path.join(self.root, layout.SITES_DIR), lock_timeout)
        self._incarnations: dict[str, Incarnation] = {}
        #: Present only when a quota is set: without one, appends do no accounting at all.
        self._usage = UsageTracker(self.root, quota) if quota is not None and quota.active else None
        try:
            self._init_dir()
        except OSError as exc:
            raise Unavailable(f"data directory {self.root} is not usable: {exc}") from exc

    def _init_dir(self) -> None:
        marker = os.path.join(self.root, layout.MARKER_FILE)
        try:
            with open(marker, "rb") as f:
                info = msgspec.json.decode(f.read())
        except FileNotFoundError:
            fileio.makedirs_durable(os.path.join(self.root, layout.SITES_DIR))
            fileio.write_file_atomic(
                marker, msgspec.json.encode({"format": FORMAT_NAME, "version": FORMAT_VERSION}) + b"\n"
            )
            return
        except msgspec.DecodeError as exc:
            raise Unavailable(f"{marker} is not a logstore marker file") from exc
        version = info.get("version") if isinstance(info, dict) else None
        if type(version) is not int or info.get("format") != FORMAT_NAME or version not in READABLE_VERSIONS:
            known = ", ".join(f"v{v}" for v in sorted(READABLE_VERSIONS))
            raise Unavailable(f"{self.root} holds an unknown format {info!r}; this engine reads {FORMAT_NAME} {known}")
        if version != FORMAT_VERSION:
            # Raised before anything of the newer format is written (the pool fills later).
            fileio.write_file_atomic(marker, msgspec.json.encode({**info, "version": FORMAT_VERSION}) + b"\n")
        fileio.makedirs_durable(os.path.join(self.root, layout.SITES_DIR))

    # ------------------------------------------------------------ plumbing

    def _check_open(self) -> None:
        if self._closed:
            raise Unavailable("the store is closed")

    def _refuse_symlinks(self, path: str, checked: str | None = None) -> str | None:
        """:func:`logstore.links.refuse_symlinks` below this store's root.

        Checked whenever a site or conversation is opened (not on every call):
        a site's directories from the root down when this store first uses the
        site, a conversation's from below its site directory (``checked``)
        when it is opened; ``fsck`` reports links anywhere below the root.
        """
        return links.refuse_symlinks(self.root, path, checked)

    def _site_is(self, site: str, incarnation: Incarnation | None) -> None:
        """Drop this store's objects of ``site`` unless they were built for ``incarnation`` (the one on disk now).

        Called at the start of every use of a site, with what the guard just
        checked: objects of a site that another process removed (and perhaps
        created again) are closed, never used. Costs a dictionary lookup when
        nothing changed.
        """
        if self._incarnations.get(site) == incarnation:
            return
        if incarnation is not None:
            self._settle_claims(site, incarnation)
        with self._lock:
            if self._incarnations.get(site) == incarnation:
                return
            stale = self._detach_locked(site)
            if incarnation is None:
                self._incarnations.pop(site, None)
            else:
                self._incarnations[site] = incarnation
        self._close_detached(site, stale)

    def _settle_claims(self, site: str, incarnation: Incarnation) -> None:
        """Move into place the site's claimed pool entries a power cut moved back, before this store uses it.

        Once per incarnation and store (:func:`logstore.poolclaims.settle_site`,
        itself once per boot and site), and before the incarnation is adopted, so
        that no thread of this store looks for a conversation first. Under the
        site's lock, shared (a read holds none otherwise).
        """
        with self._settle_lock:
            if self._settled.get(site) == incarnation:
                return
            sdir = layout.site_dir(self.root, site)
            try:
                with self._guard.writing(sdir, create=False) as now:
                    if now == incarnation:
                        poolclaims.settle_site(sdir)
            except Unavailable:
                return  # the site is being removed
            except OSError as exc:
                # A data directory this process may not write (a read-only copy): nothing can be
                # moved, and reads go on (a conversation whose claim was moved back is not seen).
                if exc.errno not in (errno.EROFS, errno.EACCES, errno.EPERM):
                    raise _io(exc, "moving a claimed conversation into place failed") from exc
            self._settled[site] = incarnation

    def _detach_locked(
        self, site: str
    ) -> tuple[list[Conversation], SiteManifest | None, convpool.SitePool | None]:
        """Take the site's conversations, manifest and pool out of the tables (store lock held)."""
        convs = [self._convs.pop(key) for key in [k for k in self._convs if k[0] == site]]
        return convs, self._manifests.pop(site, None), self._pools.pop(site, None)

    def _close_detached(
        self, site: str, stale: tuple[list[Conversation], SiteManifest | None, convpool.SitePool | None]
    ) -> None:
        convs, manifest, pool = stale
        for conv in convs:
            with conv.mutex:
                conv.close()
        if pool is not None:
            pool.close()
        if manifest is not None:
            manifest.close()
        if self._usage is not None:
            self._usage.forget(site)

    def _pool_fill(self, site: str, incarnation: Incarnation, pool: convpool.SitePool) -> None:
        """Fill ``pool`` under the site's shared lock, unless its site is no longer ``incarnation``."""
        try:
            with self._guard.writing(layout.site_dir(self.root, site), create=False) as now:
                if now != incarnation:
                    pool.closed = True
                    return
                pool.fill()
        except StoreError:
            pass  # the site is being removed: first appends create in place

    def _request_fill(self, site: str, incarnation: Incarnation, pool: convpool.SitePool) -> None:
        convpool.request_fill(pool, functools.partial(self._pool_fill, site, incarnation, pool))

    def _manifest(self, site: str) -> SiteManifest:
        with self._lock:
            known = site in self._manifests
        if not known:
            self._refuse_symlinks(layout.site_dir(self.root, site))
        with self._lock:
            m = self._manifests.get(site)
            if m is None:
                m = SiteManifest(
                    layout.site_dir(self.root, site),
                    probe=functools.partial(self._probe, site),
                    walk=functools.partial(self._walk, site),
                    lock_timeout=self.options.lock_timeout,
                )
                self._manifests[site] = m
            return m

    def _site_dir(self, site: str) -> str:
        """The site's directory (``layout.site_dir``), remembered by name for the next appends and reads."""
        path = layout.site_dir(self.root, site)
        if len(self._site_dirs) < _SITE_DIRS_KEPT:
            self._site_dirs[site] = path
        return path

    def _conversation(self, site: str, conversation_id: str) -> Conversation:
        key = (site, conversation_id)
        with self._lock:
            conv = self._convs.get(key)
            if conv is not None and not conv.closed:
                self._convs.move_to_end(key)
                return conv
            manifest = self._manifests.get(site)
        if manifest is None:
            manifest = self._manifest(site)
        path = layout.conversation_dir(self.root, site, conversation_id)
        # The site's own directories were checked by _manifest.
        missing = self._refuse_symlinks(path, layout.site_dir_of_conversation(path))
        with self._lock:
            conv = self._convs.get(key)
            if conv is None or conv.closed:
                pool = self._pools.get(site)
                incarnation = self._incarnations.get(site)
                if pool is None and self._use_pool and incarnation is not None:
                    pool = convpool.SitePool(
                        layout.site_dir(self.root, site),
                        functools.partial(self._request_fill, site, incarnation),
                        convpool.entry_bytes(first_chunk(self.options), self.options.segment_bytes),
                    )
                    self._pools[site] = pool
                conv = Conversation(path, conversation_id, self.options, manifest, pool=pool, missing=missing)
                self._convs[key] = conv
            self._convs.move_to_end(key)
            self._evict_locked(key)
            return conv

    def open_conversations(self) -> int:
        """How many conversations currently hold open descriptors (at most ``max_open``)."""
        with self._lock:
            return len(self._convs)

    def _evict_locked(self, keep: tuple[str, str]) -> None:
        """Close the least recently used conversations over ``max_open``, never ``keep`` (being handed out)."""
        excess = len(self._convs) - self._max_open
        if excess <= 0:
            return
        for key in list(itertools.islice(self._convs, excess * 2)):
            if excess <= 0:
                break
            if key == keep:
                continue
            conv = self._convs[key]
            if conv.mutex.acquire(blocking=False):
                try:
                    # Never wait here, under the store's lock, for a sync or an extension: every
                    # other conversation's lookup would wait too. A busy one stays open for now
                    # (the cache runs over max_open until a later opening evicts it).
                    if conv.busy():
                        continue
                    conv.close()
                finally:
                    conv.mutex.release()
                del self._convs[key]
                excess -= 1

    def _acquire(self, site: str, conversation_id: str, deadline: float, started: float) -> Conversation:
        """The conversation object, with its mutex held."""
        while True:
            conv = self._conversation(site, conversation_id)
            if not conv.mutex.acquire(blocking=False):
                with observe.timed("lock_wait"):
                    if not conv.mutex.acquire(timeout=max(deadline - time.monotonic(), 0.0)):
                        raise Timeout(time.monotonic() - started)
            if not conv.closed:
                return conv
            conv.mutex.release()

    def _probe(
        self,
        site: str,
        conversation_id: str,
        wait: bool = True,
        settle: Callable[[Tip | None], None] | None = None,
    ) -> Tip | None:
        """The conversation's true extent, from its segments; ``settle`` is called with it under the lock.

        With ``wait=False`` it raises Timeout at once instead of waiting for a
        writer that holds the conversation. ``settle`` logs what the listing
        makes of the extent while the lock is still held (see SiteManifest:
        no intent may be logged between a probe and the record it settles).

        The conversation's file lock is taken (shared) whatever the cached
        state says: the listing logs what a probe found as settling the
        conversation's pending intent, which is right only when no writer was
        between its intent and its data then (a writer holds the lock from
        before its intent until its batch is durable). Without the lock a probe
        could read the extent before a batch whose intent is logged, and settle
        that intent; with commits owed (SiteManifest.commit) a kill would then
        leave the acknowledged batch out of the listing.
        """
        if not os.path.isdir(layout.conversation_dir(self.root, site, conversation_id)):
            return None
        started = time.monotonic()
        deadline = started + (self.options.lock_timeout if wait else 0.0)
        conv = self._acquire(site, conversation_id, deadline, started)
        try:
            # A group of this process in flight (its leader released ``mutex`` to write and
            # sync; its exclusive file lock would be shared by the probe): the group's intent
            # is logged, its batches are not in the state yet. Settling the intent with the
            # extent before them would leave them unlisted if the process then died with
            # their commit owed, so the probe waits for the group (the leader notifies).
            while conv._inflight:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise Timeout(time.monotonic() - started)
                conv._cond.wait(left)
            conv._lock(False, deadline, started)
            try:
                tip = conv.tip(deadline)
                if settle is not None:
                    settle(tip)
                return tip
            finally:
                conv._unlock()
        finally:
            conv.mutex.release()

    def _walk(self, site: str) -> Iterator[str]:
        """Every conversation id of ``site`` with at least one segment file."""
        base = os.path.join(layout.site_dir(self.root, site), layout.CONVERSATIONS_DIR)
        for a in sorted(_listdir(base)):
            for b in sorted(_listdir(os.path.join(base, a))):
                for name in sorted(_listdir(os.path.join(base, a, b))):
                    conv = layout.decode_name(name)
                    files = _listdir(os.path.join(base, a, b, name))
                    if conv is not None and any(layout.parse_segment_name(f) is not None for f in files):
                        yield conv

    # ---------------------------------------------------------------- API

    def append(
        self,
        site: str,
        conversation_id: str,
        payloads: Sequence[Mapping[str, Any]],
        *,
        idempotency_key: str | None = None,
        expected_next_seq: int | None = None,
    ) -> SeqRange:
        self._check_open()
        # The table's keys are validated names: a key equal to these proves them well-formed
        # (as in _read), so an append to an open conversation skips the two pattern matches.
        if type(site) is not str or type(conversation_id) is not str or (site, conversation_id) not in self._convs:
            site = SiteName(site)
            conversation_id = ConversationId(conversation_id)
        if idempotency_key is not None:
            check_idempotency_key(idempotency_key)
        if expected_next_seq is not None:
            check_expected_next_seq(expected_next_seq)
        body, count = encode_batch(payloads)
        started = time.monotonic()
        deadline = started + self.options.lock_timeout
        try:
            # The site's lock, shared, for the whole append: a removal waits for it to end, and
            # every file it creates by path lands in the incarnation checked here. (What
            # ``with self._guard.writing(...)`` does, without a generator on every append.)
            site_path = self._site_dirs.get(site) or self._site_dir(site)
            held = self._guard.enter(site_path)
            refill = None
            try:
                self._site_is(site, None if held is None else held.incarnation)
                conv = self._acquire(site, conversation_id, deadline, started)
                try:
                    if self._usage is None:
                        first, last, stamp = conv.append(
                            body, count, deadline, started, idempotency_key, expected_next_seq
                        )
                    else:
                        first, last, stamp = self._append_within_quota(
                            self._usage, site, conv, body, count, deadline, started, idempotency_key, expected_next_seq
                        )
                finally:
                    refill = conv.pool_to_refill()
                    conv.mutex.release()
            finally:
                if held is not None:
                    self._guard.leave(site_path, held)
                if refill is not None:
                    refill.refill_if_due()  # every lock let go first (see Conversation.pool_to_refill)
        except StoreError:
            raise
        except OSError as exc:
            raise _io(exc, "append failed") from exc
        if stamp:  # 0: answered from its idempotency key, nothing written
            observe.emit("append_bytes", len(body))
        return SeqRange(first, last)

    @staticmethod
    def _append_within_quota(
        usage: UsageTracker,
        site: str,
        conv: Conversation,
        body: bytes,
        count: int,
        deadline: float,
        started: float,
        key: str | None = None,
        expect: int | None = None,
    ) -> tuple[int, int, int]:
        """Append after charging the site's quota (caller holds ``conv.mutex``); refunded if nothing is written.

        Whether the conversation is new is judged before the write (from the
        segments it held when last looked at, else by one ``stat`` of its
        directory) and corrected after it from the first seq.
        """
        new = not conv.holds_segments() and not os.path.isdir(conv.path)
        # What the files grew since this object's last append (extend-ahead), and may grow now.
        now = conv.allocated_bytes()
        before = conv.quota_seen if conv.quota_seen >= 0 else now
        ahead = max(0, now - before) + conv.growth_bound(len(body) + RECORD_OVERHEAD) if before >= 0 else 0
        cost = usage.charge(site, len(body), new, ahead)
        try:
            first, last, stamp = conv.append(body, count, deadline, started, key, expect)
        except BaseException:
            usage.refund(site, cost, new)
            raise
        if not stamp:
            usage.refund(site, cost, new)  # answered from its idempotency key: nothing was written
            return first, last, stamp
        conv.quota_seen = after = conv.allocated_bytes()
        if not new and before >= 0:  # the estimate's record bytes replaced by what the files grew
            usage.settle(site, max(0, after - before) + MANIFEST_BYTES_PER_APPEND - cost[0])
        if (first == 0) != new:
            usage.adjust_conversations(site, 1 if first == 0 else -1)
        return first, last, stamp

    def read(self, site: str, conversation_id: str, selector: ReadSelector) -> list[MemoryItem]:
        return self._read(site, conversation_id, selector, Conversation.read)

    def wait_for_items(self, site: str, conversation_id: str, seq: int, timeout: float) -> bool:
        # Woken by inotify for appends of any process, and by this process's writer (logstore.follow).
        site, conversation_id = SiteName(site), ConversationId(conversation_id)
        path = layout.conversation_dir(self.root, site, conversation_id)
        probe = Range(seq, 1)
        return follow.wait_until(path, self.root, lambda: bool(self.read_raw(site, conversation_id, probe)), timeout)

    def read_raw(self, site: str, conversation_id: str, selector: ReadSelector) -> list[RawMemoryItem]:
        # The payloads are the bytes of the verified records: nothing is decoded or re-encoded.
        return self._read(site, conversation_id, selector, Conversation.read_raw)

    def try_read_raw(
        self, site: str, conversation_id: str, selector: ReadSelector, max_bytes: int
    ) -> list[RawMemoryItem] | None:
        # Only a conversation already open, whose mutex is free, whose file lock is free
        # or not needed, and whose range lies in the active segment within max_bytes.
        self._check_open()
        # The tables' keys are validated names: a hit with plain strings proves them well-formed.
        # A conversation id is checked only when it is not found (so that a bad one raises as before).
        site_path = self._site_dirs.get(site) if type(site) is str is type(conversation_id) else None
        if site_path is None:
            site = SiteName(site)
            conversation_id = ConversationId(conversation_id)
            site_path = self._site_dir(site)
        start, limit = _bounds(selector)
        key = (site, conversation_id)
        incarnation = self._guard.current(site_path)
        if incarnation is None or self._incarnations.get(site) != incarnation:
            ConversationId(conversation_id)
            return None  # absent, or replaced since this store looked: the slow path finds out
        if not self._lock.acquire(blocking=False):
            ConversationId(conversation_id)
            return None
        try:
            conv = self._convs.get(key)
            if conv is None or conv.closed:
                ConversationId(conversation_id)
                return None
            self._convs.move_to_end(key)
        finally:
            self._lock.release()
        if not conv.mutex.acquire(blocking=False):
            return None
        try:
            return None if conv.closed else conv.try_read_raw(start, limit, max_bytes)
        except StoreError:
            raise
        except OSError as exc:
            raise _io(exc, "read failed") from exc
        finally:
            conv.mutex.release()

    def _read(
        self,
        site: str,
        conversation_id: str,
        selector: ReadSelector,
        method: Callable[[Conversation, int | None, int], list[_Item]],
    ) -> list[_Item]:
        self._check_open()
        try:
            # The remembered directories are keyed by validated names: a hit proves the name well-formed.
            site_path = self._site_dirs.get(site) if type(site) is str else None
            if site_path is None:
                site_path = self._site_dir(SiteName(site))
            incarnation = self._guard.current(site_path)
            self._site_is(site, incarnation)
            if incarnation is None:
                return []
            # An open conversation re-checks its directory itself (Conversation.read);
            # only an unknown one is looked up here, so it is never created by a read.
            # The table's keys are validated names: a key equal to these proves them well-formed.
            cached = self._convs.get((site, conversation_id)) if type(site) is str is type(conversation_id) else None
            if cached is None or cached.closed:
                site = SiteName(site)
                conversation_id = ConversationId(conversation_id)
                start, limit = _bounds(selector)
                if not os.path.isdir(layout.conversation_dir(self.root, site, conversation_id)):
                    return []
            else:
                start, limit = _bounds(selector)
            started = time.monotonic()
            conv = self._acquire(site, conversation_id, started + self.options.lock_timeout, started)
            try:
                return method(conv, start, limit)
            finally:
                conv.mutex.release()
        except StoreError:
            raise
        except OSError as exc:
            raise _io(exc, "read failed") from exc

    def list_conversations(self, site: str, selector: ListSelector) -> ConversationListing:
        self._check_open()
        site = SiteName(site)
        after = None
        if selector.cursor is not None:
            after = (parse_rfc3339(selector.cursor.last_appended_at), selector.cursor.conversation_id)
        try:
            # Shared, as for an append: a listing may log what its probes find.
            with self._guard.writing(layout.site_dir(self.root, site), create=False) as incarnation:
                self._site_is(site, incarnation)
                if incarnation is None:
                    return ConversationListing([], None)
                entries, more = self._manifest(site).page(after, selector.limit)
        except StoreError:
            raise
        except OSError as exc:
            raise _io(exc, "listing failed") from exc
        summaries = [
            ConversationSummary(e.conversation_id, format_us(e.created_us), format_us(e.last_us)) for e in entries
        ]
        nxt = None
        if more and summaries:
            nxt = ListCursor(summaries[-1].last_appended_at, summaries[-1].conversation_id)
        return ConversationListing(summaries, nxt)

    def sites(self) -> list[str]:
        self._check_open()
        names = (layout.decode_name(n) for n in _listdir(os.path.join(self.root, layout.SITES_DIR)))
        return sorted(n for n in names if n is not None)

    def drop_site(self, site: str) -> None:
        self._check_open()
        site = SiteName(site)
        path = layout.site_dir(self.root, site)
        try:
            # Retire the incarnation first (no new writer enters it, in any process), wait for the
            # writers inside, then move the directory away while they are kept out.
            with self._guard.removing(path):
                with self._lock:
                    stale = self._detach_locked(site)
                    self._incarnations.pop(site, None)
                self._close_detached(site, stale)
                fileio.forget_dirs(path)
                if not os.path.isdir(path):
                    return
                trash = os.path.join(self.root, layout.SITES_DIR, f".dropped-{os.getpid()}-{time.time_ns()}")
                fileio.rename(path, trash)
                fileio.fsync_dir(os.path.dirname(path))
            fileio.remove_tree(trash)
        except OSError as exc:
            raise _io(exc, f"dropping site {site} failed") from exc

    def close(self) -> None:
        with self._lock:
            self._closed = True
            convs = list(self._convs.values())
            self._convs.clear()
            manifests = list(self._manifests.values())
            self._manifests.clear()
            pools = list(self._pools.values())
            self._pools.clear()
        for pool in pools:
            pool.close()
        for conv in convs:
            with conv.mutex:
                conv.close()
        # Closing hands each conversation's unused zeros back in the background (logstore.zerofill.trim):
        # done before close returns, so that nothing of this store touches its files afterwards.
        wait_for_extensions()
        for m in manifests:
            m.close()
        if self._usage is not None:
            self._usage.close()
        self._guard.close()  # the site.id descriptors, last: closing the objects above needs no site lock

    # ------------------------------------------------------- maintenance

    def rebuild_manifest(self, site: str) -> None:
        """Re-derive a site's listing from its conversations (what fsck --repair uses)."""
        self._check_open()
        site = SiteName(site)
        with self._guard.writing(layout.site_dir(self.root, site), create=False) as incarnation:
            self._site_is(site, incarnation)
            if incarnation is not None:
                self._manifest(site).rebuild()


def open_store(data_dir: str | os.PathLike[str], **options: Any) -> FileStore:
    """Open (creating if needed) the file store at ``data_dir``."""
    return FileStore(data_dir, **options)


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except FileNotFoundError:
        return []
    except NotADirectoryError:
        return []
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            return []
        raise
