"""Problem kinds, the report types and small shared definitions."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..timefmt import format_us, parse_rfc3339

#: Name of the folder, directly inside a data directory, that receives copies
#: of segments cut by ``truncate_at_corruption``.
QUARANTINE_DIR = "quarantine"


#: Names a data directory may hold at its top: the engine's, the quarantine,
#: and ``auth/``, which the MCP server keeps beside the engine's files, and the
#: long-term memories' token secret (checked by ``logstore.memories.check``).
_TOP_LEVEL_NAMES = frozenset({"logstore.json", "sites", QUARANTINE_DIR, "auth", "memory-token.key"})


#: FORMAT.md's index interval: one entry per this many bytes of segment.
INDEX_INTERVAL = 4096


# Problem kinds. Damage to acknowledged data (never repaired by --repair alone):
CORRUPT_RECORD = "corrupt-record"


BAD_SEGMENT_HEADER = "bad-segment-header"


SEQ_GAP = "seq-gap"


SEQ_MISMATCH = "seq-mismatch"


BAD_BATCH = "bad-batch"


RECORD_AFTER_SEAL = "record-after-seal"


RECORDED_AT_DECREASING = "recorded-at-decreasing"


UNSEALED_SEGMENT = "unsealed-segment"


MISPLACED_CONVERSATION = "misplaced-conversation"


#: The identity record at the start of a conversation's first segment names another conversation
#: (FORMAT.md 3, "Identity"). Reads are not affected (the engine reads the directory it was asked
#: for), but a power cut that moved such an entry back into the pool would settle it under the other
#: name: the conversation is best restored from a backup, or exported and imported again.
IDENTITY_MISMATCH = "identity-mismatch"


# Repairable without losing acknowledged data:
TORN_TAIL = "torn-tail"


#: A conversation's first segment whose creation a power cut interrupted (its first
#: sector all zeros): it never held an acknowledged item (a note; the engine rewrites it).
TORN_CREATION = "torn-creation"


#: A conversation's directory still in its site's pool (or below a spare): a first append
#: claimed the entry and acknowledged, and a power cut undid the entry's rename into place
#: (FORMAT.md 6, "A first append in one sync"). A note: the engine moves it at its next use of
#: the site (so does ``--repair``). When the conversation has a directory too, an error.
CLAIM_NOT_MOVED = "claim-not-moved"


INDEX_MISSING = "index-missing"


INDEX_STALE = "index-stale"


INDEX_MISMATCH = "index-mismatch"


#: The index's entries end well before its segment does (more entries missing
#: than a crash or a writer's unwritten group of entries can leave).
INDEX_SHORT = "index-short"


ORPHAN_INDEX = "orphan-index"


MANIFEST_MISSING = "manifest-missing"


MANIFEST_DAMAGED = "manifest-damaged"


MANIFEST_INCOMPLETE = "manifest-incomplete"


MANIFEST_STALE = "manifest-stale"


# Acknowledged data that is gone: the log ends before the extent the listing
# recorded as committed. Never repairable by fsck; --repair only makes the
# listing agree with the log.
ACKNOWLEDGED_LOST = "acknowledged-lost"


# States a crash leaves that the engine resolves by itself (reported as notes,
# never as errors; --repair resolves them at once):
INTENT_UNRESOLVED = "intent-unresolved"


# Left alone (not engine data, or not knowable):
STRAY_FILE = "stray-file"


LOCK_TIMEOUT = "lock-timeout"


#: Kinds at which ``truncate_at_corruption`` may cut a log.
TRUNCATABLE_KINDS = frozenset({CORRUPT_RECORD, BAD_SEGMENT_HEADER, SEQ_GAP, SEQ_MISMATCH, BAD_BATCH, RECORD_AFTER_SEAL})


def format_timestamp(us: int) -> str:
    """``recorded_at`` microseconds as the RFC 3339 text clients see (``2026-11-30T01:54:43.123456Z``)."""
    return format_us(us)


def parse_timestamp(text: str) -> int:
    """Invert :func:`format_timestamp`; raises ValueError on any other text."""
    return parse_rfc3339(text)


class MaintenanceError(Exception):
    """An operational failure: not a data directory, no such site, bad arguments."""


@dataclass
class Problem:
    """One thing found wrong, where it is, and what was or can be done about it.

    ``offset`` is an absolute byte offset in ``file`` (None when the problem is
    a whole file or directory). ``repaired`` is True only when the repair was
    carried out in this run.
    """

    site: str | None
    conversation_id: str | None
    file: str
    offset: int | None
    kind: str
    detail: str
    action: str
    repaired: bool = False
    #: Set by ``truncate_at_corruption`` on the problem where the log was cut:
    #: ``(first, last)`` seqs dropped; ``last`` is None when no later record was readable.
    lost_seqs: tuple[int, int | None] | None = None
    #: True for a state a crash can leave that the engine resolves by itself
    #: (``action`` says how): a note, not an error, for the exit status.
    resolves_itself: bool = False
    #: An ``intent-unresolved`` note whose batch is exactly what the log holds: the commit a
    #: live (or idle) writer still owes. Normal on a live directory; ``convmem fsck`` summarises these.
    owed_commit: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "site": self.site,
            "conversation_id": self.conversation_id,
            "file": self.file,
            "offset": self.offset,
            "kind": self.kind,
            "detail": self.detail,
            "action": self.action,
            "repaired": self.repaired,
            "lost_seqs": list(self.lost_seqs) if self.lost_seqs is not None else None,
            "resolves_itself": self.resolves_itself,
            "owed_commit": self.owed_commit,
        }


@dataclass(frozen=True)
class Progress:
    """How far a :func:`check` has come (totals are counted before the scan starts)."""

    conversations_done: int
    conversations_total: int
    bytes_done: int
    bytes_total: int


@dataclass
class CheckReport:
    """The outcome of :func:`check`."""

    problems: list[Problem] = field(default_factory=list)
    sites: int = 0
    conversations: int = 0
    segments: int = 0
    records: int = 0
    bytes_scanned: int = 0

    @property
    def unrepaired(self) -> list[Problem]:
        """Problems neither repaired in this run nor left for the engine to resolve by itself."""
        return [p for p in self.problems if not p.repaired and not p.resolves_itself]

    @property
    def notes(self) -> list[Problem]:
        """States the engine resolves by itself, left as they were."""
        return [p for p in self.problems if not p.repaired and p.resolves_itself]
