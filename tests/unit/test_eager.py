"""start_eagerly: a coroutine's first step runs in the caller's step; one that waits goes on in
a task from where it stopped, with what bound the current task in its first step bound to
that task, never to the caller's."""
from __future__ import annotations

import asyncio
import contextvars
from typing import Any

import pytest

from quarry.services.eager import start_eagerly


def test_a_coroutine_that_does_not_wait_finishes_in_the_callers_step_without_a_task() -> None:
    seen: list[Any] = []

    async def answer(x: int) -> int:
        seen.append(asyncio.current_task())
        return x * 2

    async def go() -> tuple[Any, Any, Any, Any]:
        caller = asyncio.current_task()
        started = start_eagerly(asyncio.get_running_loop(), answer(21))
        return started.task, started.result, caller, asyncio.current_task()

    task, result, caller, after = asyncio.run(go())
    assert task is None and result == 42
    assert seen[0] is not None and seen[0] is not caller  # its own stand-in, not the caller's task
    assert after is caller  # the caller's task is current again


def test_an_error_raised_in_the_first_step_is_returned_not_raised() -> None:
    async def fails() -> None:
        raise ValueError("bad request")

    async def cancelled_at_once() -> None:
        raise asyncio.CancelledError()

    async def go() -> tuple[Any, Any]:
        loop = asyncio.get_running_loop()
        return start_eagerly(loop, fails()), start_eagerly(loop, cancelled_at_once())

    failed, cancelled = asyncio.run(go())
    assert failed.task is None and isinstance(failed.error, ValueError)
    assert cancelled.task is None and isinstance(cancelled.error, asyncio.CancelledError)


def test_a_coroutine_that_waits_goes_on_in_a_task_with_results_and_errors_of_what_it_awaited() -> None:
    trace: list[str] = []

    async def waits(fut: asyncio.Future[int], failing: asyncio.Future[int]) -> int:
        trace.append("first step")
        got = await fut
        trace.append(f"got {got}")
        await asyncio.sleep(0)  # a bare yield, as a task would take it
        try:
            await failing
        except KeyError as exc:
            trace.append(f"caught {exc.args[0]}")
        return got + 1

    async def go() -> tuple[Any, int]:
        loop = asyncio.get_running_loop()
        fut, failing = loop.create_future(), loop.create_future()
        started = start_eagerly(loop, waits(fut, failing))
        assert started.task is not None and trace == ["first step"]
        fut.set_result(41)
        failing.set_exception(KeyError("gone"))
        return started.task, await started.task

    task, result = asyncio.run(go())
    assert result == 42 and task.done()
    assert trace == ["first step", "got 41", "caught gone"]


def test_a_timeout_entered_in_the_first_step_cancels_the_calls_task_not_the_callers() -> None:
    async def slow() -> str:
        try:
            async with asyncio.timeout(0.05):
                await asyncio.Event().wait()
        except TimeoutError:
            return "timed out"
        return "not reached"

    async def go() -> tuple[str, int, Any]:
        caller = asyncio.current_task()
        assert caller is not None
        started = start_eagerly(asyncio.get_running_loop(), slow())
        assert started.task is not None
        outcome = await started.task
        await asyncio.sleep(0.1)  # the caller lives on: nothing was bound to it
        return outcome, caller.cancelling(), started.task.cancelling()

    outcome, caller_cancelling, task_cancelling = asyncio.run(go())
    assert outcome == "timed out"
    assert caller_cancelling == 0 and task_cancelling == 0


@pytest.mark.parametrize("when", ["after its first step, through the stand-in", "before its first step"])
def test_cancelling_the_task_reaches_the_coroutine(when: str) -> None:
    trace: list[str] = []
    handles: list[Any] = []

    async def waits() -> None:
        handles.append(asyncio.current_task())  # the stand-in, bound to the task once it waits
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            trace.append("cancelled inside")
            raise
        finally:
            trace.append("finally")

    async def go() -> tuple[bool, Any]:
        started = start_eagerly(asyncio.get_running_loop(), waits())
        assert started.task is not None
        if when == "before its first step":
            started.task.cancel()  # before the loop ran the task at all
        else:
            await asyncio.sleep(0)
            handles[0].cancel()  # through what current_task() gave the coroutine
        try:
            await started.task
        except asyncio.CancelledError:
            pass
        return started.task.cancelled(), handles[0].cancelled()

    task_cancelled, seen_cancelled = asyncio.run(go())
    assert task_cancelled and seen_cancelled
    assert trace == ["cancelled inside", "finally"]


