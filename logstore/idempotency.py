"""Idempotency keys of a conversation's recent appends, held in memory and rebuilt from the log.

A keyed append is written as a keyed batch record (FORMAT.md 3): the key is
in the record itself, under the record's checksum, so the one ``fdatasync``
that makes the batch durable makes its key durable too, and no crash can
keep one without the other. The log is the only copy; this table is derived
from it, the way a sparse index is:

* **Built** on a conversation's first keyed append in this process, under
  the exclusive file lock, from the tail of the log: whole segments, newest
  first, until it holds the last :data:`KEEP_BATCHES` batches and every
  batch of the last :data:`KEEP_US` microseconds (so it reads at most the
  retention window plus one segment, never the whole log of an old
  conversation).
* **Kept up to date** by the writer with its own batches, and caught up from
  the records other processes appended (found by the sparse index, from the
  seq the table covers to the end), so an append reads the log only when
  another process wrote since.
* **Pruned** to the retention rule: an entry goes once it is both older
  than :data:`KEEP_US` and more than :data:`KEEP_BATCHES` batches behind.
  A conversation holds at most 100,000 items, hence at most that many
  batches: the table is bounded however fast a conversation is written.

"Same items" means the same compact JSON encoding of the batch (the same
objects, keys in the same order), compared by a 128-bit digest.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from typing import TYPE_CHECKING, NamedTuple

import msgspec
import xxhash

from .convstate import ReadOnlyFile
from .errors import Corrupted
from .frame import ITEM_KINDS, KIND_KEYED, KIND_LOSS, SEGMENT_HEADER_SIZE, items_body, record_key
from .segment import Gap, walk
from .timefmt import now_us

if TYPE_CHECKING:
    from .recovery import Recovery

#: Keys are kept for at least the conversation's last this many batches ...
KEEP_BATCHES = 10_000
#: ... or this long (microseconds: 24 hours), whichever keeps more.
KEEP_US = 24 * 3600 * 1_000_000


def digest(items: bytes | memoryview) -> bytes:
    """The 128-bit digest of a batch's items (its JSON array) that tells "same items"."""
    return xxhash.xxh3_128_digest(items)


class KeyEntry(NamedTuple):
    """Where a key's batch lies, what it held, when it was written and how many batches came before it."""

    first: int
    last: int
    digest: bytes
    at_us: int
    ordinal: int


class _Seen(NamedTuple):
    key: str | None
    first: int
    last: int
    digest: bytes
    at_us: int


class KeyTable:
    """The keys of a conversation's retained batches; ``covered`` is the seq up to which it reflects the log."""

    __slots__ = ("_entries", "batches", "covered")

    def __init__(self, covered: int = 0) -> None:
        self.covered = covered
        #: Batch (and loss) records seen so far: the ordinal the next one gets.
        self.batches = 0
        self._entries: OrderedDict[str, KeyEntry] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: str) -> KeyEntry | None:
        return self._entries.get(key)

    def note(self, key: str | None, first: int, last: int, dig: bytes, at_us: int) -> None:
        """Record one batch of the log (in seq order); ``key`` None for a batch appended without one."""
        if key is not None:
            self._entries[key] = KeyEntry(first, last, dig, at_us, self.batches)
            self._entries.move_to_end(key)  # a key reused after it expired: its newest batch wins
        self.batches += 1
        self.covered = last + 1

    def prune(self, now: int) -> None:
        """Drop the oldest entries that are past both retention bounds."""
        entries = self._entries
        while entries:
            key, oldest = next(iter(entries.items()))
            if self.batches - oldest.ordinal <= KEEP_BATCHES or oldest.at_us >= now - KEEP_US:
                return
            del entries[key]


def _records(fd: int, start: int, end: int, salt: int, min_seq: int) -> Iterator[_Seen]:
    """The batch and loss records of a segment from byte ``start``, those ending past ``min_seq``; damage skipped."""
    for rec in walk(fd, start, end, salt):
        if isinstance(rec, Gap):
            continue  # damaged records carry no key anyone can be told about
        _off, h, body = rec
        if h.end_seq <= min_seq or (h.kind not in ITEM_KINDS and h.kind != KIND_LOSS):
            continue
        key = record_key(h.kind, body) if h.kind == KIND_KEYED else None
        dig = digest(items_body(h.kind, body)) if key is not None else b""
        yield _Seen(key, h.first_seq, h.end_seq - 1, dig, h.recorded_at_us)


