"""The long-term memory tools: argument checking and the calls into :class:`logstore.memories.LongTermMemory`.

Top-level arguments are checked here (types and bounds, as the schemas
publish them); the memory's own fields are checked by the store, which names
the field (``memory.subject``, ``candidate.tags[2]``) in ``InvalidArguments``.
Nothing is written unless every check passes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Literal

import msgspec

from convmem.logstore import StoreError
from convmem.logstore.memories import Memory
from convmem.logstore.memories import limits as L
from convmem.logstore.timefmt import format_us

from .errors import ToolFailure, invalid_arguments
from .validation import _explain, reject_unknown

if TYPE_CHECKING:
    from .server import Backend

_UNSET = msgspec.UNSET
Unset = msgspec.UnsetType

Query = Annotated[str, msgspec.Meta(min_length=1, max_length=L.CONTEXT_MAX)]
Category = Annotated[str, msgspec.Meta(min_length=1, max_length=L.CATEGORY_MAX)]
Tag = Annotated[str, msgspec.Meta(min_length=1, max_length=L.TAG_MAX)]
Token = Annotated[str, msgspec.Meta(max_length=512)]
Version = Annotated[int, msgspec.Meta(ge=1)]
Limit = Annotated[int, msgspec.Meta(ge=1, le=L.SEARCH_LIMIT_MAX)]


class VerifyArgs(msgspec.Struct, frozen=True):
    intent: Literal["create", "update", "delete"]
    candidate: dict[str, Any] | Unset = _UNSET
    memory_id: str | Unset = _UNSET
    force: bool = False


class UpsertArgs(msgspec.Struct, frozen=True):
    memory: dict[str, Any]
    memory_id: str | Unset = _UNSET
    verify_token: Token | Unset = _UNSET
    expected_version: Version | Unset = _UNSET


class DeleteArgs(msgspec.Struct, frozen=True):
    memory_id: str
    verify_token: Token | Unset = _UNSET
    force: bool = False


class GetArgs(msgspec.Struct, frozen=True):
    memory_id: str


class SearchArgs(msgspec.Struct, frozen=True):
    query: Query
    category: Category | Unset = _UNSET
    tags: Annotated[list[Tag], msgspec.Meta(max_length=L.TAGS_MAX)] = []
    limit: Limit = 10
    include_deleted: bool = False


MemoryArgs = VerifyArgs | UpsertArgs | DeleteArgs | GetArgs | SearchArgs

MEMORY_ARGUMENT_TYPES: dict[str, type[MemoryArgs]] = {
    "memory_verify": VerifyArgs,
    "memory_upsert": UpsertArgs,
    "memory_delete": DeleteArgs,
    "memory_get": GetArgs,
    "memory_search": SearchArgs,
}


def parse_memory_arguments(tool: str, arguments: dict[str, Any] | None) -> MemoryArgs:
    """Validate a memory tool's top-level arguments; ToolFailure(InvalidArguments) naming the field otherwise."""
    raw = dict(arguments or {})
    for name in ("limit", "expected_version"):
        value = raw.get(name)
        if isinstance(value, float) and value.is_integer():
            raw[name] = int(value)
    for name in ("candidate", "memory"):
        if raw.get(name) is None and name in raw and tool != "memory_upsert":
            del raw[name]  # null means "not given" for the optional candidate
    reject_unknown(tool, raw, MEMORY_ARGUMENT_TYPES[tool])
    try:
        return msgspec.convert(raw, type=MEMORY_ARGUMENT_TYPES[tool], strict=True)
    except msgspec.ValidationError as exc:
        failure = _explain(exc)
        if failure.details.get("field") == "intent" and "enum" in failure.message:
            raise invalid_arguments("intent", "expected one of create, update, delete") from None
        raise failure from None


def _opt(value: Any) -> Any:
    return None if value is _UNSET else value


