"""The error taxonomy of the store.

Every failure the store reports is a :class:`StoreError`. Each subclass has one
precise meaning and says whether retrying the same call can succeed
(``retryable``). Client faults are permanent; I/O and contention are retryable;
corruption is permanent and carries the file and absolute byte offset of the
damaged record (and its seqs, when known); items an operator repair recorded
as lost (``ItemsLost``) are permanent too, and name the lost seq ranges.

The base is deliberately not called ``MemoryError``: that name belongs to
Python's builtin.
"""

from __future__ import annotations

from typing import ClassVar, Literal, NamedTuple

ConversationIdReason = Literal["TooShort", "TooLong", "InvalidCharacters"]


class StoreError(Exception):
    """Base class of every error raised by :mod:`logstore`."""

    #: The spec's error code, e.g. ``"PayloadTooLarge"``.
    code: ClassVar[str] = "StoreError"
    #: True when the same call may succeed later (I/O, contention).
    retryable: ClassVar[bool] = False

    def details(self) -> dict[str, object]:
        """Machine-readable details of this error (no message text)."""
        return {}


class InvalidConversationId(StoreError):
    """A conversation id (or site name) breaks the id rules.

    ``reason`` is one of ``TooShort``, ``TooLong``, ``InvalidCharacters``.
    """

    code = "InvalidConversationId"

    def __init__(self, reason: ConversationIdReason, value: str, what: str = "conversation id") -> None:
        self.reason: ConversationIdReason = reason
        self.value = value
        self.what = what
        rules = {
            "TooShort": "is shorter than 8 characters",
            "TooLong": "is longer than 64 characters",
            "InvalidCharacters": "contains characters outside [A-Za-z0-9_-]",
        }
        super().__init__(f"{what} {rules[reason]} (length {len(value)})")

    def details(self) -> dict[str, object]:
        return {"reason": self.reason}


class EmptyBatch(StoreError):
    """An append carried no items."""

    code = "EmptyBatch"

    def __init__(self) -> None:
        super().__init__("an append batch must hold at least one item")


class _SizeError(StoreError):
    """A limit was exceeded; carries ``limit`` and ``actual``."""

    unit: ClassVar[str] = "bytes"

    def __init__(self, limit: int, actual: int, index: int | None = None) -> None:
        self.limit = limit
        self.actual = actual
        self.index = index
        super().__init__(self._message())

    def _message(self) -> str:  # pragma: no cover - overridden
        raise NotImplementedError

    def details(self) -> dict[str, object]:
        out: dict[str, object] = {"limit": self.limit, "actual": self.actual}
        if self.index is not None:
            out["index"] = self.index
        return out


class PayloadTooLarge(_SizeError):
    """One item's compact JSON encoding exceeds the per-item limit."""

    code = "PayloadTooLarge"

    def _message(self) -> str:
        return f"item {self.index} is {self.actual} bytes as compact JSON; the limit per item is {self.limit} bytes"


class BatchTooLarge(_SizeError):
    """A batch exceeds the per-batch byte limit or item-count limit."""

    code = "BatchTooLarge"

    def __init__(self, limit: int, actual: int, unit: str = "bytes") -> None:
        self.unit_name = unit
        super().__init__(limit, actual)

    def _message(self) -> str:
        return f"the batch holds {self.actual} {self.unit_name}; the limit per batch is {self.limit} {self.unit_name}"

    def details(self) -> dict[str, object]:
        return {**super().details(), "unit": self.unit_name}


class ConversationFull(_SizeError):
    """The batch would take the conversation past its item limit."""

    code = "ConversationFull"

    def _message(self) -> str:
        return f"the conversation would hold {self.actual} items; the limit per conversation is {self.limit} items"


class InvalidPayload(StoreError):
    """An item is not a JSON object that can be stored verbatim."""

    code = "InvalidPayload"

    def __init__(self, index: int, why: str) -> None:
        self.index = index
        self.why = why
        super().__init__(f"item {index} cannot be stored: {why}")

    def details(self) -> dict[str, object]:
        return {"index": self.index}


