"""Access checks of a data directory: modes other users could exploit, and symbolic links.

The engine creates every directory 0700 and every file 0600 and never follows
a symbolic link below the data directory (FORMAT.md). A directory made by an
older version, copied with other modes, or edited by hand may break that;
:func:`check_access` lists where, without changing anything.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from typing import Literal

AccessKind = Literal["LOOSE_PERMISSIONS", "SYMLINK"]

#: Permission bits that give someone other than the owner access.
_OTHERS = stat.S_IRWXG | stat.S_IRWXO


@dataclass(frozen=True)
class AccessFinding:
    """One path (relative to the data directory, "." for itself) that breaks the access rules."""

    kind: AccessKind
    path: str
    mode: int

    def describe(self) -> str:
        if self.kind == "SYMLINK":
            return f"{self.path} is a symbolic link; the store refuses to follow links under its data directory"
        return (
            f"{self.path} has mode {self.mode:04o}: other local users can reach tenant data "
            f"(fix with chmod -R go-rwx on the data directory)"
        )


def check_access(data_dir: str) -> list[AccessFinding]:
    """Every loose mode and symbolic link at or below ``data_dir``, in walk order (links are not followed)."""
    root = os.path.abspath(data_dir)
    findings: list[AccessFinding] = []

    def look(path: str, st: os.stat_result) -> None:
        rel = os.path.relpath(path, root)
        if stat.S_ISLNK(st.st_mode):
            findings.append(AccessFinding("SYMLINK", rel, stat.S_IMODE(st.st_mode)))
        elif st.st_mode & _OTHERS:
            findings.append(AccessFinding("LOOSE_PERMISSIONS", rel, stat.S_IMODE(st.st_mode)))

    look(root, os.stat(root))
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for name in sorted(dirnames) + sorted(filenames):
            path = os.path.join(dirpath, name)
            try:
                look(path, os.lstat(path))
            except FileNotFoundError:
                continue  # removed while we walked (a live directory)
        dirnames.sort()
    return findings


def unsafe_data_dir(data_dir: str) -> str | None:
    """Why a server must not use ``data_dir``, naming the fix; None when it may.

    Refused: a data directory that is itself a symbolic link (everything below
    it would be reached through the link, which another user may redirect), one
    that is not a directory, and one writable by group or others (anyone who
    may write there can plant links, replace files or delete tenants' data).
    Readable modes are left to ``fsck``'s warnings: the files below are 0600.
    """
    path = os.path.abspath(data_dir)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return f"data directory {path} does not exist"
    if stat.S_ISLNK(st.st_mode):
        real = os.path.realpath(path)
        return (
            f"data directory {path} is a symbolic link (to {real}); the store follows no link under or to its "
            f"data directory: serve the real directory instead (--data-dir \"$(realpath {path})\", here {real})"
        )
    if not stat.S_ISDIR(st.st_mode):
        return f"data directory {path} is not a directory"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return (
            f"data directory {path} has mode {stat.S_IMODE(st.st_mode):04o}: group or others may write into it "
            f"and so plant links or delete tenants' data; fix with chmod 700 {path} (or chmod go-w {path})"
        )
    return None
