"""Writes the store's consumer offsets on an interval, whichever protocol committed them
(RocketMQ 4 remoting, RocketMQ 5 consumer groups); the store's close writes the last ones."""
from __future__ import annotations

import logging
import threading

from quarry.services.commitlog.consumer_offsets import ConsumerOffsets
from quarry.services.log import log_event

log = logging.getLogger("quarry.commitlog")


class OffsetsPersister:
    def __init__(self, offsets: ConsumerOffsets, interval_s: float) -> None:
        self.offsets = offsets
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, args=(interval_s,), name="offsets", daemon=True)

    def start(self) -> "OffsetsPersister":
        if not self.offsets.read_only:
            self._thread.start()
        return self

    def _loop(self, interval_s: float) -> None:
        while not self._stop.wait(interval_s):
            try:
                self.offsets.persist()
            except OSError as exc:
                log_event(log, "consumer offsets not persisted; will retry", logging.ERROR, path=str(self.offsets.path), error=str(exc))

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
