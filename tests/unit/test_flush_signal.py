"""The flusher thread wakes coroutines waiting on the event loop; a wake-up between taking
the event and waiting on it is not lost."""
from __future__ import annotations

import asyncio
import threading
import time

from quarry.services.commitlog.flush_signal import FlushSignal


def test_a_fire_from_another_thread_wakes_the_waiter() -> None:
    async def main() -> float:
        signal = FlushSignal(asyncio.get_running_loop())
        event = signal.current()
        threading.Timer(0.05, signal.fire).start()
        t0 = time.monotonic()
        await signal.wait(event, 5.0)
        return time.monotonic() - t0

    assert asyncio.run(main()) < 2.0


def test_a_fire_before_the_wait_is_not_lost_and_a_quiet_wait_times_out() -> None:
    async def main() -> tuple[float, float]:
        signal = FlushSignal(asyncio.get_running_loop())
        event = signal.current()
        signal.fire()
        t0 = time.monotonic()
        await signal.wait(event, 5.0)  # already set: returns at once
        fired = time.monotonic() - t0
        t0 = time.monotonic()
        await signal.wait(signal.current(), 0.05)
        return fired, time.monotonic() - t0

    fired, quiet = asyncio.run(main())
    assert fired < 1.0
    assert 0.04 <= quiet < 2.0


def test_fire_after_the_loop_closed_is_harmless() -> None:
    loop = asyncio.new_event_loop()
    signal = FlushSignal(loop)
    loop.close()
    signal.fire()
