"""Capacity limits of the data model: every bound an append, a read or an id is checked against (README, "Errors")."""

from __future__ import annotations

#: Largest compact-JSON encoding of one item, in bytes (256 KiB); one more is rejected.
MAX_ITEM_BYTES = 262_144
#: Largest sum of the items' encodings in one batch, in bytes (1 MiB).
MAX_BATCH_BYTES = 1_048_576
#: Most items in one append batch.
MAX_BATCH_ITEMS = 250
#: Most items one conversation can ever hold.
MAX_CONVERSATION_ITEMS = 100_000
#: Most items one read or one listing page returns.
MAX_READ_ITEMS = 1000
#: Id length bounds (conversation ids and site names).
MIN_ID_LENGTH = 8
MAX_ID_LENGTH = 64
