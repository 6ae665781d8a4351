"""Forgetting: erasing a whole conversation, durably, with every copy of its items under the data directory.

What a conversation leaves under DATA is its segments (the items), their
sparse indexes (derived), the site listing's entry (ids and timestamps, no
item contents) and, after a repair or an import replaced it, copies of its
segments under ``DATA/quarantine/``. :func:`forget_conversation` removes them
all: under the conversation's exclusive lock the listing first drops it
(marked for a rebuild from the logs, so a power cut mid-way never lists a
conversation whose log is gone), then the segments and indexes are removed
and the removals synced, the removed files are shrunk to nothing (an engine
holding one open reloads and finds the conversation empty), the listing is
written without it, and the quarantined copies are removed and their removal
synced. The conversation's directory and its lock file stay: they hold no
item, and an engine holding the lock open must keep locking the same file.
A later append starts the conversation afresh at seq 0.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from .. import fileio, layout
from ..ids import ConversationId, SiteName
from ._files import _flocked
from ._manifest import _mark_manifest_incomplete, _write_manifest
from ._restore import remove_segments
from ._types import QUARANTINE_DIR


@dataclass(frozen=True)
class Forgotten:
    """What :func:`forget_conversation` removed: segment files and quarantined copies (folders)."""

    segments: int
    quarantined: int


def forget_conversation(
    data_dir: str | os.PathLike[str], site: str, conversation_id: str, *, lock_timeout: float = 30.0
) -> Forgotten:
    """Erase one conversation of ``site`` (see the module doc); durable when it returns."""
    root = os.path.abspath(os.fspath(data_dir))
    site, conversation_id = SiteName(site), ConversationId(conversation_id)
    cdir = layout.conversation_dir(root, site, conversation_id)
    names: list[str] = []
    if os.path.isdir(cdir):
        with _flocked(os.path.join(cdir, layout.LOCK_FILE), True, lock_timeout, create=True):
            names = sorted(n for n in os.listdir(cdir) if layout.parse_segment_name(n) is not None)
            _mark_manifest_incomplete(root, site, {conversation_id}, lock_timeout)
            fileio.crashpoint("forget-unlisted")
            remove_segments(cdir, names)
            fileio.crashpoint("forget-removed")
            leftovers = [n for n in os.listdir(cdir) if n != layout.LOCK_FILE]
            for name in leftovers:  # a segment being created (.tmp), an orphaned index
                fileio.unlink(os.path.join(cdir, name))
            if leftovers:
                fileio.fsync_dir(cdir)
        _write_manifest(root, site, {conversation_id: None}, {conversation_id}, False, lock_timeout)
    return Forgotten(len(names), _forget_quarantined(root, site, conversation_id))


def _forget_quarantined(root: str, site: str, conversation_id: str) -> int:
    """Remove the quarantined copies of the conversation's segments (folders named after it); how many."""
    qroot = os.path.join(root, QUARANTINE_DIR)
    tag = f"-{layout.encode_name(site)}-{layout.encode_name(conversation_id)}-"
    try:
        folders = sorted(n for n in os.listdir(qroot) if tag in n)
    except FileNotFoundError:
        return 0
    for folder in folders:
        path = os.path.join(qroot, folder)
        for name in os.listdir(path):
            fileio.unlink(os.path.join(path, name))
        fileio.fsync_dir(path)
        fileio.remove_tree(path)  # emptied above; through the I/O seam, as every removal
    if folders:
        fileio.fsync_dir(qroot)
    return len(folders)
