"""The MCP server: tool listing and tool calls over a :class:`logstore.MemoryStore`.

Built on the SDK's low-level :class:`mcp.server.lowlevel.Server`, which
publishes our exact JSON schemas. Each ``tools/call`` goes through the same
steps: find the tool (an unknown name is a protocol error), authenticate the
site from *this* request's ``Authorization`` header (or, on stdio, use the
site verified at start-up), validate the arguments, run the storage call in a
worker thread under a bounded limiter, and shape the result or the error.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, TypeVar

import anyio
import anyio.to_thread
import mcp_types as types
import msgspec
from mcp.server import Server, ServerRequestContext
from mcp.shared.exceptions import MCPError

from convmem.logstore import ListSelector, MemoryStore, Range, RawMemoryItem, ReadSelector, StoreError, Tail
from convmem.logstore.memories import LongTermMemory, LongTermStore
from convmem.logstore.memories.limits import DEFAULT_RETENTION_SECONDS

from . import __version__, requestlog
from .auth import Authenticator
from .cursors import LazySeal, seal_for
from .errors import ToolFailure, from_store_error, internal_error, memory_not_configured, unauthenticated
from .follow import FollowLimits, replay_waiting
from .memory_calls import (
    parse_memory_arguments,
    relevant_text,
    run_memory_call,
    surface,
    surfacing_failed,
    try_surface,
)
from .memory_schemas import MEMORY_TOOL_NAMES
from .tools import INSTRUCTIONS, tool_definitions
from .tracing import span_only_when_tracing
from .validation import AppendArgs, ListArgs, RecallArgs, ReplayArgs, ToolArgs, parse_arguments
from .wire import Prepared, Splice, splice_of

logger = logging.getLogger("convmem.server")

#: Default number of storage calls running at the same time.
DEFAULT_MAX_CONCURRENCY = 16

_T = TypeVar("_T")


@dataclass
class Backend:
    """Everything a tool call needs: the store and how callers are identified.

    Exactly one of ``authenticator`` (HTTP: per-request Basic credentials) and
    ``fixed_site`` (stdio: verified once at start-up) is normally set.
    """

    store: MemoryStore
    data_dir: str
    authenticator: Authenticator | None = None
    fixed_site: str | None = None
    max_concurrency: int = DEFAULT_MAX_CONCURRENCY
    #: Long-term memories; opened on first use (by ``memory_opener``, else over ``data_dir``) when not given.
    memories: LongTermStore | None = None
    #: Opens the long-term memory store when it is not kept in ``data_dir`` (PostgreSQL).
    memory_opener: Callable[[], LongTermStore] | None = None
    #: Seconds a soft-deleted memory is kept before it is erased.
    memory_retention_seconds: float = DEFAULT_RETENTION_SECONDS
    #: Probe for ``/healthz`` when the store is a database (None: check ``data_dir``).
    health: Callable[[], bool] | None = None
    #: Seals listing cursors (security: :mod:`.cursors`); by default keyed from ``data_dir``'s secret.
    cursor_seal: LazySeal | None = None
    seal: LazySeal = field(init=False)
    limiter: anyio.CapacityLimiter = field(init=False)
    #: Bounds of replay_memory calls waiting with ``wait_ms`` (see mcp_adapter.follow).
    followers: FollowLimits = field(default_factory=FollowLimits)
    _memories_lock: threading.Lock = field(init=False, default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.limiter = anyio.CapacityLimiter(self.max_concurrency)
        self.seal = self.cursor_seal if self.cursor_seal is not None else seal_for(self.data_dir)

    def memory_store(self) -> LongTermStore:
        """The long-term memory store, opened on first use (blocking)."""
        with self._memories_lock:
            if self.memories is None and self.memory_opener is not None:
                self.memories = self.memory_opener()
                self.memories.start_sweeper()
            if self.memories is None:
                if not self.data_dir:
                    # A PostgreSQL store served without --data-dir: the memory store needs a directory.
                    raise memory_not_configured()
                self.memories = LongTermMemory(self.data_dir, retention_seconds=self.memory_retention_seconds)
                self.memories.start_sweeper()
            return self.memories

    def start_memory_sweeper(self) -> None:
        """At start-up: erase expired soft-deleted memories in the background if any site has memories (blocking).

        Otherwise the sweeper starts with the memory store, on the first memory call.
        """
        if self.memory_opener is not None:
            self.memory_store()  # in the database: its sweeper sweeps every site, once per database at a time
            return
        if not self.data_dir:
            return  # no data directory and no database for memories: memory tools answer NotConfigured
        sites = os.path.join(self.data_dir, "sites")
        names = os.listdir(sites) if os.path.isdir(sites) else []
        if any(os.path.isdir(os.path.join(sites, name, "memories")) for name in names):
            self.memory_store()

    def close_memories(self) -> None:
        """Close the long-term memory store if it was opened (writes pending access times)."""
        with self._memories_lock:
            if self.memories is not None:
                self.memories.close()

    async def run(self, fn: Callable[..., _T], *args: Any) -> _T:
        """Run a blocking storage call in a worker thread, within the concurrency bound.

        The thread is never abandoned: if the request is cancelled, the call
        still runs to completion (an append is never left half-acknowledged).
        """
        return await anyio.to_thread.run_sync(fn, *args, limiter=self.limiter)

    async def drain(self, timeout: float) -> bool:
        """Wait until no storage call is running (at most ``timeout`` seconds). True when drained."""
        with anyio.move_on_after(timeout):
            while self.limiter.borrowed_tokens:
                await anyio.sleep(0.02)
            return True
        return False


def _request_headers(ctx: ServerRequestContext[Any, Any]) -> Any | None:
    request = ctx.request
    return getattr(request, "headers", None)


async def _resolve_site(backend: Backend, ctx: ServerRequestContext[Any, Any]) -> str:
    """The site this call acts for, from the call's own credentials (never cached per session)."""
    headers = _request_headers(ctx)
    if headers is None:
        if backend.fixed_site is not None:
            return backend.fixed_site
        raise unauthenticated()
    if backend.authenticator is None:  # pragma: no cover - HTTP is always served with an authenticator
        raise unauthenticated()
    values = headers.getlist("authorization") if hasattr(headers, "getlist") else [headers.get("authorization")]
    if len(values) > 1:
        # Proxies and servers disagree on which of several headers counts; accept none.
        raise unauthenticated()
    client = getattr(ctx.request, "client", None)
    address = client.host if client is not None else None
    return await backend.authenticator.authenticate(values[0] if values else None, address)


