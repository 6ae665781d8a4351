"""JSON schemas of the long-term memory tools, and the optional additions to two spec tools.

Same style as :mod:`mcp_adapter.schemas`: every property described, bounds
spelled out from :mod:`logstore.memories.limits`, a ``title`` per schema.
The additions to ``recall_memory`` and ``append_memory`` are optional
properties only (``memory_context`` in, ``memories`` out), so every property
of the spec's schemas stays exactly as it is.
"""

from __future__ import annotations

import copy
from typing import Any

from convmem.logstore.memories import limits as L

JsonSchema = dict[str, Any]

_MEMORY_ID: JsonSchema = {
    "description": "A memory's id as the server minted it: 'mem_' followed by a 26-character ULID.",
    "maxLength": 30,
    "minLength": 30,
    "type": "string",
}

_FIELDS: JsonSchema = {
    "additionalProperties": False,
    "properties": {
        "category": {
            "description": "A freeform kind of fact, e.g. 'preference', 'project', 'person', 'procedure'.",
            "maxLength": L.CATEGORY_MAX,
            "minLength": 1,
            "type": "string",
        },
        "subject": {
            "description": "What the fact is about, in a few words; shown when the memory surfaces.",
            "maxLength": L.SUBJECT_MAX,
            "minLength": 1,
            "type": "string",
        },
        "summary": {
            "description": "The fact itself in one or two sentences; shown with the subject when it surfaces.",
            "maxLength": L.SUMMARY_MAX,
            "minLength": 1,
            "type": "string",
        },
        "details": {
            "default": "",
            "description": "Optional longer context, returned by memory_get and memory_search only.",
            "maxLength": L.DETAILS_MAX,
            "minLength": 0,
            "type": "string",
        },
        "tags": {
            "default": [],
            "description": f"Up to {L.TAGS_MAX} short labels for filtering searches (each 1-{L.TAG_MAX} characters).",
            "items": {"maxLength": L.TAG_MAX, "minLength": 1, "type": "string"},
            "maxItems": L.TAGS_MAX,
            "type": "array",
        },
        "source_uris": {
            "default": [],
            "description": f"Up to {L.SOURCE_URIS_MAX} absolute URIs of documents the fact comes from; stored "
            "as given and never fetched.",
            "items": {"format": "uri", "maxLength": L.SOURCE_URI_MAX, "minLength": 1, "type": "string"},
            "maxItems": L.SOURCE_URIS_MAX,
            "type": "array",
        },
        "dedupe_key": {
            "default": None,
            "description": "Optional stable key for one fact (e.g. 'user.units'); no two active memories of "
            "your site may share it, so a second copy is refused with DuplicateMemory.",
            "maxLength": L.DEDUPE_KEY_MAX,
            "minLength": 1,
            "type": ["string", "null"],
        },
    },
    "required": ["category", "subject", "summary"],
    "type": "object",
}

_TIMESTAMP = "RFC 3339, UTC, microseconds"

_RECORD: JsonSchema = {
    "properties": {
        "id": {"description": "The memory's id.", "type": "string"},
        "category": {"description": "The memory's category.", "type": "string"},
        "subject": {"description": "What the fact is about.", "type": "string"},
        "summary": {"description": "The fact in one or two sentences.", "type": "string"},
        "details": {"description": "Longer context; may be empty.", "type": "string"},
        "tags": {"description": "Labels for filtering.", "items": {"type": "string"}, "type": "array"},
        "source_uris": {"description": "Where the fact comes from.", "items": {"type": "string"}, "type": "array"},
        "dedupe_key": {"description": "The fact's unique key, if it has one.", "type": ["string", "null"]},
        "status": {
            "description": "'active', or 'deleted' for a soft-deleted memory awaiting erasure.",
            "enum": ["active", "deleted"],
            "type": "string",
        },
        "created_at": {"description": f"When the memory was created ({_TIMESTAMP}).", "type": "string"},
        "updated_at": {"description": f"When it last changed ({_TIMESTAMP}).", "type": "string"},
        "last_accessed_at": {"description": f"When it was last read or surfaced ({_TIMESTAMP}).", "type": "string"},
        "deleted_at": {
            "description": f"When it was soft-deleted ({_TIMESTAMP}), else null.",
            "type": ["string", "null"],
        },
        "version": {
            "description": "1 at creation, +1 per change; pass it as expected_version to update safely.",
            "minimum": 1,
            "type": "integer",
        },
        "score": {
            "description": "Search and verify only: the cosine similarity of the memory to the query, -1 to 1 "
            "(about 0.6 and above: the same topic; below 0.3: weak, likely unrelated unless it holds the query's "
            "words; memory_context surfaces nothing below 0.3). Hits are ordered by a fusion with keyword "
            "matching, so a lower score can rank higher. Null for memories listed because of memory_id or "
            "dedupe_key.",
            "type": ["number", "null"],
        },
    },
    "required": ["id", "category", "subject", "summary", "status", "version"],
    "type": "object",
}

