"""Validated identifiers: conversation ids and site names.

Both follow one rule: 8 to 64 characters from ``[A-Za-z0-9_-]``. Validation
happens at construction, so a value of these types is always well-formed.
"""

from __future__ import annotations

import re

from .errors import InvalidConversationId
from .limits import MAX_ID_LENGTH, MIN_ID_LENGTH

_CHARSET = re.compile(r"[A-Za-z0-9_-]*")


def _check(value: object, what: str) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str, not {type(value).__name__}")
    # Charset first: a 3-character id with a space is reported for its characters.
    if _CHARSET.fullmatch(value) is None:
        raise InvalidConversationId("InvalidCharacters", value, what)
    if len(value) < MIN_ID_LENGTH:
        raise InvalidConversationId("TooShort", value, what)
    if len(value) > MAX_ID_LENGTH:
        raise InvalidConversationId("TooLong", value, what)
    return value


class ConversationId(str):
    """A client-minted, opaque conversation handle (8-64 of ``[A-Za-z0-9_-]``).

    Ids are case-sensitive: ``"Chat-0001"`` and ``"chat-0001"`` are different
    conversations. Raises :class:`~logstore.InvalidConversationId` when malformed.
    """

    __slots__ = ()

    def __new__(cls, value: str) -> ConversationId:
        if type(value) is cls:
            return value
        return super().__new__(cls, _check(value, "conversation id"))


class SiteName(str):
    """A tenant's name; same rules as :class:`ConversationId`."""

    __slots__ = ()

    def __new__(cls, value: str) -> SiteName:
        if type(value) is cls:
            return value
        return super().__new__(cls, _check(value, "site name"))
