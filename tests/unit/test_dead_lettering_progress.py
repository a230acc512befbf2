"""Dead-lettering's progress (review finding): a round whose DLQ append fails leaves the loop
behind only until a later round dead-letters what it finds, never for good."""
from __future__ import annotations

import threading
from typing import Any

from quarry.services.progress import Progress
from quarry.services.commitlog.doors.rmq5_consume import Consumption


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_failed_round_is_behind_until_a_later_round_succeeds() -> None:
    c: Any = Consumption.__new__(Consumption)  # the counting only: no store
    clock = _Clock()
    c.dead_lettering, c._rounds, c._rounds_lock = Progress("dead-lettering", "rounds", stall_after_s=10, clock=clock), 0, threading.Lock()
    first = c._round_begins()
    c._round_done(first)
    failed = c._round_begins()  # its append raised: never done
    assert failed == 2 and c.dead_lettering.lag == 1
    clock.now += 11
    assert "dead-lettering stalled" in c.dead_lettering.check()
    again = c._round_begins()  # the held messages found again after their hold, and stored
    c._round_done(again)
    assert c.dead_lettering.lag == 0 and c.dead_lettering.check() == ""
