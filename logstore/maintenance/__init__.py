"""The engine's maintenance surface: verify, repair, dump, export, restore, stats.

This is the public API the operator tools (``convmem fsck``, ``dump``,
``export``, ``import``, ``stats``) are built on. It reads the files exactly
as FORMAT.md describes them and takes the engine's own locks, so it is safe
against a live data directory:

* a conversation's ``lock`` is held *shared* only while its file list, sizes
  and index files are snapshotted; the bytes below that committed end never
  change, so they are read without a lock. A conversation where something
  looks wrong is scanned again under the lock (shared to report, exclusive
  to repair) before anything is reported or changed;
* a site's ``manifest.lock`` is held shared while the manifest is read and
  exclusive while a repaired one is written, always after any conversation
  lock (the engine's lock order).

Nothing here ever deletes acknowledged data, except :func:`check` with
``truncate_at_corruption=True``, which first copies every segment it cuts
into ``DATA/quarantine/`` and reports the seqs it dropped. :func:`salvage`
replaces only records that are already unreadable, by loss records that
keep their seqs, after copying the segment into ``DATA/quarantine/``.
:func:`forget_conversation` and :func:`redact_items` erase what an operator
names (a conversation; the payloads of a seq range) with every copy of it.

Entry points: :func:`backup` (online backup), :func:`check` (fsck), :func:`salvage` (fsck --repair of
damaged records), :func:`scan_segment` and :func:`scan_index` (dump), :func:`locate_conversation` (locate),
:func:`export_items` (export),
:func:`forget_conversation` (forget), :func:`redact_items` (redact), :class:`Restorer` (import), :func:`stats`.
The private submodules hold one concern each; only the names below are public.
"""

from __future__ import annotations

from ._backup import (
    BackupExtra,
    BackupReport,
    backup,
)
from ._check import (
    check,
)
from ._export import (
    ExportedItem,
    export_items,
    iter_conversation_items,
)
from ._files import (
    ConversationFiles,
    iter_conversations,
    list_sites,
    locate_conversation,
    site_has_data,
)
from ._forget import Forgotten, forget_conversation
from ._permissions import (
    AccessFinding,
    check_access,
    unsafe_data_dir,
)
from ._records import (
    IndexEntryInfo,
    IndexInfo,
    RecordInfo,
    SegmentInfo,
    build_index,
    scan_index,
    scan_segment,
)
from ._redact import TOMBSTONE, Redacted, redact_items
from ._restore import (
    RestoreConflict,
    Restorer,
    set_aside_conversation,
)
from ._salvage import (
    SalvagedRecord,
    SalvageRefused,
    SalvageReport,
    salvage,
)
from ._stats import (
    ConversationStats,
    SiteStats,
    stats,
)
from ._types import (
    ACKNOWLEDGED_LOST,
    BAD_BATCH,
    BAD_SEGMENT_HEADER,
    CLAIM_NOT_MOVED,
    CORRUPT_RECORD,
    IDENTITY_MISMATCH,
    INDEX_INTERVAL,
    INDEX_MISMATCH,
    INDEX_MISSING,
    INDEX_SHORT,
    INDEX_STALE,
    INTENT_UNRESOLVED,
    LOCK_TIMEOUT,
    MANIFEST_DAMAGED,
    MANIFEST_INCOMPLETE,
    MANIFEST_MISSING,
    MANIFEST_STALE,
    MISPLACED_CONVERSATION,
    ORPHAN_INDEX,
    QUARANTINE_DIR,
    RECORD_AFTER_SEAL,
    RECORDED_AT_DECREASING,
    SEQ_GAP,
    SEQ_MISMATCH,
    STRAY_FILE,
    TORN_CREATION,
    TORN_TAIL,
    TRUNCATABLE_KINDS,
    UNSEALED_SEGMENT,
    CheckReport,
    MaintenanceError,
    Problem,
    Progress,
    format_timestamp,
    parse_timestamp,
)

__all__ = [
    "ACKNOWLEDGED_LOST",
    "BAD_BATCH",
    "BAD_SEGMENT_HEADER",
    "CLAIM_NOT_MOVED",
    "CORRUPT_RECORD",
    "IDENTITY_MISMATCH",
    "INDEX_INTERVAL",
    "INDEX_MISMATCH",
    "INDEX_MISSING",
    "INDEX_SHORT",
    "INDEX_STALE",
    "INTENT_UNRESOLVED",
    "LOCK_TIMEOUT",
    "MANIFEST_DAMAGED",
    "MANIFEST_INCOMPLETE",
    "MANIFEST_MISSING",
    "MANIFEST_STALE",
    "MISPLACED_CONVERSATION",
    "ORPHAN_INDEX",
    "QUARANTINE_DIR",
    "RECORDED_AT_DECREASING",
    "RECORD_AFTER_SEAL",
    "SEQ_GAP",
    "SEQ_MISMATCH",
    "STRAY_FILE",
    "TOMBSTONE",
    "TORN_CREATION",
    "TORN_TAIL",
    "TRUNCATABLE_KINDS",
    "UNSEALED_SEGMENT",
    "AccessFinding",
    "BackupExtra",
    "BackupReport",
    "CheckReport",
    "ConversationFiles",
    "ConversationStats",
    "ExportedItem",
    "Forgotten",
    "IndexEntryInfo",
    "IndexInfo",
    "MaintenanceError",
    "Problem",
    "Progress",
    "RecordInfo",
    "Redacted",
    "RestoreConflict",
    "Restorer",
    "SalvageRefused",
    "SalvageReport",
    "SalvagedRecord",
    "SegmentInfo",
    "SiteStats",
    "backup",
    "build_index",
    "check",
    "check_access",
    "export_items",
    "forget_conversation",
    "format_timestamp",
    "iter_conversation_items",
    "iter_conversations",
    "list_sites",
    "locate_conversation",
    "parse_timestamp",
    "redact_items",
    "salvage",
    "scan_index",
    "scan_segment",
    "set_aside_conversation",
    "site_has_data",
    "stats",
    "unsafe_data_dir",
]