def _success(payload: dict[str, Any], extra_text: str | None = None) -> types.CallToolResult:
    if extra_text is None:
        text = msgspec.json.encode(payload).decode()
    else:
        # memory_context was given: the text keeps the spec's JSON and adds a short section.
        spec_part = msgspec.json.encode({k: v for k, v in payload.items() if k != "memories"}).decode()
        text = f"{spec_part}\n\n{extra_text}"
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)], structured_content=payload)


class _ItemsResult(msgspec.Struct):
    """``{"items": [...]}``, the result of recall_memory and replay_memory."""

    items: list[RawMemoryItem]


_result_encoder = msgspec.json.Encoder()


def _read_items(store: MemoryStore, site: str, conversation_id: str, selector: ReadSelector) -> Prepared:
    """A read's result, encoded once from the stored payloads (blocking: runs in a worker thread).

    The escaping of the text block is done here too, off the event loop; the
    items' buffers are released when this returns, before the result is sent.
    """
    doc = _encode_items(store.read_raw(site, conversation_id, selector))  # the items (1x the page) are freed here
    return Prepared.from_json(doc)


#: A read of at most this many bytes of records, answerable without waiting for a lock,
#: runs on the event loop: handing it to a worker thread and back costs more than the read
#: (a raw recall of 50 items of 1 KiB takes ~0.04 ms; the two thread switches ~0.1-0.2 ms, more
#: on a loaded machine). Anything else, and every backend without ``try_read_raw``, goes
#: to a thread.
INLINE_READ_BYTES = 128 * 1024


