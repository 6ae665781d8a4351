"""The tool definitions (name, title, description, schemas, annotations) and the server instructions.

Descriptions are written for the agent that reads them: what each tool is
for, which of the two memories it touches, when to prefer another, the id
rules, the limits, and how to treat errors. The four conversation-log tools
are defined here; the long-term memory tools in :mod:`.memory_tools`.
"""

from __future__ import annotations

import mcp_types as types

from convmem.logstore import MAX_BATCH_ITEMS, MAX_CONVERSATION_ITEMS, MAX_READ_ITEMS

from .memory_tools import NEVER_STORE, memory_tool_definitions
from .schemas import input_schema, output_schema

_ID_RULE = (
    "conversation_id is a handle you mint yourself, once per conversation, and reuse for every call about that "
    "conversation: 8-64 characters from A-Z, a-z, 0-9, '_' and '-' (a UUID or nanoid is ideal). Never derive it "
    "from personal data such as names, e-mail addresses or account ids."
)
_AUTH = "Calls need HTTP Basic credentials: your site name and its password; you only ever see your own site's data."
_RETRY = (
    "Errors say whether they are retryable (see _meta['convmem/error'].retryable). Validation errors are permanent: "
    "fix the call. Storage errors (Unavailable, Timeout, Io) are safe to retry; keep the batch meanwhile. A retried "
    "append may store the batch twice, which is acceptable. Never let a failed memory call stall the conversation."
)


_LOG = (
    "This tool works on the CONVERSATION LOG: the working memory of a conversation, every entry kept verbatim "
    "and in order. It does not touch long-term memories (durable facts across conversations: memory_search, "
    "memory_get, and memory_verify before memory_upsert or memory_delete)."
)
_CONTEXT = (
    "Optional memory_context (1-1000 characters: the current task, query, key entities, constraints): the reply "
    "then also lists the one or two most relevant long-term memories of your site (`memories`: id, subject, "
    "summary, plus a 'Relevant memories' text section). They may repeat on later calls; keep using them. Without "
    "memory_context the reply is exactly the plain log result."
)


def _text(*paragraphs: str) -> str:
    """Paragraphs joined by blank lines."""
    return "\n\n".join(paragraphs)


APPEND_DESCRIPTION = _text(
    "Append entries to a conversation's log (its working memory), in order, and get back the sequence numbers "
    "they were given.",
    _LOG,
    "Use it as the conversation progresses: each item is one JSON object whose keys describe it (for example "
    '{"role": "user", "text": "..."} or {"kind": "decision", "summary": "..."}); it is stored exactly as sent. '
    "A batch is written atomically (all items or none) and in order; the reply (first_seq, last_seq) confirms "
    "that it is durable. It is a receipt, not a signal to slow down.",
    _ID_RULE,
    f"Limits: 1-{MAX_BATCH_ITEMS} items per call; each item at most 256 KiB and the whole batch at most 1 MiB, "
    f"measured as compact JSON; at most {MAX_CONVERSATION_ITEMS:,} items per conversation.",
    _CONTEXT,
    f"{_AUTH} {_RETRY}",
)

RECALL_DESCRIPTION = _text(
    "Fetch the most recent entries of a conversation's log: the usual way to pick a conversation back up at "
    "the start of a session or after a break.",
    _LOG,
    f"Returns the last `count` items (default 50, at most {MAX_READ_ITEMS}) in ascending seq order, so the oldest "
    "of them comes first. A conversation with fewer items returns all of them, and a conversation that has never "
    "been written to returns an empty list rather than an error, so a brand-new id needs no special handling.",
    "Use replay_memory instead to read from a given position or to rebuild a whole conversation from its start; "
    "use list_conversations to find out which conversations your site has.",
    _ID_RULE,
    _CONTEXT,
    f"{_AUTH} {_RETRY}",
)

REPLAY_DESCRIPTION = _text(
    "Read a conversation's log from a given position onward, page by page: the way to rebuild a conversation "
    "completely, e.g. after a restart.",
    _LOG,
    f"Returns up to `limit` items (at most {MAX_READ_ITEMS}) starting at seq `offset` (default 0), in ascending "
    "seq order. To read everything: start at offset 0, continue from the last returned seq + 1, and stop at the "
    "first page with fewer than `limit` items (possibly empty). Seqs start at 0 and have no gaps, so they double "
    "as offsets; there is no cursor. An offset beyond the end, or a conversation never written to, gives an "
    "empty list.",
    "For just the latest items use recall_memory; to discover conversations use list_conversations.",
    _ID_RULE,
    f"{_AUTH} {_RETRY}",
)

