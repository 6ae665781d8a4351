"""The bounds of the adapter's own tool arguments, stated once.

Both the published JSON schemas (:mod:`mcp_adapter.schemas`) and the msgspec
structs that enforce them (:mod:`mcp_adapter.validation`) read these; the
engine's limits (batch size, read size) live in :mod:`logstore`, the memory
limits in :mod:`logstore.memories.limits`. ``tests/test_mcp_schema_agreement.py``
checks that what is published is what is enforced.
"""

from __future__ import annotations

#: The longest ``wait_ms`` of ``replay_memory``, in milliseconds.
MAX_WAIT_MS = 30_000
#: ``idempotency_key`` of ``append_memory``: 1 to this many characters matching the pattern.
IDEMPOTENCY_KEY_MAX = 128
IDEMPOTENCY_KEY_PATTERN = "^[A-Za-z0-9_-]+$"
