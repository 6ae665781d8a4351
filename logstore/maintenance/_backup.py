"""Online backup: a consistent copy of a live data directory, taken without stopping writers.

What "consistent" means here: every conversation in the copy is a prefix of
whole batches that the conversation held at one moment during the backup
(its own moment: conversations are copied one after another, not all at the
same instant). Nothing that was not written whole is copied, and nothing
acknowledged before the backup began is missing.

How (the engine's own rules, FORMAT.md sections 6 and 7):

1. For each conversation, its file list and segment sizes are read while its
   ``lock`` is held *shared*, which no append can hold at the same time. The
   bytes below those sizes never change afterwards (sealed segments never
   change at all; the active one only grows), so they are copied with no lock
   held, and writers continue meanwhile.
2. The one exception: a torn tail (a crashed writer's partial record) can be
   cut and overwritten by the next writer while it is being copied. So the
   last copied segment is verified; if it shows any damage, the
   conversation is copied again while holding its lock shared. Damage that
   is still there then is in the source itself and is reported.
3. Index files and site manifests are derived data and are not copied: the
   copy gets fresh ones from :func:`check` with ``repair``, which also cuts a
   torn tail (never acknowledged) off a copied segment.
4. ``logstore.json``, ``auth/`` (the site credentials) and ``quarantine/``
   are copied as files. Per-site data stores beside the conversations (for
   example a site's ``memories/`` directory) are copied by the
   :class:`BackupExtra` copiers the caller passes, and files such a store
   keeps at the top of the data directory by their root copiers (run after
   all sites). ``extras`` is a required argument, so a library caller decides
   what is copied beside the conversations rather than leaving it out by
   accident; the long-term memory store's copier is
   ``convmem.logstore.memories.backup.MEMORY_BACKUP``.

The copy is built in ``DEST.partial-<pid>`` next to ``DEST``, synced, checked,
and only then renamed to ``DEST``: a ``DEST`` that exists is complete.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from .. import fileio, layout
from ._check import check
from ._files import _flocked, _open_ro, _require_data_dir, _snapshot, iter_conversations, list_sites
from ._records import scan_segment
from ._types import QUARANTINE_DIR, CheckReport, MaintenanceError

AUTH_DIR = "auth"

#: A copier's arguments: (source directory, destination directory, lock_timeout).
Copier = Callable[[str, str, float], None]


@dataclass(frozen=True)
class BackupExtra:
    """How to copy a store that keeps its data beside the conversations.

    ``site`` copies one site's data (source site directory, destination site
    directory); ``root`` copies what the store keeps at the top of the data
    directory, after every site was copied. Each must make its copy
    consistent by the store's own locking rules.
    """

    site: Copier | None = None
    root: Copier | None = None


@dataclass
class BackupReport:
    """What :func:`backup` copied, and the check of the copy."""

    dest: str
    sites: int = 0
    conversations: int = 0
    segments: int = 0
    bytes_copied: int = 0
    #: Conversations copied a second time under their lock (their tail was changing).
    recopied: int = 0
    #: The verification of the finished copy (after repair of derived data and torn tails).
    check: CheckReport = field(default_factory=CheckReport)
    #: Repairs made to the copy: torn tails cut, indexes and manifests rebuilt.
    repaired: int = 0


def _copy_prefix(src: str, dst: str, length: int) -> int:
    """Copy the first ``length`` bytes of ``src`` to a new file ``dst`` (mode 0600), synced; bytes copied."""
    done = fileio.copy_prefix(src, dst, length)
    with _open_ro(dst) as fd:
        fileio.fsync(fd)
    return done


def _copy_file(src: str, dst: str) -> int:
    """Copy a whole file to ``dst`` (mode 0600), synced; bytes copied."""
    done = fileio.copy_file(src, dst)
    with _open_ro(dst) as fd:
        fileio.fsync(fd)
    return done


def _copy_tree(src: str, dst: str) -> int:
    """Copy a directory of plain files (recursively); bytes copied. Symlinks are not followed."""
    total = 0
    fileio.makedirs(dst)
    for entry in sorted(os.scandir(src), key=lambda e: e.name):
        target = os.path.join(dst, entry.name)
        if entry.is_dir(follow_symlinks=False):
            total += _copy_tree(entry.path, target)
        elif entry.is_file(follow_symlinks=False):
            with contextlib.suppress(FileNotFoundError):  # replaced or removed meanwhile
                total += _copy_file(entry.path, target)
    fileio.fsync_dir(dst)
    return total


def _tail_damaged(path: str) -> bool:
    _, records = scan_segment(path, payloads=False)
    return any(r.kind == "damaged" for r in records)


def _copy_conversation(src_dir: str, dst_dir: str, lock_timeout: float, report: BackupReport) -> None:
    lock = os.path.join(src_dir, layout.LOCK_FILE)
    with _flocked(lock, False, lock_timeout, create=False):
        snap = _snapshot(src_dir)
    if snap is None or not snap.segments:
        return
    fileio.makedirs(dst_dir)

    def copy_all(segments: list[tuple[int, int]]) -> tuple[int, str]:
        copied, last = 0, ""
        for base, size in segments:
            last = os.path.join(dst_dir, layout.segment_name(base))
            copied += _copy_prefix(os.path.join(src_dir, layout.segment_name(base)), last, size)
        return copied, last

    copied, last = copy_all(snap.segments)
    if _tail_damaged(last):
        # Possibly a torn tail that a writer cut and overwrote while we read it: copy again,
        # this time with writers held off. Whatever damage remains is in the source.
        for name in os.listdir(dst_dir):
            fileio.unlink(os.path.join(dst_dir, name))
        with _flocked(lock, False, lock_timeout, create=False):
            snap = _snapshot(src_dir)
            if snap is None or not snap.segments:
                fileio.remove_tree(dst_dir)
                return
            copied, last = copy_all(snap.segments)
        report.recopied += 1
    os.close(fileio.open_create(os.path.join(dst_dir, layout.LOCK_FILE), os.O_WRONLY))
    fileio.fsync_dir(dst_dir)
    report.conversations += 1
    report.segments += len(snap.segments)
    report.bytes_copied += copied


def _fsync_dirs(top: str, *, files: bool = False) -> None:
    """Sync every directory under ``top`` (deepest first), and with ``files`` every file's data before."""
    for dirpath, _dirnames, filenames in os.walk(top, topdown=False):
        if files:
            for name in filenames:
                with _open_ro(os.path.join(dirpath, name)) as fd:
                    fileio.fsync(fd)
        fileio.fsync_dir(dirpath)


