"""Durability: the flushing thread, fsync of what was written, and the one way to wait for it.

ASYNC acknowledges once bytes are in the page cache and fsyncs every interval; SYNC
acknowledges after an fsync that concurrent appenders share (group commit). Waiters, on an
event loop wait with `flush_signal.await_flushed`, threads with `wait_flushed_blocking`: the
flusher wakes them through listeners, no thread is held per waiter.
"""
from __future__ import annotations

import logging
import math
import os
import threading
import time
from typing import Callable

from quarry.services.commitlog.storage.checkpoint import StoreCheckpoint, save_checkpoint
from quarry.services.commitlog.storage.store_state import StoreState
from quarry.services.log import FailureReport, log_event
from quarry.services.commitlog.metrics import FLUSH_SECONDS

log = logging.getLogger("quarry.store")

RETENTION_EVERY_S = 60
# A reader waiting on the durable end gets a flush no sooner than its gap after the previous
# one, so under a steady stream of sends each flush carries a run of sends' records, not one
# or two. A consumer waits 5 ms: delivery latency is what it sees. An indexer's tail waits
# 20 ms: a key is findable 20 ms later at most, and the tail's frames and the fsyncs come a
# quarter as often (docs/decisions/flush-batching.md).
CONSUMER_FLUSH_GAP_S = 0.005
TAILER_FLUSH_GAP_S = 0.02
# The checkpoint only shortens recovery's scan (it starts at the segment holding the
# checkpoint's offset, verifies every record after it and writes their ConsumeQueue units
# again), so an older one is never wrong: it is written at most this often (and at a clean
# close), not by every flush. Writing it (a file, an fsync, a rename) cost more than the
# segment's own fsync, and the fsync of a file being appended to slows the appends. For the
# same reason queue files are fsynced only with a checkpoint: units past it are rebuilt.
CHECKPOINT_EVERY_S = 1.0


class Flusher:
    """fsyncs the store every interval, or at once when someone waits (`request_flush`)."""

    def __init__(self, state: StoreState, retention: Callable[[], object]) -> None:
        self.state = state
        self._retention = retention
        self._listeners: list[Callable[[], None]] = []
        self._stop = threading.Event()
        # What the next flush is owed, under one condition: the flusher re-reckons its wait
        # whenever a request comes (a consumer's short gap cuts short a tailer's long one).
        self._requests = threading.Condition(threading.Lock())
        self._wanted = False
        self._urgent = False  # a writer waits (SYNC): no gap
        self._gap = math.inf  # the shortest gap a waiting reader asked for since the last flush
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
        with self._requests:
            self._requests.notify()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _loop(self) -> None:
        interval = self.state.config.flush_interval_ms / 1000.0
        last_retention = 0.0
        while not self._stop.is_set():
            self._await_due(interval)
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

    def _await_due(self, interval: float) -> None:
        """Wait until the next flush is due: at once for a waiting writer, a reader's gap after
        the previous flush, else the interval (which also bounds a reader's gap)."""
        with self._requests:
            every = time.monotonic() + interval
            while not self._urgent and not self._stop.is_set():
                due = min(every, self._last_flush + min(self._gap, interval)) if self._wanted else every
                left = due - time.monotonic()
                if left <= 0:
                    break
                self._requests.wait(left)
            self._wanted = self._urgent = False
            self._gap = math.inf

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
            # A checkpoint promises the queues up to its offset, and their units up to
            # `target` were written under the lock: those files are synced outside it, so
            # appends are never held up by an fsync (one put off by a busy spell: once idle).
            checkpoint = clean or (target != self._checkpointed and time.monotonic() - self._checkpoint_at >= CHECKPOINT_EVERY_S)
            cq_fds = state.cqs.take_dirty() if checkpoint else []
        if not dirty and not checkpoint and target == state.flushed_offset:
            return target
        t0 = time.perf_counter()
        for seg in dirty:
            seg.fsync()
        for fd in cq_fds:
            os.fdatasync(fd)
        FLUSH_SECONDS.observe(time.perf_counter() - t0)
        if dirty:
            self._last_flush = time.monotonic()  # a reader's gap counts from any flush of the log
        if checkpoint:
            save_checkpoint(state.dir, StoreCheckpoint(target, int(time.time() * 1000), clean))
            self._checkpoint_at = time.monotonic()
            self._checkpointed = target
        if target != state.flushed_offset:
            state.flushed_offset = max(state.flushed_offset, target)
            self.notify()
        return target

    def notify(self) -> None:
        for listener in list(self._listeners):
            listener()

    def add_listener(self, listener: Callable[[], None]) -> None:
        self._listeners.append(listener)

    def remove_listener(self, listener: Callable[[], None]) -> None:
        self._listeners.remove(listener)

    def request_flush(self, gap_s: float = 0.0) -> None:
        """Flush now rather than at the next interval (a writer waiting on its own send), or
        for a reader no sooner than `gap_s` after the previous flush (the shortest gap asked
        for wins)."""
        if self.state.write_offset > self.state.flushed_offset:
            with self._requests:
                if gap_s <= 0:
                    self._urgent = True
                elif gap_s < self._gap:
                    self._gap = gap_s
                self._wanted = True
                self._requests.notify()


def wait_flushed_blocking(flusher: Flusher, end: int, timeout_s: float) -> bool:
    """Wait, on a thread of the caller's, until the log is fsynced up to `end`; False at the
    timeout. (On the event loop: flush_signal.await_flushed.)"""
    fired = threading.Event()
    flusher.add_listener(fired.set)
    try:
        flusher.request_flush()
        deadline = time.monotonic() + timeout_s
        while flusher.state.flushed_offset < end:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            fired.wait(left)
            fired.clear()  # the offset is read again after this: no wake-up is lost
        return True
    finally:
        flusher.remove_listener(fired.set)
