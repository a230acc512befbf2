"""Follow a commitlog's Tail stream and feed the index, reconnecting when the log is away.

The stream is a grpc.aio call read by a task on the indexer's event loop, beside the query
handlers: a synchronous channel would keep a `channel_spin` thread of its own, which gRPC's
shared poller woke on every query the indexer served (as it did grpc.aio's poller), for
nothing. Indexing a batch runs on the loop; flushing (msync, fsync) runs off it.

Order matters for crash safety: the index is flushed before the checkpoint that covers
it is written, so after a crash the checkpoint never claims more than the index holds;
whatever the index holds beyond the checkpoint is skipped on re-delivery.
"""
from __future__ import annotations

import asyncio
import logging
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, AsyncIterator, Callable, Protocol, Sequence

import grpc
from tenacity import AsyncRetrying, retry_if_exception, wait_exponential_jitter

from quarry.channels import open_aio_channel
from quarry.v1 import commitlog_pb2, commitlog_pb2_grpc, common_pb2
from quarry.services.indexer.metrics import INDEX_DROPPED
from quarry.services.indexer.reconcile import Held, last_held, newest_held
from quarry.services.log import log_event
from quarry.services.progress import Progress
from quarry.services.silent_streams import Silent, within

log = logging.getLogger("quarry.tailer")

STOP_TIMEOUT_S = 15.0


if TYPE_CHECKING:
    from quarry.services.indexer.presence import KeyPresencePublisher


class IndexSink(Protocol):
    """What the tailer writes to (quarry.services.indexer.index_store.IndexStore)."""

    def index_records(self, records: Sequence[common_pb2.DispatchRecord]) -> None: ...
    def prepare_flush(self) -> Sequence["Syncable"]: ...


class Syncable(Protocol):
    def sync(self) -> None: ...


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


_END = object()
GROUP_QUEUE = 32  # responses read ahead of indexing (gRPC's flow control holds the rest back)
# The commitlog sends at least an empty response each second (its TAIL_IDLE_S): a stream silent
# this long is over though it never ended (a peer gone without a word: a half-open connection),
# and is opened again. Without this limit, indexing would stop for good and nothing would say so.
TAIL_SILENT_S = 30.0


async def _grouped(call: AsyncIterator[commitlog_pb2.TailResponse], silent_s: float) -> AsyncIterator[list[commitlog_pb2.TailResponse]]:
    """The stream's responses, those that arrived while the previous group was being indexed
    taken together: a group costs one index header write, however many responses came
    meanwhile. Silent when none
    came for `silent_s` (the queue is empty only while nothing is read)."""
    queue: asyncio.Queue[Any] = asyncio.Queue(GROUP_QUEUE)

    async def read() -> None:
        try:
            async for response in call:
                await queue.put(response)
            await queue.put(_END)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # the stream failed: raised where the groups are read
            await queue.put(exc)

    reader = asyncio.ensure_future(read())
    try:
        while True:
            group = [await within(queue.get(), silent_s, f"no Tail response within {silent_s:g} s (the commitlog sends one at least each second)")]
            while not queue.empty() and isinstance(group[-1], commitlog_pb2.TailResponse):
                group.append(queue.get_nowait())
            responses = [r for r in group if isinstance(r, commitlog_pb2.TailResponse)]
            if responses:
                yield responses
            if not isinstance(group[-1], commitlog_pb2.TailResponse):
                if group[-1] is _END:
                    return
                raise group[-1]
    finally:
        reader.cancel()


