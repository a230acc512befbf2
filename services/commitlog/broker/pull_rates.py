"""Messages a consumer group pulled from a topic over the trailing minute (RocketMQ's broker
counts the same, GROUP_GET_NUMS, and answers it as GET_CONSUME_STATS' consumeTps: what
`mqadmin consumerProgress` prints as "Consume TPS"). One-second buckets, at most a minute of
them per (group, topic); a pair idle for a minute is forgotten."""
from __future__ import annotations

import time
from collections import deque
from typing import Callable

WINDOW_S = 60


class PullRates:
    def __init__(self, clock_s: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock_s
        self._buckets: dict[tuple[str, str], deque[list[int]]] = {}
        self._swept = int(clock_s())

    def add(self, group: str, topic: str, messages: int) -> None:
        now = int(self._clock())
        buckets = self._buckets.setdefault((group, topic), deque())
        if buckets and buckets[-1][0] == now:
            buckets[-1][1] += messages
        else:
            buckets.append([now, messages])
            _drop_old(buckets, now)
        if now - self._swept >= WINDOW_S:  # forget the pairs idle for a minute
            self._swept = now
            for key in [k for k, b in self._buckets.items() if not _drop_old(b, now)]:
                del self._buckets[key]

    def per_second(self, group: str, topic: str) -> float:
        """Messages pulled in the last minute, per second."""
        buckets = self._buckets.get((group, topic))
        if not buckets:
            return 0.0
        return sum(n for _, n in _drop_old(buckets, int(self._clock()))) / WINDOW_S


def _drop_old(buckets: deque[list[int]], now: int) -> deque[list[int]]:
    while buckets and buckets[0][0] <= now - WINDOW_S:
        buckets.popleft()
    return buckets
