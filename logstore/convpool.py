"""A site's pool of conversation directories made ahead of need.

A new conversation's first append would otherwise make a directory, a lock
file and a segment file, and wait for the file and each new directory to be
written out. The pool moves that work off the append: a few *entries* per
site are kept in ``<site>/pool/`` (FORMAT.md 1 and 6), refilled by a
background job (:mod:`logstore.background`) as soon as a claim leaves half
of them or fewer; each is a directory holding the lock file and a first
segment file of zeros, all synced. A first append *claims* one by renaming
it into place as the conversation's directory (``renameat2`` with
``RENAME_NOREPLACE``: atomic, exactly one of several racing processes wins,
and an existing directory, even an empty one another process has just made,
is never replaced), then writes the segment header, the conversation's
identity (an identity record, :mod:`logstore.poolclaims`) and the batch's
records into the zeros in one write, and syncs that file alone: one
``fdatasync``, as for any append, and the batch is acknowledged. The rename
(and the fan-out directories it needed) is made durable afterwards, by the
next fill; until then a power cut can undo it, and the next process to use
the site moves the entry into place again (:func:`logstore.poolclaims.settle_site`).

Invariants:

* A ready entry (``e-<16 hex>``) holds an empty lock file (in entries built
  by older engines, :data:`logstore.poolclaims.LOCK_BYTES` zeros) and a segment
  ``00000000000000000000.seg`` of exactly ``entry_bytes`` zeros, both
  synced (``entry_bytes``: :func:`entry_bytes`, 12 KiB by default, less for
  stores with tiny segments), and its name is never reused. Whoever holds the flock of its lock
  file may claim or discard it; the claimer keeps that flock as the
  conversation's writer lock until its first batch is durable, so no other
  process can see the new conversation as writable before then. A builder
  keeps the flock of the entries it built (and their descriptors open) for
  its own claims while it runs: other processes skip them, and take them
  once it has exited (or closed its store).
* An entry being built (``t-<16 hex>``) is flocked by its builder; one whose
  flock can be taken has no builder left and is removed.
* An entry in the pool whose segment (or, claimed by an older engine, lock
  file) holds an identity was claimed by a first append whose rename a power
  cut undid: it may hold acknowledged data, and is never used or removed here
  (:mod:`logstore.poolclaims` moves it into place). Any other entry whose
  segment or lock file is not as a fill leaves it holds nothing acknowledged
  (a claim acknowledges only once its identity is synced), so it is removed.
* A claimed conversation whose data did not reach the disk holds a segment
  whose first sector is zeros: a torn creation, which reads as empty
  (:func:`logstore.recovery.is_torn_creation`) and is written again by the
  next append.

* Spares: ``c/.spare`` and ``c/<aa>/.spare`` are empty directories, made and
  synced by a fill, renamed (no replace) into place as the next new
  ``<aa>`` or ``<bb>`` in that directory. A directory made by ``mkdir`` on the
  append's path would be new to the filesystem, and on ext4 without a
  journal syncing below it writes each new parent in turn; a spare is not,
  and its parent's sync covers both its old and its new name (one
  directory). A spare that is not empty is never used (a power cut undid its
  rename after entries below the new name reached the disk; none of them was
  acknowledged, since that needs the parent synced) and is removed.

Nothing that lists a site looks in ``pool/`` (the listing walks ``c/``, where
a spare is an empty directory); fsck accepts the names; stats do not count
the pool; a dropped site takes it with it. Cost on disk: :data:`TARGET`
entries (two inodes and ``entry_bytes`` each) and up to 257 empty spare
directories per site that had a first append.
"""

from __future__ import annotations

import errno
import os
import secrets
import threading
import time
import weakref
from collections.abc import Callable

from . import background, fileio, layout, poolclaims
from .frame import SEGMENT_HEADER_SIZE

#: Bytes of an entry's segment file by default (:func:`entry_bytes`): three blocks, room for a
#: first batch of ten items of 1 KiB with the segment's header and the identity, written into
#: synced zeros so that its one sync commits no new size. A bigger batch extends the file in
#: the same write, and its sync then commits the new size too, as a creation in place does
#: (``python -m bench.probes.newconv_probe``, 10 items of 1 KiB: with one-block entries the
#: claim's write and sync took about 0.05 ms more than an ordinary append's at p50, about the
#: same with these). Zeros past the data end are given back at close, as for any segment.
ENTRY_BYTES = 12 * 1024


