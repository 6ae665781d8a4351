"""Per-site quotas: the bytes a site's logs may take and how many conversations it may hold.

A site's *usage* is the total size of its segment files (its logs, the last
segment of each conversation up to its data end, without the zeros
preallocated after its records; indexes and manifests are derived data and
not counted) and the number of its
conversations that hold a segment. :func:`site_usage` measures it from disk;
``convmem stats`` shows it.

Enforcement must not slow appends down: a :class:`UsageTracker` measures a
site once, the first time an append to it needs checking in this process,
and from then on adds the size of each record it writes (header, body and
trailer, as framed on disk) and each conversation it creates. A check is then
two additions under a lock, with no file system call. The count is per
process: appends made by another process sharing the data directory are
seen at the next start (``convmem stats`` always measures from disk).
A segment roll adds a segment header and a seal record not charged here, so
the tracked figure can run a few dozen bytes per 16 MiB below the disk's.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass

from . import layout
from .errors import QuotaExceeded
from .frame import RECORD_OVERHEAD, SEGMENT_HEADER_SIZE
from .segment import data_end


@dataclass(frozen=True)
class SiteQuota:
    """Limits applied to every site; None means unlimited."""

    max_bytes: int | None = None
    max_conversations: int | None = None

    def __post_init__(self) -> None:
        for name in ("max_bytes", "max_conversations"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be a positive integer or None, not {value!r}")

    @property
    def active(self) -> bool:
        return self.max_bytes is not None or self.max_conversations is not None


@dataclass
class Usage:
    """What a site takes: segment bytes and conversations holding a segment."""

    bytes: int = 0
    conversations: int = 0


def site_usage(root: str, site: str) -> Usage:
    """Measure ``site``'s usage from disk (a walk of its conversation directories)."""
    usage = Usage()
    base = os.path.join(layout.site_dir(root, site), layout.CONVERSATIONS_DIR)
    for a in _entries(base):
        for b in _entries(os.path.join(base, a)):
            for name in _entries(os.path.join(base, a, b)):
                conv = os.path.join(base, a, b, name)
                segs = [f for f in _entries(conv) if layout.parse_segment_name(f) is not None]
                # The last segment counts up to its data end: the zeros preallocated after its
                # records hold nothing (FORMAT.md section 2), and appends are charged per record.
                sizes = [_size(os.path.join(conv, f)) for f in segs[:-1]]
                sizes += [_data_size(os.path.join(conv, f)) for f in segs[-1:]]
                if sizes:
                    usage.conversations += 1
                    usage.bytes += sum(sizes)
    return usage


def record_cost(body_len: int, new_conversation: bool) -> int:
    """Bytes an append of a ``body_len``-byte batch adds to the logs."""
    return body_len + RECORD_OVERHEAD + (SEGMENT_HEADER_SIZE if new_conversation else 0)


class UsageTracker:
    """Keeps each site's usage in memory and refuses appends beyond the quota. Thread-safe."""

    def __init__(self, root: str, quota: SiteQuota) -> None:
        self.root = root
        self.quota = quota
        self._lock = threading.Lock()
        self._usage: dict[str, Usage] = {}

    def charge(self, site: str, body_len: int, new_conversation: bool) -> int:
        """Count an append about to be written; its cost, for :meth:`refund`. Raises QuotaExceeded."""
        with self._lock:
            usage = self._usage.get(site)
            if usage is not None:
                return self._charge_locked(usage, body_len, new_conversation)
        measured = site_usage(self.root, site)  # once per site and process, outside the lock
        with self._lock:
            return self._charge_locked(self._usage.setdefault(site, measured), body_len, new_conversation)

    def _charge_locked(self, usage: Usage, body_len: int, new_conversation: bool) -> int:
        cost = record_cost(body_len, new_conversation)
        limit = self.quota.max_conversations
        if new_conversation and limit is not None and usage.conversations + 1 > limit:
            raise QuotaExceeded("conversations", limit, usage.conversations + 1)
        limit = self.quota.max_bytes
        if limit is not None and usage.bytes + cost > limit:
            raise QuotaExceeded("bytes", limit, usage.bytes + cost)
        usage.bytes += cost
        usage.conversations += int(new_conversation)
        return cost

    def refund(self, site: str, cost: int, new_conversation: bool) -> None:
        """Undo :meth:`charge` for an append that was not written."""
        with self._lock:
            usage = self._usage.get(site)
            if usage is not None:
                usage.bytes -= cost
                usage.conversations -= int(new_conversation)

    def adjust_conversations(self, site: str, delta: int) -> None:
        """Correct the conversation count after an append showed whether its conversation was new."""
        with self._lock:
            usage = self._usage.get(site)
            if usage is not None:
                usage.conversations += delta

    def forget(self, site: str) -> None:
        """Drop what is known of ``site`` (it was deleted); it is measured again when next needed."""
        with self._lock:
            self._usage.pop(site, None)


def _entries(path: str) -> list[str]:
    try:
        return sorted(os.listdir(path))
    except (FileNotFoundError, NotADirectoryError):
        return []


def _data_size(path: str) -> int:
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return 0
    try:
        size = os.fstat(fd).st_size
        return data_end(fd, min(size, SEGMENT_HEADER_SIZE), size)
    finally:
        os.close(fd)


def _size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        return 0
