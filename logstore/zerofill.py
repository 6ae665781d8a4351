"""How much zero-filled space an active segment keeps ahead of its records, and giving it back.

An append's ``fdatasync`` flushes data only when its records land in space
the file already has, written (zeros) and synced before: no block to
allocate, no size to change (FORMAT.md, "Preallocated space"), as
PostgreSQL zero-fills a WAL segment before use. This module decides how
much of that space each conversation keeps:

* **Sized to its write rate.** A :class:`Pace` measures the bytes appended
  since the conversation's last extension over the time since; the next
  extension adds about :data:`AHEAD_SECONDS` of that, rounded up to whole
  blocks: at least one block, at most :data:`CHUNK_MAX`, and at most twice
  the last chunk (it grows while the conversation stays busy, and falls
  back at once when it slows).
* **Bounded per site.** A :class:`SiteBudget` caps the chunks held at once
  by the open conversations of one site in this process
  (:data:`SITE_MAX`); past it, the idle ones are asked to give theirs back,
  and failing that a conversation gets one block at a time.
* **Given back when idle.** When a conversation is closed (evicted from the
  store's cache, or the store closed), :func:`trim` cuts its active segment
  back to the data end rounded up to a block, in the background.

Who writes a chunk (:mod:`logstore.preallocation`): one of at least
:data:`AHEAD_MIN_CHUNK` is written ahead of need by a background job, in
steps written out without a device flush, then one ``fdatasync`` for the
whole chunk: the job's flush per chunk is one per ``chunk / group``
appends (about one in a hundred for 10 KiB groups and 1 MiB chunks). A
smaller chunk (a slow conversation) is written by the append that needs
it, after its records in its own write and sync: no flush of its own, only
the size change in that sync.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

from . import fileio, layout, segment

#: The unit of allocation: chunks and trimmed sizes are whole blocks.
BLOCK = 4096
#: A chunk covers about this many seconds of the conversation's recent writes ...
AHEAD_SECONDS = 0.5
#: ... and is at most this big.
CHUNK_MAX = 1 << 20
#: Chunks this big or bigger are written by a background job; smaller ones by the append that needs them.
AHEAD_MIN_CHUNK = 64 * 1024
#: The most the open conversations of one site hold in chunks at once, per process ...
SITE_MAX = 64 << 20
#: ... past which those that extended last this many seconds ago or more give theirs back.
IDLE_SECONDS = 1.0


def blocks(n: int, block: int = BLOCK) -> int:
    """``n`` rounded up to whole blocks."""
    return -(-n // block) * block


class SiteBudget:
    """The chunks held by the open conversations of one site in this process, at most ``limit`` in all.

    Each conversation holds the chunk of its last extension until it is
    closed. When one needs more than is left, the conversations whose last
    extension is :data:`IDLE_SECONDS` old or more are asked, oldest first, to
    give their zeros back now (``reclaim``: cut in the background, as at
    close); one that is busy declines.
    """

    def __init__(self, limit: int = SITE_MAX) -> None:
        self.limit = limit
        self._held: dict[str, tuple[int, float, Callable[[], bool] | None]] = {}
        self._total = 0
        self._lock = threading.Lock()

    def grant(self, key: str, want: int, least: int, now: float = 0.0,
              reclaim: Callable[[], bool] | None = None, block: int = BLOCK) -> int:
        """Hold ``want`` bytes for conversation ``key`` in place of what it held (what is left, at least ``least``).

        What is left is taken in whole ``block`` s (``want`` and ``least`` are).

        ``reclaim``: how the site's budget asks this conversation, later, to
        give its zeros back (it calls :meth:`release`; True when it did).
        Called with no lock of the budget held.
        """
        with self._lock:
            room = self.limit - (self._total - self._held.get(key, (0, 0.0, None))[0])
            idle = [] if room >= want else sorted(
                (at, other) for other, (_n, at, r) in self._held.items()
                if other != key and r is not None and at <= now - IDLE_SECONDS)
        for _at, other in idle:
            with self._lock:
                entry = self._held.get(other)
                if entry is None or self.limit - (self._total - self._held.get(key, (0, 0.0, None))[0]) >= want:
                    continue
            if entry[2] is not None:
                entry[2]()
        with self._lock:
            mine = self._held.get(key, (0, 0.0, None))[0]
            room = self.limit - (self._total - mine)
            got = max(least, min(want, room // block * block))
            self._held[key] = (got, now, reclaim)
            self._total += got - mine
            return got

    def release(self, key: str) -> None:
        with self._lock:
            entry = self._held.pop(key, None)
            if entry is not None:
                self._total -= entry[0]

    def held(self) -> int:
        with self._lock:
            return self._total


_budgets: dict[str, SiteBudget] = {}
_budgets_lock = threading.Lock()


def site_budget(conversation_path: str) -> SiteBudget:
    """The budget of the site holding the conversation directory ``conversation_path``."""
    site = layout.site_dir_of_conversation(conversation_path)
    with _budgets_lock:
        b = _budgets.get(site)
        if b is None:
            b = _budgets[site] = SiteBudget()
        return b


class Pace:
    """One conversation's write rate, measured from one extension to the next, and the chunk it calls for.

    ``chunk`` is the current chunk (what the next extension adds, and what
    "free space runs low" is judged against); it changes only in
    :meth:`measure`, called once per extension.
    """

    __slots__ = ("budget", "chunk", "key", "mark_at", "mark_end", "reclaim")

    def __init__(self, key: str, first: int, end: int, now: float, budget: SiteBudget,
                 reclaim: Callable[[], bool] | None = None) -> None:
        self.key = key
        self.chunk = first
        self.mark_at = now
        self.mark_end = end
        self.budget = budget
        self.reclaim = reclaim

    def measure(self, end: int, now: float, first: int) -> int:
        """At an extension, with the records ending at ``end``: the chunk it adds (held in the site's budget)."""
        span = now - self.mark_at
        written = max(end - self.mark_end, 0)  # negative: a new segment, or the tail reloaded
        # (A span under a microsecond counts as a microsecond: back-to-back writes, as fast as can be.)
        rate_wants = int(written * AHEAD_SECONDS / max(span, 1e-6))
        block = min(BLOCK, first)
        want = min(CHUNK_MAX, 2 * self.chunk, blocks(max(rate_wants, first), block))
        self.chunk = self.budget.grant(self.key, want, first, now, self.reclaim, block)
        self.mark_at = now
        self.mark_end = end
        return self.chunk

    def release(self) -> None:
        """The conversation is closed: its chunk goes back to the site's budget."""
        self.budget.release(self.key)


def trim(seg_path: str, lock_path: str, size: int, end: int, keep: int) -> None:
    """Cut the zeros after ``end`` of an idle active segment back to ``keep`` bytes, durably (a background job).

    ``size`` and ``end``: the file size and the data end its writer knew at
    close; ``keep``: ``end`` rounded up to whole blocks. Nothing is cut
    unless the conversation's lock is free (taken, not waited for), the file
    still has that size and every byte after ``end`` is still zero: only
    zeros past the last non-zero byte go, so no record and no evidence of a
    torn one is ever removed, whatever another process did meanwhile. A failure leaves the zeros (harmless).
    """
    if not end <= keep < size:
        return
    try:
        lock_fd = os.open(lock_path, os.O_RDWR | os.O_NOFOLLOW)
    except OSError:
        return
    try:
        if not fileio.try_lock(lock_fd, True):
            return
        try:
            fd = os.open(seg_path, os.O_RDWR | os.O_NOFOLLOW)
        except OSError:
            return
        try:
            if os.fstat(fd).st_size == size and segment.zero_from(fd, end, size):
                fileio.truncate(fd, keep)
        except OSError:
            pass
        finally:
            os.close(fd)
    finally:
        os.close(lock_fd)  # releases the lock