def entry_bytes(first_chunk: int, segment_bytes: int) -> int:
    """Bytes of a pool entry's segment for a store whose new segments start at ``first_chunk`` bytes.

    :data:`ENTRY_BYTES`, a quarter of ``segment_bytes`` when that is smaller,
    and never less than ``first_chunk``: a claimed segment starts with at
    least the space of one created in place.
    """
    return max(first_chunk, min(ENTRY_BYTES, segment_bytes // 4))
#: Ready entries a site's pool is filled to (refilled, in one batch, once half are used).
TARGET = 4
#: An unfinished entry with no lock file is removed only when older than this (seconds):
#: its builder may be between making the directory and the lock file.
STALE_UNLOCKED_S = 60.0

#: Conversation directory -> directories whose sync must be part of its first segment's
#: durability (the claim's parents and pool directory): set when a claim renames an entry
#: into place, cleared when the first segment is durable. Kept per process, beyond any
#: one Conversation object, so that a retry after a failed first append syncs them too.
_unsettled: dict[str, list[str]] = {}
_unsettled_lock = threading.Lock()


def unsettled(conversation_path: str) -> tuple[str, ...]:
    """Directories a claim of ``conversation_path`` left to be synced with its first segment."""
    with _unsettled_lock:
        return tuple(_unsettled.get(conversation_path, ()))


def settled(conversation_path: str) -> None:
    """The conversation's first segment is durable, with every directory of its claim."""
    with _unsettled_lock:
        _unsettled.pop(conversation_path, None)


class Claim:
    """An entry renamed into place as a conversation: its locked lock file, its segment and syncs under way."""

    __slots__ = ("dirs", "linked", "lock_fd", "seg_fd", "size")

    def __init__(self, lock_fd: int, seg_fd: int, size: int, dirs: list[str], linked: list[str]) -> None:
        self.lock_fd = lock_fd
        self.seg_fd = seg_fd
        self.size = size
        #: Directories the rename changed: the new entry's parent (and any directory above it not
        #: yet known durable), and the pool directory; synced after the first batch is acknowledged
        #: (:meth:`SitePool.settle_later`), or with its first segment by a retry created in place.
        self.dirs = dirs
        #: Those of them to remember as durably linked once synced (fileio.mark_durable).
        self.linked = linked

    def release(self) -> None:
        """Close the segment's descriptor (the first append did not use it; the lock is the conversation's)."""
        try:
            os.close(self.seg_fd)
        except OSError:
            pass


class SitePool:
    """The pool of one site directory, in this process."""

    def __init__(
        self,
        site_path: str,
        request_fill: Callable[[SitePool], None],
        entry_bytes: int = ENTRY_BYTES,
    ) -> None:
        if entry_bytes <= SEGMENT_HEADER_SIZE:
            raise ValueError(f"a pool entry's segment must be larger than a segment header ({entry_bytes} bytes)")
        #: Bytes of each entry's segment file: the first chunk of a new segment.
        self.entry_bytes = entry_bytes
        self._zeros = bytes(entry_bytes)
        self.site_path = site_path
        self.dir = layout.pool_dir(site_path)
        self._sites_dir = os.path.dirname(site_path)
        self._request_fill = request_fill
        self._fill_lock = threading.Lock()
        self.closed = False
        self._reclaimed = False
        #: Ready entries as last listed here (others may have claimed some since), not ours.
        self._names: list[str] = []
        #: Ready entries this pool built, kept open and flocked (lock, segment descriptors): only
        #: this process claims them while it runs; closed by close() (or in a forked child). At
        #: most MAX_HELD over all the pools of the process.
        self._held: dict[str, tuple[int, int]] = {}
        #: Directories (``c/`` and ``c/<aa>/``) whose spare was used, or that may lack one.
        self._spares_wanted: set[str] = set()
        #: Spare paths (``.../.spare``) this pool found clean or made: any spare there now is clean,
        #: and a claim renames it without listing it (see :meth:`_place`).
        self._clean_spares: set[str] = set()
        self._conversations_dir = os.path.join(site_path, layout.CONVERSATIONS_DIR)
        self._names_lock = threading.Lock()
        #: A fill is handed to a background job and has not started (request_fill).
        self._fill_queued = False
        #: A claim left half the pool or less (or nothing is known of it yet): refill_if_due fills.
        self._fill_due = True
        _pools.add(self)
        #: Claims' directories to sync (and then record as durably linked) by the next fill: see
        #: :meth:`settle_later`.
        self._unsynced: list[tuple[list[str], list[str]]] = []
        #: Whether this filesystem (or C library) cannot rename without replacing: unknown until a
        #: claim or fill needs it, since finding ``renameat2`` loads ctypes, which a process that
        #: only reads should not pay for on its cold start.
        self._disabled: bool | None = None

    @property
    def disabled(self) -> bool:
        """The pool is unusable here: claims return None and nothing is filled."""
        if self._disabled is None:
            self._disabled = not fileio.can_rename_noreplace()
        return self._disabled

    @disabled.setter
    def disabled(self, value: bool) -> None:
        self._disabled = value

    # ------------------------------------------------------------ claiming

    def claim(self, conversation_path: str, missing: str | None = None) -> Claim | None:
        """Rename a ready entry into place as ``conversation_path`` (which did not exist); None to create in place.

        ``missing``: a directory at or above ``conversation_path`` found missing
        lately (see :meth:`_fanout`).

        None when the pool is empty or unusable, or when the directory exists
        by now (another process made it): the caller then goes the ordinary
        way. Either way a refill may be due: the caller asks for it with
        :meth:`refill_if_due` once its append is acknowledged (a fill started
        now would compete with the append for the disk and the interpreter).
        """
        if self.closed or self.disabled:
            return None
        with self._names_lock:
            held = self._held.popitem() if self._held else None
        if held is not None:
            name, (lock_fd, seg_fd) = held
            keep = False
            got: Claim | bool | None = None
            try:
                got = self._place_entry(os.path.join(self.dir, name), lock_fd, seg_fd, conversation_path, missing)
                if got is False:
                    with self._names_lock:
                        self._held[name] = (lock_fd, seg_fd)  # still ours, still clean
                keep = got is not None
            finally:
                if got is not False:
                    _release_held(1)
                if not keep:
                    os.close(seg_fd)
                    os.close(lock_fd)
                self._note_left()
            if got is not None:
                return got if isinstance(got, Claim) else None
        with self._names_lock:
            if not self._names:
                self._names = [n for n in self._list_ready() if n not in self._held]
            names, self._names = self._names, []
        try:
            while names:
                # Several processes share the pool: each starts at a different entry.
                name = names.pop(os.getpid() % len(names))
                got = self._take(os.path.join(self.dir, name), conversation_path, missing)
                if got is not None:
                    return got if isinstance(got, Claim) else None
            return None
        finally:
            with self._names_lock:
                self._names = names + self._names
            self._note_left()

    def _note_left(self) -> None:
        with self._names_lock:
            if len(self._names) + len(self._held) <= TARGET // 2:
                self._fill_due = True

    def settle_later(self, claim: Claim) -> None:
        """Have the directories ``claim``'s rename changed synced by the next fill (its first batch is durable).

        Not needed for durability (a power cut that undoes the rename leaves the
        entry, identity and data, for :func:`logstore.poolclaims.settle_site`),
        only so that a cut seldom leaves anything to move.
        """
        with self._names_lock:
            self._unsynced.append((claim.dirs, claim.linked))
            self._fill_due = True

    def _sync_claimed(self) -> None:
        with self._names_lock:
            todo, self._unsynced = self._unsynced, []
        if not todo:
            return
        fileio.crashpoint("pool-claim-settling")  # acknowledged, the rename into place not durable
        dirs = sorted({d for ds, _ in todo for d in ds})
        try:
            fileio.sync_all([], dirs)
        except OSError:
            return  # (fileio syncs a failed directory again before its next use)
        for _, linked in todo:
            fileio.mark_durable(linked)

    def refill_if_due(self) -> None:
        """Have the pool filled (in the background unless :data:`inline_fill`) if a claim used it up to half.

        Also when a spare fan-out directory was used or found missing, and on
        a site's first conversation (nothing is known of its pool yet). Called
        by the appending thread once it holds no lock of the append (see
        :meth:`logstore.convstate.ConversationState.pool_to_refill`), so that
        the fill does not compete with the rest of the append for the interpreter.
        """
        with self._names_lock:
            due = self._fill_due or bool(self._spares_wanted)
            self._fill_due = False
        if due and not (self.closed or self.disabled):
            self._request_fill(self)

    def _list_ready(self) -> list[str]:
        try:
            return [n for n in os.listdir(self.dir) if n.startswith(layout.POOL_READY_PREFIX)]
        except (FileNotFoundError, NotADirectoryError):
            return []

    def _take(self, entry: str, conversation_path: str, missing: str | None = None) -> Claim | bool | None:
        """Claim ``entry``: the claim, False when the conversation exists, None to try another entry."""
        try:
            lock_fd = os.open(os.path.join(entry, layout.LOCK_FILE), os.O_RDWR)
        except OSError:
            return None
        keep = False
        seg_fd = -1
        try:
            if not fileio.try_lock(lock_fd, True):
                return None  # another process is claiming it, or keeps it for itself (it built it)
            try:
                seg_fd = os.open(os.path.join(entry, layout.segment_name(0)), os.O_RDWR)
                size = os.fstat(seg_fd).st_size
                clean = size == self.entry_bytes and os.pread(seg_fd, size, 0) == self._zeros
            except FileNotFoundError:
                return None  # claimed and gone already
            if not (clean and _lock_clean(lock_fd)):
                if poolclaims.holds_identity(lock_fd, seg_fd):
                    return None  # a claim a power cut moved back: poolclaims moves it into place
                self._discard(entry)
                return None
            got = self._place_entry(entry, lock_fd, seg_fd, conversation_path, missing)
            missing = None  # (another entry is tried after a failure: look again)
            keep = isinstance(got, Claim)
            return got
        finally:
            if not keep:
                if seg_fd >= 0:
                    os.close(seg_fd)
                os.close(lock_fd)

    def _place_entry(
        self, entry: str, lock_fd: int, seg_fd: int, conversation_path: str, missing: str | None = None
    ) -> Claim | bool | None:
        """Rename ``entry`` (locked by us, checked clean) into place; as :meth:`_take` returns."""
        parent = os.path.dirname(conversation_path)
        try:
            self._fanout(parent, missing)
            fileio.rename_noreplace(entry, conversation_path)
        except FileExistsError:
            return False
        except FileNotFoundError:
            return None
        except OSError as exc:
            if exc.errno in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP, errno.EPERM):
                self.disabled = True  # this filesystem cannot rename without replacing
                return False
            raise
        fileio.crashpoint("pool-claimed")
        chain, linked = fileio.dir_chain(parent, self._sites_dir)
        dirs = [*chain, self.dir]
        with _unsettled_lock:
            _unsettled[conversation_path] = dirs
        return Claim(lock_fd, seg_fd, self.entry_bytes, dirs, linked)

    def _fanout(self, leaf: str, missing: str | None = None) -> None:
        """Make the fan-out directory ``leaf`` (``c/<aa>/<bb>``) and ``c/<aa>`` when missing, from spares if any.

        A spare is an empty directory made and synced ahead of need in the same
        parent, renamed into place (no replace): syncing it after costs one
        write of each directory, where a directory made now would have the
        filesystem write each new parent in turn (ext4 without a journal).
        Without a spare (or when another process takes it first) it is made.

        ``missing`` (a directory at or above ``leaf``'s conversation found
        missing lately): a hint that saves looking at ``leaf`` and ``c/<aa>``
        again. Taken as it is: one made since is found by the rename of the
        spare (no replace) or by ``mkdir``, and left as it is.
        """
        middle = os.path.dirname(leaf)
        if missing is None or not (missing == leaf or leaf.startswith(missing + os.sep)):
            if missing is not None and os.path.dirname(missing) == leaf:
                return  # only the conversation's own directory was missing
            if os.path.isdir(leaf):
                return
            if not os.path.isdir(middle):
                self._place(middle)
        elif missing != leaf:
            self._place(middle)  # missing: c/<aa> (or above it)
        self._place(leaf)

    def _place(self, path: str) -> None:
        parent = os.path.dirname(path)
        spare = os.path.join(parent, layout.SPARE_DIR)
        try:
            # Never one that holds anything else (a power cut can leave a rename undone after
            # entries were made below its new name; none of them was acknowledged). Invariant:
            # a spare is made empty (by a fill, in some process) and is only ever changed by
            # being renamed away, so only a power cut leaves one that is not clean, and every
            # process now running started after it: once this process has seen the spare of a
            # directory clean (or made it), any spare there is clean while it runs.
            # (_clean_spares; a spare another process took meanwhile: FileNotFoundError below.)
            nested = parent == self._conversations_dir
            if spare in self._clean_spares or self._clean_spare(spare, nested):
                self._clean_spares.add(spare)
                fileio.rename_noreplace(spare, path)
                if nested:
                    self._clean_spares.add(os.path.join(path, layout.SPARE_DIR))  # the spare it held, if any
                fileio.not_durable(path)
                self._want_spare(parent)
                return
        except FileExistsError:
            return  # made meanwhile by another writer
        except FileNotFoundError:
            pass  # no spare (or another writer took it)
        fileio.make_dirs(path)
        self._want_spare(parent)

    @staticmethod
    def _clean_spare(spare: str, nested: bool) -> bool:
        """Whether ``spare`` is empty, or (``nested``: the spare of ``c/``) holds only an empty spare of its own.

        The spare of ``c/`` becomes a new ``<aa>``, and the spare inside it that
        ``<aa>``'s spare, so a new ``<aa>`` and its first ``<bb>`` both come from
        spares. Raises FileNotFoundError when there is no spare.
        """
        names = os.listdir(spare)
        if not names:
            return True
        return nested and names == [layout.SPARE_DIR] and not os.listdir(os.path.join(spare, layout.SPARE_DIR))

    def _want_spare(self, parent: str) -> None:
        with self._names_lock:
            self._spares_wanted.add(parent)

    @staticmethod
    def _discard(entry: str) -> None:
        """Remove an entry we hold the lock of (a claim that never became durable left data in it)."""
        try:
            fileio.remove_tree(entry)
        except OSError:
            pass

    # ------------------------------------------------------------- filling

    def close(self) -> None:
        """Stop filling (waits for a fill under way, so the site can be removed after); let go of our entries."""
        self.closed = True
        with self._fill_lock:
            self._let_go()

    def _let_go(self) -> None:
        """Close the entries this pool keeps open and locked (they stay ready, for any writer)."""
        with self._names_lock:
            held, self._held = list(self._held.values()), {}
        _release_held(len(held))
        for lock_fd, seg_fd in held:
            for fd in (seg_fd, lock_fd):
                try:
                    os.close(fd)
                except OSError:
                    pass

    def fill(self) -> None:
        """Build ready entries up to :data:`TARGET` (removing what dead builders left, once per process)."""
        with self._names_lock:
            self._fill_queued = False
        with self._fill_lock:
            if self.closed or self.disabled:
                return
            try:
                self._fill_locked()
            except OSError:
                pass  # the site is being dropped, the disk is full...: first appends create in place

    def _fill_locked(self) -> None:
        self._sync_claimed()
        if not os.path.isdir(self.dir):
            try:
                fileio.mkdir(self.dir)  # never the site itself: a dropped site stays dropped
            except FileExistsError:
                pass
            fileio.fsync_dir(self.site_path)
        names = os.listdir(self.dir)
        if not self._reclaimed:
            self._reclaimed = True
            for name in names:
                if name.startswith(layout.POOL_BUILDING_PREFIX):
                    self._reclaim(os.path.join(self.dir, name))
                elif name.startswith(layout.POOL_READY_PREFIX):
                    self._check_ready(os.path.join(self.dir, name))
            names = os.listdir(self.dir)
            # Every fan-out directory made before this process: give each a spare.
            with self._names_lock:
                self._spares_wanted.add(self._conversations_dir)
                self._spares_wanted.update(_subdirs(self._conversations_dir))
        ready = [n for n in names if n.startswith(layout.POOL_READY_PREFIX)]
        built: list[str] = []
        if len(ready) < TARGET and not self.closed:
            built = self._build(TARGET - len(ready))
            fileio.fsync_dir(self.dir)
        with self._names_lock:
            self._names = [n for n in ready + built if n not in self._held]
            wanted, self._spares_wanted = self._spares_wanted, set()
        self._make_spares(sorted(wanted))

    def _make_spares(self, parents: list[str]) -> None:
        """Make the missing spare of each directory of ``parents``, each synced (so none is new to the filesystem).

        The spare of ``c/`` gets a spare inside it (see :meth:`_clean_spare`).
        Their entries need not be durable: a spare lost to a power cut is only
        not there, and a first append then makes the directory itself.
        """
        made: list[str] = []
        for parent in parents:
            if self.closed:
                break
            nested = parent == self._conversations_dir
            spare = os.path.join(parent, layout.SPARE_DIR)
            try:
                if not self._clean_spare(spare, nested):  # (listed even when known clean: is it there?)
                    if poolclaims.holds_claim(spare):
                        continue  # a claim poolclaims could not move (fsck reports it): never removed
                    fileio.remove_tree(spare)  # holds what a power cut left below an undone rename
                    raise FileNotFoundError(spare)
            except FileNotFoundError:
                try:
                    fileio.mkdir(spare)
                except OSError:
                    continue  # the directory itself is gone (its site was dropped), or made meanwhile
                made.append(spare)
            except OSError:
                continue
            self._clean_spares.add(spare)  # (see _place)
            if nested:
                try:
                    fileio.mkdir(os.path.join(spare, layout.SPARE_DIR))
                except OSError:
                    continue  # there already (or the spare was just taken)
                made.append(os.path.join(spare, layout.SPARE_DIR))
                if spare not in made:
                    made.append(spare)  # its new entry
        if made:
            fileio.sync_all([], made)

    def _build(self, count: int) -> list[str]:
        """Make ``count`` entries, built under ``t-`` names, synced together, then renamed ready.

        The caller syncs the pool directory after. Each entry is flocked by
        this builder until it is named ready (so no claimer or reclaimer
        touches it unfinished), and after that too: the entries are kept open
        and locked for this process's claims (:attr:`_held`). Returns the
        names of entries built and not kept (the pool was closed meanwhile).
        """
        tokens: list[str] = []
        lock_fds: list[int] = []
        seg_fds: list[int] = []
        try:
            for _ in range(count):
                token = secrets.token_hex(8)
                tmp = os.path.join(self.dir, layout.POOL_BUILDING_PREFIX + token)
                fileio.mkdir(tmp)
                tokens.append(token)
                lock_fds.append(fileio.open_create(os.path.join(tmp, layout.LOCK_FILE)))
                fileio.try_lock(lock_fds[-1], True)
                seg_fds.append(fileio.open_create(os.path.join(tmp, layout.segment_name(0)), os.O_RDWR | os.O_TRUNC))
                fileio.pwrite_all(seg_fds[-1], self._zeros, 0)
            # Every entry's files and directory at once: one round of device flushes for the batch.
            built = [os.path.join(self.dir, layout.POOL_BUILDING_PREFIX + t) for t in tokens]
            fileio.sync_all(seg_fds + lock_fds, built)
            fileio.crashpoint("pool-entry-built")
            for t in tokens:
                fileio.rename(
                    os.path.join(self.dir, layout.POOL_BUILDING_PREFIX + t),
                    os.path.join(self.dir, layout.POOL_READY_PREFIX + t),
                )
            kept = 0 if self.closed else _reserve_held(len(tokens))
            # Kept open and locked (within the process's budget): this process's next claims need
            # no open, lock or check.
            with self._names_lock:
                for t, lock_fd, seg_fd in zip(tokens[:kept], lock_fds, seg_fds, strict=False):
                    self._held[layout.POOL_READY_PREFIX + t] = (lock_fd, seg_fd)
            lock_fds, seg_fds = lock_fds[kept:], seg_fds[kept:]
            tokens = tokens[kept:]
        finally:
            for fd in seg_fds + lock_fds:
                os.close(fd)
        return [layout.POOL_READY_PREFIX + t for t in tokens]

    def _check_ready(self, entry: str) -> None:
        """Remove a ready entry that holds data (a claim whose rename a power cut undid), unless a claimer holds it.

        A claim checks the same before it renames an entry; done here, once per
        process, such an entry never costs a first append the detour.
        """
        try:
            fd = os.open(os.path.join(entry, layout.LOCK_FILE), os.O_RDWR)
        except OSError:
            return
        try:
            if not fileio.try_lock(fd, True):
                return  # being claimed
            seg = os.open(os.path.join(entry, layout.segment_name(0)), os.O_RDONLY)
            try:
                ready = os.fstat(seg).st_size == self.entry_bytes and os.pread(seg, self.entry_bytes, 0) == self._zeros
                holds_data = not (ready and _lock_clean(fd)) and not poolclaims.holds_identity(fd, seg)
            finally:
                os.close(seg)
            if holds_data:
                self._discard(entry)
        except OSError:
            pass
        finally:
            os.close(fd)

    @staticmethod
    def _reclaim(entry: str) -> None:
        """Remove an unfinished entry whose builder is gone."""
        try:
            fd = os.open(os.path.join(entry, layout.LOCK_FILE), os.O_RDWR)
        except FileNotFoundError:
            try:
                if time.time() - os.stat(entry).st_mtime > STALE_UNLOCKED_S:
                    fileio.remove_tree(entry)
            except OSError:
                pass
            return
        try:
            if fileio.try_lock(fd, True):
                fileio.remove_tree(entry)
        except OSError:
            pass
        finally:
            os.close(fd)


_LOCK_ZEROS = bytes(poolclaims.LOCK_BYTES)


def _lock_clean(fd: int) -> bool:
    """Whether an entry's lock file is as a fill leaves it: empty, or (built by older engines) a sector of zeros."""
    return os.pread(fd, poolclaims.LOCK_BYTES + 1, 0) in (b"", _LOCK_ZEROS)


#: Fill on the calling thread instead of a background job (tests that record every file
#: operation in order, e.g. the power-cut simulation, set it).
inline_fill = False


def request_fill(pool: SitePool, fill: Callable[[], None] | None = None) -> None:
    """Have ``pool`` filled by a background job (:mod:`logstore.background`), or now with :data:`inline_fill`.

    At most one fill of a pool is queued at a time; a request while one is
    queued is part of it. ``fill`` runs the fill (``pool.fill`` by default):
    the store passes one that holds the site's lock and checks the site is
    still the incarnation the pool belongs to (:mod:`logstore.incarnation`).
    """
    fill = pool.fill if fill is None else fill
    if inline_fill:
        fill()
        return
    with pool._names_lock:
        if pool._fill_queued:
            return
        pool._fill_queued = True
    try:
        background.run(fill, "pool-refill")
    except RuntimeError:
        with pool._names_lock:
            pool._fill_queued = False  # the interpreter is shutting down: first appends create in place


#: At most this many entries are kept open and locked by one process, over all its sites (two
#: descriptors each); entries built beyond it are closed, ready for any writer's claim.
MAX_HELD = 32
_held_count = [0]
_held_lock = threading.Lock()


def _reserve_held(wanted: int) -> int:
    """How many of ``wanted`` more entries this process may keep open (reserved for the caller)."""
    with _held_lock:
        n = max(0, min(wanted, MAX_HELD - _held_count[0]))
        _held_count[0] += n
        return n


def _release_held(n: int) -> None:
    with _held_lock:
        _held_count[0] -= n


#: Every SitePool of this process (so that a forked child can let go of their entries).
_pools: weakref.WeakSet[SitePool] = weakref.WeakSet()


def _after_fork() -> None:
    global _unsettled_lock, _held_lock
    _unsettled_lock = threading.Lock()  # another thread may have held it at the fork
    _held_lock = threading.Lock()
    for pool in list(_pools):
        # The parent keeps them: the child only closes its copies of the descriptors.
        pool._names_lock = threading.Lock()
        pool._fill_lock = threading.Lock()
        pool._let_go()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


def _subdirs(path: str) -> list[str]:
    """The fan-out directories in ``path`` (two hex digits), as paths; none when it is missing."""
    try:
        with os.scandir(path) as it:
            return [e.path for e in it if len(e.name) == 2 and e.is_dir(follow_symlinks=False)]
    except (FileNotFoundError, NotADirectoryError):
        return []