def _encode_items(items: list[RawMemoryItem]) -> bytes:
    return _result_encoder.encode(_ItemsResult(items))


async def _read(backend: Backend, site: str, conversation_id: str, selector: ReadSelector) -> Prepared:
    """A read's prepared result: at once when the store can answer without waiting, else in a worker thread."""
    items = backend.store.try_read_raw(site, conversation_id, selector, INLINE_READ_BYTES)
    if items is not None:
        return Prepared.from_json(_encode_items(items))
    return await backend.run(_read_items, backend.store, site, conversation_id, selector)


def _finish(result: dict[str, Any] | Prepared, splice: Splice | None) -> types.CallToolResult:
    """The tool result for ``result``: spliced into the HTTP response when it can be, else an ordinary one."""
    if isinstance(result, dict):
        return _success(result)
    return splice.result(result) if splice is not None else result.decoded()


async def _execute(backend: Backend, site: str, args: ToolArgs) -> dict[str, Any] | Prepared:
    """Run one validated call against the store; the structured result (reads: already encoded)."""
    store = backend.store
    if isinstance(args, AppendArgs):
        if args.idempotency_key is None and args.expected_next_seq is None:
            seqs = await backend.run(store.append, site, args.conversation_id, args.items)
        else:
            seqs = await backend.run(
                partial(store.append, idempotency_key=args.idempotency_key, expected_next_seq=args.expected_next_seq),
                site,
                args.conversation_id,
                args.items,
            )
        return {"first_seq": seqs.first, "last_seq": seqs.last}
    if isinstance(args, RecallArgs):
        return await _read(backend, site, args.conversation_id, Tail(args.count))
    if isinstance(args, ReplayArgs):
        if args.wait_ms:
            found = await replay_waiting(
                backend.run, backend.followers, store, site, args.conversation_id, args.offset, args.limit, args.wait_ms
            )
            return Prepared.from_json(_encode_items(found))
        return await _read(backend, site, args.conversation_id, Range(args.offset, args.limit))
    assert isinstance(args, ListArgs)
    cursor = backend.seal.open(args.cursor, site) if args.cursor is not None else None
    listing = await backend.run(store.list_conversations, site, ListSelector(cursor=cursor, limit=args.limit))
    return {
        "conversations": [
            {
                "conversation_id": str(s.conversation_id),
                "created_at": str(s.created_at),
                "last_appended_at": str(s.last_appended_at),
            }
            for s in listing.summaries
        ],
        "next_cursor": backend.seal.seal(listing.next_cursor, site) if listing.next_cursor is not None else None,
    }


