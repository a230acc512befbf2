"""The flusher thread wakes coroutines waiting on the event loop; a wake-up between taking
the event and waiting on it is not lost. Each wait is told apart from its timeout by the
event's state, not by the clock (a loaded machine makes durations meaningless)."""
from __future__ import annotations

import asyncio
import threading

from quarry.services.commitlog.broker.flush_signal import FlushSignal


def test_a_fire_from_another_thread_wakes_the_waiter() -> None:
    async def main() -> bool:
        signal = FlushSignal(asyncio.get_running_loop())
        event = signal.current()
        threading.Thread(target=signal.fire).start()
        await signal.wait(event, 60.0)  # returns when woken; the timeout is only a safety net
        return event.is_set()

    assert asyncio.run(main())


def test_a_fire_before_the_wait_is_not_lost_and_a_quiet_wait_times_out() -> None:
    async def main() -> tuple[bool, bool, bool]:
        signal = FlushSignal(asyncio.get_running_loop())
        event = signal.current()
        signal.fire()  # before anyone waits
        await signal.wait(event, 60.0)
        quiet = signal.current()
        fresh = quiet is not event  # each fire starts a new event for the next waiters
        await signal.wait(quiet, 0.05)  # nobody fires: ends by its timeout
        return event.is_set(), fresh, quiet.is_set()

    assert asyncio.run(main()) == (True, True, False)


def test_fire_after_the_loop_closed_is_harmless() -> None:
    loop = asyncio.new_event_loop()
    signal = FlushSignal(loop)
    event = signal.current()
    loop.close()
    signal.fire()  # a flusher outliving the loop must not raise
    assert not event.is_set()  # and nothing was scheduled on the closed loop


def test_fires_while_nobody_took_the_event_cost_nothing_and_lose_no_wake_up() -> None:
    async def main() -> tuple[bool, bool, bool]:
        signal = FlushSignal(asyncio.get_running_loop())
        first = signal._event
        for _ in range(3):
            signal.fire_in_loop()  # every send fires it; nobody waits
        untouched = signal._event is first and not first.is_set()
        event = signal.current()  # a waiter takes it, then checks its condition
        signal.fire_in_loop()
        await signal.wait(event, 60.0)
        return untouched, event.is_set(), signal.current() is not event

    assert asyncio.run(main()) == (True, True, True)
