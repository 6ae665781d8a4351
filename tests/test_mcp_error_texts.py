"""Every error text a tool call can answer says one thing.

The paths are enumerated through the real server in process (the SDK's own
client over ``build_server``): each store error raised from each
conversation-log tool and each memory tool, the errors a real long-term
memory store gives for bad writes, a server without long-term memory, an
unexpected exception, and the "Relevant memories" line of ``memory_context``
when the lookup fails. Every text must

* name no Python exception class (only error codes, which the README lists),
* agree with its ``retryable`` flag: a permanent error gives no retry advice,
  a retryable one never says retrying is useless,
* fit the tool it came from: a memory tool never talks about a batch or a
  conversation's lock.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mcp import Client
from mcp_helpers import error_of
from memories_support import fields
from test_mcp_errors import FailingStore

import convmem.logstore.memories.errors as memory_errors
from convmem.logstore import (
    BatchTooLarge,
    ConversationFull,
    Corrupted,
    EmptyBatch,
    FileStore,
    IdempotencyConflict,
    InvalidConversationId,
    InvalidCursor,
    InvalidIdempotencyKey,
    InvalidPayload,
    Io,
    ItemsLost,
    Loss,
    PayloadTooLarge,
    QuotaExceeded,
    SeqConflict,
    StoreError,
    Timeout,
    Unavailable,
)
from convmem.logstore.memories import LongTermMemory
from convmem.logstore.memories.errors import MEMORY_LOCK
from convmem.logstore.memories.retrieval import Retriever
from convmem.mcp_adapter.errors import (
    ToolFailure,
    from_store_error,
    internal_error,
    invalid_arguments,
    memory_not_configured,
    throttled,
    unauthenticated,
)
from convmem.mcp_adapter.server import Backend, build_server

pytestmark = pytest.mark.anyio

SITE = "texts-site"
LOG_CALLS: dict[str, dict[str, Any]] = {
    "append_memory": {"conversation_id": "texts-conv", "items": [{"a": 1}]},
    "recall_memory": {"conversation_id": "texts-conv"},
    "replay_memory": {"conversation_id": "texts-conv", "offset": 0, "limit": 10},
    "list_conversations": {},
}
MEMORY_ID = "mem_" + "0" * 26
MEMORY_CALLS: dict[str, dict[str, Any]] = {
    "memory_verify": {"intent": "create", "candidate": fields(1)},
    "memory_upsert": {"memory": fields(1), "verify_token": "x"},
    "memory_delete": {"memory_id": MEMORY_ID, "verify_token": "x"},
    "memory_get": {"memory_id": MEMORY_ID},
    "memory_search": {"query": "anything"},
}


def _log_errors() -> list[StoreError]:
    """One instance of every error the conversation-log stores raise."""
    loss = Loss(3, 5, "/srv/data/sites/ab/seg", 128)
    return [
        InvalidConversationId("TooShort", "abc"),
        EmptyBatch(),
        PayloadTooLarge(262_144, 300_000, 0),
        BatchTooLarge(1_048_576, 2_000_000),
        ConversationFull(100_000, 100_001),
        InvalidCursor(),
        Unavailable("the store is closed"),
        Timeout(5.0),
        Io("write failed: No space left on device", 28),
        Corrupted("/srv/data/sites/ab/seg", 4096, "checksum mismatch", 1, 2),
        ItemsLost([loss]),
        QuotaExceeded("bytes", 100, 200),
        InvalidIdempotencyKey("is empty"),
        IdempotencyConflict("key-1", 0, 3),
        SeqConflict(4, 7),
    ]


def _memory_errors() -> list[StoreError]:
    """One instance of every error the long-term memory store raises (its Timeout names its own lock)."""
    return [
        InvalidConversationId("TooShort", "abc", "site name"),
        Unavailable("the memory store is closed"),
        Timeout(5.0, MEMORY_LOCK),
        Io("write failed: No space left on device", 28),
        Corrupted("/srv/data/sites/ab/memories/seg", 0, "bad header"),
        memory_errors.InvalidMemory("memory.subject", "must not be empty"),
        memory_errors.VerifyRequired("missing", "no verify_token was given"),
        memory_errors.DuplicateMemory(MEMORY_ID, "key-1"),
        memory_errors.VersionConflict(MEMORY_ID, 1, 2),
        memory_errors.MemoryStoreFull(10_000),
        memory_errors.NotFound(MEMORY_ID),
        memory_errors.LooksLikeSecret("memory.details", "aws_access_key"),
    ]


def _exception_classes() -> set[str]:
    """Names of every exception class loaded in this process (builtins, the stores, the drivers, the SDK)."""
    names: set[str] = set()
    todo: list[type[BaseException]] = [BaseException]
    while todo:
        cls = todo.pop()
        names.add(cls.__name__)
        todo.extend(cls.__subclasses__())
    return {n for n in names if not n.startswith("_")}


#: Error codes: they appear in texts on purpose (and some share a class's name: Unavailable, Timeout, Io).
CODES = {type(e).code for e in _log_errors() + _memory_errors()} | {
    "InvalidArguments",
    "Unauthenticated",
    "Throttled",
    "InternalError",
    "NotConfigured",
}
CLASS_WORD = re.compile(r"\b[A-Z][A-Za-z0-9]*\b")
#: What a permanent error must never advise.
RETRY_ADVICE = re.compile(
    r"temporar|retry later|try again later|safe to retry|keep the batch|\band retry\b|\bthen retry\b|"
    r"unavailable right now",
    re.IGNORECASE,
)
#: What a retryable error must never say.
NO_USE = re.compile(r"will not help|fails again|permanent\b(?!\))|gone for good", re.IGNORECASE)


def assert_says_one_thing(text: str, retryable: bool | None, tool: str) -> None:
    """The rules of the module docstring, for one text (``retryable`` None: a memory_context line)."""
    classes = _exception_classes() - CODES
    named = {w for w in CLASS_WORD.findall(text) if w in classes} | set(re.findall(r"\b[A-Z]\w*\(", text))
    assert not named, f"{tool}: class names {named} in {text!r}"
    assert "<class " not in text and "Traceback" not in text, text
    assert not re.search(r"\b(ToolFailure|StoreError|Exception)\b", text), text
    if retryable is False:
        assert not RETRY_ADVICE.search(text), f"{tool}: permanent error advises retrying: {text!r}"
    elif retryable is True:
        assert not NO_USE.search(text.removeprefix(text.split(":", 1)[0])), f"{tool}: retryable says no use: {text!r}"
    if tool.startswith("memory_"):
        assert not re.search(r"\bbatch\b|conversation lock|conversation was busy", text, re.IGNORECASE), (
            f"{tool}: a memory tool's text talks about the conversation log: {text!r}"
        )


def _check_error(result: Any, tool: str) -> dict[str, Any]:
    error = error_of(result)
    text = result.content[0].text
    kind = "retryable" if error["retryable"] else "permanent"
    assert text.startswith(f"{error['code']} ({kind}): "), text
    assert_says_one_thing(text, error["retryable"], tool)
    return error


class FailingMemories:
    """A long-term memory store raising the configured exception from every call (try_surface: "not at once")."""

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc

    def __getattr__(self, name: str) -> Any:
        if name == "try_surface":
            return lambda *a, **k: None
        if name == "close":
            return lambda: None

        def fail(*args: Any, **kwargs: Any) -> Any:
            raise self.exc

        return fail


def _failing(exc: BaseException, data_dir: str = "/srv/data") -> Backend:
    return Backend(store=FailingStore(exc), data_dir=data_dir, fixed_site=SITE, memories=FailingMemories(exc))  # type: ignore[arg-type]


def _driver_errors() -> list[StoreError]:
    """What PostgreSQL failures become, message-less ones included (the text must not fall back to a class name)."""
    import psycopg
    import psycopg_pool
    from psycopg import errors as pgerr

    from convmem.logstore.postgres._errors import translate

    raised = [
        psycopg.OperationalError(),
        psycopg.OperationalError("server closed the connection unexpectedly\nThis probably means..."),
        psycopg.InterfaceError(),
        pgerr.AdminShutdown(),
        pgerr.DeadlockDetected(),
        pgerr.ReadOnlySqlTransaction(),
        pgerr.QueryCanceled(),
        pgerr.LockNotAvailable(),
        psycopg_pool.PoolTimeout("couldn't get a connection after 5.00 sec"),
        psycopg.DataError(),
    ]
    return [translate(exc, 0.5, writing=writing) for exc in raised for writing in (True, False)]


ALL_FAILURES: list[BaseException] = [
    *_log_errors(),
    *_memory_errors(),
    *_driver_errors(),
    RuntimeError("/private/path details"),
]


@pytest.mark.parametrize("exc", ALL_FAILURES, ids=lambda e: type(e).__name__)
async def test_every_store_error_from_every_log_tool_says_one_thing(exc: BaseException) -> None:
    async with Client(build_server(_failing(exc))) as client:
        for tool, args in LOG_CALLS.items():
            error = _check_error(await client.call_tool(tool, args), tool)
            if isinstance(exc, StoreError):
                assert (error["code"], error["retryable"]) == (exc.code, exc.retryable)


@pytest.mark.parametrize("exc", [*_memory_errors(), RuntimeError("boom")], ids=lambda e: type(e).__name__)
async def test_every_store_error_from_every_memory_tool_says_one_thing(exc: BaseException) -> None:
    async with Client(build_server(_failing(exc))) as client:
        for tool, args in MEMORY_CALLS.items():
            error = _check_error(await client.call_tool(tool, args), tool)
            if isinstance(exc, StoreError):
                assert (error["code"], error["retryable"]) == (exc.code, exc.retryable)


FAILED_LOOKUPS: list[BaseException] = [*_memory_errors(), memory_not_configured(), RuntimeError("boom")]


@pytest.mark.parametrize("exc", FAILED_LOOKUPS, ids=lambda e: getattr(e, "code", type(e).__name__))
async def test_a_failed_memory_context_lookup_says_one_thing(exc: BaseException, tmp_path: Path) -> None:
    with FileStore(tmp_path) as store:
        backend = Backend(store=store, data_dir=str(tmp_path), fixed_site=SITE, memories=FailingMemories(exc))  # type: ignore[arg-type]
        async with Client(build_server(backend)) as client:
            for tool in ("append_memory", "recall_memory"):
                result = await client.call_tool(tool, {**LOG_CALLS[tool], "memory_context": "the task"})
                assert not result.is_error, result
                section = result.content[0].text.split("\n\n", 1)[1]
                assert section.startswith("Relevant memories: ") and "the call itself succeeded" in section
                retryable = exc.retryable if isinstance(exc, StoreError | ToolFailure) else True
                assert_says_one_thing(section, retryable, tool)
                assert re.search(r"\((\w+)[,)]", section) or "not configured" in section, section


async def test_a_server_without_long_term_memory_says_so_permanently(tmp_path: Path) -> None:
    """A Backend with neither a data directory nor a database for memories, in process."""
    with FileStore(tmp_path) as store:
        backend = Backend(store=store, data_dir="", fixed_site=SITE, cursor_seal=None)
        async with Client(build_server(backend)) as client:
            for tool, args in MEMORY_CALLS.items():
                error = _check_error(await client.call_tool(tool, args), tool)
                assert error["code"] == "NotConfigured" and error["retryable"] is False
                assert "long-term memory is not configured on this server" in error["message"]
                assert "a data directory or a postgresql:// store" in error["message"]
            result = await client.call_tool("append_memory", {**LOG_CALLS["append_memory"], "memory_context": "x"})
            assert not result.is_error
            assert "long-term memory is not configured on this server" in result.content[0].text


@pytest.fixture
def real_memories(tmp_path: Path) -> Iterator[Backend]:
    """A real file store and long-term memory store (lexical ranking only, to stay quick)."""
    with FileStore(tmp_path) as store:
        memories = LongTermMemory(tmp_path, retriever_factory=lambda d: Retriever(d, embedder=None))
        try:
            yield Backend(store=store, data_dir=str(tmp_path), fixed_site=SITE, memories=memories)
        finally:
            memories.close()


async def test_the_errors_of_a_real_memory_store_say_one_thing(real_memories: Backend) -> None:
    async with Client(build_server(real_memories)) as client:
        seen = set()

        async def failing(tool: str, args: dict[str, Any]) -> dict[str, Any]:
            error = _check_error(await client.call_tool(tool, args), tool)
            seen.add(error["code"])
            return error

        async def verify(intent: str, **args: Any) -> str:
            result = await client.call_tool("memory_verify", {"intent": intent, **args})
            assert not result.is_error, result
            return str(result.structured_content["verify_token"])

        await failing("memory_upsert", {"memory": fields(1)})  # VerifyRequired
        await failing("memory_upsert", {"memory": fields(1), "verify_token": "not-a-token"})
        await failing("memory_get", {"memory_id": MEMORY_ID})  # NotFound
        await failing("memory_get", {"memory_id": "nope"})  # InvalidArguments
        await failing("memory_search", {"query": ""})
        await failing("memory_verify", {"intent": "create", "candidate": fields(2, details="AKIAIOSFODNN7EXAMPLE")})
        token = await verify("create", candidate=fields(1))
        created = await client.call_tool("memory_upsert", {"memory": fields(1), "verify_token": token})
        mid = created.structured_content["memory"]["id"]
        await failing("memory_upsert", {"memory": fields(1), "verify_token": token})  # the token was used
        token = await verify("create", candidate=fields(1, subject="another subject"))
        await failing("memory_upsert", {"memory": fields(1, subject="another subject"), "verify_token": token})
        changed = fields(1, summary="changed")
        token = await verify("update", candidate=changed, memory_id=mid)
        await failing(
            "memory_upsert", {"memory": changed, "memory_id": mid, "verify_token": token, "expected_version": 7}
        )
        await failing("memory_delete", {"memory_id": mid, "verify_token": "x", "force": True})
    assert {"VerifyRequired", "NotFound", "InvalidArguments", "LooksLikeSecret", "DuplicateMemory"} <= seen, seen
    assert "VersionConflict" in seen, seen


ADAPTER_FAILURES = [
    unauthenticated(),
    unauthenticated(bearer=True),
    throttled(2.5),
    internal_error("0123456789abcdef"),
    memory_not_configured(),
    invalid_arguments("count", "expected an integer"),
]
BUILT = [(f, [*LOG_CALLS, *MEMORY_CALLS]) for f in ADAPTER_FAILURES]
BUILT += [(from_store_error(InvalidPayload(2, "nesting too deep")), ["append_memory"])]
BUILT += [(from_store_error(e, "/srv/data"), list(LOG_CALLS)) for e in _log_errors()]
BUILT += [(from_store_error(e, "/srv/data"), list(MEMORY_CALLS)) for e in _memory_errors()]


@pytest.mark.parametrize(("failure", "tools"), BUILT, ids=[f"{f.code}-{t[0]}" for f, t in BUILT])
def test_every_failure_the_adapter_builds_says_one_thing(failure: ToolFailure, tools: list[str]) -> None:
    """Also the failures built outside a store call (logins, throttling, arguments), as each tool answers them."""
    for tool in tools:
        text = failure.text(tool)
        assert text.startswith(f"{failure.code} ({'retryable' if failure.retryable else 'permanent'}): ")
        assert_says_one_thing(text, failure.retryable, tool)