async def _execute_with_memories(
    backend: Backend, site: str, args: ToolArgs, context: str, splice: Splice | None
) -> types.CallToolResult:
    """The spec tool's call and the lookup of memories relevant to ``context``.

    When the memory store holds the answer already (a repeated hint: see
    ``LongTermMemory.try_surface``), the lookup runs right here on the event
    loop. Otherwise (a ranking, or waiting for a lock or refreshing from disk)
    it runs in a worker thread concurrently with the log call, so that it
    overlaps with it and never holds up the loop. A
    failing memory store never fails the log call: the section then says
    memories are unavailable and ``memories`` is empty. A failing log call
    fails as it would without ``memory_context``.
    """
    try:
        quick = try_surface(backend, site, context)
    except Exception:  # the worker-thread path below reports (and logs) whatever the store says
        quick = None
    if quick is not None:
        # Answered on the event loop from a kept answer (no ranking, a few microseconds):
        # handing it to a worker thread costs two thread switches and GIL contention with the log call.
        done = await _execute(backend, site, args)
        section_now = relevant_text(quick)
        if isinstance(done, Prepared):
            return _finish(done.with_memories(quick, section_now), splice)
        return _success({**done, "memories": quick}, section_now)

    found: list[dict[str, str]] = []
    section = ""

    async def lookup() -> None:
        nonlocal found, section
        try:
            found = await backend.run(surface, backend, site, context)
            section = relevant_text(found)
        except Exception as exc:
            section = surfacing_failed(exc)
            if isinstance(exc, StoreError | ToolFailure):
                logger.warning("memory_context lookup failed: %s: %s", exc.code, exc)
            else:
                logger.exception("memory_context lookup failed unexpectedly")
            found = []

    failure: Exception | None = None
    payload: dict[str, Any] | Prepared = {}
    async with anyio.create_task_group() as tg:
        tg.start_soon(lookup)
        try:
            payload = await _execute(backend, site, args)
        except Exception as exc:
            failure = exc
    if failure is not None:
        raise failure
    if isinstance(payload, Prepared):
        return _finish(payload.with_memories(found, section), splice)
    return _success({**payload, "memories": found}, section)


async def call_tool(
    backend: Backend, ctx: ServerRequestContext[Any, Any], name: str, arguments: Any
) -> types.CallToolResult:
    """Serve one ``tools/call``. Tool failures become ``isError`` results; an unknown tool is a protocol error."""
    if name not in _TOOL_NAMES:
        raise MCPError(types.INVALID_PARAMS, f"Unknown tool: {name} (request id {requestlog.request_id()})")
    started = time.perf_counter()
    call = requestlog.ToolCall(name)  # ops: metrics, request line, request id in errors
    try:
        site = await _resolve_site(backend, ctx)
        call.set_site(site)
        if arguments is not None and not isinstance(arguments, dict):
            raise ToolFailure("InvalidArguments", "arguments must be a JSON object", field="arguments", rule="object")
        if name in MEMORY_TOOL_NAMES:
            margs = parse_memory_arguments(name, arguments)
            result = _success(await backend.run(run_memory_call, backend, site, margs))
        else:
            args = parse_arguments(name, arguments)
            context = getattr(args, "memory_context", None)
            splice = splice_of(ctx.request)
            if isinstance(context, str):
                result = await _execute_with_memories(backend, site, args, context, splice)
            else:
                result = _finish(await _execute(backend, site, args), splice)
        logger.debug("%s ok in %.1f ms", name, (time.perf_counter() - started) * 1000)
        return call.succeeded(result)
    except ToolFailure as failure:
        logger.info("%s failed: %s [request_id=%s]", name, failure.code, call.request_id)
        return call.failed(failure)
    except StoreError as exc:
        mapped = from_store_error(exc, backend.data_dir)
        log = logger.warning if mapped.retryable or mapped.code == "Corrupted" else logger.info
        log("%s failed: %s: %s [request_id=%s]", name, mapped.code, exc, call.request_id)
        return call.failed(mapped)
    except Exception:
        logger.exception("%s failed unexpectedly [request_id=%s]", name, call.request_id)
        return call.failed(internal_error(call.request_id))


_TOOL_NAMES = frozenset(t.name for t in tool_definitions())


def build_server(backend: Backend) -> Server[Any]:
    """The low-level MCP server named ``convmem`` serving the four tools over ``backend``."""
    tools = tool_definitions()

    async def on_list_tools(
        ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=tools)

    async def on_call_tool(
        ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        return await call_tool(backend, ctx, params.name, params.arguments)

    server = Server(
        "convmem",
        version=__version__,
        title="convmem conversation memory",
        instructions=INSTRUCTIONS,
        on_list_tools=on_list_tools,
        on_call_tool=on_call_tool,
    )
    span_only_when_tracing(server)  # perf: no OpenTelemetry detour without a tracer provider (see .tracing)
    return server