def test_a_task_cancelled_before_its_first_step_cancels_what_the_coroutine_waits_on() -> None:
    trace: list[str] = []

    async def child() -> None:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            trace.append("child cancelled")
            raise

    async def fans_out() -> None:
        await asyncio.gather(child())

    async def go() -> None:
        started = start_eagerly(asyncio.get_running_loop(), fans_out())
        assert started.task is not None
        started.task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await started.task

    asyncio.run(go())
    assert trace == ["child cancelled"]  # not left running, as a task's cancel would not leave it


def test_a_cancellation_uncancelled_in_the_first_step_is_still_delivered_as_a_tasks_is() -> None:
    async def cancels_and_uncancels() -> tuple[str, int]:
        task = asyncio.current_task()
        assert task is not None
        task.cancel()
        left = task.uncancel()
        try:
            await asyncio.sleep(0.01)
        except asyncio.CancelledError:
            return "cancelled", left
        return "not cancelled", left

    async def go() -> tuple[tuple[str, int], tuple[str, int]]:
        loop = asyncio.get_running_loop()
        eager = start_eagerly(loop, cancels_and_uncancels()).task
        assert eager is not None
        return await loop.create_task(cancels_and_uncancels()), await eager

    real, eager = asyncio.run(go())
    assert eager == real == ("cancelled", 0)


def test_a_cancellation_asked_for_in_the_first_step_reaches_the_task_it_goes_on_in() -> None:
    async def cancels_itself() -> str:
        task = asyncio.current_task()
        assert task is not None
        task.cancel()
        try:
            await asyncio.sleep(0)
        except asyncio.CancelledError:
            return "cancelled at its first wait"
        return "not cancelled"

    async def go() -> str:
        started = start_eagerly(asyncio.get_running_loop(), cancels_itself())
        assert started.task is not None
        return await started.task

    assert asyncio.run(go()) == "cancelled at its first wait"


def test_it_runs_from_a_plain_callback_with_no_task_current() -> None:
    async def waits_once() -> str:
        await asyncio.sleep(0)
        return "done"

    async def go() -> str:
        loop = asyncio.get_running_loop()
        holder: list[Any] = []
        loop.call_soon(lambda: holder.append(start_eagerly(loop, waits_once())))
        while not holder:
            await asyncio.sleep(0)
        assert holder[0].task is not None
        return await holder[0].task  # type: ignore[no-any-return]

    assert asyncio.run(go()) == "done"


def test_each_start_runs_in_its_own_copy_of_the_callers_context_as_a_task_would() -> None:
    var: contextvars.ContextVar[str] = contextvars.ContextVar("var", default="caller's")
    seen: list[str] = []

    async def sets(value: str, waits: bool) -> None:
        seen.append(var.get())
        var.set(value)
        if waits:
            await asyncio.sleep(0)
        seen.append(var.get())

    async def go() -> str:
        loop = asyncio.get_running_loop()
        started = start_eagerly(loop, sets("first", waits=True))
        start_eagerly(loop, sets("second", waits=False))
        assert started.task is not None
        await started.task
        return var.get()

    assert asyncio.run(go()) == "caller's"
    assert seen == ["caller's", "caller's", "second", "first"]


@pytest.mark.parametrize("error", [KeyboardInterrupt, SystemExit])
def test_an_interrupt_in_the_first_step_propagates_as_from_a_task(error: type[BaseException]) -> None:
    async def interrupted() -> None:
        raise error()

    async def go() -> Any:
        loop = asyncio.get_running_loop()
        with pytest.raises(error):
            start_eagerly(loop, interrupted())
        return asyncio.current_task()

    assert asyncio.run(go()) is not None  # and the caller's task is current again
