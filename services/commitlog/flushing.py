"""Durability: the flushing thread, fsync of what was written, and the one way to wait for it.

ASYNC acknowledges once bytes are in the page cache and fsyncs every interval; SYNC
acknowledges after an fsync that concurrent appenders share (group commit). Waiters, on an
event loop or not, wait with `await_flushed`: the flusher wakes them through listeners
(`FlushSignal.fire`), no thread is held per waiter.
"""
from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from typing import Callable

from quarry.services.commitlog.checkpoint import StoreCheckpoint, save_checkpoint
from quarry.services.commitlog.flush_signal import FlushSignal
from quarry.services.commitlog.store_state import StoreState
from quarry.services.log import FailureReport, log_event
from quarry.services.commitlog.metrics import FLUSH_SECONDS

log = logging.getLogger("quarry.store")

RETENTION_EVERY_S = 60
# A reader waiting on the durable end (a tailer, a consumer) gets a flush at most this long
# after the previous one: under a steady stream of sends each flush (fsyncs and a checkpoint)
# then carries several sends' records, not one or two, at a few ms of indexing latency.
READER_FLUSH_GAP_S = 0.005
# The checkpoint only shortens recovery's scan (it starts at the segment holding the
# checkpoint's offset and verifies every record after it), so an older one is never wrong:
# it is written at most this often (and at a clean close), not by every flush. Writing it
# (a file, an fsync, a rename) cost more than the segment's own fsync, and the fsync of a
# file being appended to slows the appends.
CHECKPOINT_EVERY_S = 1.0


class Flusher:
    """fsyncs the store every interval, or at once when someone waits (`request_flush`)."""

    def __init__(self, state: StoreState, retention: Callable[[], object]) -> None:
        self.state = state
        self._retention = retention
        self._listeners: list[Callable[[], None]] = []
        self._stop = threading.Event()
        self._wanted = threading.Event()
        self._urgent = threading.Event()  # a writer waits (SYNC): no gap
        self._last_flush = 0.0
        self._checkpoint_at = -CHECKPOINT_EVERY_S  # monotonic time of the last checkpoint written
        self._checkpointed = -1  # the offset it holds
        self._thread: threading.Thread | None = None
        # One flush at a time: the flusher thread, close() and callers of store.flush() may
        # overlap, and two overlapping flushes could write the checkpoint out of order.
        self._flushing = threading.Lock()
        self._rounds = FailureReport(log, "flush failed", "flush recovered")

    def alive(self) -> bool:
        """The flushing thread runs (False before start, after stop, or if it died)."""
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="flusher", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """End the thread without a last flush (close() flushes itself; a crash test does not)."""
        self._stop.set()
        self._urgent.set()
        self._wanted.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _loop(self) -> None:
        interval = self.state.config.flush_interval_ms / 1000.0
        last_retention = 0.0
        while not self._stop.is_set():
            self._wanted.wait(interval)
            if self._wanted.is_set() and not self._urgent.is_set():
                gap = self._last_flush + READER_FLUSH_GAP_S - time.monotonic()
                if gap > 0:
                    self._urgent.wait(gap)
            self._wanted.clear()
            self._urgent.clear()
            if self._stop.is_set():
                break  # close() does the last flush itself
            # Nothing may end this thread: without it the durable end never moves again
            # (SYNC sends time out, tailers see nothing new).
            self._rounds.run(self.flush)
            if time.monotonic() - last_retention > RETENTION_EVERY_S:
                last_retention = time.monotonic()
                try:
                    self._retention()
                except Exception as exc:
                    log_event(log, "retention failed", logging.ERROR, error=repr(exc))

    @property
    def failing(self) -> str:
        """The error of the last flush round, "" once one succeeds."""
        return self._rounds.failing

    def flush(self, clean: bool = False) -> int:
        """fsync everything written so far; wake waiters. Returns the flushed offset."""
        with self._flushing:
            return self._flush(clean)

    def _flush(self, clean: bool) -> int:
        state = self.state
        with state.lock:
            target = state.write_offset
            dirty = [s for s in state.segments.segments if s.dirty]
            # Queue units up to `target` were written under the lock; sync them outside it,
            # so appends are never held up by an fsync.
            cq_fds = state.cqs.take_dirty()
        if target == state.flushed_offset and not clean and not dirty and not cq_fds:
            self._checkpoint(target, clean)  # one a busy spell put off is written once idle
            return target
        t0 = time.perf_counter()
        for seg in dirty:
            seg.fsync()
        for fd in cq_fds:
            os.fdatasync(fd)
        FLUSH_SECONDS.observe(time.perf_counter() - t0)
        self._last_flush = time.monotonic()  # a reader's gap counts from any flush
        self._checkpoint(target, clean)
        state.flushed_offset = max(state.flushed_offset, target)
        self.notify()
        return target

    def _checkpoint(self, flushed: int, clean: bool) -> None:
        if clean or (flushed != self._checkpointed and time.monotonic() - self._checkpoint_at >= CHECKPOINT_EVERY_S):
            save_checkpoint(self.state.dir, StoreCheckpoint(flushed, int(time.time() * 1000), clean))
            self._checkpoint_at = time.monotonic()
            self._checkpointed = flushed

    def notify(self) -> None:
        for listener in list(self._listeners):
            listener()

    def add_listener(self, listener: Callable[[], None]) -> None:
        self._listeners.append(listener)

    def remove_listener(self, listener: Callable[[], None]) -> None:
        self._listeners.remove(listener)

    def request_flush(self, reader: bool = False) -> None:
        """Flush now rather than at the next interval; for a `reader` (not a writer waiting
        on its own send), no sooner than READER_FLUSH_GAP_S after the previous flush."""
        if self.state.write_offset > self.state.flushed_offset:
            if not reader:
                self._urgent.set()
            self._wanted.set()


async def await_flushed(flusher: Flusher, signal: FlushSignal, end: int, timeout_s: float) -> bool:
    """Wait until the log is fsynced up to `end`; False at the timeout. The one fsync wait."""
    state = flusher.state
    flusher.request_flush()
    deadline = time.monotonic() + timeout_s
    while True:
        event = signal.current()  # taken before the check: no wake-up is lost
        if state.flushed_offset >= end:
            return True
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        await signal.wait(event, left)


def wait_flushed_blocking(flusher: Flusher, end: int, timeout_s: float) -> bool:
    """await_flushed for a caller without an event loop (a thread of its own)."""
    async def main() -> bool:
        signal = FlushSignal(asyncio.get_running_loop())
        flusher.add_listener(signal.fire)
        try:
            return await await_flushed(flusher, signal, end, timeout_s)
        finally:
            flusher.remove_listener(signal.fire)

    return asyncio.run(main())
