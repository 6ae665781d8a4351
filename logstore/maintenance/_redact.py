"""Redaction: replacing the payloads of a seq range of one conversation by tombstones that keep their seqs.

Each redacted item becomes :data:`TOMBSTONE` (``{"redacted":true}``) in its
own record, which keeps its kind, seqs, ``recorded_at`` and idempotency key:
numbering stays gapless and a read returns the tombstone where the payload
was. Every segment holding a seq of the range is rewritten, under the
conversation's exclusive lock, exactly as a repair rewrites one (FORMAT.md,
section 6, "Redacting items"): the new segment, same header and salt, goes to
``<name>.tmp`` and synced, the old index is unlinked (and the directory
synced), the new segment renamed over the old one (and the directory synced
again); the old file is then truncated to
nothing (an engine holding it open sees the change and reloads) and the index
written again. Quarantined copies of the conversation's segments (which may
hold the payloads) are removed. Every segment is planned (read, checked,
rebuilt in memory) before the first is written, so bad input or a damaged
segment changes nothing.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import msgspec

from .. import fileio, frame, layout, redaction
from ..frame import ITEM_KINDS, SEGMENT_HEADER_SIZE
from ..ids import ConversationId, SiteName
from ..segment import Gap, classify_failure, data_end, walk
from ._files import _flocked, _open_ro, _pread_range, _require_data_dir
from ._forget import _forget_quarantined
from ._salvage import _write_index
from ._types import MaintenanceError

#: What a redacted item reads as (compact JSON, as stored).
TOMBSTONE = redaction.TOMBSTONE

_RAW_ITEMS = msgspec.json.Decoder(list[msgspec.Raw])


@dataclass(frozen=True)
class Redacted:
    """What :func:`redact_items` did: the seqs now tombstones, segments rewritten, quarantined copies removed."""

    first_seq: int
    last_seq: int
    segments: int
    quarantined: int


@dataclass
class _Plan:
    path: str
    base: int
    salt: int
    data: bytes


def redact_items(
    data_dir: str | os.PathLike[str],
    site: str,
    conversation_id: str,
    first_seq: int,
    last_seq: int,
    *,
    lock_timeout: float = 30.0,
) -> Redacted:
    """Replace items ``first_seq..last_seq`` (inclusive) of one conversation by tombstones; durable on return.

    Raises :class:`MaintenanceError`, with nothing changed, when the range is
    empty or reversed, lies outside ``[0, next_seq)``, the conversation does
    not exist, or a segment holding the range is damaged (``fsck --repair``
    first); :class:`~logstore.Timeout` when the conversation stays locked.
    """
    root = os.path.abspath(os.fspath(data_dir))
    _require_data_dir(root)
    check_range(first_seq, last_seq, None, "")
    try:
        cdir = layout.conversation_dir(root, SiteName(site), ConversationId(conversation_id))
    except Exception as exc:
        raise MaintenanceError(f"{site!r}/{conversation_id!r} is not a valid site and conversation id: {exc}") from exc
    if not os.path.isdir(cdir):
        raise MaintenanceError(f"conversation {conversation_id!r} does not exist in site {site!r}")
    with _flocked(os.path.join(cdir, layout.LOCK_FILE), True, lock_timeout, create=True):
        plans, next_seq = _plan(cdir, first_seq, last_seq)
        check_range(first_seq, last_seq, next_seq, f"{site}/{conversation_id}")
        for name in os.listdir(cdir):
            if name.endswith(".tmp"):  # an unfinished rewrite or roll: it may hold a copy of the items
                fileio.unlink(os.path.join(cdir, name))
        for p in plans:
            _replace(cdir, p)
    quarantined = _forget_quarantined(root, site, conversation_id)
    return Redacted(first_seq, last_seq, len(plans), quarantined)


def check_range(first: int, last: int, next_seq: int | None, where: str) -> None:
    """Raise :class:`MaintenanceError` unless ``0 <= first <= last < next_seq`` (``None``: not known yet)."""
    try:
        redaction.check_range(first, last, next_seq, where)
    except redaction.RedactionError as exc:
        raise MaintenanceError(str(exc)) from None


def _plan(cdir: str, first: int, last: int) -> tuple[list[_Plan], int]:
    """Every segment holding a seq of ``first..last``, rebuilt in memory; and the conversation's next seq."""
    bases = sorted(b for b in map(layout.parse_segment_name, os.listdir(cdir)) if b is not None)
    plans: list[_Plan] = []
    expected = 0
    for i, base in enumerate(bases):
        path = os.path.join(cdir, layout.segment_name(base))
        active = i + 1 == len(bases)
        with _open_ro(path) as fd:
            size = os.fstat(fd).st_size
            if active:
                size = data_end(fd, min(size, SEGMENT_HEADER_SIZE), size)
            if active and base == 0 and size <= SEGMENT_HEADER_SIZE and not any(os.pread(fd, SEGMENT_HEADER_SIZE, 0)):
                return plans, 0  # a torn creation: an empty conversation
            header = frame.decode_segment_header(os.pread(fd, SEGMENT_HEADER_SIZE, 0))
            if header is None or header.base_seq != base:
                raise MaintenanceError(f"{path}: the segment header is damaged; run convmem fsck first")
            parts = [os.pread(fd, SEGMENT_HEADER_SIZE, 0)]
            changed = False
            expected = base
            for rec in walk(fd, SEGMENT_HEADER_SIZE, size, header.salt):
                if isinstance(rec, Gap):
                    if active and classify_failure(fd, rec.offset, size, header.salt, expected) == "torn":
                        break  # never acknowledged: left out of a rewrite, as the next writer would cut it
                    if expected <= last:
                        raise MaintenanceError(
                            f"{path}: damaged record at offset {rec.offset}; run convmem fsck --repair first"
                        )
                    break
                off, h, body = rec
                if h.kind in ITEM_KINDS and h.first_seq <= last and h.end_seq > first:
                    parts.append(_redacted_record(header.salt, h, bytes(body), first, last))
                    changed = True
                else:
                    parts.append(_pread_range(fd, off, off + h.size))
                expected = h.end_seq
            if changed:
                plans.append(_Plan(path, base, header.salt, b"".join(parts)))
    return plans, expected


