"""Tool errors: what a failed call tells the agent and its client.

A failed tool call is answered as a tool result with ``isError: true``, one
text block written for the agent, and a machine-readable object in
``_meta["convmem/error"]``::

    {"code": "PayloadTooLarge", "retryable": false, "message": "...",
     "limit": 262144, "actual": 300000, "index": 2}

``code`` is the spec's error name where the spec has one; the adapter adds
``InvalidArguments``, ``InvalidCursor``, ``Unauthenticated``, ``Throttled``
(retryable, with ``retry_after_seconds``), ``NotConfigured`` (permanent, with
``feature``: a memory tool on a server without long-term memory) and
``InternalError``. The advice added to the text depends on the code and on the
tool that failed (an append keeps its batch; a memory tool has none).
Detail keys sit beside ``code``: ``reason`` for
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

#: What an agent should do next, per code (appended to the human-readable text). Codes whose advice
#: depends on the tool (see :data:`_BY_TOOL`) are not here. Every text agrees with the code's
#: ``retryable`` flag: a permanent code never advises retrying unchanged, a retryable one never
#: says retrying is useless.
_ADVICE: dict[str, str] = {
    "InvalidConversationId": "Use an id of 8-64 characters from [A-Za-z0-9_-], e.g. a UUID; retrying unchanged "
    "fails again.",
    "EmptyBatch": "Send at least one item; retrying unchanged fails again.",
    "PayloadTooLarge": "Shrink or split that item (at most 256 KiB of compact JSON); retrying unchanged fails again.",
    "BatchTooLarge": "Split the batch into smaller appends (at most 250 items and 1 MiB in total); retrying "
    "unchanged fails again.",
    "ConversationFull": "This conversation cannot take more items; continue in a new conversation id.",
    "Corrupted": "Stored data failed verification; retrying will not help. Report this to the operator.",
    "ItemsLost": "Those items were lost to damage and an operator recorded the loss; retrying will not help. "
    "Read around the lost seqs with replay_memory: every other item is intact.",
    "InvalidArguments": "Fix the named argument; retrying unchanged fails again.",
    "IdempotencyConflict": "That idempotency_key was already used for other items (at first_seq..last_seq); use a "
    "fresh key for a new batch. Retrying unchanged fails again. With redacted_seqs: the batch the key stands for is "
    "stored at first_seq..last_seq and matches these items wherever it was not redacted since; do not send it again.",
    "SeqConflict": "Someone appended since you last looked: read from your last known seq + 1 (actual_next_seq is "
    "the next seq now), decide, then append with the new expected_next_seq.",
    "InvalidIdempotencyKey": "Use 1-128 characters from [A-Za-z0-9_-] as idempotency_key.",
    "InvalidCursor": "Pass next_cursor back exactly as received, or omit cursor to start over.",
    "Unauthenticated": "Configure the client with HTTP Basic credentials: the site name as user name and the "
    "site's password.",
    "Throttled": "Too many failed logins came from this address or for this site; wait retry_after_seconds, "
    "check the credentials, then retry.",
    "QuotaExceeded": "The site has used its storage allowance; retrying will not help until the operator raises "
    "the quota or removes data.",
    "NotConfigured": "Retrying will not help until the operator changes the server's configuration. The "
    "conversation-log tools (append_memory, recall_memory, replay_memory, list_conversations) work as usual.",
    # Long-term memory tools (mcp_adapter/memory_*.py).
    "VerifyRequired": "Pass the same intent and candidate or memory_id to memory_verify, decide from the related "
    "memories whether the write is still right, then repeat it with the new verify_token (single use, 10 minutes).",
    "DuplicateMemory": "That fact is already stored under existing_id: update that memory (memory_verify with "
    "intent update) rather than creating a second copy.",
    "VersionConflict": "The memory changed since you read it: memory_get it again, decide whether your change "
    "still applies, re-verify, and send the update with expected_version set to current_version.",
    "MemoryStoreFull": "Delete memories that no longer matter first (soft-deleted ones count until they are erased; "
    "force: true erases at once).",
    "NotFound": "Check the id (memory_search finds memories by content); an erased memory is gone for good.",
    "LooksLikeSecret": "Memories must never hold credentials: remove the secret from the named field (say where it "
    "is kept instead, e.g. 'in the team vault') and verify again; retrying unchanged fails again.",
}

_FRESH_TOKEN = " (a write whose verify_token was used needs a new memory_verify first)"

#: Advice for the retryable storage codes, per kind of tool: an append holds a batch to keep,
#: a read holds none, a memory tool works on long-term memories, not on a conversation.
_BY_TOOL: dict[str, dict[str, str]] = {
    "Unavailable": {
        "append": "The store cannot be reached right now and the batch was not acknowledged; keep the batch and "
        "retry later.",
        "read": "The store cannot be reached right now; retry later.",
        "memory": "Long-term memory cannot be reached right now; retry later" + _FRESH_TOKEN + ".",
    },
    "Timeout": {
        "append": "The conversation was busy and nothing was written; keep the batch and retry.",
        "read": "The conversation was busy; retry.",
        "memory": "The site's long-term memories were busy and nothing was written; retry.",
    },
    "Io": {
        "append": "A storage I/O error occurred and nothing was acknowledged; keep the batch and retry.",
        "read": "A storage I/O error occurred; retry.",
        "memory": "A storage I/O error occurred; retry" + _FRESH_TOKEN + ".",
    },
    "InternalError": {
        "append": "An unexpected server error occurred; it is safe to retry (keep the batch meanwhile).",
        "read": "An unexpected server error occurred; it is safe to retry.",
        "memory": "An unexpected server error occurred; it is safe to retry" + _FRESH_TOKEN + ".",
    },
}

def tool_kind(tool: str | None) -> str:
    """``append``, ``read`` or ``memory``: which advice fits a failure of ``tool`` (``read`` when unknown)."""
    if tool == "append_memory":
        return "append"
    if tool is not None and tool.startswith("memory_"):
        return "memory"
    return "read"


def advice(code: str, retryable: bool, tool: str | None = None) -> str:
    """What the agent should do after ``code`` from ``tool``, in words that agree with ``retryable``."""
    by_tool = _BY_TOOL.get(code)
    if by_tool is not None and retryable:
        return by_tool[tool_kind(tool)]
    known = _ADVICE.get(code)
    if known is not None:
        return known
    return "Retry later." if retryable else "Retrying unchanged fails again."


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

    def text(self, tool: str | None = None) -> str:
        """One paragraph an agent can act on, with advice that fits ``tool`` (the tool that failed)."""
        kind = "retryable" if self.retryable else "permanent"
        text = f"{self.code} ({kind}): {self.message}. {advice(self.code, self.retryable, tool)}"
        rid = self.details.get("request_id")
        if rid and rid not in self.message:
            text += f" (request id {rid})"
        return text

    def to_result(self, tool: str | None = None) -> types.CallToolResult:
        """The tool result for this failure of ``tool`` (no ``structuredContent``)."""
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=self.text(tool))],
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


def memory_not_configured() -> ToolFailure:
    """A memory tool on a server built without a long-term memory store (neither a data directory nor a database)."""
    return ToolFailure(
        "NotConfigured",
        "long-term memory is not configured on this server: it was started without a place to keep memories "
        "(the operator serves with a data directory or a postgresql:// store)",
        feature="long-term memory",
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
