"""Online backup of long-term memories: the copiers :func:`logstore.maintenance.backup` runs.

:data:`MEMORY_BACKUP` holds two copiers, passed to the backup by its caller:

* :func:`copy_site_memories`, per site: a site's ``memories/``
  directory, copied whole while the store's own ``lock`` is held *shared*.
  Every write (append, torn-tail cut, erasure rewrite, used-token record)
  holds that lock exclusively, so the copy is the store as it stood at one
  moment. Copied: the event log, the used-token log (a token used before the
  backup stays used in the copy) and the access-time side file; not the
  ``lock`` (made fresh), nor the search index (rebuilt on open), nor temporary
  files of interrupted writes. A torn tail in the copied log (a writer that
  crashed mid-record; never acknowledged) is cut from the copy.
* :func:`copy_token_secret`, once: the data directory's
  verify-token secret, so the copy accepts tokens the source minted. It runs
  after every site was copied; the secret is created (atomically, once) before
  any token can be minted and never changes, so a copy holding memories
  always gets the secret they were written with.
"""

from __future__ import annotations

import os

from .. import fileio
from ..errors import Corrupted
from ..maintenance import BackupExtra
from .check import site_lock
from .eventlog import salvage
from .site import LOCK_NAME, LOG_NAME, MEMORIES_DIR
from .tokens import SECRET_FILE, USED_FILE

#: The files of a memories directory a backup carries (the rest is derived or transient).
_COPIED = (LOG_NAME, USED_FILE, "access.json")


def _copy_synced(src: str, dst: str) -> None:
    fileio.copy_file(src, dst)
    fd = os.open(dst, os.O_RDONLY)
    try:
        fileio.fsync(fd)
    finally:
        os.close(fd)


def copy_site_memories(src_site: str, dst_site: str, lock_timeout: float) -> None:
    """Copy a site's memory store consistently (its lock held shared), if it has one."""
    src = os.path.join(src_site, MEMORIES_DIR)
    if not os.path.isdir(src):
        return
    dst = os.path.join(dst_site, MEMORIES_DIR)
    fileio.makedirs(dst)
    try:
        with site_lock(src, False, lock_timeout):
            for name in _COPIED:
                try:
                    _copy_synced(os.path.join(src, name), os.path.join(dst, name))
                except FileNotFoundError:
                    continue
    except FileNotFoundError:
        if os.path.isdir(src):
            raise
        fileio.remove_tree(dst, ignore_errors=True)  # the site was removed while we copied it
        return
    log = os.path.join(dst, LOG_NAME)
    if os.path.exists(log):
        try:
            _events, _damaged, torn = salvage(log)
        except Corrupted:
            torn = None  # a bad header is in the source too: fsck of the copy reports it
        if torn is not None:
            fd = os.open(log, os.O_RDWR)
            try:
                fileio.truncate(fd, torn)
            finally:
                os.close(fd)
    os.close(fileio.open_create(os.path.join(dst, LOCK_NAME), os.O_WRONLY))
    fileio.fsync_dir(dst)


def copy_token_secret(src_root: str, dst_root: str, lock_timeout: float) -> None:
    """Copy the verify-token secret (when the source has one)."""
    try:
        _copy_synced(os.path.join(src_root, SECRET_FILE), os.path.join(dst_root, SECRET_FILE))
    except FileNotFoundError:
        return
    fileio.fsync_dir(dst_root)


#: What :func:`convmem.logstore.maintenance.backup` needs to copy long-term memories.
MEMORY_BACKUP = BackupExtra(site=copy_site_memories, root=copy_token_secret)
