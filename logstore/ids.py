"""Validated identifiers: conversation ids and site names.

Both are made of the characters ``[A-Za-z0-9_-]`` and are case-sensitive.
A conversation id is 8 to 64 characters (clients mint them, so a short one
is most likely a mistake); a site name is 1 to 64 (it is a user name:
``demo`` and ``acme`` are natural ones). On disk both are stored as the hex
of their ASCII bytes (layout.py), so the length rule does not touch the
data directory's layout. Validation happens at construction, so a value of
these types is always well-formed.
"""

from __future__ import annotations

import re

from .errors import InvalidConversationId, InvalidIdempotencyKey
from .limits import MAX_ID_LENGTH, MIN_ID_LENGTH

_CHARSET = re.compile(r"[A-Za-z0-9_-]*")

#: Shortest site name (a site name is only ever too short when it is empty).
MIN_SITE_NAME_LENGTH = 1

#: The rules in words, for error messages and help texts.
CONVERSATION_ID_RULE = f"{MIN_ID_LENGTH}-{MAX_ID_LENGTH} characters from [A-Za-z0-9_-]"
SITE_NAME_RULE = f"{MIN_SITE_NAME_LENGTH}-{MAX_ID_LENGTH} characters from [A-Za-z0-9_-]"


def _check(value: object, what: str, min_length: int) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str, not {type(value).__name__}")
    # Charset first: a 3-character id with a space is reported for its characters.
    if _CHARSET.fullmatch(value) is None:
        raise InvalidConversationId("InvalidCharacters", value, what)
    if len(value) < min_length:
        exc = InvalidConversationId("TooShort", value, what)
        if min_length == MIN_SITE_NAME_LENGTH:
            exc.args = (f"{what} is empty",)  # the generic text names the id minimum
        raise exc
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
        return super().__new__(cls, _check(value, "conversation id", MIN_ID_LENGTH))


class SiteName(str):
    """A tenant's name: 1-64 of ``[A-Za-z0-9_-]``, case-sensitive.

    Raises :class:`~logstore.InvalidConversationId` (with ``what`` "site name") when malformed.
    """

    __slots__ = ()

    def __new__(cls, value: str) -> SiteName:
        if type(value) is cls:
            return value
        return super().__new__(cls, _check(value, "site name", MIN_SITE_NAME_LENGTH))


#: The longest idempotency key (the spec's extension: 1-128 characters of ``[A-Za-z0-9_-]``).
MAX_IDEMPOTENCY_KEY_LENGTH = 128


def check_idempotency_key(value: object) -> str:
    """``value`` when it is a valid idempotency key; raises InvalidIdempotencyKey (or TypeError) otherwise."""
    if not isinstance(value, str):
        raise TypeError(f"idempotency_key must be a str, not {type(value).__name__}")
    if not value:
        raise InvalidIdempotencyKey("is empty")
    if len(value) > MAX_IDEMPOTENCY_KEY_LENGTH:
        raise InvalidIdempotencyKey(f"is {len(value)} characters long")
    if _CHARSET.fullmatch(value) is None or not value.isascii():
        raise InvalidIdempotencyKey("contains characters outside [A-Za-z0-9_-]")
    return value


def check_expected_next_seq(value: object) -> int:
    """``value`` when it is a valid ``expected_next_seq`` (a non-negative int); raises ValueError otherwise."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"expected_next_seq must be a non-negative int, got {value!r}")
    return value
