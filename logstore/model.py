"""The data model of the spec, as small immutable value types.

Timestamps are RFC 3339 text (see :mod:`logstore.timefmt`); payloads are JSON
objects as Python dicts, exactly as appended.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

import msgspec
import xxhash

from .errors import InvalidCursor
from .ids import ConversationId
from .limits import MAX_READ_ITEMS
from .timefmt import format_us, parse_rfc3339


class MemoryItem(msgspec.Struct, frozen=True):
    """One appended item: its ``seq``, its batch's ``recorded_at``, its ``payload``."""

    seq: int
    recorded_at: str
    payload: dict[str, Any]


class RawMemoryItem(msgspec.Struct, frozen=True):
    """A :class:`MemoryItem` whose payload is left as the JSON object's bytes, as stored.

    What a reader that only passes items on (the MCP server) asks for: the
    payload is checked (its record's checksum, the batch's shape, UTF-8) but
    never decoded. ``msgspec.json.encode`` writes ``payload`` verbatim, so an
    item encodes as ``{"seq":..,"recorded_at":"..","payload":{..}}``;
    ``bytes(memoryview(item.payload))`` gives the bytes themselves.
    """

    seq: int
    recorded_at: str
    payload: msgspec.Raw


class SeqRange(msgspec.Struct, frozen=True):
    """The inclusive, non-empty range ``[first, last]`` a committed batch occupies."""

    first: int
    last: int

    def __post_init__(self) -> None:
        if not 0 <= self.first <= self.last:
            raise ValueError(f"a SeqRange is non-empty and 0-based: [{self.first}, {self.last}]")

    def __len__(self) -> int:
        return self.last - self.first + 1


def _check_count(name: str, value: int, maximum: int | None) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be a non-negative int, got {value!r}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{name} must be at most {maximum}, got {value}")


class Tail(msgspec.Struct, frozen=True):
    """Select the last ``count`` items, oldest first (fewer if the log is shorter)."""

    count: int

    def __post_init__(self) -> None:
        _check_count("count", self.count, MAX_READ_ITEMS)


class Range(msgspec.Struct, frozen=True):
    """Select up to ``limit`` items starting at seq ``start``."""

    start: int
    limit: int

    def __post_init__(self) -> None:
        _check_count("start", self.start, None)
        _check_count("limit", self.limit, MAX_READ_ITEMS)


ReadSelector = Tail | Range

_CURSOR_VERSION = 1


def _site_tag(site: str) -> str:
    return xxhash.xxh64_hexdigest(site.encode(), seed=0x636F6E766D656D)[:8]


class ListCursor(msgspec.Struct, frozen=True):
    """A keyset position in a listing: the last summary of a previous page.

    A listing resumes strictly after ``(last_appended_at desc, conversation_id asc)``.
    Clients see it only as an opaque token (:meth:`to_token`), bound to the site
    that issued it.
    """

    last_appended_at: str
    conversation_id: str

    def to_token(self, site: str) -> str:
        """The opaque, URL-safe text form handed to clients of ``site``."""
        raw = msgspec.json.encode(
            [_CURSOR_VERSION, _site_tag(site), parse_rfc3339(self.last_appended_at), str(self.conversation_id)]
        )
        return base64.urlsafe_b64encode(raw).decode().rstrip("=")

    @classmethod
    def from_token(cls, token: str, site: str) -> ListCursor:
        """Parse a token made by :meth:`to_token` for the same site.

        Raises :class:`~logstore.InvalidCursor` on anything else.
        """
        if not isinstance(token, str) or not 0 < len(token) <= 256:
            raise InvalidCursor("the cursor is empty or too long to be one this listing issued")
        try:
            raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
            version, tag, ts, conv = msgspec.json.decode(raw, type=tuple[int, str, int, str])
            if version != _CURSOR_VERSION:
                raise ValueError("unknown cursor version")
            ConversationId(conv)
            stamp = format_us(ts)
            if parse_rfc3339(stamp) != ts:  # e.g. years before 1000 have no 4-digit RFC 3339 form
                raise ValueError("the cursor's timestamp is out of range")
        except InvalidCursor:
            raise
        except (binascii.Error, ValueError, msgspec.DecodeError, OverflowError, Exception) as exc:
            raise InvalidCursor("the cursor is malformed") from exc
        if tag != _site_tag(site):
            raise InvalidCursor("the cursor was issued to another site")
        return cls(stamp, conv)


class ListSelector(msgspec.Struct, frozen=True):
    """One page of a listing: resume after ``cursor`` (None: from the start), at most ``limit``."""

    cursor: ListCursor | None = None
    limit: int = 50

    def __post_init__(self) -> None:
        _check_count("limit", self.limit, MAX_READ_ITEMS)


class ConversationSummary(msgspec.Struct, frozen=True):
    """A conversation's id, first and latest ``recorded_at``."""

    conversation_id: str
    created_at: str
    last_appended_at: str


class ConversationListing(msgspec.Struct, frozen=True):
    """One page of a site's listing, most recently active first."""

    summaries: list[ConversationSummary]
    next_cursor: ListCursor | None