class InvalidCursor(StoreError):
    """A listing cursor is malformed or belongs to another site."""

    code = "InvalidCursor"

    def __init__(self, why: str = "the cursor is not one this listing issued") -> None:
        super().__init__(why)


class Unavailable(StoreError):
    """The store cannot serve right now (closed, or its directory is unusable)."""

    code = "Unavailable"
    retryable = True


class Timeout(StoreError):
    """Waiting for a lock took longer than the configured timeout; nothing was written.

    ``lock`` names what was waited for: a conversation's lock by default, a
    site's long-term memories for the memory store.
    """

    code = "Timeout"
    retryable = True

    def __init__(self, waited: float, lock: str = "the conversation lock") -> None:
        self.waited = waited
        super().__init__(f"gave up waiting for {lock} after {waited:.3f}s; nothing was written")

    def details(self) -> dict[str, object]:
        return {"waited_seconds": round(self.waited, 3)}


class Io(StoreError):
    """An operating-system I/O call failed; nothing was acknowledged."""

    code = "Io"
    retryable = True

    def __init__(self, message: str, errno: int | None = None) -> None:
        self.errno = errno
        super().__init__(message)

    def details(self) -> dict[str, object]:
        return {"errno": self.errno} if self.errno is not None else {}


class Corrupted(StoreError):
    """Acknowledged data failed verification.

    ``file`` is the path of the damaged file and ``offset`` the absolute byte
    offset of the damaged record within it. ``first_seq``/``last_seq`` are the
    seqs the damaged stretch held, when they could be told: ``first_seq`` from
    the intact data before it, ``last_seq`` from the intact record after it
    (or, for the last record of a log, from the damaged record's own header
    when its fields are still plausible); None when unknown.
    """

    code = "Corrupted"

    def __init__(
        self, file: str, offset: int, why: str, first_seq: int | None = None, last_seq: int | None = None
    ) -> None:
        self.file = file
        self.offset = offset
        self.why = why
        self.first_seq = first_seq
        self.last_seq = last_seq
        super().__init__(f"{file} is corrupted at byte offset {offset}: {why}{self._seqs()}")

    def _seqs(self) -> str:
        if self.first_seq is None:
            return ""
        if self.last_seq is None:
            return f" (items from seq {self.first_seq} on are unreadable)"
        return f" (seqs {self.first_seq}..{self.last_seq} are unreadable)"

    def details(self) -> dict[str, object]:
        out: dict[str, object] = {"file": self.file, "offset": self.offset}
        if self.first_seq is not None:
            out["first_seq"] = self.first_seq
            out["last_seq"] = self.last_seq
        return out


class Loss(NamedTuple):
    """One stretch of seqs an operator repair recorded as lost (a loss record).

    ``file`` and ``offset`` locate the loss record; ``quarantine`` is where the
    repair kept the damaged bytes (relative to the data directory), if known.
    """

    first_seq: int
    last_seq: int
    file: str
    offset: int
    quarantine: str | None = None


class ItemsLost(StoreError):
    """The read covers seqs that were lost to damage and recorded as lost by an operator repair.

    Permanent. ``losses`` lists each lost stretch in the range read; every
    other seq of the log reads normally, so a client reads around them.
    """

    code = "ItemsLost"

    def __init__(self, losses: list[Loss]) -> None:
        self.losses = list(losses)
        spans = ", ".join(f"{x.first_seq}..{x.last_seq}" for x in self.losses)
        first = self.losses[0]
        super().__init__(
            f"seqs {spans} were lost to damage (recorded by a repair at byte offset {first.offset} of {first.file}); "
            "the other seqs read normally"
        )

    def details(self) -> dict[str, object]:
        first = self.losses[0]
        return {
            "file": first.file,
            "offset": first.offset,
            "lost": [{"first_seq": x.first_seq, "last_seq": x.last_seq} for x in self.losses],
        }