_SURFACED: JsonSchema = {
    "properties": {
        "id": {"description": "The memory's id (memory_get loads its details).", "type": "string"},
        "subject": {"description": "What the remembered fact is about.", "type": "string"},
        "summary": {"description": "The remembered fact itself, in a sentence or two.", "type": "string"},
    },
    "required": ["id", "subject", "summary"],
    "type": "object",
}

_TOKEN: JsonSchema = {
    "description": "The verify_token memory_verify returned for exactly this change (same intent and candidate "
    "or memory id; single use; valid 10 minutes). Without a valid one the call fails with VerifyRequired.",
    "maxLength": 512,
    "type": "string",
}

MEMORY_CONTEXT: JsonSchema = {
    "description": "Optional short hint about the current task (task, query, key entities, constraints; "
    f"1-{L.CONTEXT_MAX} characters). When given, the reply also lists the one or two most relevant long-term "
    "memories of your site under `memories`. Leave it out and the reply is exactly as without this feature.",
    "maxLength": L.CONTEXT_MAX,
    "minLength": 1,
    "type": "string",
}

SURFACED_MEMORIES: JsonSchema = {
    "description": "Only when memory_context was given: up to two relevant active long-term memories (id, "
    "subject, summary). They may repeat on later calls; that is intended.",
    "items": {"$ref": "#/$defs/SurfacedMemory"},
    "type": "array",
}

MEMORY_VERIFY_REQUEST: JsonSchema = {
    "$defs": {"MemoryFields": _FIELDS},
    "properties": {
        "intent": {
            "description": "The change you plan: 'create' (needs candidate), 'update' (needs memory_id and "
            "candidate: the memory's full new fields) or 'delete' (needs memory_id).",
            "enum": ["create", "update", "delete"],
            "type": "string",
        },
        "candidate": {
            "$ref": "#/$defs/MemoryFields",
            "description": "The memory as you intend to write it (create and update).",
        },
        "memory_id": {**_MEMORY_ID, "description": "The memory to update or delete."},
        "force": {
            "default": False,
            "description": "Delete only: the force the memory_delete will pass. The token authorises exactly "
            "that: a token asked for a soft delete (false) cannot erase, nor one asked for an erasure soft-delete.",
            "type": "boolean",
        },
    },
    "required": ["intent"],
    "title": "MemoryVerifyRequest",
    "type": "object",
}

MEMORY_VERIFY_RESPONSE: JsonSchema = {
    "$defs": {"MemoryRecord": _RECORD},
    "properties": {
        "related": {
            "description": "Existing active memories related to the change, most relevant first: the target of "
            "memory_id first, then any holding the candidate's dedupe_key, then search hits. Read them before "
            "writing: the fact may already be stored, or an old memory may need updating or deleting instead.",
            "items": {"$ref": "#/$defs/MemoryRecord"},
            "type": "array",
        },
        "verify_token": {
            "description": "Pass this to memory_upsert or memory_delete for exactly this change; single use.",
            "type": "string",
        },
        "expires_at": {"description": f"When the token stops being accepted ({_TIMESTAMP}).", "type": "string"},
    },
    "required": ["related", "verify_token", "expires_at"],
    "title": "MemoryVerifyResponse",
    "type": "object",
}

MEMORY_UPSERT_REQUEST: JsonSchema = {
    "$defs": {"MemoryFields": _FIELDS},
    "properties": {
        "memory": {
            "$ref": "#/$defs/MemoryFields",
            "description": "The memory's writable fields; on update they replace all of the old ones.",
        },
        "memory_id": {**_MEMORY_ID, "description": "Leave out to create a memory; give it to update that memory."},
        "verify_token": _TOKEN,
        "expected_version": {
            "description": "Update only: the version you read; a different current version fails with "
            "VersionConflict instead of overwriting someone else's change.",
            "minimum": 1,
            "type": "integer",
        },
    },
    "required": ["memory"],
    "title": "MemoryUpsertRequest",
    "type": "object",
}

MEMORY_RECORD_RESPONSE: JsonSchema = {
    "$defs": {"MemoryRecord": _RECORD},
    "properties": {"memory": {"$ref": "#/$defs/MemoryRecord", "description": "The memory as stored now."}},
    "required": ["memory"],
    "type": "object",
}

