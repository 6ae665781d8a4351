"""Symbolic links under the data directory are refused, never followed.

Invariant (FORMAT.md, section 1): the engine follows no symbolic link at or
below its data directory, for conversations and long-term memories alike. A
link planted there could make one tenant's directory serve (or receive)
another's data, write memory text outside the data directory, or hand the
store a secret of someone else's choosing.

Two means, used together: :func:`refuse_symlinks` checks a directory's path
from the data directory down and the entries in it, when a site,
conversation or memory store is first opened (and again when its files are
replaced); :func:`open_nofollow` opens a file with ``O_NOFOLLOW``, so the
last component is never a link even if one appears after the check. Each
refusal is :class:`Unavailable` naming the link relative to the data
directory.
"""

from __future__ import annotations

import errno
import os
import stat

from . import layout
from .errors import Unavailable


def symlink_refused(root: str, path: str) -> Unavailable:
    """The error for a symbolic link found at ``path`` below the data directory ``root``."""
    rel = os.path.relpath(path, root)
    return Unavailable(
        f"{rel} in the data directory is a symbolic link; the store refuses symbolic links under its data "
        "directory (replace it with the real directory or file; `convmem fsck` lists them)"
    )


def refuse_symlinks(root: str, path: str, checked: str | None = None) -> str | None:
    """Raise Unavailable when ``path``, a directory between ``root`` and it, or an entry in it is a symlink.

    Returns the first directory on the way (``path`` itself at the most)
    found missing, if any: nothing below it is there to check. ``checked``
    is a prefix of ``path`` already checked (its components are skipped).
    ``root`` itself is not looked at: ``serve`` refuses a linked data
    directory before the store opens (:func:`logstore.maintenance.unsafe_data_dir`).
    """
    # Each directory from there down, by its prefix of ``path`` (no relpath/join per part).
    end = len(root if checked is None else checked)
    while end < len(path):
        end = path.find(os.sep, end + 1)
        if end < 0:
            end = len(path)
        current = path[:end]
        try:
            if stat.S_ISLNK(os.lstat(current).st_mode):
                raise symlink_refused(root, current)
        except FileNotFoundError:
            return current
    try:
        with os.scandir(path) as entries:
            for entry in entries:
                if entry.is_symlink():
                    raise symlink_refused(root, entry.path)
    except FileNotFoundError:
        return path
    except NotADirectoryError:
        pass
    return None


def open_nofollow(path: str, flags: int, mode: int = 0o600) -> int:
    """``os.open`` with ``O_NOFOLLOW``: a symbolic link at ``path`` raises Unavailable instead of being opened."""
    try:
        return os.open(path, flags | os.O_NOFOLLOW, mode)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise symlink_refused(data_root_of(path), path) from None
        raise


def read_nofollow(path: str) -> bytes:
    """The bytes of the file ``path``, opened with :func:`open_nofollow` (a link raises Unavailable)."""
    fd = open_nofollow(path, os.O_RDONLY)
    try:
        chunks = []
        while chunk := os.read(fd, 1 << 16):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def data_root_of(path: str) -> str:
    """The data directory above ``path`` (a path below its ``sites/``, or a file directly in it)."""
    marker = os.sep + layout.SITES_DIR + os.sep
    cut = path.rfind(marker)
    return path[:cut] if cut >= 0 else os.path.dirname(path)
