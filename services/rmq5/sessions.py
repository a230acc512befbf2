"""What a server knows of its SDK clients: the settings each announced on its Telemetry
stream and when it was last heard from (Heartbeat). Kept in memory: a client re-announces
its settings on every new stream and heartbeats every 10 s, so a restarted server relearns
them within seconds. Consumers (issue 17) keep their subscriptions here too.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Callable

from quarry.services.rmq5.contract import v2


@dataclass
class Session:
    client_id: str
    client_type: int
    settings: v2.Settings | None
    last_seen_ms: int


class Sessions:
    """Thread-safe client_id → Session table."""

    def __init__(self, clock_ms: Callable[[], int] | None = None) -> None:
        self._clock = clock_ms or (lambda: int(time.time() * 1000))
        self._lock = threading.Lock()
        self._sessions: dict[str, Session] = {}

    def announce(self, client_id: str, settings: v2.Settings) -> None:
        with self._lock:
            self._sessions[client_id] = Session(client_id, settings.client_type, settings, self._clock())

    def heartbeat(self, client_id: str, client_type: int) -> bool:
        """Record a heartbeat; False when the client never announced settings here."""
        with self._lock:
            s = self._sessions.get(client_id)
            if s is None:
                self._sessions[client_id] = Session(client_id, client_type, None, self._clock())
                return False
            s.last_seen_ms = self._clock()
            return s.settings is not None

    def terminate(self, client_id: str) -> bool:
        with self._lock:
            return self._sessions.pop(client_id, None) is not None

    def get(self, client_id: str) -> Session | None:
        with self._lock:
            return self._sessions.get(client_id)

    def online_groups(self, within_ms: int = 30_000) -> set[str]:
        """Consumer groups with a client heard from in the last `within_ms` (SDKs heartbeat every 10 s)."""
        now = self._clock()
        with self._lock:
            return {s.settings.subscription.group.name for s in self._sessions.values()
                    if s.settings is not None and s.settings.WhichOneof("pub_sub") == "subscription" and now - s.last_seen_ms <= within_ms}

    def __len__(self) -> int:
        with self._lock:
            return len(self._sessions)