MEMORY_DELETE_REQUEST: JsonSchema = {
    "properties": {
        "memory_id": {**_MEMORY_ID, "description": "The memory to delete."},
        "verify_token": _TOKEN,
        "force": {
            "default": False,
            "description": "false (default): soft delete; the memory stops surfacing and is erased after the "
            "retention window. true: erase it now, permanently; nothing of its content remains on disk.",
            "type": "boolean",
        },
    },
    "required": ["memory_id"],
    "title": "MemoryDeleteRequest",
    "type": "object",
}

MEMORY_DELETE_RESPONSE: JsonSchema = {
    "$defs": {"MemoryRecord": _RECORD},
    "properties": {
        "memory_id": {"description": "The memory the call deleted.", "type": "string"},
        "status": {
            "description": "'deleted' (soft-deleted, still readable with memory_get) or 'erased' (gone).",
            "enum": ["deleted", "erased"],
            "type": "string",
        },
        "memory": {
            "anyOf": [{"$ref": "#/$defs/MemoryRecord"}, {"type": "null"}],
            "description": "The soft-deleted record, or null once erased.",
        },
    },
    "required": ["memory_id", "status"],
    "title": "MemoryDeleteResponse",
    "type": "object",
}

MEMORY_GET_REQUEST: JsonSchema = {
    "properties": {"memory_id": {**_MEMORY_ID, "description": "The memory to load, with all its fields."}},
    "required": ["memory_id"],
    "title": "MemoryGetRequest",
    "type": "object",
}

MEMORY_SEARCH_REQUEST: JsonSchema = {
    "properties": {
        "query": {
            "description": "What you are looking for, in words (matched on subject, summary, details and tags).",
            "maxLength": L.CONTEXT_MAX,
            "minLength": 1,
            "type": "string",
        },
        "category": {
            "description": "Only memories of this category.",
            "maxLength": L.CATEGORY_MAX,
            "minLength": 1,
            "type": "string",
        },
        "tags": {
            "default": [],
            "description": "Only memories carrying every one of these tags (exact match).",
            "items": {"maxLength": L.TAG_MAX, "minLength": 1, "type": "string"},
            "maxItems": L.TAGS_MAX,
            "type": "array",
        },
        "limit": {
            "default": 10,
            "description": f"Most memories to return (1 to {L.SEARCH_LIMIT_MAX}, default 10).",
            "maximum": L.SEARCH_LIMIT_MAX,
            "minimum": 1,
            "type": "integer",
        },
        "include_deleted": {
            "default": False,
            "description": "Also return soft-deleted memories (default false).",
            "type": "boolean",
        },
    },
    "required": ["query"],
    "title": "MemorySearchRequest",
    "type": "object",
}

MEMORY_SEARCH_RESPONSE: JsonSchema = {
    "$defs": {"MemoryRecord": _RECORD},
    "properties": {
        "memories": {
            "description": "Matching memories, most relevant first; empty when nothing matches.",
            "items": {"$ref": "#/$defs/MemoryRecord"},
            "type": "array",
        }
    },
    "required": ["memories"],
    "title": "MemorySearchResponse",
    "type": "object",
}

_SCHEMAS: dict[str, tuple[JsonSchema, JsonSchema]] = {
    "memory_verify": (MEMORY_VERIFY_REQUEST, MEMORY_VERIFY_RESPONSE),
    "memory_upsert": (MEMORY_UPSERT_REQUEST, {**MEMORY_RECORD_RESPONSE, "title": "MemoryUpsertResponse"}),
    "memory_delete": (MEMORY_DELETE_REQUEST, MEMORY_DELETE_RESPONSE),
    "memory_get": (MEMORY_GET_REQUEST, {**MEMORY_RECORD_RESPONSE, "title": "MemoryGetResponse"}),
    "memory_search": (MEMORY_SEARCH_REQUEST, MEMORY_SEARCH_RESPONSE),
}

MEMORY_TOOL_NAMES: tuple[str, ...] = tuple(_SCHEMAS)


def memory_input_schema(tool: str) -> JsonSchema:
    return copy.deepcopy(_SCHEMAS[tool][0])


def memory_output_schema(tool: str) -> JsonSchema:
    return copy.deepcopy(_SCHEMAS[tool][1])


def with_memory_context(request: JsonSchema, response: JsonSchema) -> tuple[JsonSchema, JsonSchema]:
    """A spec tool's schemas plus the optional memory_context / memories properties (copies)."""
    request, response = copy.deepcopy(request), copy.deepcopy(response)
    request["properties"]["memory_context"] = copy.deepcopy(MEMORY_CONTEXT)
    response.setdefault("$defs", {})["SurfacedMemory"] = copy.deepcopy(_SURFACED)
    response["properties"]["memories"] = copy.deepcopy(SURFACED_MEMORIES)
    return request, response
