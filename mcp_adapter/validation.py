"""Argument validation for the four tools (msgspec), with the spec's error codes.

The low-level MCP server hands tool arguments over unchecked, so every call is
validated here against the same rules its input schema publishes. A violation
raises :class:`~mcp_adapter.errors.ToolFailure`:

* a malformed ``conversation_id`` is ``InvalidConversationId`` with its reason;
* an empty ``items`` list is ``EmptyBatch``; more than 250 items is
  ``BatchTooLarge`` (``unit: "items"``);
* an argument the tool does not take is ``InvalidArguments`` naming it and
  the nearest one the tool takes (a misspelt ``memory_contxt`` would
  otherwise silently turn surfacing off);
* anything else (wrong type, out-of-range number, missing field) is
  ``InvalidArguments`` naming the field and the rule it broke.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Annotated, Any, TypeVar

import msgspec

from convmem.logstore import (
    MAX_BATCH_ITEMS,
    MAX_READ_ITEMS,
    BatchTooLarge,
    ConversationId,
    EmptyBatch,
    InvalidConversationId,
)
from convmem.logstore.memories.limits import CONTEXT_MAX

from .bounds import IDEMPOTENCY_KEY_MAX, IDEMPOTENCY_KEY_PATTERN, MAX_WAIT_MS
from .errors import ToolFailure, from_store_error, invalid_arguments

_UINT64_MAX = 2**64 - 1

ReadCount = Annotated[int, msgspec.Meta(ge=0, le=MAX_READ_ITEMS)]
Offset = Annotated[int, msgspec.Meta(ge=0)]  # the uint64 ceiling is checked by hand (msgspec bounds are int64)


#: The optional long-term memory hint of append_memory and recall_memory (absent: the spec's behaviour).
MemoryContext = Annotated[str, msgspec.Meta(min_length=1, max_length=CONTEXT_MAX)]


#: The optional idempotency key of append_memory.
IdempotencyKey = Annotated[
    str, msgspec.Meta(min_length=1, max_length=IDEMPOTENCY_KEY_MAX, pattern=IDEMPOTENCY_KEY_PATTERN)
]
#: The optional wait of replay_memory, in milliseconds.
WaitMs = Annotated[int, msgspec.Meta(ge=0, le=MAX_WAIT_MS)]


class AppendArgs(msgspec.Struct, frozen=True):
    """Arguments of ``append_memory``."""

    conversation_id: str
    items: list[dict[str, Any]]
    memory_context: MemoryContext | msgspec.UnsetType = msgspec.UNSET
    idempotency_key: IdempotencyKey | None = None
    expected_next_seq: Offset | None = None


class RecallArgs(msgspec.Struct, frozen=True):
    """Arguments of ``recall_memory``."""

    conversation_id: str
    count: ReadCount = 50
    memory_context: MemoryContext | msgspec.UnsetType = msgspec.UNSET


class ReplayArgs(msgspec.Struct, frozen=True):
    """Arguments of ``replay_memory``."""

    conversation_id: str
    limit: ReadCount
    offset: Offset = 0
    wait_ms: WaitMs = 0


class ListArgs(msgspec.Struct, frozen=True):
    """Arguments of ``list_conversations``."""

    cursor: str | None = None
    limit: ReadCount = 50


ToolArgs = AppendArgs | RecallArgs | ReplayArgs | ListArgs

ARGUMENT_TYPES: dict[str, type[ToolArgs]] = {
    "append_memory": AppendArgs,
    "recall_memory": RecallArgs,
    "replay_memory": ReplayArgs,
    "list_conversations": ListArgs,
}

_INTEGER_FIELDS = frozenset({"count", "limit", "offset", "expected_next_seq", "wait_ms"})

_T = TypeVar("_T", bound=msgspec.Struct)


def _field_from_path(path: str) -> str:
    """``$.items[3]`` -> ``items[3]``; ``$`` -> ``arguments``."""
    path = path.removeprefix("$").removeprefix(".")
    return path or "arguments"


def _explain(exc: msgspec.ValidationError) -> ToolFailure:
    """Turn msgspec's ``"Expected `int` >= 0 - at `$.count`"`` into field + rule."""
    text = str(exc)
    rule, sep, where = text.rpartition(" - at `")
    if not sep:
        rule, where = text, "$`"
    field = _field_from_path(where.rstrip("`"))
    if rule.startswith("Object missing required field `"):
        missing = rule.removeprefix("Object missing required field `").rstrip("`")
        field = missing if field == "arguments" else f"{field}.{missing}"
        rule = "this argument is required"
    else:
        rule = rule.replace("Expected `", "expected ").replace("`", "")
        rule = rule.replace("expected object", "expected a JSON object").replace("expected array", "expected a list")
        rule = rule.replace("expected int", "expected an integer").replace("expected str", "expected a string")
        rule = rule.replace(" | null", " or null")
    return invalid_arguments(field, rule)


def _normalize_integers(arguments: dict[str, Any]) -> dict[str, Any]:
    """JSON Schema counts ``5.0`` as an integer; turn such floats into ints."""
    out = arguments
    for name in _INTEGER_FIELDS & arguments.keys():
        value = arguments[name]
        if isinstance(value, float) and value.is_integer():
            if out is arguments:
                out = dict(arguments)
            out[name] = int(value)
    return out


def reject_unknown(tool: str, arguments: Mapping[str, Any], kind: type[msgspec.Struct]) -> None:
    """InvalidArguments for the first argument (in name order) that ``kind`` has no field for."""
    known = kind.__struct_fields__
    unknown = sorted(set(arguments) - set(known))
    if not unknown:
        return
    name = unknown[0]
    near = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    hint = f"did you mean `{near[0]}`?" if near else f"{tool} takes " + ", ".join(f"`{k}`" for k in sorted(known))
    raise invalid_arguments(name, f"not an argument of {tool}; {hint}")


def _check_conversation_id(value: str) -> None:
    try:
        ConversationId(value)
    except InvalidConversationId as exc:
        raise from_store_error(exc) from None


def parse_arguments(tool: str, arguments: dict[str, Any] | None) -> ToolArgs:
    """Validate ``arguments`` for ``tool`` and return them typed, defaults filled in.

    Raises :class:`ToolFailure` for any violation and ``KeyError`` for an
    unknown tool.
    """
    kind = ARGUMENT_TYPES[tool]
    raw = _normalize_integers(arguments or {})
    reject_unknown(tool, raw, kind)
    if kind is AppendArgs:
        # Batch-size rules have their own spec codes; check them before the generic ones.
        items = raw.get("items")
        if isinstance(items, list):
            if not items:
                raise from_store_error(EmptyBatch())
            if len(items) > MAX_BATCH_ITEMS:
                raise from_store_error(BatchTooLarge(MAX_BATCH_ITEMS, len(items), "items"))
    for name in ("offset", "expected_next_seq"):
        value = raw.get(name)
        if type(value) is int and value > _UINT64_MAX:
            raise invalid_arguments(name, f"expected an integer <= {_UINT64_MAX}")
    conversation_id = raw.get("conversation_id")
    if isinstance(conversation_id, str):
        _check_conversation_id(conversation_id)
    try:
        return msgspec.convert(raw, type=kind, strict=True)
    except msgspec.ValidationError as exc:
        raise _explain(exc) from None
