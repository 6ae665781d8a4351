"""Tool errors: what a failed call tells the agent and its client.

A failed tool call is answered as a tool result with ``isError: true``, one
text block written for the agent, and a machine-readable object in
``_meta["convmem/error"]``::

    {"code": "PayloadTooLarge", "retryable": false, "message": "...",
     "limit": 262144, "actual": 300000, "index": 2}

``code`` is the spec's error name where the spec has one; the adapter adds
``InvalidArguments``, ``InvalidCursor``, ``Unauthenticated``, ``Throttled``
(retryable, with ``retry_after_seconds``) and ``InternalError``. Detail keys sit beside ``code``: ``reason`` for
``InvalidConversationId``; ``limit``/``actual`` (and ``index``, ``unit``) for
size errors; ``file``/``offset`` (and ``first_seq``/``last_seq`` when known)
for ``Corrupted``; ``file``/``offset`` and ``lost`` (a list of
``{"first_seq", "last_seq"}``) for ``ItemsLost``; ``field``/``rule`` for
``InvalidArguments``; ``request_id`` on every error the server answers (the
id of the request in its log; it is quoted in the text too). No
``structuredContent`` is sent with an error, since clients check that against
the success schema.
"""

from __future__ import annotations

import math
import os
import re
from typing import Any

import mcp_types as types

from convmem.logstore import Corrupted, InvalidPayload, ItemsLost, StoreError

#: The ``_meta`` key under which the machine-readable error travels.
ERROR_META_KEY = "convmem/error"

#: What an agent should do next, per code (appended to the human-readable text).
_ADVICE: dict[str, str] = {
    "InvalidConversationId": "Use an id of 8-64 characters from [A-Za-z0-9_-], e.g. a UUID; retrying unchanged "
    "fails again.",
    "EmptyBatch": "Send at least one item; retrying unchanged fails again.",
    "PayloadTooLarge": "Shrink or split that item (at most 256 KiB of compact JSON); retrying unchanged fails again.",
    "BatchTooLarge": "Split the batch into smaller appends (at most 250 items and 1 MiB in total); retrying "
    "unchanged fails again.",
    "ConversationFull": "This conversation cannot take more items; continue in a new conversation id.",
    "Unavailable": "The memory store is temporarily unavailable; keep the batch and retry later.",
    "Timeout": "The conversation was busy and nothing was written; keep the batch and retry.",
    "Io": "A storage I/O error occurred and nothing was acknowledged; keep the batch and retry.",
    "Corrupted": "Stored data failed verification; retrying will not help. Report this to the operator.",
    "ItemsLost": "Those items were lost to damage and an operator recorded the loss; retrying will not help. "
    "Read around the lost seqs with replay_memory: every other item is intact.",
    "InvalidArguments": "Fix the named argument; retrying unchanged fails again.",
    "IdempotencyConflict": "That idempotency_key was already used for other items (at first_seq..last_seq); use a "
    "fresh key for a new batch. Retrying unchanged fails again.",
    "SeqConflict": "Someone appended since you last looked: read from your last known seq + 1 (actual_next_seq is "
    "the next seq now), decide, then append with the new expected_next_seq.",
    "InvalidIdempotencyKey": "Use 1-128 characters from [A-Za-z0-9_-] as idempotency_key.",
    "InvalidCursor": "Pass next_cursor back exactly as received, or omit cursor to start over.",
    "Unauthenticated": "Configure the client with HTTP Basic credentials: the site name as user name and the "
    "site's password.",
    "InternalError": "An unexpected server error occurred; it is safe to retry.",
    "Throttled": "Too many failed logins came from this address or for this site; wait retry_after_seconds, "
    "check the credentials, then retry.",
    "QuotaExceeded": "The site has used its storage allowance; retrying will not help until the operator raises "
    "the quota or removes data.",
    # Long-term memory tools (mcp_adapter/memory_*.py).
    "VerifyRequired": "Pass the same intent and candidate or memory_id to memory_verify, decide from the related "
    "memories whether the write is still right, then repeat it with the new verify_token (single use, 10 minutes).",
    "DuplicateMemory": "That fact is already stored under existing_id: update that memory (memory_verify with "
    "intent update) rather than creating a second copy.",
    "VersionConflict": "The memory changed since you read it: memory_get it again, decide whether your change "
    "still applies, re-verify and retry with current_version.",
    "MemoryStoreFull": "Delete memories that no longer matter first (soft-deleted ones count until they are erased; "
    "force: true erases at once).",
    "NotFound": "Check the id (memory_search finds memories by content); an erased memory is gone for good.",
    "LooksLikeSecret": "Memories must never hold credentials: remove the secret from the named field (say where it "
    "is kept instead, e.g. 'in the team vault') and verify again; retrying unchanged fails again.",
}