def record(m: Memory, score: float | Unset | None = _UNSET) -> dict[str, Any]:
    out = m.to_json()
    if score is not _UNSET:
        out["score"] = score
    return out


def run_memory_call(backend: Backend, site: str, args: MemoryArgs) -> dict[str, Any]:
    """Run one validated memory call (blocking; the server runs it in a worker thread)."""
    store = backend.memory_store()
    if isinstance(args, VerifyArgs):
        related, token, expires = store.verify(
            site, args.intent, _opt(args.candidate), _opt(args.memory_id), force=args.force
        )
        return {
            "related": [record(m, s) for m, s in related],
            "verify_token": token,
            "expires_at": format_us(expires),
        }
    if isinstance(args, UpsertArgs):
        m = store.upsert(site, args.memory, _opt(args.verify_token), _opt(args.memory_id), _opt(args.expected_version))
        return {"memory": record(m)}
    if isinstance(args, DeleteArgs):
        gone = store.delete(site, args.memory_id, _opt(args.verify_token), args.force)
        if gone is None:
            return {"memory_id": args.memory_id, "status": "erased", "memory": None}
        return {"memory_id": args.memory_id, "status": "deleted", "memory": record(gone)}
    if isinstance(args, GetArgs):
        return {"memory": record(store.get(site, args.memory_id))}
    assert isinstance(args, SearchArgs)
    hits = store.search(
        site,
        args.query,
        limit=args.limit,
        category=_opt(args.category),
        tags=args.tags,
        include_deleted=args.include_deleted,
    )
    return {"memories": [record(m, s) for m, s in hits]}


#: How many memories memory_context surfaces.
SURFACE_LIMIT = 2


def _compact(ms: list[Memory]) -> list[dict[str, str]]:
    return [{"id": m.memory_id, "subject": m.fields.subject, "summary": m.fields.summary} for m in ms]


def surface(backend: Backend, site: str, context: str) -> list[dict[str, str]]:
    """The one or two active memories most relevant to ``context``, compact (blocking)."""
    return _compact(backend.memory_store().surface(site, context, limit=SURFACE_LIMIT))


def try_surface(backend: Backend, site: str, context: str) -> list[dict[str, str]] | None:
    """:func:`surface` when the store can answer at once, without waiting, ranking or I/O; None otherwise.

    Cheap enough for the event loop (a kept answer looked up, one ``stat``); None
    when the store is not open yet, would have to rank (encode, multiply, run
    BM25: milliseconds of CPU that would hold up every other request on the
    loop), or must wait, refresh or write first (see
    ``LongTermMemory.try_surface``): then call :func:`surface` in a worker thread.
    """
    store = backend.memories
    if store is None:
        return None
    found = store.try_surface(site, context, limit=SURFACE_LIMIT)
    return None if found is None else _compact(found)


def relevant_text(memories: list[dict[str, str]]) -> str:
    """The "Relevant memories" section of a text block, one line per memory."""
    if not memories:
        return "Relevant memories: none found for this memory_context."
    lines = ["Relevant memories (long-term, from earlier conversations; memory_get loads details):"]
    lines += [f"- {m['subject']}: {m['summary']} [{m['id']}]" for m in memories]
    return "\n".join(lines)


def surfacing_failed(exc: BaseException) -> str:
    """The "Relevant memories" line when looking them up failed with ``exc`` (the log call itself succeeded).

    Names the error code (never an exception class) and says whether it is
    worth asking again: long-term memory not configured on this server, a
    permanent failure for the operator, or unavailable right now.
    """
    if isinstance(exc, ToolFailure | StoreError):
        code, retryable = exc.code, exc.retryable
    else:
        code, retryable = "InternalError", True
    if code == "NotConfigured":
        return "Relevant memories: none, long-term memory is not configured on this server; the call itself succeeded."
    if not retryable:
        return f"Relevant memories: unavailable ({code}, permanent: ask the operator); the call itself succeeded."
    return f"Relevant memories: unavailable right now ({code}); the call itself succeeded."
