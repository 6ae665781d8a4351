"""The JSON schemas of the four tools, exactly as the contract fixes them.

Structure (property names, types, bounds, ``format``, defaults, ``required``,
``$defs``, ``title``) follows the conversation-memory spec to the letter; the
``description`` texts are convmem's own. The bounds are spelled out from
:mod:`logstore`'s limits so that the two can never drift apart silently.

Every function returns a fresh deep copy, so a caller may mutate what it gets.
"""

from __future__ import annotations

import copy
from typing import Any

from convmem.logstore import MAX_BATCH_ITEMS, MAX_READ_ITEMS

from .bounds import IDEMPOTENCY_KEY_MAX, IDEMPOTENCY_KEY_PATTERN, MAX_WAIT_MS
from .memory_schemas import with_memory_context

JsonSchema = dict[str, Any]

_ID_RULES = "8 to 64 characters, each a letter, digit, '_' or '-'"

_CONV_ID_FOR_READ = {
    "description": (
        "Id of the conversation to read: the same handle that was used to append to it "
        f"({_ID_RULES}). A malformed id is an error; a well-formed id that was never "
        "appended to simply has no items."
    ),
    "type": "string",
}

_MEMORY_ITEM: JsonSchema = {
    "properties": {
        "payload": {
            "additionalProperties": True,
            "description": "The JSON object that was appended, returned byte-for-byte as stored; the server never "
            "looks inside it.",
            "type": "object",
        },
        "recorded_at": {
            "description": "When the server committed the batch this item came in (RFC 3339, UTC). Items appended "
            "together carry the same value.",
            "type": "string",
        },
        "seq": {
            "description": "Position of the item in its conversation: starts at 0 and grows by one per item, "
            "without gaps.",
            "format": "uint64",
            "minimum": 0,
            "type": "integer",
        },
    },
    "required": ["seq", "recorded_at", "payload"],
    "type": "object",
}

_CONVERSATION_SUMMARY: JsonSchema = {
    "properties": {
        "conversation_id": {
            "description": "The conversation's id, exactly as the client chose it.",
            "type": "string",
        },
        "created_at": {
            "description": "Commit time (RFC 3339, UTC) of the conversation's first item.",
            "type": "string",
        },
        "last_appended_at": {
            "description": "Commit time (RFC 3339, UTC) of the conversation's newest item; the listing is sorted "
            "on this, newest first.",
            "type": "string",
        },
    },
    "required": ["conversation_id", "created_at", "last_appended_at"],
    "type": "object",
}

APPEND_MEMORY_REQUEST: JsonSchema = {
    "properties": {
        "conversation_id": {
            "description": (
                f"Id of the conversation to write to, chosen by you ({_ID_RULES}); mint one random id "
                "(a UUID works) per conversation and keep using it. Never build it from personal data. "
                "A malformed id is rejected; it never silently starts a different conversation."
            ),
            "type": "string",
        },
        "items": {
            "description": (
                f"The entries to store, oldest first: 1 to {MAX_BATCH_ITEMS} JSON objects, each one "
                'self-describing through its keys (for example {"role": "user", "text": "..."}). '
                "They are kept exactly as sent and committed together: either all of them or none."
            ),
            "items": {"additionalProperties": True, "type": "object"},
            "maxItems": MAX_BATCH_ITEMS,
            "minItems": 1,
            "type": "array",
        },
    },
    "required": ["conversation_id", "items"],
    "title": "AppendMemoryRequest",
    "type": "object",
}

APPEND_MEMORY_RESPONSE: JsonSchema = {
    "properties": {
        "first_seq": {
            "description": "Sequence number given to the batch's first item (per conversation, counting from 0).",
            "format": "uint64",
            "minimum": 0,
            "type": "integer",
        },
        "last_seq": {
            "description": "Sequence number given to the batch's last item; the batch holds every seq from "
            "first_seq to last_seq, both included.",
            "format": "uint64",
            "minimum": 0,
            "type": "integer",
        },
    },
    "required": ["first_seq", "last_seq"],
    "title": "AppendMemoryResponse",
    "type": "object",
}

RECALL_MEMORY_REQUEST: JsonSchema = {
    "properties": {
        "conversation_id": _CONV_ID_FOR_READ,
        "count": {
            "default": 50,
            "description": (
                f"How many of the newest items to return (0 to {MAX_READ_ITEMS}, default 50). They come back "
                "oldest first; a shorter log returns everything it has, and 0 returns nothing."
            ),
            "format": "uint64",
            "maximum": MAX_READ_ITEMS,
            "minimum": 0,
            "type": "integer",
        },
    },
    "required": ["conversation_id"],
    "title": "RecallMemoryRequest",
    "type": "object",
}

RECALL_MEMORY_RESPONSE: JsonSchema = {
    "$defs": {"McpMemoryItem": _MEMORY_ITEM},
    "properties": {
        "items": {
            "description": "The newest items of the conversation, in ascending seq order; empty for a conversation "
            "that holds nothing yet.",
            "items": {"$ref": "#/$defs/McpMemoryItem"},
            "type": "array",
        },
    },
    "required": ["items"],
    "title": "RecallMemoryResponse",
    "type": "object",
}