class QuotaExceeded(StoreError):
    """The append would take the site past its quota: bytes on disk, files and directories, or conversations.

    Permanent: retrying the same append fails again until the operator raises
    the quota or data is removed.
    """

    code = "QuotaExceeded"

    def __init__(self, unit: Literal["bytes", "files", "conversations"], limit: int, actual: int) -> None:
        self.unit = unit
        self.limit = limit
        self.actual = actual
        what = {"bytes": "bytes on disk", "files": "files and directories"}.get(unit, unit)
        super().__init__(f"the site would hold {actual} {what}; its quota is {limit} {what}")

    def details(self) -> dict[str, object]:
        return {"limit": self.limit, "actual": self.actual, "unit": self.unit}


class InvalidIdempotencyKey(StoreError):
    """An idempotency key is not 1-128 characters from ``[A-Za-z0-9_-]``."""

    code = "InvalidIdempotencyKey"

    def __init__(self, why: str) -> None:
        super().__init__(f"idempotency_key {why}; use 1-128 characters from [A-Za-z0-9_-]")


class IdempotencyConflict(StoreError):
    """The idempotency key was already used for a batch with other items.

    Permanent. ``first_seq``/``last_seq`` are the range the key's original
    batch occupies; nothing was written.
    """

    code = "IdempotencyConflict"

    def __init__(self, key: str, first_seq: int, last_seq: int) -> None:
        self.key = key
        self.first_seq = first_seq
        self.last_seq = last_seq
        super().__init__(
            f"idempotency key {key!r} was used for a different batch, at seqs {first_seq}..{last_seq}; "
            "nothing was written"
        )

    def details(self) -> dict[str, object]:
        return {"first_seq": self.first_seq, "last_seq": self.last_seq}


class IdempotencyRedacted(IdempotencyConflict):
    """A keyed retry of a batch part of which was redacted since: whether its items match can't be told.

    Permanent; code ``IdempotencyConflict``, with ``redacted_seqs`` in the
    details. The retry matches every item of the batch the redaction left;
    the seqs named are tombstones now, and a tombstone keeps nothing (no
    digest either) of what it replaced. The batch the key stands for is at
    ``first_seq..last_seq``; nothing was written.
    """

    def __init__(self, key: str, first_seq: int, last_seq: int, redacted_seqs: list[int]) -> None:
        self.key = key
        self.first_seq = first_seq
        self.last_seq = last_seq
        self.redacted_seqs = redacted_seqs
        whole = len(redacted_seqs) == last_seq - first_seq + 1
        StoreError.__init__(
            self,
            f"idempotency key {key!r} stands for the batch at seqs {first_seq}..{last_seq}, which was redacted "
            f"since (seqs {_seq_list(redacted_seqs)} are tombstones): "
            + ("" if whole else "the retried items match every item it kept, but ")
            + "the redacted items can no longer be compared with the retried ones; nothing was written",
        )

    def details(self) -> dict[str, object]:
        return {**super().details(), "redacted_seqs": list(self.redacted_seqs)}


def _seq_list(seqs: list[int]) -> str:
    """``[3, 4, 5, 9]`` -> ``"3-5, 9"``."""
    runs: list[list[int]] = []
    for s in seqs:
        if runs and runs[-1][1] + 1 == s:
            runs[-1][1] = s
        else:
            runs.append([s, s])
    return ", ".join(f"{a}-{b}" if a != b else str(a) for a, b in runs)


class SeqConflict(StoreError):
    """``expected_next_seq`` differed from the conversation's next seq; nothing was written.

    Permanent for this request: read what was appended since, then decide.
    ``actual_next_seq`` is the seq the next item would have had.
    """

    code = "SeqConflict"

    def __init__(self, expected: int, actual: int) -> None:
        self.expected = expected
        self.actual_next_seq = actual
        super().__init__(f"expected the conversation's next seq to be {expected}, it is {actual}; nothing was written")

    def details(self) -> dict[str, object]:
        return {"expected_next_seq": self.expected, "actual_next_seq": self.actual_next_seq}
