"""Errors of the long-term memory store (all :class:`logstore.StoreError`)."""

from __future__ import annotations

from ..errors import StoreError

#: What a memory call waits for when it times out (the text of its ``Timeout``).
MEMORY_LOCK = "the lock on the site's long-term memories"


class InvalidMemory(StoreError):
    """A field of a memory (or of a call about one) breaks its rule; nothing was written.

    ``field`` names the field (``subject``, ``tags[3]``, ...), ``rule`` says how it failed.
    """

    code = "InvalidArguments"

    def __init__(self, field: str, rule: str) -> None:
        self.field = field
        self.rule = rule
        super().__init__(f"`{field}` is invalid: {rule}")

    def details(self) -> dict[str, object]:
        return {"field": self.field, "rule": self.rule}


class VerifyRequired(StoreError):
    """A write came without a valid verify token for exactly this change."""

    code = "VerifyRequired"

    def __init__(self, reason: str, why: str) -> None:
        #: One of missing, malformed, other-intent, other-force (a delete token asked with the
        #: other ``force``), mismatch, expired, used.
        self.reason = reason
        self.why = why
        super().__init__(f"{why}; call memory_verify for this exact change and read what it returns first")

    def details(self) -> dict[str, object]:
        return {"reason": self.reason}


class DuplicateMemory(StoreError):
    """Another active memory of the site already has this dedupe_key."""

    code = "DuplicateMemory"

    def __init__(self, existing_id: str, dedupe_key: str) -> None:
        self.existing_id = existing_id
        super().__init__(f"active memory {existing_id} already has this dedupe_key")

    def details(self) -> dict[str, object]:
        return {"existing_id": self.existing_id}


class VersionConflict(StoreError):
    """``expected_version`` does not match the memory's current version."""

    code = "VersionConflict"

    def __init__(self, memory_id: str, expected: int, current: int) -> None:
        self.memory_id = memory_id
        self.expected = expected
        self.current = current
        super().__init__(f"memory {memory_id} is at version {current}, not {expected}")

    def details(self) -> dict[str, object]:
        return {"memory_id": self.memory_id, "expected_version": self.expected, "current_version": self.current}


class MemoryStoreFull(StoreError):
    """The site already holds the most memories it may (active and soft-deleted)."""

    code = "MemoryStoreFull"

    def __init__(self, limit: int) -> None:
        self.limit = limit
        super().__init__(f"the site already holds {limit} memories, the most it may keep")

    def details(self) -> dict[str, object]:
        return {"limit": self.limit}


class NotFound(StoreError):
    """No memory with this id exists in the site (or it is not in the state the call needs)."""

    code = "NotFound"

    def __init__(self, memory_id: str, why: str = "no memory with this id exists in your site") -> None:
        self.memory_id = memory_id
        super().__init__(f"{memory_id}: {why}")

    def details(self) -> dict[str, object]:
        return {"memory_id": self.memory_id}


class LooksLikeSecret(StoreError):
    """A field of a write looks like a credential; nothing was written.

    ``field`` names the field (``memory.details``, ``candidate.tags[1]``),
    ``kind`` the credential found (``private_key``, ``aws_access_key``,
    ``bearer_token``, ``password_assignment``, ... see :mod:`.credentials`).
    """

    code = "LooksLikeSecret"

    def __init__(self, field: str, kind: str) -> None:
        self.field = field
        self.kind = kind
        super().__init__(f"`{field}` looks like it holds a credential ({kind}); memories must never hold secrets")

    def details(self) -> dict[str, object]:
        return {"field": self.field, "kind": self.kind}
