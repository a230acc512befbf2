"""Writes the store's consumer offsets on an interval, whichever protocol committed them
(RocketMQ 4 remoting, RocketMQ 5 consumer groups); the store's close writes the last ones."""
from __future__ import annotations

import logging
import threading

from quarry.services.commitlog.storage.consumer_offsets import ConsumerOffsets
from quarry.services.log import log_event
from quarry.services.progress import Progress

log = logging.getLogger("quarry.commitlog")


class OffsetsPersister:
    def __init__(self, offsets: ConsumerOffsets, interval_s: float) -> None:
        self.offsets = offsets
        # Commits made against commits written: a persister that cannot write says so.
        self.progress = Progress("consumer offset persistence", unit="changes", stall_after_s=max(10.0, 3 * interval_s))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, args=(interval_s,), name="offsets", daemon=True)

    def start(self) -> "OffsetsPersister":
        if not self.offsets.read_only:
            self._thread.start()
        return self

    def _loop(self, interval_s: float) -> None:
        failing = ""
        while not self._stop.wait(interval_s):
            self.progress.input(self.offsets.version)
            try:
                self.offsets.persist()
            except OSError as exc:
                if str(exc) != failing:  # said once, not every round
                    log_event(log, "consumer offsets not persisted; will retry", logging.ERROR, path=str(self.offsets.path), error=str(exc))
                failing = str(exc)
                self.progress.block(f"{self.offsets.path}: {exc}")
            else:
                if failing:
                    log_event(log, "consumer offsets persisted again", path=str(self.offsets.path))
                failing = ""
                self.progress.block("")
            self.progress.advanced(self.offsets.persisted)

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
