"""A site's memory event log: one segment file in logstore's segment format.

Every change to a site's memories is one record of kind "batch" holding one
event (a one-element JSON array), framed, checksummed and recovered exactly
like a conversation's records (:mod:`logstore.frame`, :mod:`logstore.segment`):
a record that fails verification at the end of the file and was never written
whole is a torn tail and is cut away (only by a writer holding the exclusive
lock); anything else is damage, reported with its byte offset.

Events (the ``op`` member)::

    {"op": "create", "id": ..., "at": us, "record": {...}}   whole record after the change
    {"op": "update", "id": ..., "at": us, "record": {...}}
    {"op": "delete", "id": ..., "at": us, "version": n}       soft delete
    {"op": "erase",  "id": ..., "at": us}                     the memory is gone

Erasure rewrites the file without the memory's create/update/delete events
(and so without its content), keeping every other event in order and adding
the erase event: new file, sync, rename over the old one, sync the directory.
Readers notice the rewrite by the file's inode number changing.

Crash points (see :mod:`logstore.fileio`): ``memory-rewrite-written`` (the
new file is synced, not yet renamed) and ``memory-rewrite-renamed`` (renamed,
directory not yet synced).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import msgspec

from .. import fileio, frame, links
from ..errors import Corrupted
from ..frame import KIND_BATCH, SEGMENT_HEADER_SIZE
from ..segment import BadRecord, Fault, Gap, classify_failure, iter_records, walk

_encoder = msgspec.json.Encoder()
#: Why a valid record that is not one event fails in this log.
_ONE_EVENT = "a memory log record must hold exactly one event"
_decoder = msgspec.json.Decoder(type=list[dict[str, Any]])

OPS = frozenset({"create", "update", "delete", "erase"})


@dataclass(frozen=True)
class Event:
    """One decoded event and where its record sits."""

    offset: int
    seq: int
    recorded_us: int
    body: dict[str, Any]

    @property
    def op(self) -> str:
        return str(self.body["op"])

    @property
    def memory_id(self) -> str:
        return str(self.body["id"])


@dataclass
class ScanResult:
    """What a scan found between two offsets."""

    events: list[Event]
    end: int  # one past the last whole, valid record
    next_seq: int
    torn_at: int | None = None  # a torn tail starts here (not yet cut)


def encode_event(body: dict[str, Any]) -> bytes:
    return b"[" + _encoder.encode(body) + b"]"


def decode_event(raw: bytes | memoryview, offset: int, path: str) -> dict[str, Any]:
    try:
        items = _decoder.decode(raw)
    except msgspec.DecodeError as exc:
        raise Corrupted(path, offset, f"record body is not an event: {exc}") from None
    if len(items) != 1 or items[0].get("op") not in OPS or not isinstance(items[0].get("id"), str):
        raise Corrupted(path, offset, "record body is not one memory event")
    return items[0]


def new_segment_bytes(salt: int) -> bytes:
    return frame.encode_segment_header(0, salt)


class EventLog:
    """The open segment file of one site's memories. Callers hold the site's lock."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.fd: int | None = None
        self.inode: int | None = None
        self.salt = 0

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
        self.fd = None
        self.inode = None

    def exists(self) -> bool:
        return os.path.exists(self.path)

    def create_if_missing(self) -> None:
        """Make an empty segment (header only), atomically: it never exists without a header."""
        if os.path.exists(self.path):
            return
        fileio.makedirs_durable(os.path.dirname(self.path))
        fileio.write_file_atomic(self.path, new_segment_bytes(frame.new_salt()))

    def changed(self) -> bool:
        """True when the file on disk is not the one we have open (rewritten or removed)."""
        if self.fd is None:
            return True
        try:
            return os.stat(self.path).st_ino != self.inode
        except FileNotFoundError:
            return True

    def open(self, writable: bool) -> None:
        self.close()
        fd = links.open_nofollow(self.path, os.O_RDWR if writable else os.O_RDONLY)
        try:
            header = frame.decode_segment_header(os.pread(fd, SEGMENT_HEADER_SIZE, 0))
            if header is None or header.base_seq != 0:
                raise Corrupted(self.path, 0, "segment header is missing or invalid")
        except BaseException:
            os.close(fd)
            raise
        self.fd = fd
        self.inode = os.fstat(fd).st_ino
        self.salt = header.salt

    def size(self) -> int:
        assert self.fd is not None
        return os.fstat(self.fd).st_size

    def scan(self, start: int, next_seq: int) -> ScanResult:
        """Verified events from ``start`` to the end of the file.

        A failed record is a torn tail (returned in ``torn_at``, not cut) or
        damage (raises Corrupted with its offset).
        """
        assert self.fd is not None
        size = self.size()
        events: list[Event] = []
        end = start
        try:
            for off, h, body in iter_records(self.fd, start, size, self.salt):
                if h.kind != KIND_BATCH or h.count != 1:
                    raise BadRecord(off, _ONE_EVENT, Fault.CONTENT)
                if h.first_seq != next_seq:
                    raise BadRecord(off, f"expected seq {next_seq}, record has {h.first_seq}", Fault.SEQ)
                events.append(Event(off, h.first_seq, h.recorded_at_us, decode_event(body, off, self.path)))
                next_seq += 1
                end = off + h.size
        except BadRecord as bad:
            # A valid record out of place is damage; only bytes that fail may be a torn write.
            if not bad.fault.framing or classify_failure(self.fd, bad.offset, size, self.salt, next_seq) == "corrupt":
                raise Corrupted(self.path, bad.offset, bad.why) from None
            return ScanResult(events, end, next_seq, torn_at=bad.offset)
        return ScanResult(events, end, next_seq)

    def cut(self, offset: int) -> None:
        """Cut a torn tail away (exclusive lock held)."""
        assert self.fd is not None
        fileio.truncate(self.fd, offset)

    def append(self, end: int, seq: int, at_us: int, body: dict[str, Any]) -> int:
        """Write one event at ``end`` and make it durable; returns the new end."""
        assert self.fd is not None
        data = frame.encode_record(self.salt, KIND_BATCH, seq, 1, at_us, encode_event(body))
        fileio.pwrite_all(self.fd, data, end)
        fileio.fdatasync(self.fd)
        return end + len(data)

    def rewrite(self, events: Iterable[tuple[int, dict[str, Any]]]) -> None:
        """Replace the file with ``events`` ((recorded_us, body) in order), durably.

        Written to a temporary file beside the log, synced, renamed over the
        log, directory synced. The temporary file never outlives the call.
        """
        rewrite_file(self.path, events)
        self.open(writable=True)


