"""Long-term memory: small durable facts per site, written verify-first, found by search.

The conversation logs of :mod:`logstore` are working memory; this package
keeps the other kind. Each site's memories are an event log in logstore's
segment format (see FORMAT.md, "Long-term memory event log"), the current
state is rebuilt from it, and the search index (``retrieval``) is derived
data. Entry point: :class:`LongTermMemory`, one backend of :class:`LongTermStore`
(the other is ``logstore.postgres.PgLongTermMemory``).
"""

from __future__ import annotations

from . import limits
from .errors import (
    DuplicateMemory,
    InvalidMemory,
    LooksLikeSecret,
    MemoryStoreFull,
    NotFound,
    VerifyRequired,
    VersionConflict,
)
from .interface import LongTermStore, StoredMemory
from .record import WRITABLE_FIELDS, Fields, Memory, is_memory_id, new_memory_id, parse_fields
from .sqlite_statistics import turn_off_sqlite_statistics
from .store import LongTermMemory

__all__ = [
    "WRITABLE_FIELDS",
    "DuplicateMemory",
    "Fields",
    "InvalidMemory",
    "LongTermMemory",
    "LongTermStore",
    "LooksLikeSecret",
    "Memory",
    "MemoryStoreFull",
    "NotFound",
    "StoredMemory",
    "VerifyRequired",
    "VersionConflict",
    "is_memory_id",
    "limits",
    "new_memory_id",
    "parse_fields",
    "turn_off_sqlite_statistics",
]
