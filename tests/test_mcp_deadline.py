"""The body deadline (``mcp_adapter.deadline``): it cuts a wait short, and never swallows anyone else's cancellation."""

from __future__ import annotations

import asyncio

import anyio
import pytest

from convmem.mcp_adapter.deadline import Begun, Deadline, at_once


@pytest.mark.anyio
async def test_a_block_that_finishes_in_time_is_not_cancelled() -> None:
    with Deadline(60) as deadline:
        await asyncio.sleep(0)
    assert not deadline.cancelled_caught and not deadline.expired
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0
    await asyncio.sleep(0)  # no cancellation left pending for the task


@pytest.mark.anyio
async def test_a_wait_past_the_deadline_is_cut_short_and_the_task_goes_on() -> None:
    never = asyncio.get_running_loop().create_future()
    with Deadline(0.01) as deadline:
        await never
    assert deadline.cancelled_caught and deadline.expired
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0
    await asyncio.sleep(0)
    assert not never.done() or never.cancelled()


@pytest.mark.anyio
async def test_an_outer_cancellation_passes_through() -> None:
    with anyio.move_on_after(0.01) as outer:
        with Deadline(60) as deadline:
            await anyio.sleep_forever()
    assert outer.cancelled_caught and not deadline.cancelled_caught


@pytest.mark.anyio
async def test_a_cancellation_of_the_task_during_the_deadline_is_not_taken_for_it() -> None:
    started = asyncio.Event()
    caught: list[bool] = []

    async def body() -> None:
        with Deadline(0.01) as deadline:
            started.set()
            try:
                await asyncio.sleep(60)
            finally:
                caught.append(deadline.cancelled_caught)

    task = asyncio.ensure_future(body())
    await started.wait()
    task.cancel()  # someone else's cancellation, before the deadline fires
    with pytest.raises(asyncio.CancelledError):
        await task
    assert caught == [False]


@pytest.mark.anyio
async def test_both_at_once_the_other_cancellation_wins() -> None:
    started = asyncio.Event()
    held: list[Deadline] = []

    async def body() -> None:
        with Deadline(60) as deadline:
            held.append(deadline)
            started.set()
            await asyncio.sleep(60)

    task = asyncio.ensure_future(body())
    await started.wait()
    held[0]._expire()  # the timer's callback, run now: both cancellations reach the task before it runs again
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert held[0].expired and not held[0].cancelled_caught


@pytest.mark.anyio
async def test_a_result_there_already_comes_at_once_and_a_wait_goes_on_when_awaited() -> None:
    ready = asyncio.Event()
    steps: list[str] = []

    async def receive() -> dict[str, str]:
        steps.append("called")
        await ready.wait()
        steps.append("woken")
        return {"type": "http.request"}

    ready.set()
    assert at_once(receive) == {"type": "http.request"} and steps == ["called", "woken"]
    ready.clear()
    steps.clear()
    begun = at_once(receive)
    assert isinstance(begun, Begun) and steps == ["called"]
    asyncio.get_running_loop().call_later(0.01, ready.set)
    assert await begun == {"type": "http.request"} and steps == ["called", "woken"]


@pytest.mark.anyio
async def test_a_begun_wait_is_cancelled_by_the_deadline_and_cleans_up() -> None:
    cleaned: list[bool] = []

    async def receive() -> dict[str, str]:
        try:
            await asyncio.get_running_loop().create_future()
        finally:
            cleaned.append(True)
        raise AssertionError  # pragma: no cover

    begun = at_once(receive)
    assert isinstance(begun, Begun)
    with Deadline(0.01) as deadline:
        await begun
    assert deadline.cancelled_caught and cleaned == [True]
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0