def _redacted_record(salt: int, h: frame.RecordHeader, body: bytes, first: int, last: int) -> bytes:
    items = frame.items_body(h.kind, body)
    prefix = body[: len(body) - len(items)]  # a keyed batch's key, kept
    raws = _RAW_ITEMS.decode(items)
    elems = [TOMBSTONE if first <= h.first_seq + i <= last else bytes(raw) for i, raw in enumerate(raws)]
    new_body = prefix + b"[" + b",".join(elems) + b"]"
    return frame.encode_record(salt, h.kind, h.first_seq, h.count, h.recorded_at_us, new_body)


def _replace(cdir: str, p: _Plan) -> None:
    """Write-new, sync, unlink the old index and sync, rename over and sync, then cut the old file."""
    tmp = p.path + ".tmp"
    out = fileio.open_create(tmp, os.O_WRONLY | os.O_TRUNC)
    try:
        fileio.pwrite_all(out, p.data, 0)
        fileio.fdatasync(out)
    finally:
        os.close(out)
    fileio.crashpoint("redact-new-synced")
    # The old index holds the old offsets: it goes, durably, before the rename. In one directory
    # sync with it, a power cut could keep the rename and not the unlink (POSIX orders neither),
    # leaving the new segment with an index of the old one.
    idx = os.path.join(cdir, layout.index_name(p.base))
    if os.path.lexists(idx):
        fileio.unlink(idx)
        fileio.fsync_dir(cdir)
    with open(p.path, "r+b") as old:
        fileio.rename(tmp, p.path)
        fileio.crashpoint("redact-renamed")
        fileio.fsync_dir(cdir)
        fileio.crashpoint("redact-replaced")
        # The old inode holds the payloads until it is cut; an engine with it open sees its size change.
        fileio.truncate(old.fileno(), 0)
    _write_index(cdir, p.base, p.salt, p.path)
