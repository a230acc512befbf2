"""Queue locks of orderly consumers (RocketMQ 4's LOCK_BATCH_MQ / UNLOCK_BATCH_MQ), per consumer
group: queue -> the client holding it, as a RocketMQ broker's RebalanceLockManager keeps them.

A lock is held by one client id at a time and lives `max_live_ms` (RocketMQ's
rocketmq.broker.rebalance.lockMaxLiveTime, 60 s) past its holder's last lock request: an
orderly consumer locks its queues again every 20 s, so a lock lapses only when its holder
stopped asking (a crashed client); then any client of the group may take it. Locking a queue
one already holds renews it. Unlocking takes effect only for the holder. A client that leaves
normally unlocks what it held; a connection closing does not unlock (RocketMQ's broker waits
for the expiry too: the client may still be consuming what it pulled).

Protocol-free: a queue is any hashable value (the remoting door uses (topic, brokerName,
queueId)); in memory only, as RocketMQ's (a restarted broker starts with none locked and
clients lock again within their 20 s round).
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Callable, Hashable, Iterable

MAX_LIVE_MS = 60_000


@dataclass
class _Lock:
    client_id: str
    renewed_ms: int


class QueueLocks:
    def __init__(self, max_live_ms: int = MAX_LIVE_MS, clock_ms: Callable[[], int] | None = None) -> None:
        self.max_live_ms = max_live_ms
        self._clock = clock_ms or (lambda: int(time.time() * 1000))
        self._mutex = threading.Lock()
        self._groups: dict[str, dict[Hashable, _Lock]] = {}
        self._swept_ms = self._clock()  # expired locks are dropped at most once a lifetime, by a lock request

    def _expired(self, lock: _Lock, now: int) -> bool:
        return now - lock.renewed_ms > self.max_live_ms

    def try_lock(self, group: str, queues: Iterable[Hashable], client_id: str) -> set[Hashable]:
        """Lock `queues` for `client_id` where it may: the queues it now holds (taken, renewed,
        or taken over from a holder whose lock expired); those another live holder keeps are left out."""
        now = self._clock()
        locked: set[Hashable] = set()
        with self._mutex:
            if now - self._swept_ms > self.max_live_ms:
                self._sweep(now)
            table = self._groups.setdefault(group, {})
            for q in queues:
                lock = table.get(q)
                if lock is None or lock.client_id == client_id or self._expired(lock, now):
                    table[q] = _Lock(client_id, now)
                    locked.add(q)
        return locked

    def unlock(self, group: str, queues: Iterable[Hashable], client_id: str) -> set[Hashable]:
        """Release the queues `client_id` holds among `queues`; the unlocked ones (others
        are left to their holders, as RocketMQ's unlockBatch leaves them)."""
        released: set[Hashable] = set()
        with self._mutex:
            table = self._groups.get(group)
            if table is None:
                return released
            for q in queues:
                lock = table.get(q)
                if lock is not None and lock.client_id == client_id:
                    del table[q]
                    released.add(q)
            if not table:
                del self._groups[group]
        return released

    def holder(self, group: str, queue: Hashable) -> str | None:
        """Who holds `queue` for `group` now (None: free, or its lock expired)."""
        with self._mutex:
            lock = self._groups.get(group, {}).get(queue)
            return lock.client_id if lock is not None and not self._expired(lock, self._clock()) else None

    def held(self, group: str) -> dict[Hashable, str]:
        """Every queue of `group` with a live lock, and its holder."""
        now = self._clock()
        with self._mutex:
            return {q: lk.client_id for q, lk in self._groups.get(group, {}).items() if not self._expired(lk, now)}

    def forget_expired(self) -> int:
        """Drop expired locks (they would be taken over anyway; this only bounds memory: lock
        requests do it once a lifetime, so groups and queues no longer locked do not pile up)."""
        with self._mutex:
            return self._sweep(self._clock())

    def _sweep(self, now: int) -> int:
        self._swept_ms = now
        dropped = 0
        for group in list(self._groups):
            table = self._groups[group]
            for q in [q for q, lk in table.items() if self._expired(lk, now)]:
                del table[q]
                dropped += 1
            if not table:
                del self._groups[group]
        return dropped
