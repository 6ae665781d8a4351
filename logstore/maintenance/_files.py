"""Files and locks: data-directory walking, conversation snapshots under the engine's flock."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass

import msgspec

from .. import fileio, layout, lease, manifestfiles, poolclaims
from ..errors import StoreError
from ..frame import SEGMENT_HEADER_SIZE
from ..ids import CONVERSATION_ID_RULE, SITE_NAME_RULE, ConversationId, SiteName
from ..incarnation import RETIRED_ID_FILE, SITE_ID_FILE
from ..segment import data_end
from ._types import (
    MISPLACED_CONVERSATION,
    STRAY_FILE,
    MaintenanceError,
    Problem,
)


def _pread_range(fd: int, start: int, end: int) -> bytes:
    """Bytes ``[start, end)`` of a file (fewer if it has shrunk), in few preads."""
    parts: list[bytes] = []
    pos = start
    while pos < end:
        chunk = os.pread(fd, min(end - pos, 1 << 30), pos)
        if not chunk:
            break
        parts.append(chunk)
        pos += len(chunk)
    return parts[0] if len(parts) == 1 else b"".join(parts)


@contextlib.contextmanager
def _open_ro(path: str) -> Iterator[int]:
    fd = os.open(path, os.O_RDONLY)
    try:
        yield fd
    finally:
        os.close(fd)


@contextlib.contextmanager
def _flocked(path: str, exclusive: bool, timeout: float, create: bool) -> Iterator[None]:
    """Hold ``flock`` on ``path`` (as the engine does); without ``create`` a missing file means no lock."""
    try:
        fd = fileio.open_create(path) if create else os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        yield
        return
    try:
        started = time.monotonic()
        # Knocking while it waits: an engine keeping the lock as a lease lets it go (logstore.lease).
        lease.wait_lock(lambda: fileio.try_lock(fd, exclusive), fd, started + timeout, started)
        try:
            yield
        finally:
            fileio.unlock(fd)
    finally:
        os.close(fd)


@dataclass
class _ConvSnapshot:
    """A conversation directory as it stood under its lock."""

    path: str
    names: list[str]
    #: (base seq, size), ascending. The last segment's size is its data end: the
    #: preallocated zeros after its records are not part of the log (FORMAT.md).
    segments: list[tuple[int, int]]
    indexes: dict[int, bytes]  # base seq -> index file bytes


def _snapshot(path: str) -> _ConvSnapshot | None:
    try:
        names = sorted(os.listdir(path))
    except FileNotFoundError:
        return None
    segments: list[tuple[int, int]] = []
    indexes: dict[int, bytes] = {}
    for name in names:
        base = layout.parse_segment_name(name)
        try:
            if base is not None:
                segments.append((base, os.stat(os.path.join(path, name)).st_size))
            elif len(name) == 24 and name.endswith(layout.INDEX_SUFFIX) and name[:20].isdigit():
                with open(os.path.join(path, name), "rb") as f:
                    indexes[int(name[:20])] = f.read()
        except FileNotFoundError:
            continue
    if segments:
        base, size = segments[-1]
        try:
            with _open_ro(os.path.join(path, layout.segment_name(base))) as fd:
                segments[-1] = (base, data_end(fd, min(size, SEGMENT_HEADER_SIZE), size))
        except FileNotFoundError:
            pass
    return _ConvSnapshot(path, names, segments, indexes)


def _replace_with_prefix(path: str, fd: int, length: int) -> None:
    """Replace the file at ``path`` (open as ``fd``) with a new file holding its first ``length`` bytes.

    Written as the engine creates a segment: ``<name>.tmp``, synced, renamed
    into place, directory synced.
    """
    prefix = _pread_range(fd, 0, length)
    tmp = path + ".tmp"
    out = fileio.open_create(tmp, os.O_WRONLY | os.O_TRUNC)
    try:
        fileio.pwrite_all(out, prefix, 0)
        fileio.fdatasync(out)
    finally:
        os.close(out)
    fileio.rename(tmp, path)
    fileio.fsync_dir(os.path.dirname(path))


@contextlib.contextmanager
def _open_rw(path: str) -> Iterator[int]:
    fd = os.open(path, os.O_RDWR)
    try:
        yield fd
    finally:
        os.close(fd)


def _require_data_dir(root: str) -> None:
    marker = os.path.join(root, layout.MARKER_FILE)
    try:
        with open(marker, "rb") as f:
            info = msgspec.json.decode(f.read())
    except FileNotFoundError:
        raise MaintenanceError(f"{root} is not a logstore data directory (no {layout.MARKER_FILE})") from None
    except (OSError, msgspec.DecodeError) as exc:
        raise MaintenanceError(f"cannot read {marker}: {exc}") from exc
    if (
        not isinstance(info, dict)
        or info.get("format") != layout.FORMAT_NAME
        or type(info.get("version")) is not int
        or info.get("version") not in layout.READABLE_VERSIONS
    ):
        raise MaintenanceError(f"{marker} names an unknown format: {info!r}")
    if not os.access(root, os.R_OK | os.X_OK):
        raise MaintenanceError(f"{root} is not readable")


def _valid_id(value: str, kind: type[str]) -> bool:
    try:
        kind(value)
    except (StoreError, TypeError):
        return False
    return True


def list_sites(data_dir: str | os.PathLike[str]) -> list[str]:
    """Names of the sites in a data directory, sorted (raises MaintenanceError when it is not one)."""
    root = os.path.abspath(os.fspath(data_dir))
    _require_data_dir(root)
    names = (layout.decode_name(n) for n in _listdir(os.path.join(root, layout.SITES_DIR)))
    return sorted(n for n in names if n is not None and _valid_id(n, SiteName))


def _select_sites(root: str, site: str | None) -> list[str]:
    _require_data_dir(root)
    if site is None:
        return list_sites(root)
    if not _valid_id(site, SiteName):
        raise MaintenanceError(f"{site!r} is not a valid site name ({SITE_NAME_RULE})")
    if not os.path.isdir(layout.site_dir(root, site)):
        raise MaintenanceError(f"site {site!r} does not exist in {root}")
    return [site]


def _listdir(path: str) -> list[str]:
    try:
        return sorted(os.listdir(path))
    except (FileNotFoundError, NotADirectoryError):
        return []


def _is_hex2(name: str) -> bool:
    return len(name) == 2 and all(c in "0123456789abcdef" for c in name)


def iter_conversations(
    data_dir: str | os.PathLike[str], site: str, strays: list[Problem] | None = None
) -> Iterator[tuple[str, str]]:
    """``(conversation_id, directory)`` of every conversation directory of ``site``, in directory order.

    Names the engine does not create are appended to ``strays`` as problems.
    """
    root = os.path.abspath(os.fspath(data_dir))
    sdir = layout.site_dir(root, site)

    def stray(path: str, kind: str = STRAY_FILE, detail: str = "a file the engine does not create") -> None:
        if strays is not None:
            strays.append(
                Problem(
                    site,
                    None,
                    path,
                    None,
                    kind,
                    detail,
                    "none: not engine data; move it out of the data directory if it is not needed",
                )
            )

    for name in _listdir(sdir):
        # "memories": the site's long-term memories, checked by logstore.memories.check.
        # The pool (logstore.convpool) holds no conversation: nothing there was acknowledged.
        # site.id: the site's incarnation (logstore.incarnation); usage.acct: its quota account (logstore.quota).
        known = (
            manifestfiles.LOCK_FILE, layout.CONVERSATIONS_DIR, layout.POOL_DIR, "memories", SITE_ID_FILE, "usage.acct"
        )
        if name in known or name == RETIRED_ID_FILE or ".tmp" in name:
            continue
        stem, _, ext = name.partition(".")
        if stem.startswith("manifest-") and stem[9:].isdigit() and ext in ("snap", "log"):
            continue
        stray(os.path.join(sdir, name))
    cdir = os.path.join(sdir, layout.CONVERSATIONS_DIR)
    for a in _listdir(cdir):
        if a == layout.SPARE_DIR:
            continue  # an empty directory kept for the next new fan-out directory (logstore.convpool)
        if not _is_hex2(a) or not os.path.isdir(os.path.join(cdir, a)):
            stray(os.path.join(cdir, a))
            continue
        for b in _listdir(os.path.join(cdir, a)):
            if b == layout.SPARE_DIR:
                continue
            bdir = os.path.join(cdir, a, b)
            if not _is_hex2(b) or not os.path.isdir(bdir):
                stray(bdir)
                continue
            for name in _listdir(bdir):
                path = os.path.join(bdir, name)
                cid = layout.decode_name(name)
                if cid is None or not _valid_id(cid, ConversationId) or not os.path.isdir(path):
                    stray(path)
                elif layout.fanout(cid) != (a, b):
                    stray(
                        path,
                        MISPLACED_CONVERSATION,
                        f"conversation {cid!r} sits under {a}/{b}, the engine looks for it under "
                        f"{'/'.join(layout.fanout(cid))}, so its data is unreachable",
                    )
                else:
                    yield cid, path
    # Claimed pool entries a power cut moved back (FORMAT.md 6): each is its conversation's
    # directory until the engine moves it into place (unless the conversation has one already).
    for u in poolclaims.unmoved(sdir):
        if not os.path.lexists(layout.conversation_dir(root, site, u.conversation_id)):
            yield u.conversation_id, u.path


def _segment_bytes(conv_dir: str) -> int:
    total = 0
    try:
        with os.scandir(conv_dir) as it:
            for entry in it:
                if layout.parse_segment_name(entry.name) is not None:
                    with contextlib.suppress(FileNotFoundError):
                        total += entry.stat().st_size
    except FileNotFoundError:
        pass
    return total


def _has_segments(conv_dir: str) -> bool:
    return any(layout.parse_segment_name(n) is not None for n in _listdir(conv_dir))


def _committed_segments(conv_dir: str, lock_timeout: float) -> list[tuple[int, int]]:
    with _flocked(os.path.join(conv_dir, layout.LOCK_FILE), False, lock_timeout, create=False):
        snap = _snapshot(conv_dir)
    return [] if snap is None else snap.segments


def conversation_home(root: str, site: str, conversation_id: str) -> str:
    """The directory holding a conversation's files: its own path, or a claimed pool entry not moved.

    With no directory at its own path, a conversation whose first append a power
    cut moved back into the pool (FORMAT.md 6, "A first append in one sync") is
    read from that entry until an engine or ``fsck --repair`` moves it; its own
    path when neither exists.
    """
    path = layout.conversation_dir(root, site, conversation_id)
    if os.path.lexists(path):
        return path
    found = [u.path for u in poolclaims.unmoved(layout.site_dir(root, site)) if u.conversation_id == conversation_id]
    return found[0] if found else path


def committed_segments_at(root: str, site: str, conversation_id: str, conv_dir: str, lock_timeout: float
                          ) -> tuple[str, list[tuple[int, int]]]:
    """``(directory, its committed segments)``; from the conversation's home when ``conv_dir`` went meanwhile.

    An engine moving a claimed entry into place renames the whole directory: a
    reader that found it in the pool looks again at the conversation's place.
    """
    segs = _committed_segments(conv_dir, lock_timeout)
    if not segs and not os.path.isdir(conv_dir):
        home = conversation_home(root, site, conversation_id)
        if home != conv_dir:
            return home, _committed_segments(home, lock_timeout)
    return conv_dir, segs


@dataclass(frozen=True)
class ConversationFiles:
    """Where a conversation's files are, and what is there (``convmem locate``)."""

    site: str
    conversation_id: str
    directory: str
    exists: bool
    files: list[tuple[str, int]]  # (name, size in bytes), sorted by name


def locate_conversation(data_dir: str | os.PathLike[str], site: str, conversation_id: str) -> ConversationFiles:
    """The directory a conversation's files live in and the files in it (raises MaintenanceError on bad names)."""
    root = os.path.abspath(os.fspath(data_dir))
    _require_data_dir(root)
    if not _valid_id(site, SiteName):
        raise MaintenanceError(f"{site!r} is not a valid site name ({SITE_NAME_RULE})")
    if not _valid_id(conversation_id, ConversationId):
        raise MaintenanceError(f"{conversation_id!r} is not a valid conversation id ({CONVERSATION_ID_RULE})")
    path = conversation_home(root, site, conversation_id)
    files: list[tuple[str, int]] = []
    for name in _listdir(path):
        with contextlib.suppress(FileNotFoundError):
            files.append((name, os.stat(os.path.join(path, name)).st_size))
    return ConversationFiles(site, conversation_id, path, os.path.isdir(path), files)


def site_has_data(data_dir: str | os.PathLike[str], site: str) -> bool:
    """True when the data directory holds a directory for ``site`` (False for a site nothing was written to)."""
    root = os.path.abspath(os.fspath(data_dir))
    return _valid_id(site, SiteName) and os.path.isdir(layout.site_dir(root, site))
