"""Streaming a site's items out exactly as stored (``convmem export``)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass

from .. import frame, layout
from ..errors import Corrupted, ItemsLost, Loss
from ..frame import ITEM_KINDS, KIND_IDENTITY, KIND_LOSS, SEGMENT_HEADER_SIZE, items_body
from ..ids import ConversationId, SiteName
from ..recovery import is_torn_creation
from ..segment import Gap, classify_failure, walk
from ._files import (
    _open_ro,
    _select_sites,
    committed_segments_at,
    conversation_home,
    iter_conversations,
)
from ._records import (
    _BATCH_RAW,
    _batch_problem,
)


@dataclass(frozen=True)
class ExportedItem:
    """One item as stored: ``payload`` is its exact compact JSON bytes."""

    conversation_id: str
    seq: int
    recorded_at_us: int
    payload: bytes


def iter_conversation_items(
    data_dir: str | os.PathLike[str], site: str, conversation_id: str, *, lock_timeout: float = 30.0
) -> Iterator[ExportedItem]:
    """Every item of one conversation in seq order, verified, as it stood when the read began.

    Reads one record at a time (constant memory). A torn tail (never
    acknowledged) ends the log; any damage to acknowledged data raises
    :class:`~logstore.Corrupted` with its file and offset; seqs a repair recorded as
    lost raise :class:`~logstore.ItemsLost` (an export never skips items silently).
    A conversation whose first append a power cut moved back into the pool is
    read from there (:func:`conversation_home`).
    """
    root = os.path.abspath(os.fspath(data_dir))
    home = conversation_home(root, SiteName(site), ConversationId(conversation_id))
    yield from _conversation_items(root, site, conversation_id, home, lock_timeout)


def _conversation_items(
    root: str, site: str, conversation_id: str, conv_dir: str, lock_timeout: float
) -> Iterator[ExportedItem]:
    conv_dir, segs = committed_segments_at(root, site, conversation_id, conv_dir, lock_timeout)
    expected = 0
    decode = _BATCH_RAW.decode
    for i, (base, size) in enumerate(segs):
        path = os.path.join(conv_dir, layout.segment_name(base))
        with _open_ro(path) as fd:
            header = frame.decode_segment_header(os.pread(fd, SEGMENT_HEADER_SIZE, 0))
            if header is None and is_torn_creation(fd, base, i == len(segs) - 1, len(segs) == 1):
                return  # a creation a power cut interrupted: the conversation holds nothing
            if header is None or header.base_seq != base:
                raise Corrupted(path, 0, "segment header is missing or invalid")
            if base != expected:
                raise Corrupted(path, 0, f"segment starts at seq {base}, expected {expected}")
            for rec in walk(fd, SEGMENT_HEADER_SIZE, size, header.salt):
                if isinstance(rec, Gap):
                    if i == len(segs) - 1:
                        if classify_failure(fd, rec.offset, size, header.salt, expected) == "torn":
                            return
                    raise Corrupted(path, rec.offset, rec.why)
                offset, h, body = rec
                if h.first_seq != expected:
                    raise Corrupted(path, offset, f"expected seq {expected}, record starts at {h.first_seq}")
                if h.kind == KIND_LOSS:
                    raise ItemsLost([Loss(h.first_seq, h.end_seq - 1, path, offset)])
                if h.kind == KIND_IDENTITY:
                    continue  # a claimed conversation's identity: no items
                if h.kind not in ITEM_KINDS:
                    break
                why = _batch_problem(body, h.count, h.kind)
                if why is not None:
                    raise Corrupted(path, offset, why)
                for n, raw in enumerate(decode(items_body(h.kind, body))):
                    yield ExportedItem(conversation_id, h.first_seq + n, h.recorded_at_us, bytes(raw))
                expected = h.end_seq


def export_items(
    data_dir: str | os.PathLike[str], site: str, conversation_id: str | None = None, *, lock_timeout: float = 30.0
) -> Iterator[ExportedItem]:
    """Every item of a site (or of one conversation), conversation by conversation, in constant memory."""
    root = os.path.abspath(os.fspath(data_dir))
    _select_sites(root, site)
    if conversation_id is not None:
        yield from iter_conversation_items(root, site, conversation_id, lock_timeout=lock_timeout)
        return
    for cid, conv_dir in iter_conversations(root, site):
        yield from _conversation_items(root, site, cid, conv_dir, lock_timeout)