REPLAY_MEMORY_REQUEST: JsonSchema = {
    "properties": {
        "conversation_id": _CONV_ID_FOR_READ,
        "limit": {
            "description": (
                f"Page size: the most items to return (0 to {MAX_READ_ITEMS}). Receiving fewer than this "
                "means you have reached the end of the log."
            ),
            "format": "uint64",
            "maximum": MAX_READ_ITEMS,
            "minimum": 0,
            "type": "integer",
        },
        "offset": {
            "default": 0,
            "description": (
                "Seq of the first item to return (default 0). Seqs start at 0 and have no gaps, so to get the "
                "next page pass the last returned seq plus one."
            ),
            "format": "uint64",
            "minimum": 0,
            "type": "integer",
        },
    },
    "required": ["conversation_id", "limit"],
    "title": "ReplayMemoryRequest",
    "type": "object",
}

REPLAY_MEMORY_RESPONSE: JsonSchema = {
    "$defs": {"McpMemoryItem": _MEMORY_ITEM},
    "properties": {
        "items": {
            "description": "Items starting at seq `offset`, ascending. Fewer than `limit` (possibly none) means the "
            "log ends here; an unknown conversation or an offset beyond the end gives an empty list.",
            "items": {"$ref": "#/$defs/McpMemoryItem"},
            "type": "array",
        },
    },
    "required": ["items"],
    "title": "ReplayMemoryResponse",
    "type": "object",
}

LIST_CONVERSATIONS_REQUEST: JsonSchema = {
    "properties": {
        "cursor": {
            "default": None,
            "description": "Continuation token: the next_cursor of the previous page, passed back unchanged. Leave "
            "it out (or null) for the first page.",
            "type": ["string", "null"],
        },
        "limit": {
            "default": 50,
            "description": f"Most conversations to return in this page (0 to {MAX_READ_ITEMS}, default 50).",
            "format": "uint64",
            "maximum": MAX_READ_ITEMS,
            "minimum": 0,
            "type": "integer",
        },
    },
    "title": "ListConversationsRequest",
    "type": "object",
}

LIST_CONVERSATIONS_RESPONSE: JsonSchema = {
    "$defs": {"McpConversationSummary": _CONVERSATION_SUMMARY},
    "properties": {
        "conversations": {
            "description": "This page of your site's conversations, most recently appended first; ids and "
            "timestamps only, no stored items.",
            "items": {"$ref": "#/$defs/McpConversationSummary"},
            "type": "array",
        },
        "next_cursor": {
            "description": "Pass this back as `cursor` to get the next page; null when there is nothing more.",
            "type": ["string", "null"],
        },
    },
    "required": ["conversations"],
    "title": "ListConversationsResponse",
    "type": "object",
}

#: Optional properties convmem adds to append_memory; without them the tool is the spec's.
APPEND_OPTIONS: JsonSchema = {
    "idempotency_key": {
        "description": (
            f"Optional key you mint for this batch (1-{IDEMPOTENCY_KEY_MAX} characters from [A-Za-z0-9_-], e.g. a "
            "UUID) and send "
            "again, unchanged, with the same items when you retry it. A retry of a batch that was already stored "
            "writes nothing and returns its original first_seq/last_seq; the same key with other items fails "
            "with IdempotencyConflict naming the original range. Keys are remembered per conversation for at "
            "least its last 10,000 batches or 24 hours, whichever is longer."
        ),
        "maxLength": IDEMPOTENCY_KEY_MAX,
        "minLength": 1,
        "pattern": IDEMPOTENCY_KEY_PATTERN,
        "type": "string",
    },
    "expected_next_seq": {
        "description": (
            "Optional: append only if the conversation's next seq is this one (the last seq you know of plus "
            "one; 0 for an empty conversation). Otherwise nothing is written and the call fails with "
            "SeqConflict carrying actual_next_seq."
        ),
        "format": "uint64",
        "minimum": 0,
        "type": "integer",
    },
}

#: Optional property convmem adds to replay_memory.
REPLAY_OPTIONS: JsonSchema = {
    "wait_ms": {
        "default": 0,
        "description": (
            f"Optional, 0-{MAX_WAIT_MS}: when `offset` is at the end of the log, wait up to this many "
            "milliseconds for an item to arrive (appended by anyone) instead of returning an empty page at once. "
            "Returns as soon as there is at least one item; an empty page means nothing arrived in time."
        ),
        "maximum": MAX_WAIT_MS,
        "minimum": 0,
        "type": "integer",
    },
}


def _with_options(request: JsonSchema, options: JsonSchema) -> JsonSchema:
    """``request`` with the optional ``options`` added to its properties (never to ``required``)."""
    out = copy.deepcopy(request)
    out["properties"].update(copy.deepcopy(options))
    return out


# append_memory and recall_memory also take the optional long-term memory hint (see memory_schemas).
_SCHEMAS: dict[str, tuple[JsonSchema, JsonSchema]] = {
    "append_memory": with_memory_context(_with_options(APPEND_MEMORY_REQUEST, APPEND_OPTIONS), APPEND_MEMORY_RESPONSE),
    "recall_memory": with_memory_context(RECALL_MEMORY_REQUEST, RECALL_MEMORY_RESPONSE),
    "replay_memory": (_with_options(REPLAY_MEMORY_REQUEST, REPLAY_OPTIONS), REPLAY_MEMORY_RESPONSE),
    "list_conversations": (LIST_CONVERSATIONS_REQUEST, LIST_CONVERSATIONS_RESPONSE),
}

TOOL_NAMES: tuple[str, ...] = tuple(_SCHEMAS)


def input_schema(tool: str) -> JsonSchema:
    """A fresh copy of ``tool``'s input schema. Raises KeyError for an unknown tool."""
    return copy.deepcopy(_SCHEMAS[tool][0])


def output_schema(tool: str) -> JsonSchema:
    """A fresh copy of ``tool``'s output schema. Raises KeyError for an unknown tool."""
    return copy.deepcopy(_SCHEMAS[tool][1])