class Tailer:
    """A task on the event loop that tails `commitlog_addr` from the checkpoint and indexes
    every record. `lock` is shared with the threads that also touch the index (the filter
    builder, flushes) and the query handlers."""

    def __init__(
        self,
        commitlog_addr: str,
        index: IndexSink,
        checkpoint: CheckpointSink,
        start_offset: int,
        flush_interval_ms: int = 1000,
        lock: threading.Lock | None = None,
        on_batch: Callable[[int, TailState], None] | None = None,
        presence: "KeyPresencePublisher | None" = None,
    ) -> None:
        self.commitlog_addr = commitlog_addr
        self.presence = presence  # told each batch's keys as it is written (presence.py)
        self.index = index
        self.checkpoint = checkpoint
        self.state = TailState(next_offset=start_offset)
        # Its position against the log's durable end: a tail that stops moving says so (progress.py).
        self.progress = Progress("index tail")
        self.progress.advanced(start_offset)
        self.flush_interval_s = flush_interval_ms / 1000.0
        self.lock = lock or threading.Lock()
        self.on_batch = on_batch
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self._wake: asyncio.Event | None = None  # ends a backoff pause when stopping
        self._last_flush = time.monotonic()
        self._last_expiry = 0.0
        self._dirty = False

    def start(self) -> "Tailer":
        """Start tailing; call inside the event loop that serves the indexer."""
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        self._task = self._loop.create_task(self._run(), name="tailer")
        return self

    async def _run(self) -> None:
        retrying = AsyncRetrying(
            retry=retry_if_exception(lambda e: isinstance(e, _Disconnected) and not self._stopping),
            wait=wait_exponential_jitter(initial=0.05, max=2.0, jitter=0.1),
            sleep=self._pause,
            reraise=True,
        )
        try:
            await retrying(self._tail_once)
        except (_Disconnected, asyncio.CancelledError):
            pass  # stopping
        finally:
            await self._flush(force=True)

    async def _pause(self, seconds: float) -> None:
        """The backoff between attempts, cut short by stop()."""
        assert self._wake is not None
        try:
            async with asyncio.timeout(seconds):
                await self._wake.wait()
        except TimeoutError:
            pass

    async def _tail_once(self) -> None:
        if self._stopping:
            return
        channel = open_aio_channel(self.commitlog_addr)
        stub = commitlog_pb2_grpc.CommitLogServiceStub(channel)
        try:
            await self._reconcile(stub)
            call = stub.Tail(commitlog_pb2.TailRequest(from_offset=self.state.next_offset, max_batch=1024))
            async for responses in _grouped(call, TAIL_SILENT_S):
                if not self.state.connected:
                    self.state.connected = True
                    self.state.last_error = ""
                    self.progress.block("")
                    log_event(log, "tail connected", commitlog=self.commitlog_addr, from_offset=self.state.next_offset)
                try:
                    await self._apply(responses)
                    await self._expire(stub)
                except Exception as exc:  # a full disk, a damaged IndexFile: the task must live on
                    # Not counted as connected while indexing fails (health says why); the
                    # batch is asked for again after a pause, from the last offset indexed.
                    self._disconnected(f"indexing failed: {exc!r}", logging.ERROR)
                    raise _Disconnected(repr(exc)) from exc
            self._disconnected("stream ended")
            raise _Disconnected("stream ended")
        except Silent as exc:
            self._disconnected(str(exc))
            raise _Disconnected(str(exc)) from exc
        except grpc.aio.AioRpcError as exc:
            if self._stopping:
                return
            code = exc.code()
            if code == grpc.StatusCode.OUT_OF_RANGE:
                await self._skip_to_min_offset(stub)
            self._disconnected(f"{code.name}: {exc.details()}")
            raise _Disconnected(str(exc)) from exc
        finally:
            await channel.close()

    async def _reconcile(self, stub: commitlog_pb2_grpc.CommitLogServiceStub) -> None:
        """Before tailing: the log must still hold what the index was built from. If it was cut
        or restored below the index (reconcile.py), drop the entries it no longer holds, go back
        to where it parts from the index, save that, and say so once."""
        if not hasattr(self.index, "drop_after"):
            return
        status = await stub.GetStoreStatus(commitlog_pb2.GetStoreStatusRequest(), timeout=5)
        self.progress.input(status.committed_offset)

        async def lookup(offsets: list[int]) -> dict[int, Any]:
            got = await stub.GetMessages(commitlog_pb2.GetMessagesRequest(physical_offsets=offsets), timeout=10)
            found: dict[int, Any] = {o: None for o in got.not_found}
            found.update((m.commit_log_offset, m) for m in got.messages)
            return found

        index: Any = self.index
        held: Held | None = await newest_held(index, lookup, status.min_offset)
        if held is not None and self.state.next_offset <= status.max_offset:
            return
        if held is None:
            held = await last_held(index, lookup, status.min_offset)
        before, indexed = self.state.next_offset, index.last_update_phy_offset
        with self.lock:
            dropped = index.drop_after(held.phy_offset, held.store_timestamp)
            self.state.next_offset = held.end
            self.state.last_store_timestamp = held.store_timestamp
            self._dirty = True
        INDEX_DROPPED.inc(dropped)
        problem = (f"the log of {self.commitlog_addr} no longer holds all that was indexed (cut, repaired or restored below it: "
                   f"it ends at {status.max_offset}; the index had reached {before}, its newest entry at {indexed}): "
                   f"{dropped} index entries after offset {held.phy_offset} dropped; indexing resumes at {held.end}")
        if hasattr(index, "problems"):
            index.problems.append(problem)
        log_event(log, "index ahead of the log: entries it no longer holds dropped", logging.WARNING, commitlog=self.commitlog_addr,
                  log_end=status.max_offset, checkpoint=before, newest_entry=indexed, dropped_entries=dropped, kept_through=held.phy_offset,
                  resume_at=held.end)
        await self._flush(force=True)  # the new position is the checkpoint before anything is tailed
        self.progress.advanced(held.end)

    async def _skip_to_min_offset(self, stub: commitlog_pb2_grpc.CommitLogServiceStub) -> None:
        """The checkpoint fell below the log's minimum (segments expired): resume from the minimum."""
        try:
            status = await stub.GetStoreStatus(commitlog_pb2.GetStoreStatusRequest(), timeout=2)
        except grpc.aio.AioRpcError:
            return
        if self.state.next_offset < status.min_offset:
            log_event(log, "checkpoint below commitlog minimum; expired records skipped", logging.WARNING, checkpoint=self.state.next_offset, min_offset=status.min_offset)
            self.state.next_offset = status.min_offset

    def _disconnected(self, why: str, level: int = logging.WARNING) -> None:
        if self.state.connected or self.state.last_error != why:
            log_event(log, "tail disconnected; reconnecting with backoff", level, commitlog=self.commitlog_addr, error=why)
        self.state.connected = False
        self.state.last_error = why
        self.progress.block(why)

    async def _apply(self, responses: list[commitlog_pb2.TailResponse]) -> None:
        """Index the records of consecutive responses as one batch."""
        records = [r for response in responses for r in response.records]
        last = responses[-1]
        presence = self.presence
        with self.lock:
            if records:
                if presence is None:
                    self.index.index_records(records)
                else:
                    batch = self.index.prepare_records(records)  # type: ignore[attr-defined]
                    try:
                        self.index.write_prepared(batch)  # type: ignore[attr-defined]
                    finally:  # (a failed write may have written part: an extra hash only costs a call)
                        presence.add(batch.key_hashes)  # in the step that writes it (presence.py)
                self.state.last_store_timestamp = records[-1].store_timestamp
            self.state.next_offset = last.next_offset
            self.state.commitlog_max_offset = last.max_offset
            self._dirty = self._dirty or bool(records)
        self.progress.input(last.max_offset)
        self.progress.advanced(last.next_offset)
        if self.on_batch is not None:
            self.on_batch(len(records), self.state)
        await self._flush()

    async def _expire(self, stub: commitlog_pb2_grpc.CommitLogServiceStub) -> None:
        """Drop IndexFiles that only cover expired segments (checked once a minute)."""
        if time.monotonic() - self._last_expiry < 60 or not hasattr(self.index, "delete_below"):
            return
        self._last_expiry = time.monotonic()
        try:
            status = await stub.GetStoreStatus(commitlog_pb2.GetStoreStatusRequest(), timeout=2)
        except grpc.aio.AioRpcError:
            return
        with self.lock:
            self.index.delete_below(status.min_offset)  # type: ignore[attr-defined]

    async def _flush(self, force: bool = False) -> None:
        if not self._dirty or (not force and time.monotonic() - self._last_flush < self.flush_interval_s):
            return
        # msync and fsync off the loop; the task waits, so nothing is indexed meanwhile and the
        # checkpoint saved is the one the flushed index covers.
        await asyncio.to_thread(self._flush_then_checkpoint, self.state.next_offset, self.state.last_store_timestamp)
        self._dirty = False
        self._last_flush = time.monotonic()

    def _flush_then_checkpoint(self, offset: int, timestamp: int) -> None:
        # Headers under the lock (queries read them); the disk writes without it, so queries
        # on the loop do not wait for them. The tail task awaits this: nothing is indexed
        # meanwhile, so the checkpoint saved is the one the synced files cover.
        with self.lock:
            files = self.index.prepare_flush()
        for f in files:
            f.sync()
        self.checkpoint.save(offset, timestamp)

    async def aclose(self) -> None:
        """End the stream, flush the index, then save the checkpoint (on the loop)."""
        self._stopping = True
        if self._wake is not None:
            self._wake.set()
        if self._task is not None and not self._task.done():
            self._task.cancel()
            try:
                await asyncio.wait_for(asyncio.shield(self._task), STOP_TIMEOUT_S)
            except (asyncio.CancelledError, TimeoutError):
                pass

    def stop(self) -> None:
        """aclose from another thread (the server's on_stop runs off the loop); waits for it."""
        if self._loop is None or self._loop.is_closed():
            return
        asyncio.run_coroutine_threadsafe(self.aclose(), self._loop).result(timeout=STOP_TIMEOUT_S + 5)
