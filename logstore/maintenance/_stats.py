"""Per-site sizes and the largest conversations (``convmem stats``)."""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

from .. import frame, index, layout
from ..errors import Timeout
from ..frame import KIND_BATCH, KIND_KEYED, KIND_LOSS, SEGMENT_HEADER_SIZE
from ..limits import MAX_CONVERSATION_ITEMS
from ..recovery import is_torn_creation
from ..segment import Gap, classify_failure, walk
from ._files import (
    _committed_segments,
    _open_ro,
    _select_sites,
    iter_conversations,
)


@dataclass(frozen=True)
class ConversationStats:
    conversation_id: str
    items: int
    bytes: int
    #: ``items / MAX_CONVERSATION_ITEMS``.
    fill: float
    #: Set when the log's tail could not be read.
    error: str | None = None


@dataclass(frozen=True)
class SiteStats:
    site: str
    conversations: int
    items: int
    #: Every file under the site's directory (segments, indexes, manifest).
    bytes_on_disk: int
    largest: list[ConversationStats]
    damaged: list[ConversationStats]


def _probe_items(conv_dir: str, lock_timeout: float) -> tuple[int, int, str | None]:
    """``(items, segment bytes, error)``, counting from the last segment's last verified index entry."""
    segs = _committed_segments(conv_dir, lock_timeout)
    if not segs:
        return 0, 0, None
    base, size = segs[-1]
    path = os.path.join(conv_dir, layout.segment_name(base))
    total = sum(s for _, s in segs)
    with _open_ro(path) as fd:
        header = frame.decode_segment_header(os.pread(fd, SEGMENT_HEADER_SIZE, 0))
        if header is None and is_torn_creation(fd, base, True, len(segs) == 1):
            return 0, total, None  # a creation a power cut interrupted: nothing in it
        if header is None:
            return base, total, f"{path}: segment header is invalid"
        idx = index.load(os.path.join(conv_dir, layout.index_name(base)), base, header.salt, size)
        start, seq = SEGMENT_HEADER_SIZE, base
        for s, off in reversed(list(zip(idx.seqs, idx.offsets, strict=True)) if idx else []):
            first = next(walk(fd, off, size, header.salt), None)
            if first is not None and not isinstance(first, Gap) and first[1].first_seq == s:
                start, seq = off, s
                break
        for rec in walk(fd, start, size, header.salt):
            if isinstance(rec, Gap):
                torn = classify_failure(fd, rec.offset, size, header.salt, seq) == "torn"
                return seq, total, None if torn else f"{path} is damaged at byte {rec.offset}: {rec.why}"
            if rec[1].kind in (KIND_BATCH, KIND_KEYED, KIND_LOSS):  # lost seqs still count: seqs never move
                seq = rec[1].end_seq
    return seq, total, None


def _tree_bytes(path: str) -> int:
    """Bytes of the files below a site directory, its pool of pre-created conversations left out."""
    total = 0
    for dirpath, dirs, files in os.walk(path):
        if dirpath == path and layout.POOL_DIR in dirs:
            dirs.remove(layout.POOL_DIR)
        for name in files:
            with contextlib.suppress(FileNotFoundError):
                total += os.lstat(os.path.join(dirpath, name)).st_size
    return total


def stats(
    data_dir: str | os.PathLike[str], site: str | None = None, *, top: int = 10, lock_timeout: float = 30.0
) -> list[SiteStats]:
    """Per site: conversations, items, bytes on disk, and the ``top`` largest conversations.

    Item counts come from each conversation's last segment (its base seq plus
    the records after its last verified index entry), so this reads little.
    """
    root = os.path.abspath(os.fspath(data_dir))
    out: list[SiteStats] = []
    for s in _select_sites(root, site):
        convs: list[ConversationStats] = []
        damaged: list[ConversationStats] = []
        items = count = 0
        for cid, cdir in iter_conversations(root, s):
            try:
                n, nbytes, err = _probe_items(cdir, lock_timeout)
            except (OSError, Timeout) as exc:
                n, nbytes, err = 0, 0, str(exc)
            if n == 0 and err is None:
                continue  # a directory without items (its first append never completed)
            cs = ConversationStats(cid, n, nbytes, n / MAX_CONVERSATION_ITEMS, err)
            count += 1
            items += n
            convs.append(cs)
            if err is not None:
                damaged.append(cs)
            if len(convs) > 4 * max(top, 1):
                convs.sort(key=lambda c: (-c.items, c.conversation_id))
                del convs[top:]
        convs.sort(key=lambda c: (-c.items, c.conversation_id))
        out.append(SiteStats(s, count, items, _tree_bytes(layout.site_dir(root, s)), convs[:top], damaged))
    return out