def rewrite_file(path: str, events: Iterable[tuple[int, dict[str, Any]]]) -> None:
    """Write a fresh log at ``path`` holding ``events``: temp file, sync, rename, sync directory."""
    salt = frame.new_salt()
    parts = [new_segment_bytes(salt)]
    for seq, (at_us, body) in enumerate(events):
        parts.append(frame.encode_record(salt, KIND_BATCH, seq, 1, at_us, encode_event(body)))
    tmp = f"{path}.rewrite.{os.getpid()}"
    try:
        fd = fileio.open_create(tmp, os.O_WRONLY | os.O_TRUNC)
        try:
            fileio.pwrite_all(fd, b"".join(parts), 0)
            fileio.fsync(fd)
        finally:
            os.close(fd)
        fileio.crashpoint("memory-rewrite-written")
        fileio.rename(tmp, path)
        fileio.crashpoint("memory-rewrite-renamed")
    except BaseException:
        try:
            fileio.unlink(tmp)
        except OSError:
            pass
        raise
    fileio.fsync_dir(os.path.dirname(path))


def salvage(path: str) -> tuple[list[Event], list[tuple[int, str]], int | None]:
    """Every valid event of a log, stepping over damaged records (for fsck).

    Returns ``(events, damaged, torn_at)``: ``damaged`` lists (offset, why)
    of each damaged stretch skipped; ``torn_at`` is where a torn tail starts.
    Raises Corrupted when the segment header itself is bad.
    """
    log = EventLog(path)
    log.open(writable=False)
    try:
        assert log.fd is not None
        size = log.size()
        events: list[Event] = []
        damaged: list[tuple[int, str]] = []
        for rec in walk(log.fd, SEGMENT_HEADER_SIZE, size, log.salt):
            if isinstance(rec, Gap):
                expected = events[-1].seq + 1 if events else None
                if classify_failure(log.fd, rec.offset, size, log.salt, expected) == "torn":
                    return events, damaged, rec.offset
                damaged.append((rec.offset, rec.why))
                continue
            off, h, body = rec
            try:
                if h.kind != KIND_BATCH or h.count != 1:
                    raise Corrupted(path, off, _ONE_EVENT)
                ev = decode_event(body, off, path)
            except Corrupted as exc:
                damaged.append((off, exc.why))
                continue
            events.append(Event(off, len(events), h.recorded_at_us, ev))
        return events, damaged, None
    finally:
        log.close()
