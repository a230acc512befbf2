"""Follow a commitlog's Tail stream and feed the index, reconnecting when the log is away.

Order matters for crash safety: the index is flushed before the checkpoint that covers
it is written, so after a crash the checkpoint never claims more than the index holds;
whatever the index holds beyond the checkpoint is skipped on re-delivery.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Callable, Protocol, Sequence

import grpc

from quarry.channels import open_channel
from tenacity import Retrying, retry_if_exception, wait_exponential_jitter

from quarry.v1 import commitlog_pb2, commitlog_pb2_grpc, common_pb2
from quarry.services.log import log_event

log = logging.getLogger("quarry.tailer")


class IndexSink(Protocol):
    """What the tailer writes to (quarry.services.indexer.index_store.IndexStore)."""

    def index_records(self, records: Sequence[common_pb2.DispatchRecord]) -> None: ...
    def flush(self) -> None: ...


class CheckpointSink(Protocol):
    def save(self, offset: int, timestamp: int) -> None: ...


@dataclass
class TailState:
    """What status reports: where the tail is, how far behind, whether it is connected."""

    next_offset: int = 0
    commitlog_max_offset: int = 0
    last_store_timestamp: int = 0
    connected: bool = False
    last_error: str = ""


class _Disconnected(Exception):
    """The stream ended or failed; reconnect."""


class Tailer:
    """A thread that tails `commitlog_addr` from the checkpoint and indexes every record."""

    def __init__(
        self,
        commitlog_addr: str,
        index: IndexSink,
        checkpoint: CheckpointSink,
        start_offset: int,
        flush_interval_ms: int = 1000,
        lock: threading.Lock | None = None,
        on_batch: Callable[[int, TailState], None] | None = None,
    ) -> None:
        self.commitlog_addr = commitlog_addr
        self.index = index
        self.checkpoint = checkpoint
        self.state = TailState(next_offset=start_offset)
        self.flush_interval_s = flush_interval_ms / 1000.0
        self.lock = lock or threading.Lock()
        self.on_batch = on_batch
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tailer", daemon=True)
        self._channel: grpc.Channel | None = None
        self._call: grpc.Future | None = None
        self._last_flush = time.monotonic()
        self._last_expiry = 0.0
        self._dirty = False
        self.caught_up = threading.Condition()

    def start(self) -> "Tailer":
        self._thread.start()
        return self

    def _run(self) -> None:
        retrying = Retrying(
            retry=retry_if_exception(lambda e: isinstance(e, _Disconnected) and not self._stop.is_set()),
            wait=wait_exponential_jitter(initial=0.05, max=2.0, jitter=0.1),
            sleep=self._stop.wait,
            reraise=True,
        )
        try:
            retrying(self._tail_once)
        except _Disconnected:
            pass  # stopping
        finally:
            self._flush(force=True)

    def _tail_once(self) -> None:
        if self._stop.is_set():
            return
        self._channel = open_channel(self.commitlog_addr)
        stub = commitlog_pb2_grpc.CommitLogServiceStub(self._channel)
        try:
            self._call = stub.Tail(commitlog_pb2.TailRequest(from_offset=self.state.next_offset, max_batch=1024))
            for response in self._call:  # type: ignore[union-attr]
                if not self.state.connected:
                    self.state.connected = True
                    self.state.last_error = ""
                    log_event(log, "tail connected", commitlog=self.commitlog_addr, from_offset=self.state.next_offset)
                self._apply(response)
                self._expire(stub)
            raise _Disconnected("stream ended")
        except grpc.RpcError as exc:
            if self._stop.is_set():
                return
            code = exc.code()  # type: ignore[attr-defined]
            if code == grpc.StatusCode.OUT_OF_RANGE:
                self._skip_to_min_offset(stub, exc)
            self._disconnected(f"{code.name}: {exc.details()}")  # type: ignore[attr-defined]
            raise _Disconnected(str(exc)) from exc
        finally:
            self._channel.close()

    def _skip_to_min_offset(self, stub: commitlog_pb2_grpc.CommitLogServiceStub, exc: grpc.RpcError) -> None:
        """The checkpoint fell below the log's minimum (segments expired): resume from the minimum."""
        try:
            status = stub.GetStoreStatus(commitlog_pb2.GetStoreStatusRequest(), timeout=2)
        except grpc.RpcError:
            return
        if self.state.next_offset < status.min_offset:
            log_event(log, "checkpoint below commitlog minimum; expired records skipped", logging.WARNING, checkpoint=self.state.next_offset, min_offset=status.min_offset)
            self.state.next_offset = status.min_offset

    def _disconnected(self, why: str) -> None:
        if self.state.connected or self.state.last_error != why:
            log_event(log, "tail disconnected; reconnecting with backoff", logging.WARNING, commitlog=self.commitlog_addr, error=why)
        self.state.connected = False
        self.state.last_error = why

    def _apply(self, response: commitlog_pb2.TailResponse) -> None:
        with self.lock:
            if response.records:
                self.index.index_records(response.records)
                self.state.last_store_timestamp = response.records[-1].store_timestamp
            self.state.next_offset = response.next_offset
            self.state.commitlog_max_offset = response.max_offset
            self._dirty = self._dirty or bool(response.records)
        if self.on_batch is not None:
            self.on_batch(len(response.records), self.state)
        self._flush()
        with self.caught_up:
            self.caught_up.notify_all()

    def _expire(self, stub: commitlog_pb2_grpc.CommitLogServiceStub) -> None:
        """Drop IndexFiles that only cover expired segments (checked once a minute)."""
        if time.monotonic() - self._last_expiry < 60 or not hasattr(self.index, "delete_below"):
            return
        self._last_expiry = time.monotonic()
        try:
            status = stub.GetStoreStatus(commitlog_pb2.GetStoreStatusRequest(), timeout=2)
        except grpc.RpcError:
            return
        with self.lock:
            self.index.delete_below(status.min_offset)  # type: ignore[attr-defined]

    def _flush(self, force: bool = False) -> None:
        if not self._dirty or (not force and time.monotonic() - self._last_flush < self.flush_interval_s):
            return
        with self.lock:
            self.index.flush()
            self.checkpoint.save(self.state.next_offset, self.state.last_store_timestamp)
            self._dirty = False
        self._last_flush = time.monotonic()

    def wait_until(self, offset: int, timeout_s: float) -> bool:
        """Block until next_offset >= offset or the timeout; True when reached."""
        with self.caught_up:
            return self.caught_up.wait_for(lambda: self.state.next_offset >= offset, timeout=timeout_s)

    def stop(self) -> None:
        self._stop.set()
        if self._call is not None:
            self._call.cancel()  # type: ignore[union-attr]
        self._thread.join(timeout=10)