class ToolFailure(Exception):
    """A failed tool call, ready to be turned into an ``isError`` result."""

    def __init__(self, code: str, message: str, *, retryable: bool = False, **details: Any) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.retryable = retryable
        self.details = details

    def error_object(self) -> dict[str, Any]:
        """The machine-readable object sent under ``_meta["convmem/error"]``."""
        return {"code": self.code, "retryable": self.retryable, "message": self.message, **self.details}

    def text(self) -> str:
        """One paragraph an agent can act on."""
        kind = "retryable" if self.retryable else "permanent"
        advice = _ADVICE.get(self.code, "")
        text = f"{self.code} ({kind}): {self.message}. {advice}".strip()
        rid = self.details.get("request_id")
        if rid and rid not in self.message:
            text += f" (request id {rid})"
        return text

    def to_result(self) -> types.CallToolResult:
        """The tool result for this failure (no ``structuredContent``)."""
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=self.text())],
            is_error=True,
            _meta={ERROR_META_KEY: self.error_object()},
        )


def invalid_arguments(field: str, rule: str) -> ToolFailure:
    """An argument broke the tool's input schema; ``field`` names it, ``rule`` says how."""
    return ToolFailure("InvalidArguments", f"argument `{field}` is invalid: {rule}", field=field, rule=rule)


def unauthenticated(*, bearer: bool = False) -> ToolFailure:
    """The call lacks valid Basic credentials. Never says whether the site exists."""
    if bearer:
        message = "Bearer tokens are not accepted; this server requires HTTP Basic authentication"
    else:
        message = (
            "missing or invalid credentials: HTTP Basic authentication with a site name and its password is required"
        )
    return ToolFailure("Unauthenticated", message)


def throttled(retry_after: float) -> ToolFailure:
    """Too many failed logins: the password was not checked; try again after ``retry_after`` seconds."""
    seconds = max(1, math.ceil(retry_after))
    return ToolFailure(
        "Throttled",
        f"too many failed logins; the credentials were not checked, try again in {seconds} s",
        retryable=True,
        retry_after_seconds=seconds,
    )


def internal_error(request_id: str) -> ToolFailure:
    """An unexpected failure; the details are in the server log under ``request_id``."""
    return ToolFailure(
        "InternalError",
        f"the server failed unexpectedly (request id {request_id})",
        retryable=True,
        request_id=request_id,
    )


def _public_path(path: str, data_dir: str | None) -> str:
    """``path`` relative to the data directory when it lies inside it (no server layout leaks)."""
    if data_dir:
        try:
            rel = os.path.relpath(path, data_dir)
        except ValueError:
            return os.path.basename(path)
        if not rel.startswith(".."):
            return rel
    return os.path.basename(path)


_ABSOLUTE_PATH = re.compile(r"(?<![\w.])/[^\s'\",:;()]*")


def _hide_paths(message: str, data_dir: str | None) -> str:
    """``message`` with every absolute path made relative to the data directory (or cut to its last part).

    OS errors name the file they failed on, with its absolute path; the
    server's layout is none of the client's business.
    """
    return _ABSOLUTE_PATH.sub(lambda m: _public_path(m.group(0), data_dir), message)


def from_store_error(exc: StoreError, data_dir: str | None = None) -> ToolFailure:
    """Map a :class:`logstore.StoreError` to the tool error the client sees."""
    message = str(exc).rstrip(".")
    if isinstance(exc, InvalidPayload):
        # Not a spec code: a payload the store cannot keep verbatim is an argument problem.
        field = f"items[{exc.index}]"
        return ToolFailure("InvalidArguments", f"argument `{field}` is invalid: {exc.why}", field=field, rule=exc.why)
    details = dict(exc.details())
    if not isinstance(exc, Corrupted):
        message = _hide_paths(message, data_dir)
    if isinstance(exc, Corrupted):
        details["file"] = _public_path(exc.file, data_dir)
        message = f"{details['file']} is corrupted at byte offset {exc.offset}: {exc.why}"
        if exc.first_seq is not None:
            message += (
                f" (seqs {exc.first_seq}..{exc.last_seq} are unreadable)"
                if exc.last_seq is not None
                else f" (items from seq {exc.first_seq} on are unreadable)"
            )
    elif isinstance(exc, ItemsLost):
        details["file"] = _public_path(exc.losses[0].file, data_dir)
        spans = ", ".join(f"{x.first_seq}..{x.last_seq}" for x in exc.losses)
        message = (
            f"seqs {spans} were lost to damage (a repair recorded the loss at byte offset {exc.losses[0].offset} "
            f"of {details['file']}); the other seqs read normally"
        )
    return ToolFailure(exc.code, message, retryable=exc.retryable, **details)
