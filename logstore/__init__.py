"""logstore: durable, append-only, per-conversation logs on the local filesystem.

The public surface is what this module exports; everything in underscored or
unlisted modules is private. See ``FORMAT.md`` beside this file for the
on-disk format.
"""

from __future__ import annotations

from .errors import (
    BatchTooLarge,
    ConversationFull,
    Corrupted,
    EmptyBatch,
    IdempotencyConflict,
    IdempotencyRedacted,
    InvalidConversationId,
    InvalidCursor,
    InvalidIdempotencyKey,
    InvalidPayload,
    Io,
    ItemsLost,
    Loss,
    PayloadTooLarge,
    QuotaExceeded,
    SeqConflict,
    StoreError,
    Timeout,
    Unavailable,
)
from .filestore import FileStore, open_store
from .ids import ConversationId, SiteName, check_idempotency_key
from .limits import (
    MAX_BATCH_BYTES,
    MAX_BATCH_ITEMS,
    MAX_CONVERSATION_ITEMS,
    MAX_ID_LENGTH,
    MAX_ITEM_BYTES,
    MAX_READ_ITEMS,
    MIN_ID_LENGTH,
)
from .model import (
    ConversationListing,
    ConversationSummary,
    ListCursor,
    ListSelector,
    MemoryItem,
    Range,
    RawMemoryItem,
    ReadSelector,
    SeqRange,
    Tail,
)
from .quota import SiteQuota, Usage, site_usage
from .store import MemoryStore

__all__ = [
    "MAX_BATCH_BYTES",
    "MAX_BATCH_ITEMS",
    "MAX_CONVERSATION_ITEMS",
    "MAX_ID_LENGTH",
    "MAX_ITEM_BYTES",
    "MAX_READ_ITEMS",
    "MIN_ID_LENGTH",
    "BatchTooLarge",
    "ConversationFull",
    "ConversationId",
    "ConversationListing",
    "ConversationSummary",
    "Corrupted",
    "EmptyBatch",
    "FileStore",
    "IdempotencyConflict",
    "IdempotencyRedacted",
    "InvalidConversationId",
    "InvalidCursor",
    "InvalidIdempotencyKey",
    "InvalidPayload",
    "Io",
    "ItemsLost",
    "ListCursor",
    "ListSelector",
    "Loss",
    "MemoryItem",
    "MemoryStore",
    "PayloadTooLarge",
    "QuotaExceeded",
    "Range",
    "RawMemoryItem",
    "ReadSelector",
    "SeqConflict",
    "SeqRange",
    "SiteName",
    "SiteQuota",
    "StoreError",
    "Tail",
    "Timeout",
    "Unavailable",
    "Usage",
    "check_idempotency_key",
    "open_store",
    "site_usage",
]
