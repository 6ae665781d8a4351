"""What a redacted item becomes, and which seq ranges a redaction accepts: shared by every backend.

The procedures live with their backends (``logstore.maintenance.redact_items``
for a data directory, ``PgStore.redact_items``); this module holds only what
they must agree on, so that neither backend imports the other's layer.
"""

from __future__ import annotations

from collections.abc import Sequence

#: The stored payload of a redacted item (FORMAT.md, "Redacting items").
TOMBSTONE = b'{"redacted":true}'


class RedactionError(ValueError):
    """A redaction refused before anything was written: a bad range, or no such conversation."""


def check_range(first: int, last: int, next_seq: int | None, where: str) -> None:
    """Raise :class:`RedactionError` unless ``0 <= first <= last < next_seq`` (``None``: not known yet)."""
    if first < 0 or last < first:
        raise RedactionError(f"bad range {first}-{last}: give A-B with 0 <= A <= B")
    if next_seq is not None and last >= next_seq:
        held = f"its items are 0-{next_seq - 1}" if next_seq else "it holds no items"
        raise RedactionError(f"seqs {first}-{last} are not all in {where}: {held}")


def redacted_in_retry(stored: Sequence[bytes], retried: Sequence[bytes]) -> list[int] | None:
    """Why a keyed retry's items differ from its batch as stored, when a redaction may be the reason.

    ``stored`` and ``retried`` are the batch's items (compact JSON each). The
    offsets in the batch of the stored tombstones the retry does not match,
    when the retry has as many items and matches every other item byte for
    byte; else None (the items differ where nothing was redacted: a plain
    conflict). A tombstone keeps nothing of what it replaced, so whether the
    retry matched it there can no longer be known.
    """
    if len(stored) != len(retried):
        return None
    hidden = []
    for i, (s, r) in enumerate(zip(stored, retried, strict=True)):
        if s == r:
            continue
        if s != TOMBSTONE:
            return None
        hidden.append(i)
    return hidden or None
