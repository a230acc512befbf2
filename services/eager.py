"""A coroutine's first step run at once, in the caller's step, as Python 3.12's eager tasks run
it: a call whose handler does not wait is answered without a task of its own and without a
turn of the event loop; one that waits goes on in a task from where it stopped.

While the first step runs, asyncio.current_task() is a stand-in for the task the coroutine
goes on in if it waits (`_PendingTask`), so what binds the current task in that step
(asyncio.timeout, a TaskGroup) binds that task, not the caller's. Python 3.11 has no eager
task, so the stand-in is entered as the loop's current task the way a task's step enters
itself (asyncio's _enter_task and _leave_task, which exist for task implementations).
"""
from __future__ import annotations

import asyncio
import collections.abc
import contextvars
from asyncio import tasks as _tasks
from typing import Any, Coroutine, Generator, Generic, TypeVar

T = TypeVar("T")


class Started(Generic[T]):
    """What start_eagerly left: the coroutine finished (`result`, or `error` raised), or it
    waits and goes on in `task`."""

    __slots__ = ("task", "result", "error")

    def __init__(self, task: "asyncio.Task[T] | None", result: T | None = None, error: BaseException | None = None) -> None:
        self.task, self.result, self.error = task, result, error


def start_eagerly(loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, T]) -> Started[T]:
    """Run `coro` up to its first wait now; if it waits, it goes on in a task on `loop` (the
    running loop). KeyboardInterrupt and SystemExit raised in the step propagate, as from a
    task's step."""
    pending = _PendingTask(loop)
    context = contextvars.copy_context()  # its own, as a task's: what it sets stays its own
    caller = _tasks._current_tasks.get(loop)
    if caller is not None:
        _tasks._leave_task(loop, caller)
    _tasks._enter_task(loop, pending)
    try:
        waits_on = context.run(coro.send, None)
    except StopIteration as done:
        return Started(None, done.value)
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as exc:
        return Started(None, error=exc)
    finally:
        _tasks._leave_task(loop, pending)
        if caller is not None:
            _tasks._enter_task(loop, caller)
    task = loop.create_task(_GoingOn(coro, waits_on), context=context)  # type: ignore[arg-type,call-arg]
    pending.bind(task)
    return Started(task)


class _GoingOn(collections.abc.Coroutine):  # type: ignore[type-arg]
    """A coroutine whose first step already ran (and yielded `waits_on`), for a task to drive
    from there: the task's first step is handed what the coroutine waits on, and everything
    after (wake-ups, cancellations, a cancellation before that first step included) goes to the
    coroutine itself, as if the task had run it from the start."""

    __slots__ = ("_coro", "_waits_on")

    def __init__(self, coro: Coroutine[Any, Any, Any], waits_on: Any) -> None:
        self._coro = coro
        self._waits_on = waits_on

    def send(self, value: Any) -> Any:
        if self._waits_on is not _TAKEN:
            waits_on, self._waits_on = self._waits_on, _TAKEN
            return waits_on
        return self._coro.send(value)

    def throw(self, typ: Any, val: Any = None, tb: Any = None) -> Any:
        waits_on, self._waits_on = self._waits_on, _TAKEN
        if (isinstance(typ, asyncio.CancelledError) and waits_on is not _TAKEN and asyncio.isfuture(waits_on)
                and waits_on.cancel(typ.args[0] if typ.args else None)):
            # Cancelled before the task's first step: as a task cancels what it waits on (an
            # inner task, a gather), then hands the coroutine that future's cancellation.
            return waits_on
        if val is None and tb is None:
            return self._coro.throw(typ)
        return self._coro.throw(typ, val, tb)

    def close(self) -> None:
        self._coro.close()

    def __await__(self) -> Generator[Any, None, Any]:
        raise TypeError("run by a task (start_eagerly), not awaited")


_TAKEN = object()  # _GoingOn handed its task what the coroutine waits on


class _PendingTask:
    """asyncio.current_task() during an eager first step: the task the coroutine goes on in,
    once there is one. Cancellations asked for before that (and uncancel() calls, which, as a
    task's, leave a requested cancellation to be delivered) are passed to that task; none
    when the coroutine finished in its first step: it is not waiting."""

    __slots__ = ("_loop", "_task", "_cancel", "_uncancels", "__weakref__")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._task: asyncio.Task[Any] | None = None
        self._cancel: list[Any] = []  # cancel() messages asked for before there was a task
        self._uncancels = 0

    def bind(self, task: "asyncio.Task[Any]") -> None:
        self._task = task
        for msg in self._cancel:
            task.cancel(msg)
        for _ in range(self._uncancels):
            task.uncancel()
        self._cancel, self._uncancels = [], 0

    def get_loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    def cancel(self, msg: Any = None) -> bool:
        if self._task is not None:
            return self._task.cancel(msg)
        self._cancel.append(msg)
        return True

    def uncancel(self) -> int:
        if self._task is not None:
            return self._task.uncancel()
        if self.cancelling() > 0:
            self._uncancels += 1
        return self.cancelling()

    def cancelling(self) -> int:
        return self._task.cancelling() if self._task is not None else len(self._cancel) - self._uncancels

    def done(self) -> bool:
        return self._task is not None and self._task.done()

    def cancelled(self) -> bool:
        return self._task is not None and self._task.cancelled()

    def __getattr__(self, name: str) -> Any:
        if self._task is None:
            raise AttributeError(f"{name}: not known while the call's first step runs (it has no task yet)")
        return getattr(self._task, name)
