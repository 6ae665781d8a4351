"""A deadline for reading a request body: one timer on the event loop, the request's task cancelled when it fires.

:class:`~convmem.mcp_adapter.http.RequestAdmission` reads every ``POST
/mcp`` body under a deadline. anyio's ``move_on_after`` does that with a
cancel scope (scope stack, backend lookup, a task-state table), most of
which serves nesting and shielding; inside the body read nothing nests: the
task only awaits the server's ``receive``. :class:`Deadline` does the same
with asyncio's own means, as ``asyncio.timeout`` does: a timer that cancels
the task, and at exit the cancellation taken back when it was the timer's.
On a loop that is not asyncio's (trio) it is ``anyio.move_on_after``.

Invariants: a cancellation requested by anyone else (server shutdown, an
outer scope) is never swallowed: it is told apart by the task's count of
pending cancellation requests (``Task.cancelling``); the timer is always
cancelled at exit, so it cannot fire once the body is read (the task is
running then, and the timer's callback runs only between task steps).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Generator
from types import TracebackType
from typing import Any, TypeVar

import anyio


class Deadline:
    """``with Deadline(seconds) as d:``: the block cancelled after ``seconds``; ``d.cancelled_caught`` says whether."""

    __slots__ = ("_cancelling", "_fallback", "_handle", "_task", "cancelled_caught", "expired", "seconds")

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.expired = False
        self.cancelled_caught = False
        self._task: asyncio.Task[Any] | None = None
        self._handle: asyncio.TimerHandle | None = None
        self._fallback: anyio.CancelScope | None = None
        self._cancelling = 0

    def __enter__(self) -> Deadline:
        try:
            task = asyncio.current_task()  # raises without a running asyncio loop (trio)
        except RuntimeError:
            task = None
        if task is None:
            self._fallback = anyio.move_on_after(self.seconds).__enter__()
            return self
        loop = task.get_loop()
        self._task = task
        self._cancelling = task.cancelling()
        self._handle = loop.call_later(self.seconds, self._expire)
        return self

    def _expire(self) -> None:
        assert self._task is not None
        self.expired = True
        self._task.cancel()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool:
        if self._fallback is not None:
            suppressed = bool(self._fallback.__exit__(exc_type, exc, tb))
            self.cancelled_caught = self._fallback.cancelled_caught
            return suppressed
        assert self._handle is not None and self._task is not None
        self._handle.cancel()
        if not self.expired:
            return False
        # The timer cancelled the task once: take that back; a CancelledError is ours only if no other request remains.
        if self._task.uncancel() <= self._cancelling and exc_type is asyncio.CancelledError:
            self.cancelled_caught = True
            return True
        return False


T = TypeVar("T")


def at_once(receive: Callable[[], Awaitable[T]]) -> T | Begun[T]:
    """``receive()``'s result when it comes without waiting; else the call, begun, as a :class:`Begun`.

    A :class:`Begun` is awaited for the call's result (it has yielded once;
    awaiting it hands that yield to the task and goes on as awaiting the call
    itself would). Lets a caller arm a timer only once there is something to
    wait for.
    """
    steps = receive().__await__()
    try:
        first = steps.send(None)
    except StopIteration as done:
        result: T = done.value
        return result
    return Begun(steps, first)


class Begun(Awaitable[T]):
    """The rest of an awaitable whose iterator has yielded ``first`` (see :func:`at_once`)."""

    __slots__ = ("_first", "_steps")

    def __init__(self, steps: Generator[Any, Any, T], first: Any) -> None:
        self._steps = steps
        self._first = first

    def __await__(self) -> Generator[Any, Any, T]:
        steps, value = self._steps, self._first
        while True:
            try:
                sent = yield value
            except BaseException as exc:  # thrown in by the task (a cancellation): the call's to handle
                try:
                    value = steps.throw(exc)
                except StopIteration as done:
                    result: T = done.value
                    return result
            else:
                try:
                    value = steps.send(sent)
                except StopIteration as done:
                    result = done.value
                    return result
