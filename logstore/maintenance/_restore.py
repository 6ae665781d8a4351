"""Writing items back with their original seqs and ``recorded_at`` (``convmem import``)."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from .. import fileio, layout
from ..codec import encode_batch
from ..conversation import Conversation
from ..errors import ConversationFull, StoreError
from ..filestore import FileStore
from ..ids import ConversationId, SiteName
from ..limits import MAX_CONVERSATION_ITEMS
from ..model import SeqRange
from ._files import (
    _flocked,
    _has_segments,
    _open_ro,
    _open_rw,
)
from ._manifest import _mark_manifest_incomplete, _write_manifest
from ._types import QUARANTINE_DIR


class RestoreConflict(StoreError):
    """A restored batch does not continue its conversation (wrong seq or earlier ``recorded_at``)."""

    code = "RestoreConflict"


class _RestoringConversation(Conversation):
    """A conversation that appends batches with given seqs and ``recorded_at``."""

    def restore(self, body: bytes, count: int, first_seq: int, stamp: int, deadline: float, started: float) -> None:
        """Append one encoded batch at ``first_seq`` stamped ``stamp``, durably, as ``append`` does."""
        with self.mutex, self._exclusive(deadline, started):
            if first_seq != self._next_seq:
                raise RestoreConflict(f"batch starts at seq {first_seq}, the conversation holds {self._next_seq}")
            if stamp < self._last_us:
                raise RestoreConflict(f"recorded_at {stamp} us is earlier than the last batch's {self._last_us} us")
            if first_seq + count > MAX_CONVERSATION_ITEMS:
                raise ConversationFull(MAX_CONVERSATION_ITEMS, first_seq + count)
            self._commit_batch(body, count, first_seq, stamp)


class Restorer:
    """Writes items back with their original seqs and ``recorded_at`` (for ``convmem import``).

    Each batch is framed, written and ``fdatasync``\\ ed exactly as an append
    is, under the conversation's exclusive lock, with the manifest's intent and
    commit records. Use as a context manager.
    """

    def __init__(
        self, data_dir: str | os.PathLike[str], *, lock_timeout: float = 30.0, segment_bytes: int = 16 * 1024 * 1024
    ) -> None:
        self._store = FileStore(data_dir, lock_timeout=lock_timeout, segment_bytes=segment_bytes)
        self._convs: dict[tuple[str, str], _RestoringConversation] = {}

    def site_is_empty(self, site: str) -> bool:
        """True when ``site`` holds no conversation with a segment."""
        return not any(True for _ in self._store._walk(SiteName(site)))

    def conversation_is_empty(self, site: str, conversation_id: str) -> bool:
        return not _has_segments(
            layout.conversation_dir(self._store.root, SiteName(site), ConversationId(conversation_id))
        )

    def restore_batch(
        self,
        site: str,
        conversation_id: str,
        first_seq: int,
        recorded_at_us: int,
        payloads: Sequence[Mapping[str, Any]],
    ) -> SeqRange:
        """Append ``payloads`` as one batch occupying seqs ``first_seq..``, stamped ``recorded_at_us``.

        Raises :class:`RestoreConflict` unless the conversation holds exactly
        ``first_seq`` items and its last batch is not later than
        ``recorded_at_us``; the payload limits apply as for an append.
        """
        site, conversation_id = SiteName(site), ConversationId(conversation_id)
        body, count = encode_batch(payloads)
        key = (site, conversation_id)
        conv = self._convs.get(key)
        if conv is None:
            if len(self._convs) >= 64:
                old = self._convs.pop(next(iter(self._convs)))
                with old.mutex:
                    old.close()
            conv = _RestoringConversation(
                layout.conversation_dir(self._store.root, site, conversation_id),
                conversation_id,
                self._store.options,
                self._store._manifest(site),
            )
            self._convs[key] = conv
        started = time.monotonic()
        conv.restore(body, count, first_seq, recorded_at_us, started + self._store.options.lock_timeout, started)
        return SeqRange(first_seq, first_seq + count - 1)

    def close(self) -> None:
        for conv in self._convs.values():
            with conv.mutex:  # Conversation.close waits (on its condition) for an extend-ahead job
                conv.close()
        self._convs.clear()
        self._store.close()

    def __enter__(self) -> Restorer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def remove_segments(cdir: str, names: list[str]) -> None:
    """Remove a conversation's segments ``names`` and their indexes, durably (its exclusive lock held).

    The indexes go first, and their removal is made durable before any
    segment is removed: a power cut never leaves an index without its segment
    (the directory's entries may otherwise reach the disk in any order).
    Segments are removed newest first, and the removals made durable before
    any file is emptied: a power cut never leaves a segment name on disk whose
    bytes are already gone. Each removed segment is then shrunk to nothing, so
    an engine holding it open notices and reloads, and its blocks are freed.
    """
    indexes = 0
    for name in reversed(names):
        base = layout.parse_segment_name(name)
        assert base is not None
        with contextlib.suppress(FileNotFoundError):
            fileio.unlink(os.path.join(cdir, layout.index_name(base)))
            indexes += 1
    if indexes:
        fileio.fsync_dir(cdir)
    with contextlib.ExitStack() as stack:
        held = []
        for name in reversed(names):
            held.append(stack.enter_context(_open_rw(os.path.join(cdir, name))))
            fileio.unlink(os.path.join(cdir, name))
        fileio.fsync_dir(cdir)
        for fd in held:
            fileio.truncate(fd, 0)


def set_aside_conversation(
    data_dir: str | os.PathLike[str], site: str, conversation_id: str, *, lock_timeout: float = 30.0
) -> str:
    """Move a (damaged) conversation's log into ``DATA/quarantine/`` so it can be restored from a backup.

    Under the conversation's exclusive lock: every segment is copied (and
    synced) into a new quarantine folder, then removed with its index; each
    removed file is first shrunk to nothing, so an engine holding it open
    notices and reloads. The site's listing then drops the conversation.
    Returns the quarantine folder.
    """
    root = os.path.abspath(os.fspath(data_dir))
    site, conversation_id = SiteName(site), ConversationId(conversation_id)
    cdir = layout.conversation_dir(root, site, conversation_id)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    qdir = os.path.join(
        root,
        QUARANTINE_DIR,
        f"{stamp}-{layout.encode_name(site)}-{layout.encode_name(conversation_id)}-replaced-"
        f"{time.time_ns() % 1_000_000_000:09d}",
    )
    with _flocked(os.path.join(cdir, layout.LOCK_FILE), True, lock_timeout, create=True):
        names = sorted(n for n in os.listdir(cdir) if layout.parse_segment_name(n) is not None)
        fileio.makedirs_durable(qdir)
        for name in names:
            fileio.copy_file(os.path.join(cdir, name), os.path.join(qdir, name))
            with _open_ro(os.path.join(qdir, name)) as qfd:
                fileio.fsync(qfd)
        info = {
            "site": str(site),
            "conversation_id": str(conversation_id),
            "reason": "replaced by an import",
            "segments": names,
        }
        fileio.write_file_atomic(os.path.join(qdir, "replaced.json"), msgspec.json.encode(info) + b"\n")
        fileio.fsync_dir(qdir)
        # The listing must not outlive the log: it drops the conversation first, marked for a
        # rebuild from the logs at the next open in case power is lost before the removal is done.
        _mark_manifest_incomplete(root, site, {conversation_id}, lock_timeout)
        remove_segments(cdir, names)
    _write_manifest(root, site, {conversation_id: None}, {conversation_id}, False, lock_timeout)
    return qdir