LIST_DESCRIPTION = _text(
    "List the conversations stored for your site: each one's id, creation time and last-append time, most "
    "recently active first. No item contents are returned.",
    _LOG,
    "Use it to discover conversations you do not already know about. To read one, use recall_memory (latest "
    "items) or replay_memory (from a position); to check whether a known conversation holds anything, a "
    "recall_memory that returns items is the check, not this listing.",
    f"Pages hold up to `limit` entries (default 50, at most {MAX_READ_ITEMS}). While more remain the reply "
    "carries next_cursor: pass it back unchanged as `cursor` for the next page; a null next_cursor means the "
    "listing is complete. Cursors are bound to your site.",
    "Only your authenticated site's conversations are listed. Conversations within one site are not isolated "
    "from each other; use separate sites to keep sets of conversations strictly apart.",
    f"{_AUTH} {_RETRY}",
)

INSTRUCTIONS = "\n".join(
    [
        "convmem keeps two kinds of memory for your site, durable across sessions.",
        "1. The conversation log (working memory): everything of one conversation, verbatim and in order. "
        "Tools: append_memory, recall_memory, replay_memory, list_conversations.",
        "- Mint one random id per conversation (e.g. a UUID) and reuse it; never derive it from personal data.",
        "- At the start of a session, call recall_memory with that id to rehydrate recent context "
        "(an unknown id just returns nothing).",
        "- As you go, append_memory what happens, as small self-describing JSON objects, in batches.",
        "- replay_memory rebuilds a whole conversation page by page; list_conversations finds conversations "
        "you have lost track of.",
        "2. Long-term memories: a few durable facts that matter in any later conversation (the user's "
        "preferences, decisions, conventions, standing instructions). Tools: memory_verify, memory_upsert, "
        "memory_delete, memory_get, memory_search.",
        "- Pass a short memory_context (task, query, entities, constraints) to recall_memory or append_memory and "
        "the one or two most relevant long-term memories come back with the result.",
        "- Save a long-term memory only when a fact will still matter later, or the user asks you to remember it.",
        "- Every create, update or delete starts with memory_verify: read the related memories it returns, then "
        "upsert, delete, or do nothing, passing its verify_token. Prefer updating an existing memory to adding a "
        "near-duplicate; delete with force: true when the user asks for something to be forgotten.",
        f"- {NEVER_STORE}",
        "- Memory must never block the conversation: on a retryable error keep the batch and retry later.",
    ]
)

_READ_ONLY = types.ToolAnnotations(
    read_only_hint=True, destructive_hint=False, idempotent_hint=True, open_world_hint=False
)


def tool_definitions() -> list[types.Tool]:
    """The tools as advertised by ``tools/list``."""
    return [
        types.Tool(
            name="append_memory",
            title="Append to the conversation log",
            description=APPEND_DESCRIPTION,
            input_schema=input_schema("append_memory"),
            output_schema=output_schema("append_memory"),
            annotations=types.ToolAnnotations(
                title="Append to the conversation log",
                read_only_hint=False,
                destructive_hint=False,
                idempotent_hint=False,
                open_world_hint=False,
            ),
        ),
        types.Tool(
            name="recall_memory",
            title="Recall the conversation log",
            description=RECALL_DESCRIPTION,
            input_schema=input_schema("recall_memory"),
            output_schema=output_schema("recall_memory"),
            annotations=_READ_ONLY.model_copy(update={"title": "Recall the conversation log"}),
        ),
        types.Tool(
            name="replay_memory",
            title="Replay the conversation log",
            description=REPLAY_DESCRIPTION,
            input_schema=input_schema("replay_memory"),
            output_schema=output_schema("replay_memory"),
            annotations=_READ_ONLY.model_copy(update={"title": "Replay the conversation log"}),
        ),
        types.Tool(
            name="list_conversations",
            title="List conversations",
            description=LIST_DESCRIPTION,
            input_schema=input_schema("list_conversations"),
            output_schema=output_schema("list_conversations"),
            annotations=_READ_ONLY.model_copy(update={"title": "List conversations"}),
        ),
        *memory_tool_definitions(),
    ]
