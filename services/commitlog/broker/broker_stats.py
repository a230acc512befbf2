"""A broker's per-topic and per-group counters over the last minute, hour and day, kept as
RocketMQ's BrokerStatsManager keeps them (what VIEW_BROKER_STATS_DATA answers: `mqadmin
statsAll`, rocketmq-dashboard's topic charts).

Each item (a stats name and a key: a topic for TOPIC_PUT_NUMS, "topic@group" for
GROUP_GET_NUMS) adds a value (messages, bytes) and a count of calls. Its totals are sampled
every 10 s (the last 7 samples: the minute), every 10 min (7: the hour) and every hour (25: the
day), the first of each list preceded by a zero one period earlier, and the first samples taken
at the item's first add, as RocketMQ's StatsItem does. A window's figures are those of its
first and last sample: sum (value added), tps (sum per second), avgpt (sum per call).
Protocol-free, on the event loop only: the remoting door serializes the figures.
"""
from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable

TOPIC_PUT_NUMS = "TOPIC_PUT_NUMS"  # key: topic; messages stored, calls: sends
TOPIC_PUT_SIZE = "TOPIC_PUT_SIZE"  # key: topic; record bytes stored
GROUP_GET_NUMS = "GROUP_GET_NUMS"  # key: topic@group; messages handed to the group's pulls, calls: pulls
GROUP_GET_SIZE = "GROUP_GET_SIZE"  # key: topic@group; record bytes handed
NAMES = (TOPIC_PUT_NUMS, TOPIC_PUT_SIZE, GROUP_GET_NUMS, GROUP_GET_SIZE)

# (period between samples, samples kept) of the minute, hour and day windows.
WINDOWS_MS = ((10_000, 7), (600_000, 7), (3_600_000, 25))
TICK_S = 1.0  # how often due samples are taken


def group_key(topic: str, group: str) -> str:
    """BrokerStatsManager.buildStatsKey(topic, group)."""
    return f"{topic}@{group}"


@dataclass(frozen=True)
class Snapshot:
    sum: int
    tps: float
    avgpt: float


class StatsItem:
    __slots__ = ("counts", "samples", "due")

    def __init__(self) -> None:
        self.counts = [0, 0]  # value, calls: added to in place by the counting paths
        self.samples: list[deque[tuple[int, int, int]]] = [deque(maxlen=keep) for _, keep in WINDOWS_MS]  # (ms, calls, value)
        self.due = [0, 0, 0]  # when each window's next sample is due

    def sample(self, window: int, now_ms: int) -> None:
        samples = self.samples[window]
        if not samples:
            samples.append((now_ms - WINDOWS_MS[window][0], 0, 0))
        samples.append((now_ms, self.counts[1], self.counts[0]))
        self.due[window] = now_ms + WINDOWS_MS[window][0]

    def snapshot(self, window: int) -> Snapshot:
        samples = self.samples[window]
        if not samples:
            return Snapshot(0, 0.0, 0.0)
        (t0, calls0, v0), (t1, calls1, v1) = samples[0], samples[-1]
        total = v1 - v0
        return Snapshot(total, total * 1000.0 / (t1 - t0) if t1 > t0 else 0.0, total / (calls1 - calls0) if calls1 > calls0 else 0.0)


class BrokerStats:
    def __init__(self, clock_ms: Callable[[], int] | None = None) -> None:
        self._clock = clock_ms or (lambda: int(time.time() * 1000))
        self._tables: dict[str, dict[str, StatsItem]] = {name: {} for name in NAMES}
        self._new: list[StatsItem] = []  # items added to since the last tick, not sampled yet

    def counts(self, name: str, key: str) -> list[int]:
        """The [value, calls] pair of an item, made on first use: a counting path keeps it and adds in place."""
        table = self._tables[name]
        item = table.get(key)
        if item is None:
            item = table[key] = StatsItem()
            self._new.append(item)
        return item.counts

    def add(self, name: str, key: str, value: int, calls: int = 1) -> None:
        counts = self.counts(name, key)
        counts[0] += value
        counts[1] += calls
        if self._new:
            self.sample_new()

    def sample_new(self) -> None:
        """First samples of the items made since: RocketMQ samples an item as soon as it exists."""
        now = self._clock()
        for item in self._new:
            for window in range(len(WINDOWS_MS)):
                item.sample(window, now)
        self._new.clear()

    def tick(self) -> None:
        """Take the samples that are due."""
        self.sample_new()
        now = self._clock()
        for table in self._tables.values():
            for item in table.values():
                for window, due in enumerate(item.due):
                    if now >= due:
                        item.sample(window, now)

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            self.tick()
            try:
                await asyncio.wait_for(stop.wait(), TICK_S)
            except asyncio.TimeoutError:
                pass

    def view(self, name: str, key: str) -> tuple[Snapshot, Snapshot, Snapshot] | None:
        """The minute, hour and day figures of an item; None when it never counted anything
        (RocketMQ: "The stats <name> <key> not exist"), or the name is not one kept here."""
        table = self._tables.get(name)
        item = table.get(key) if table is not None else None
        if item is None:
            return None
        if self._new:
            self.sample_new()
        return item.snapshot(0), item.snapshot(1), item.snapshot(2)
