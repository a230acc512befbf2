"""Wakes the commitlog's event loop when the store's durable end may have moved.

The store flushes on its own thread; SYNC senders and tailers wait on the loop. This is the
bridge: the flusher calls `fire`, waiting coroutines wake, no thread is held per waiter.
"""
from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from quarry.services.commitlog.storage.flushing import Flusher


class FlushSignal:
    """Wakes coroutines when the store's durable end may have moved (the store calls `fire`
    from its flushing thread)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._event = asyncio.Event()
        # Whether anyone took the current event: a signal fired on every send (long polls
        # wait on it) costs nothing while nobody waits.
        self._taken = False

    def fire(self) -> None:
        try:
            self._loop.call_soon_threadsafe(self._set)
        except RuntimeError:
            pass  # the loop has closed: nobody is waiting any more

    def fire_in_loop(self) -> None:
        """`fire` for a caller already on the loop's thread (no hand-off)."""
        self._set()

    def _set(self) -> None:
        if self._taken:
            self._event.set()
            self._event = asyncio.Event()
            self._taken = False

    def current(self) -> asyncio.Event:
        """Take this before checking the condition, then wait on it: no wake-up is lost."""
        self._taken = True
        return self._event

    @staticmethod
    async def wait_first(events: tuple[asyncio.Event, ...], timeout_s: float) -> bool:
        """Wait until one of the events is set, or the timeout; whether one was set."""
        waits = [asyncio.ensure_future(e.wait()) for e in events]
        try:
            done, _ = await asyncio.wait(waits, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()
        return bool(done)

    @staticmethod
    async def wait(event: asyncio.Event, timeout_s: float) -> None:
        try:
            async with asyncio.timeout(timeout_s):  # (not wait_for: on 3.11 it may swallow a cancellation)
                await event.wait()
        except TimeoutError:
            pass


async def await_flushed(flusher: Flusher, signal: FlushSignal, end: int, timeout_s: float) -> bool:
    """Wait on the loop until the log is fsynced up to `end`; False at the timeout. The one
    fsync wait of the event loop (threads: flushing.wait_flushed_blocking)."""
    state = flusher.state
    flusher.request_flush()
    deadline = time.monotonic() + timeout_s
    while True:
        event = signal.current()  # taken before the check: no wake-up is lost
        if state.flushed_offset >= end:
            return True
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        await signal.wait(event, left)
