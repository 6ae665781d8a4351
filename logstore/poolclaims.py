"""Claims of pool entries whose move into place a power cut undid: finding them and finishing the move.

A first append claims a pool entry (:mod:`logstore.convpool`) by renaming it
into place as the conversation's directory, writes the first segment into the
entry's synced zeros, its header followed by the conversation's **identity**
(an identity record, :data:`logstore.frame.KIND_IDENTITY`) and the first
batch's records in one write, and syncs that one file, and nothing else,
before it acknowledges (FORMAT.md 6, "A first append in one sync"). The
rename is made durable later, in the background. A power cut before that can
leave the entry, with acknowledged data, back in ``pool/`` (or below a spare
directory whose own rename was undone). Such an entry is a **claimed entry
not moved**: not damage, and moved into place (:func:`finish`) by every process
before it first uses the site (:func:`settle_site`), so that no reader,
listing or writer of that process can miss the conversation. Entries claimed
by an engine that wrote the identity into the entry's ``lock`` file instead
(and synced both files) are found the same way (:func:`read_identity`).

Invariants:

* Only the claimer whose rename succeeded writes an identity, into the entry
  that is then the conversation's directory: at most one directory holds the
  identity of a conversation, and an entry still in ``pool/`` holds one only
  after a power cut undid its rename (a killed claimer's entry stays where
  its rename put it). So every running process started after any such cut,
  and settling a site once per process and boot is enough.
* The identity lies under the sync that acknowledges the first batch (in the
  same segment, the same write): an entry whose segment holds no valid
  identity (and whose lock file holds none) never acknowledged anything.
* An entry whose identity names a conversation that has a directory holding
  the same identity is the old name of that directory (a power cut kept the
  rename's new name and not the removal of the old, which a filesystem with
  per-directory durability may do): it is removed. One whose conversation
  has a directory without that identity is left as it is (never removed:
  which is right is not known) and reported by ``convmem fsck``.
* ``pool/settled`` holds the boot id (:data:`logstore.bootid.boot_id`) of
  the last boot in which a process finished every move; a process of that
  boot skips the search. Not synced: after a power cut the boot differs.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import NamedTuple

import xxhash

from . import bootid, fileio, frame, layout

#: First bytes of an identity in a lock file, as engines before identity records wrote it (FORMAT.md 6).
MAGIC = b"CVMCLM\x00\x01"
#: Bytes of a pool entry's lock file as those engines built it: one sector of zeros.
LOCK_BYTES = 512
#: Bytes of a first segment that hold its header and an identity record.
_HEAD_BYTES = frame.SEGMENT_HEADER_SIZE + frame.RECORD_OVERHEAD + frame.MAX_IDENTITY_BODY
#: The file of ``pool/`` naming the boot whose claims are all in place.
SETTLED_FILE = "settled"
_LONGEST_ID = 64


def encode(conversation_id: str) -> bytes:
    """An identity in a lock file's older form (magic, u8 length, id, u64 xxh3), as :func:`decode` reads it."""
    raw = conversation_id.encode("ascii")
    head = MAGIC + bytes((len(raw),)) + raw
    return head + xxhash.xxh3_64_intdigest(head).to_bytes(8, "little")


def decode(data: bytes) -> str | None:
    """The conversation id an identity names, or None (zeros, torn, or not an identity)."""
    if len(data) < len(MAGIC) + 1 or data[: len(MAGIC)] != MAGIC:
        return None
    n = data[len(MAGIC)]
    end = len(MAGIC) + 1 + n
    if not 1 <= n <= _LONGEST_ID or len(data) < end + 8:
        return None
    if xxhash.xxh3_64_intdigest(data[:end]) != int.from_bytes(data[end : end + 8], "little"):
        return None
    try:
        ident = data[len(MAGIC) + 1 : end].decode("ascii")
    except UnicodeDecodeError:
        return None
    return ident if layout.decode_name(layout.encode_name(ident)) == ident else None


def segment_identity(data: bytes) -> str | None:
    """The conversation a first segment's leading bytes name by an identity record, or None.

    ``data``: the segment's bytes from offset 0 (at least the header and the
    record at offset 40). The identity is valid when the header is valid with
    base seq 0 and the record at offset 40 is a valid identity record of that
    header's salt naming a valid conversation id.
    """
    header = frame.decode_segment_header(data)
    at = frame.SEGMENT_HEADER_SIZE
    if header is None or header.base_seq != 0 or len(data) < at + frame.RECORD_HEADER_SIZE:
        return None
    h = frame.decode_record_header(data, at)
    if h.kind != frame.KIND_IDENTITY or not frame.plausible(h) or h.first_seq != 0 or at + h.size > len(data):
        return None
    if not frame.checksum_ok(data, at, h, header.salt):
        return None
    return frame.identity_of(data[at + frame.RECORD_HEADER_SIZE : at + frame.RECORD_HEADER_SIZE + h.body_len])


def _pread_file(path: str, n: int) -> bytes | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        return os.pread(fd, n, 0)
    except OSError:
        return None
    finally:
        os.close(fd)


def read_identity(entry: str) -> str | None:
    """The identity in the directory ``entry`` (its first segment's identity record, else its lock file's), or None."""
    head = _pread_file(os.path.join(entry, layout.segment_name(0)), _HEAD_BYTES)
    ident = segment_identity(head) if head else None
    if ident is not None:
        return ident
    lock = _pread_file(os.path.join(entry, layout.LOCK_FILE), LOCK_BYTES)
    return decode(lock) if lock else None


def holds_identity(lock_fd: int, seg_fd: int) -> bool:
    """Whether an entry open as these descriptors holds an identity (a claim a power cut moved back)."""
    return segment_identity(os.pread(seg_fd, _HEAD_BYTES, 0)) is not None or decode(
        os.pread(lock_fd, LOCK_BYTES, 0)
    ) is not None


