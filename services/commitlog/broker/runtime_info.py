"""A broker's runtime figures, as RocketMQ 4's broker reports them (GET_BROKER_RUNTIME_INFO:
mqadmin brokerStatus and clusterList), from what Quarry counts: messages appended (every door)
and messages pulled by consumers, the store's offsets and its disk.

Rates are sampled once a second and reported for the last 10 s, 1 min and 10 min ("putTps",
"getTransferedTps" as "0.00 0.00 0.00"); a window the process has not been up for yet is
reported 0.00, as RocketMQ's StoreStatsService does. Daily totals follow RocketMQ's BrokerStats:
"...TodayNow" is the count since the process started, "...TodayMorning" its value at the last
local midnight the process saw and "...YesterdayMorning" the one before (0 until then).
Figures Quarry does not have (RocketMQ's thread pool queues, page cache lock times) are left out.
Protocol-free: the remoting door serializes the table.
"""
from __future__ import annotations

import asyncio
import importlib.metadata
import os
import time
from collections import deque
from datetime import date
from typing import Callable

from quarry.services.commitlog.storage.errors import StoreError
from quarry.services.commitlog.storage.store import CommitLogStore

WINDOWS_S = (10, 60, 600)
SAMPLE_S = 1.0
VERSION = 409  # RocketMQ's MQVersion.Version.V4_9_8.ordinal(): the protocol the remoting door speaks
VERSION_DESC = "V4_9_8"


def quarry_version() -> str:
    try:
        return importlib.metadata.version("quarry")
    except importlib.metadata.PackageNotFoundError:
        return ""


class RateSampler:
    """A counter's rate over recent windows, from samples taken every SAMPLE_S."""

    def __init__(self, total: Callable[[], float], clock: Callable[[], float] = time.monotonic, keep: int = max(WINDOWS_S) + 1) -> None:
        self.total, self._clock = total, clock
        self._samples: deque[tuple[float, float]] = deque(maxlen=keep + 1)

    def sample(self) -> None:
        self._samples.append((self._clock(), self.total()))

    def rate(self, window_s: float) -> float:
        """Per second over the last `window_s` (0.0 before the process has sampled that long)."""
        if len(self._samples) < 2:
            return 0.0
        t1, v1 = self._samples[-1]
        for t0, v0 in reversed(self._samples):
            if t1 - t0 >= window_s - SAMPLE_S / 2:
                return (v1 - v0) / (t1 - t0)
        return 0.0

    def rates_text(self) -> str:
        """RocketMQ's form: the 10 s, 1 min and 10 min rates, two decimals, space separated."""
        return " ".join(f"{self.rate(w):.2f}" for w in WINDOWS_S)


class DailyTotals:
    """RocketMQ's BrokerStats: a counter's value at the last two local midnights seen."""

    def __init__(self, total: Callable[[], float], today: Callable[[], date] = date.today) -> None:
        self.total, self._today = total, today
        self._day = today()
        self.today_morning = 0
        self.yesterday_morning = 0

    def roll(self) -> None:
        day = self._today()
        if day != self._day:
            self._day = day
            self.yesterday_morning, self.today_morning = self.today_morning, int(self.total())


def human_bytes(n: int) -> str:
    """MixAll.humanReadableByteCount(n, false): binary units, one decimal ("1.5 GiB")."""
    if n < 1024:
        return f"{n} B"
    exp, value = 0, float(n)
    while value >= 1024 and exp < 6:
        value /= 1024
        exp += 1
    return f"{value:.1f} {'KMGTPE'[exp - 1]}iB"


def runtime_text(ms: int) -> str:
    """StoreStatsService's "runtime": [ D days, H hours, M minutes, S seconds ]."""
    s = ms // 1000
    return f"[ {s // 86400} days, {s % 86400 // 3600} hours, {s % 3600 // 60} minutes, {s % 60} seconds ]"


class RuntimeInfo:
    def __init__(self, store: CommitLogStore, put_total: Callable[[], float], get_total: Callable[[], float],
                 version: str = "", wall_ms: Callable[[], int] | None = None,
                 found_total: Callable[[], float] = lambda: 0, missed_total: Callable[[], float] = lambda: 0) -> None:
        self.store = store
        self._wall = wall_ms or (lambda: int(time.time() * 1000))
        self.boot_ms = self._wall()
        self.version = version
        self.put, self.get = RateSampler(put_total), RateSampler(get_total)
        # Pull requests that found messages and those that did not (RocketMQ's getFoundTps, getMissTps).
        self.found, self.missed = RateSampler(found_total), RateSampler(missed_total)
        self.put_days, self.get_days = DailyTotals(put_total), DailyTotals(get_total)

    def sample(self) -> None:
        for s in (self.put, self.get, self.found, self.missed):
            s.sample()
        for d in (self.put_days, self.get_days):
            d.roll()

    async def run(self, stop: asyncio.Event) -> None:
        self.sample()
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), SAMPLE_S)
                return
            except asyncio.TimeoutError:
                self.sample()

    def _earliest_store_time(self) -> int:
        """The store time of the oldest record held; -1 when there is none (as RocketMQ)."""
        if self.store.min_offset >= self.store.write_offset:
            return -1
        try:
            return self.store.read(self.store.min_offset).store_timestamp
        except StoreError:
            return -1

    def table(self) -> dict[str, str]:
        now = self._wall()
        table = {
            "brokerVersionDesc": VERSION_DESC, "brokerVersion": str(VERSION),
            "bootTimestamp": str(self.boot_ms), "runtime": runtime_text(now - self.boot_ms),
            "putTps": self.put.rates_text(), "getTransferedTps": self.get.rates_text(),
            "getFoundTps": self.found.rates_text(), "getMissTps": self.missed.rates_text(),
            "getTotalTps": " ".join(f"{self.found.rate(w) + self.missed.rate(w):.2f}" for w in WINDOWS_S),
            "msgPutTotalTodayNow": str(int(self.put.total())), "msgPutTotalTodayMorning": str(self.put_days.today_morning),
            "msgPutTotalYesterdayMorning": str(self.put_days.yesterday_morning),
            "msgGetTotalTodayNow": str(int(self.get.total())), "msgGetTotalTodayMorning": str(self.get_days.today_morning),
            "msgGetTotalYesterdayMorning": str(self.get_days.yesterday_morning),
            "commitLogMinOffset": str(self.store.min_offset), "commitLogMaxOffset": str(self.store.write_offset),
            "earliestMessageTimeStamp": str(self._earliest_store_time()),
        }
        if self.version:
            table["quarryVersion"] = self.version
        try:
            st = os.statvfs(self.store.dir)
        except OSError:
            return table
        total, free = st.f_blocks * st.f_frsize, st.f_bfree * st.f_frsize
        if total:
            # UtilAll.getDiskPartitionSpaceUsedPercent: (total - free) / total
            table["commitLogDiskRatio"] = str((total - free) / total)
            table["commitLogDirCapacity"] = f"Total : {human_bytes(total)}, Free : {human_bytes(free)}."
        return table
