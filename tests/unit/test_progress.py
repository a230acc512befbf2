"""A loop that stops moving while its input grows says so within its stall time, once, and says
when it moves again; one that keeps up, or has nothing to do, is never stalled."""
from __future__ import annotations

import logging

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from quarry.services.progress import Progress, Watches


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _stall_lines(caplog: pytest.LogCaptureFixture, event: str) -> int:
    return sum(1 for r in caplog.records if r.getMessage() == event)


def test_a_loop_behind_without_progress_is_stalled_once_and_recovers_once(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    p = Progress("tail", stall_after_s=10, clock=clock)
    caplog.set_level(logging.INFO, "quarry.progress")
    p.input(500)
    clock.now += 9
    assert p.check() == ""
    clock.now += 2
    p.block("OUT_OF_RANGE: from_offset 600 is past the end")
    reason = p.check()
    assert "tail stalled: no progress for 11 s at 0 with its input at 500 (500 bytes behind)" in reason and "OUT_OF_RANGE" in reason
    for _ in range(3):
        clock.now += 5
        assert p.check()
    assert _stall_lines(caplog, "stalled") == 1
    p.advanced(100)
    assert p.check() == "" and _stall_lines(caplog, "progressing again") == 1


def test_a_loop_that_keeps_up_or_idles_is_never_stalled() -> None:
    clock = Clock()
    p = Progress("delivery", stall_after_s=10, clock=clock)
    clock.now += 1000  # idle: nothing to do
    p.input(100)  # behind from now on: the clock starts here, not at the last progress
    assert p.seconds_behind() == 0 and p.check() == ""
    for i in range(1, 20):
        clock.now += 5
        p.input(100 + i * 10)
        p.advanced(100 + i * 10 - 5)  # always a little behind, always moving
        assert p.check() == ""


def test_watches_export_lag_and_time_since_progress() -> None:
    clock = Clock()
    watches = Watches().register(registry := CollectorRegistry())
    p = watches.add(Progress("follower", stall_after_s=10, clock=clock))
    p.input(4096)
    clock.now += 12
    text = generate_latest(registry).decode()
    assert 'quarry_loop_lag{loop="follower",unit="bytes"} 4096.0' in text
    assert 'quarry_loop_seconds_since_progress{loop="follower"} 12.0' in text
    assert 'quarry_loop_stalled{loop="follower"} 1.0' in text
    assert watches.stalls() and "follower stalled" in watches.stalls()[0]