class Unmoved(NamedTuple):
    """A directory holding a claimed conversation, away from its place."""

    path: str
    conversation_id: str


#: What becomes of a claimed entry not moved (:func:`fate`).
MOVE, OLD_NAME, CONFLICT = "move", "old-name", "conflict"


def fate(site_path: str, u: Unmoved) -> str:
    """:data:`MOVE` (its conversation has no directory), :data:`OLD_NAME` (it has one holding this
    identity: the entry is that directory's old name) or :data:`CONFLICT` (it has another)."""
    target = _place(site_path, u.conversation_id)
    if not os.path.lexists(target):
        return MOVE
    return OLD_NAME if read_identity(target) == u.conversation_id else CONFLICT


def _children(path: str) -> list[str]:
    try:
        with os.scandir(path) as it:
            return [e.path for e in it if e.is_dir(follow_symlinks=False)]
    except (FileNotFoundError, NotADirectoryError):
        return []


def _candidates(site_path: str) -> Iterator[str]:
    """Every directory a power cut can have left a claimed entry in.

    ``pool/e-*`` (its rename undone), and below a spare whose rename into place
    was undone while the claim's rename into it was not: ``c/.spare/<x>/<conv>``
    (``<x>`` a ``<bb>`` or its spare) and ``c/<aa>/.spare/<conv>``.
    """
    pool = layout.pool_dir(site_path)
    for p in _children(pool):
        if os.path.basename(p).startswith(layout.POOL_READY_PREFIX):
            yield p
    cdir = os.path.join(site_path, layout.CONVERSATIONS_DIR)
    top = os.path.join(cdir, layout.SPARE_DIR)
    for x in _children(top):
        yield from _children(x)
    for a in _children(cdir):
        if os.path.basename(a) != layout.SPARE_DIR:
            yield from _children(os.path.join(a, layout.SPARE_DIR))


def unmoved(site_path: str) -> list[Unmoved]:
    """The claimed entries of the site directory ``site_path`` that are not at their conversation's place."""
    out = []
    for path in _candidates(site_path):
        ident = read_identity(path)
        if ident is not None and path != _place(site_path, ident):
            out.append(Unmoved(path, ident))
    return out


def holds_claim(spare: str) -> bool:
    """Whether a directory at or below the spare ``spare`` (two levels) holds an identity."""
    return any(read_identity(p) is not None for x in _children(spare) for p in [x, *_children(x)])


def _place(site_path: str, conversation_id: str) -> str:
    a, b = layout.fanout(conversation_id)
    return os.path.join(site_path, layout.CONVERSATIONS_DIR, a, b, layout.encode_name(conversation_id))


def finish(site_path: str) -> tuple[list[Unmoved], list[Unmoved]]:
    """Move every claimed entry not in place to its conversation's directory, durably; (done, left).

    Done: moved, or removed as the old name of its conversation's directory.

    Caller holds the site's lock shared. Each move holds the entry's lock
    exclusively (an entry another process holds is left for it), makes the
    missing fan-out directories (``mkdir``), renames the entry without
    replacing anything, and syncs the directories it changed before the next.
    Left: an entry whose conversation has another directory (:data:`CONFLICT`),
    or that could not be locked.
    """
    moved: list[Unmoved] = []
    left: list[Unmoved] = []
    sites = os.path.dirname(site_path)
    for u in unmoved(site_path):
        target = _place(site_path, u.conversation_id)
        try:
            fd = os.open(os.path.join(u.path, layout.LOCK_FILE), os.O_RDWR | os.O_NOFOLLOW)
        except OSError:
            continue
        try:
            if not fileio.try_lock(fd, True) or read_identity(u.path) != u.conversation_id:
                left.append(u)
                continue
            what = fate(site_path, u)
            if what == OLD_NAME:
                fileio.remove_tree(u.path)
                fileio.fsync_dir(os.path.dirname(u.path))
                moved.append(u)
                continue
            if what == CONFLICT:
                left.append(u)
                continue
            parent = os.path.dirname(target)
            fileio.make_dirs(parent)
            try:
                fileio.rename_noreplace(u.path, target)
            except FileExistsError:
                left.append(u)
                continue
            chain, linked = fileio.dir_chain(parent, sites)
            fileio.sync_all([], [*chain, os.path.dirname(u.path)])
            fileio.mark_durable(linked)
            moved.append(u)
        finally:
            os.close(fd)
    return moved, left


def settled_here(site_path: str) -> bool:
    """Whether a process of this boot finished every move of the site (``pool/settled``)."""
    try:
        fd = os.open(os.path.join(layout.pool_dir(site_path), SETTLED_FILE), os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        return os.pread(fd, 128, 0).decode("ascii", "replace").strip() == bootid.boot_id
    except OSError:
        return False
    finally:
        os.close(fd)


def settle_site(site_path: str) -> None:
    """Finish the site's unmoved claims unless a process of this boot did (caller holds the site's lock shared)."""
    pool = layout.pool_dir(site_path)
    if not os.path.isdir(pool) or settled_here(site_path):
        return
    _moved, left = finish(site_path)
    if left:
        return  # looked for again by the next process (and reported by fsck)
    tmp = os.path.join(pool, f"{SETTLED_FILE}.tmp.{os.getpid()}")
    try:
        fd = fileio.open_create(tmp, os.O_WRONLY | os.O_TRUNC)
        try:
            fileio.pwrite_all(fd, (bootid.boot_id + "\n").encode("ascii"), 0)
        finally:
            os.close(fd)
        fileio.rename(tmp, os.path.join(pool, SETTLED_FILE))
    except OSError:
        pass  # only costs the next process the search
