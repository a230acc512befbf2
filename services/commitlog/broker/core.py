"""One broker: its store and the RocketMQ semantics every door shares.

The composition root (main.py) builds it by constructor; each door (doors/quarry_v1.py,
RocketMQ 4 remoting in doors/remoting.py, RocketMQ 5 in doors/rmq5_*.py) is given this object
and never another door or servicer.
"""
from __future__ import annotations

import threading
from typing import Callable

from quarry.services.commitlog.broker.flush_signal import FlushSignal
from quarry.services.commitlog.broker.sending import SendPath
from quarry.services.commitlog.storage.store import CommitLogStore
from quarry.services.commitlog.broker.transactions import Transactions
from quarry.services.progress import Watches


class Broker:
    def __init__(self, store: CommitLogStore, name: str, stopping: threading.Event, flushed: FlushSignal, *,
                 watches: Watches | None = None, consumer_max_attempts: int = 17,
                 has_company: Callable[[], bool] = lambda: True) -> None:
        """`has_company`: whether another call is in flight on the server (a lone send is
        appended at once instead of waiting for its loop turn's company)."""
        self.store = store
        self.name = name
        self.stopping = stopping
        self.flushed = flushed
        self.watches = watches or Watches()  # the loops that move a position forward: their stalls are problems
        self.consumer_max_attempts = consumer_max_attempts  # deliveries before a message is dead-lettered
        self.sending = SendPath(store, flushed, has_company)  # the send path every door shares
        self.transactions = Transactions(store)  # half messages, resolved once whichever door ends them
        # Who knows which consumer groups were heard from lately (the RocketMQ 5 door's sessions);
        # read by consume status, which calls a group seen there online.
        self.online_sources: list[Callable[[], set[str]]] = []

    def online_groups(self) -> set[str]:
        groups: set[str] = set()
        for source in self.online_sources:
            groups |= source()
        return groups