def backup(
    data_dir: str | os.PathLike[str],
    dest: str | os.PathLike[str],
    *,
    lock_timeout: float = 30.0,
    progress: Callable[[int], None] | None = None,
    extras: Sequence[BackupExtra],
) -> BackupReport:
    """Copy the live data directory ``data_dir`` to the new directory ``dest`` (see the module docstring).

    ``progress`` is called with the number of conversations copied so far.
    Raises :class:`MaintenanceError` when ``data_dir`` is not a data directory
    or ``dest`` already exists, and OSError when copying fails (the partial
    copy is then removed).
    """
    root = os.path.abspath(os.fspath(data_dir))
    target = os.path.abspath(os.fspath(dest))
    _require_data_dir(root)
    if os.path.lexists(target):
        raise MaintenanceError(f"{target} already exists; a backup goes into a new directory")
    if target == root or target.startswith(root + os.sep):
        raise MaintenanceError(f"{target} lies inside the data directory {root}; choose a place outside it")
    parent = os.path.dirname(target)
    if not os.path.isdir(parent):
        raise MaintenanceError(f"{parent} does not exist")
    work = f"{target}.partial-{os.getpid()}"
    report = BackupReport(dest=target)
    fileio.mkdir(work)
    try:
        _copy_file(os.path.join(root, layout.MARKER_FILE), os.path.join(work, layout.MARKER_FILE))
        for name in (AUTH_DIR, QUARANTINE_DIR):
            if os.path.isdir(os.path.join(root, name)):
                report.bytes_copied += _copy_tree(os.path.join(root, name), os.path.join(work, name))
        for site in list_sites(root):
            report.sites += 1
            dst_site = layout.site_dir(work, site)
            fileio.makedirs(dst_site)
            for cid, cdir in iter_conversations(root, site):
                # At its place in the copy, also when read from a claimed pool entry not moved.
                dst = layout.conversation_dir(work, site, cid)
                home = layout.conversation_dir(root, site, cid)
                try:
                    _copy_conversation(cdir, dst, lock_timeout, report)
                except FileNotFoundError:
                    if os.path.isdir(cdir):
                        raise
                    fileio.remove_tree(dst, ignore_errors=True)  # deleted (its site removed) while we copied it
                    if cdir != home and os.path.isdir(home):  # an engine moved the claimed entry into place
                        _copy_conversation(home, dst, lock_timeout, report)
                if progress is not None:
                    progress(report.conversations)
            for extra in extras:
                if extra.site is not None:
                    extra.site(layout.site_dir(root, site), dst_site, lock_timeout)
        for extra in extras:
            if extra.root is not None:
                extra.root(root, work, lock_timeout)
        _fsync_dirs(work)
        repaired = check(work, repair=True, lock_timeout=lock_timeout)
        report.repaired = sum(1 for p in repaired.problems if p.repaired)
        report.check = check(work, lock_timeout=lock_timeout)
        # The repair wrote indexes and manifests as derived data, unsynced: all of it is made
        # durable before the rename publishes the copy, so a published copy checks clean.
        _fsync_dirs(work, files=True)
        fileio.rename(work, target)
        fileio.fsync_dir(parent)
    except BaseException:
        fileio.remove_tree(work, ignore_errors=True)
        raise
    return report
