"""Deleting a site's memories as a whole: what ``convmem site remove`` does to them.

A site's memories live in ``sites/<site-hex>/memories`` of the data
directory, also when its conversations are in PostgreSQL. Removing a site
must cover them as it covers conversations: refused without ``--force``
while any are held, and with it gone from disk, nothing left behind.
"""

from __future__ import annotations

import os
import time

from .. import fileio, layout
from .check import site_lock, stats
from .site import memories_dir


def memories_held(root: str, site: str) -> int:
    """How many memories (active and soft-deleted) ``site`` holds in the data directory ``root``.

    A log too damaged to count is taken to hold at least one: it may hold content.
    """
    found = stats(root, site)
    if not found:
        return 0
    s = found[0]
    return max(s.active + s.deleted, 1 if s.error is not None else 0)


def drop_memories(root: str, site: str, lock_timeout: float = 5.0) -> bool:
    """Delete every memory of ``site`` (its whole memories directory), durably; False when it had none.

    Taken under the site's exclusive memory lock, so no writer of another
    process is midway; the directory is renamed out of the site first, so a
    crash leaves either all of it or a ``.dropped-`` directory that the next
    drop or ``fsck`` removes, never part of a site.
    """
    directory = memories_dir(root, site)
    if os.path.islink(directory):  # a planted link: remove the link, never what it points to
        fileio.unlink(directory)
        fileio.fsync_dir(os.path.dirname(directory))
        return True
    if not os.path.isdir(directory):
        return False
    trash = os.path.join(root, layout.SITES_DIR, f".dropped-memories-{os.getpid()}-{time.time_ns()}")
    with site_lock(directory, exclusive=True, timeout=lock_timeout):
        fileio.rename(directory, trash)
        fileio.fsync_dir(os.path.dirname(directory))
    fileio.remove_tree(trash)
    fileio.fsync_dir(os.path.dirname(trash))
    return True
