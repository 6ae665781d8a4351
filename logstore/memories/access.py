"""last_accessed_at: kept in memory, written to a side file now and then, never fsynced.

Reads must not pay an fsync each, so access times are not events in the log.
They live in ``access.json`` (``{memory_id: microseconds}``) beside the log,
replaced by write-to-temp-and-rename at most every few seconds and on close,
merged with what other processes wrote (the later time wins). Losing the last
few seconds of access times in a crash is accepted: they are a hint for
ranking and housekeeping, not acknowledged data. The file holds ids and
times only, never memory content.
"""

from __future__ import annotations

import contextlib
import os

import msgspec

from .. import fileio, links
from ..errors import Unavailable

ACCESS_FILE = "access.json"
#: Seconds between two writes of the side file by one process.
FLUSH_INTERVAL_S = 5.0

_decoder = msgspec.json.Decoder(type=dict[str, int])


def read_access(directory: str) -> dict[str, int]:
    try:
        return _decoder.decode(links.read_nofollow(os.path.join(directory, ACCESS_FILE)))
    except (FileNotFoundError, msgspec.DecodeError, ValueError, Unavailable):
        # Derived data: a missing or damaged file only loses access times, and a symbolic link
        # there is not followed: the next write replaces the link itself (never what it points to).
        return {}


def write_access(directory: str, times: dict[str, int], keep: set[str]) -> None:
    """Merge ``times`` into the side file, keeping only ids in ``keep`` (no fsync)."""
    merged = {k: v for k, v in read_access(directory).items() if k in keep}
    for k, v in times.items():
        if k in keep and v > merged.get(k, 0):
            merged[k] = v
    path = os.path.join(directory, ACCESS_FILE)
    tmp = f"{path}.tmp.{os.getpid()}"
    try:
        fileio.write_file(tmp, msgspec.json.encode(merged))
        fileio.rename(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            fileio.unlink(tmp)