def _segment_records(conv: Recovery, base: int, min_seq: int) -> list[_Seen]:
    """The records of segment ``base`` ending past ``min_seq`` (file lock held, state refreshed)."""
    seg = conv.active
    if base == conv._segments[-1] and seg is not None:
        entry = seg.idx.floor(min_seq)
        start = entry[1] if entry is not None else SEGMENT_HEADER_SIZE
        return list(_records(seg.fd, start, seg.end, seg.salt, min_seq))
    with ReadOnlyFile(conv._seg_path(base)) as fd:
        sealed = conv._sealed(base, fd)
        entry = sealed.idx.floor(min_seq)
        start = entry[1] if entry is not None else SEGMENT_HEADER_SIZE
        return list(_records(fd, start, sealed.end, sealed.salt, min_seq))


def build(conv: Recovery) -> KeyTable:
    """A table from the tail of the log: newest segments first, until both retention bounds are met."""
    now = now_us()
    per_segment: list[list[_Seen]] = []
    batches = 0
    for base in reversed(conv._segments):
        seen = _segment_records(conv, base, 0)
        per_segment.append(seen)
        batches += len(seen)
        if batches >= KEEP_BATCHES and seen and seen[0].at_us < now - KEEP_US:
            break
    table = KeyTable()
    for seen in reversed(per_segment):
        for s in seen:
            table.note(s.key, s.first, s.last, s.digest, s.at_us)
    table.covered = conv._next_seq
    table.prune(now)
    return table


def catch_up(conv: Recovery, table: KeyTable) -> None:
    """Add the records appended since ``table.covered`` (by other processes) to ``table``."""
    start = table.covered
    bases = [b for b in conv._segments if b <= start]
    first_base = bases[-1] if bases else conv._segments[0]
    for base in conv._segments:
        if base < first_base:
            continue
        for s in _segment_records(conv, base, start):
            table.note(s.key, s.first, s.last, s.digest, s.at_us)
    table.covered = conv._next_seq
    table.prune(now_us())


#: A batch's items array, element by element (each element's bytes as stored).
RAW_ITEMS = msgspec.json.Decoder(list[msgspec.Raw])


def _batch_at(fd: int, start: int, end: int, salt: int, first: int) -> tuple[bytes, list[bytes]] | None:
    for rec in walk(fd, start, end, salt):
        if isinstance(rec, Gap):
            continue
        _off, h, body = rec
        if h.first_seq == first and h.kind in ITEM_KINDS:
            items = items_body(h.kind, body)
            try:
                return digest(items), [bytes(r) for r in RAW_ITEMS.decode(items)]
            except msgspec.DecodeError:
                return None
        if h.first_seq > first:
            return None
    return None


def stored_batch(conv: Recovery, first: int) -> tuple[bytes, list[bytes]] | None:
    """The digest and items (compact JSON each) of the batch record at seq ``first`` as stored now; None if none.

    File lock held, state refreshed (as :func:`catch_up`). A keyed retry is
    judged by it rather than by the table's digest, which is of the items as
    appended: a redaction may have replaced some by tombstones since. None
    also when the record cannot be read now (the table's digest then answers).
    """
    bases = [b for b in conv._segments if b <= first]
    if not bases:
        return None
    base = bases[-1]
    seg = conv.active
    if base == conv._segments[-1] and seg is not None:
        entry = seg.idx.floor(first)
        start = entry[1] if entry is not None else SEGMENT_HEADER_SIZE
        return _batch_at(seg.fd, start, seg.end, seg.salt, first)
    try:
        with ReadOnlyFile(conv._seg_path(base)) as fd:
            sealed = conv._sealed(base, fd)
            entry = sealed.idx.floor(first)
            start = entry[1] if entry is not None else SEGMENT_HEADER_SIZE
            return _batch_at(fd, start, sealed.end, sealed.salt, first)
    except (Corrupted, OSError):
        return None  # unreadable now: the table's digest answers, as before
