"""Loops that move a position forward, watched so none stalls in silence.

A `Progress` is one such loop (the indexer's tail, a follower, delayed delivery, offset
persistence, retention): it is told how far its input reaches (`input`) and how far it got
(`advanced`). It is *stalled* when its input has been ahead of it, with no advance, for
`stall_after_s`. `check()` says so (the reason, for health and status problems), logs one line
when a stall starts and one when it ends, and `Watches` exports every loop's lag and the time
since it last progressed while behind, for an alert (docs/operations.md). Plain Python: any
thread may call it.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Callable, Iterator

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from quarry.services.log import log_event

log = logging.getLogger("quarry.progress")

STALL_AFTER_S = 10.0


class Progress:
    """One loop's position against its input; see the module doc."""

    def __init__(self, name: str, unit: str = "bytes", stall_after_s: float = STALL_AFTER_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.name, self.unit, self.stall_after_s, self._clock = name, unit, stall_after_s, clock
        self._lock = threading.Lock()
        self.position = 0
        self.input_end = 0
        self.blocked = ""  # why the loop cannot go on, when it knows (an error it keeps meeting)
        self._last_progress = clock()
        self._stalled = ""  # the reason last reported, "" while not stalled

    def advanced(self, position: int) -> None:
        """The loop reached `position` (a smaller one after a reset is taken as is)."""
        with self._lock:
            if position != self.position:
                self.position = position
                self._last_progress = self._clock()
            if position >= self.input_end:
                self._last_progress = self._clock()
        self.check()

    def input(self, end: int) -> None:
        """The loop's input now reaches `end`."""
        with self._lock:
            if self.input_end <= self.position < end:
                self._last_progress = self._clock()  # behind from now on: the clock starts here
            self.input_end = end

    def block(self, why: str) -> None:
        """The loop meets an error it cannot pass ("" when it passes again); said with the stall."""
        with self._lock:
            self.blocked = why

    @property
    def lag(self) -> int:
        return max(0, self.input_end - self.position)

    def seconds_behind(self) -> float:
        """Seconds since the loop last progressed, while its input is ahead of it (else 0)."""
        with self._lock:
            if self.input_end <= self.position:
                return 0.0
            return max(0.0, self._clock() - self._last_progress)

    def check(self) -> str:
        """"" while the loop keeps up or progresses, else why it is stalled. Logs the start and
        the end of a stall, once each."""
        behind = self.seconds_behind()
        reason = ""
        if behind >= self.stall_after_s:
            reason = (f"{self.name} stalled: no progress for {behind:.0f} s at {self.position} "
                      f"with its input at {self.input_end} ({self.lag} {self.unit} behind)")
            if self.blocked:
                reason += f": {self.blocked}"
        if reason and not self._stalled:
            log_event(log, "stalled", logging.ERROR, loop=self.name, position=self.position, input_end=self.input_end,
                      seconds=round(behind, 1), blocked=self.blocked or None)
        elif not reason and self._stalled:
            log_event(log, "progressing again", loop=self.name, position=self.position, input_end=self.input_end)
        self._stalled = reason
        return reason


class Watches(Collector):
    """A process's watched loops: their stalls for health and status, their metrics for alerts."""

    def __init__(self) -> None:
        self._loops: list[Progress] = []

    def add(self, progress: Progress) -> Progress:
        self._loops.append(progress)
        return progress

    def stalls(self) -> list[str]:
        """Why each stalled loop is stalled (empty when none is)."""
        return [r for r in (p.check() for p in list(self._loops)) if r]

    def register(self, registry: CollectorRegistry) -> "Watches":
        registry.register(self)
        return self

    def describe(self) -> Iterator[Metric]:
        return iter(self._families())

    def collect(self) -> Iterator[Metric]:
        return iter(self._families())

    def _families(self) -> list[Metric]:
        lag = GaugeMetricFamily("quarry_loop_lag", "How far a loop's input is ahead of it, in the loop's unit", labels=["loop", "unit"])
        behind = GaugeMetricFamily("quarry_loop_seconds_since_progress",
                                   "Seconds since a loop last progressed while its input was ahead of it (0 while it keeps up)", labels=["loop"])
        stalled = GaugeMetricFamily("quarry_loop_stalled", "1 while a loop is stalled (behind, with no progress for its stall time)", labels=["loop"])
        for p in list(self._loops):
            seconds = p.seconds_behind()
            lag.add_metric([p.name, p.unit], p.lag)
            behind.add_metric([p.name], seconds)
            stalled.add_metric([p.name], 1.0 if seconds >= p.stall_after_s else 0.0)
        return [lag, behind, stalled]
