"""Bounds of a long-term memory record and of a site's memory store."""

from __future__ import annotations

CATEGORY_MAX = 64
SUBJECT_MAX = 200
SUMMARY_MAX = 500
DETAILS_MAX = 2000
TAGS_MAX = 12
TAG_MAX = 64
SOURCE_URIS_MAX = 12
SOURCE_URI_MAX = 2048
DEDUPE_KEY_MAX = 160
#: Most memories (active and soft-deleted) one site may hold.
MAX_MEMORIES_PER_SITE = 10_000
#: A verify token is accepted for this many seconds after it was minted.
VERIFY_TOKEN_TTL_SECONDS = 600
#: Soft-deleted memories are erased this long after their deletion, by default.
DEFAULT_RETENTION_SECONDS = 30 * 24 * 3600
#: memory_search returns at most this many memories.
SEARCH_LIMIT_MAX = 20
#: Length bounds of a memory_context hint and of a search query.
CONTEXT_MAX = 1000
#: Memories a process holds over all its sites (records and search indexes; about 5 MiB of RSS per 1,000,
#: measured by ``python -m bench --only memory``), by default: past it, the least recently used sites are
#: released whole (their records and index, read again when next used; ``index_budget`` of both stores).
INDEX_BUDGET = 50_000
#: Sites a store keeps at all, by default, beside those in use (a file store's site holds up to three
#: descriptors; either store's, with its records released, a few KiB): past it the least recently used idle
#: ones are forgotten, and opened or read again when next used (``sites_kept`` of both stores).
SITES_KEPT = 256
