"""Each signature accepted once: the signatures seen while their timestamp is still acceptable.

A signed call is valid while its timestamp is within `window_ms` of the server clock; a copy
of it sent again in that time (a replay) must be refused. The guard remembers a signature
until its timestamp has left the window, after which the timestamp check alone refuses it,
so memory stays bounded by the signed calls of one window (8-byte entries in time buckets,
about 60 bytes each: 1,000 signed calls/s for a 10-minute span is ~36 MB).

Reusable by any front door that verifies signatures: `first_use(signature, timestamp_ms)`.
"""
from __future__ import annotations

import threading
import time
from typing import Callable

BUCKET_MS = 10_000


class ReplayGuard:
    """Thread-safe; `first_use` is True the first time a (verified) signature is seen."""

    def __init__(self, window_ms: int, clock_ms: Callable[[], int] | None = None) -> None:
        self.window_ms = window_ms
        self.clock_ms = clock_ms or (lambda: int(time.time() * 1000))
        self._buckets: dict[int, set[bytes]] = {}
        self._lock = threading.Lock()

    def first_use(self, signature: str, timestamp_ms: int) -> bool:
        # A signature is hex of 32 bytes; 8 of them are enough to tell calls apart.
        key = signature[:16].encode()
        bucket = timestamp_ms // BUCKET_MS
        with self._lock:
            self._prune(self.clock_ms())
            seen = self._buckets.setdefault(bucket, set())
            if key in seen:
                return False
            seen.add(key)
            return True

    def _prune(self, now_ms: int) -> None:
        # A bucket's newest timestamp is refused as stale once now > it + window.
        oldest_live = (now_ms - self.window_ms) // BUCKET_MS
        for bucket in [b for b in self._buckets if b < oldest_live]:
            del self._buckets[bucket]

    def __len__(self) -> int:
        with self._lock:
            return sum(len(s) for s in self._buckets.values())
