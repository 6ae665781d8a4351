"""Definitions of the long-term memory tools: names, titles, descriptions, schemas, annotations.

Every description says which of the two memories the tool touches: the
conversation log (working memory of one conversation, verbatim and ordered)
or long-term memories (a few durable facts shared by all conversations of
the site).
"""

from __future__ import annotations

import mcp_types as types

from convmem.logstore.memories import limits as L

from .memory_schemas import memory_input_schema, memory_output_schema

LONG_TERM = (
    "This tool works on LONG-TERM memories: a small set of durable facts (preferences, decisions, conventions, "
    "standing instructions) shared by every conversation of your site. It does not touch the conversation log "
    "(append_memory, recall_memory, replay_memory, list_conversations)."
)
NEVER_STORE = (
    "Never store secrets, passwords, API keys or other credentials, transient task state (what you are doing "
    "right now belongs in the conversation log), or anything the user did not mean to be kept."
)
_ERRORS = "Errors carry _meta['convmem/error'] with code and retryable. InvalidArguments names the field; fix it."


def _text(*paragraphs: str) -> str:
    return "\n\n".join(paragraphs)


VERIFY_DESCRIPTION = _text(
    "Step one of every long-term memory write: show the server the change you plan (create, update or delete) "
    "and get back the related memories already stored plus a verify_token for exactly that change.",
    "Read `related` before writing. The fact may already be stored (then do nothing, or update that memory); an "
    "older memory may contradict it (update or delete that one instead); if a related memory holds the same "
    "dedupe_key, a create would be refused. Then call memory_upsert or memory_delete with the token, or do "
    "nothing. Tokens are bound to your site, the intent and the exact candidate or memory id, work once, and "
    "expire after 10 minutes; a changed candidate needs a new memory_verify.",
    "intent create: pass candidate. intent update: pass memory_id and candidate (the memory's complete new "
    "fields). intent delete: pass memory_id, and force: true if the delete is to erase.",
    LONG_TERM,
    NEVER_STORE,
    _ERRORS + " NotFound: no memory with that id in your site.",
)

UPSERT_DESCRIPTION = _text(
    "Create a long-term memory (no memory_id) or replace all writable fields of one (with memory_id). Needs the "
    "verify_token of a memory_verify for this exact change; without one the call fails with VerifyRequired and "
    "nothing is written.",
    f"A memory: category (1-{L.CATEGORY_MAX} characters, freeform), subject (1-{L.SUBJECT_MAX}), summary "
    f"(1-{L.SUMMARY_MAX}; subject and summary are what surfaces later, so make them self-contained), details "
    f"(0-{L.DETAILS_MAX}), tags (0-{L.TAGS_MAX}, each 1-{L.TAG_MAX}), source_uris (0-{L.SOURCE_URIS_MAX} absolute "
    f"URIs, each up to {L.SOURCE_URI_MAX}), dedupe_key (optional, 1-{L.DEDUPE_KEY_MAX}, unique among your active "
    f"memories). A site holds at most {L.MAX_MEMORIES_PER_SITE:,} memories. Pass expected_version (the version "
    "you read) on updates so a concurrent change fails with VersionConflict instead of being overwritten.",
    LONG_TERM,
    NEVER_STORE,
    _ERRORS + " DuplicateMemory names the existing_id holding the dedupe_key; VersionConflict carries "
    "current_version; MemoryStoreFull means delete something first. None of these is retryable unchanged.",
)

DELETE_DESCRIPTION = _text(
    "Delete a long-term memory. Needs the verify_token of a memory_verify with intent delete for this memory_id "
    "and the same force (a token asked for a soft delete cannot erase).",
    "By default the delete is soft: the memory stops surfacing and searching (memory_get still shows it, with "
    "status 'deleted') and is erased for good after the retention window (30 days unless the operator set "
    "another). force: true erases it now: when the call returns, its subject, summary, details, tags, source URIs "
    "and dedupe key are in no file of the server's data directory, and exports no longer contain it. Use force "
    "when the user asks for something to be forgotten.",
    LONG_TERM,
    _ERRORS,
)

GET_DESCRIPTION = _text(
    "Load one long-term memory by id with all its fields (details, tags, source URIs, timestamps, version). Use it "
    "when a surfaced or searched memory's subject and summary are not enough, or to read the version before an "
    "update. Soft-deleted memories are returned with status 'deleted'; erased ones are NotFound.",
    LONG_TERM,
    _ERRORS,
)

SEARCH_DESCRIPTION = _text(
    "Search your site's long-term memories, most relevant to the query first (1-20 results, default 10). It "
    "matches subject, summary, details and tags. Filter by category and by tags (a memory must carry every "
    "tag given); soft-deleted memories only with include_deleted. Use it to browse what is remembered; for "
    "the few memories relevant to the task at hand, passing memory_context to recall_memory or append_memory "
    "is cheaper.",
    LONG_TERM,
    _ERRORS,
)

_READ_ONLY = types.ToolAnnotations(
    read_only_hint=True, destructive_hint=False, idempotent_hint=True, open_world_hint=False
)


def _tool(name: str, title: str, description: str, annotations: types.ToolAnnotations) -> types.Tool:
    return types.Tool(
        name=name,
        title=title,
        description=description,
        input_schema=memory_input_schema(name),
        output_schema=memory_output_schema(name),
        annotations=annotations.model_copy(update={"title": title}),
    )


def memory_tool_definitions() -> list[types.Tool]:
    """The five long-term memory tools as ``tools/list`` shows them."""
    write = types.ToolAnnotations(
        read_only_hint=False, destructive_hint=False, idempotent_hint=False, open_world_hint=False
    )
    return [
        _tool("memory_verify", "Verify a long-term memory change", VERIFY_DESCRIPTION, _READ_ONLY),
        _tool("memory_upsert", "Create or update a long-term memory", UPSERT_DESCRIPTION, write),
        _tool(
            "memory_delete",
            "Delete a long-term memory",
            DELETE_DESCRIPTION,
            write.model_copy(update={"destructive_hint": True}),
        ),
        _tool("memory_get", "Get a long-term memory", GET_DESCRIPTION, _READ_ONLY),
        _tool("memory_search", "Search long-term memories", SEARCH_DESCRIPTION, _READ_ONLY),
    ]
