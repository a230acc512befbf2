"""The commitlog's send path, shared by every front door (quarry.v1, the RocketMQ 4 remoting
port, the RocketMQ 5 SDKs' door): append, count, announce new topics, wake long-polling pulls,
and (SYNC) await the fsync with the one wait (`flushing.await_flushed`). A StoreError
propagates: each protocol answers it in its own terms."""
from __future__ import annotations

import time
from typing import Callable

from quarry.services.commitlog import metrics
from quarry.services.commitlog.append import AppendResult
from quarry.services.commitlog.errors import StoreError
from quarry.services.commitlog.flush_signal import FlushSignal
from quarry.services.commitlog.flushing import await_flushed
from quarry.services.commitlog.message_input import NewMessage
from quarry.services.commitlog.store import CommitLogStore


class SendPath:
    """One store's appends on the event loop; `on_topic_created` / `on_appended` are hooks the
    process wires (heartbeat, remoting long polls)."""

    def __init__(self, store: CommitLogStore, flushed: FlushSignal) -> None:
        self.store = store
        self.flushed = flushed
        self.on_topic_created: Callable[[], None] = lambda: None
        self.on_appended: Callable[[], None] = lambda: None  # wakes long-polling remoting pulls
        self.append_listeners: list[Callable[[], None]] = []  # more of the same (RocketMQ 5 receives), on the loop

    async def append_flushed(self, msgs: list[NewMessage], rpc: str = "SendMessage", abort_prefix: str = "", wait_flush: bool = True,
                             same_topic: bool = True) -> list[AppendResult]:
        """Store, count, announce new topics and (SYNC, unless told otherwise) await the fsync."""
        topics_before = len(self.store.topics)
        t0 = time.perf_counter()
        try:
            results = self.store.append_many(msgs, same_topic=same_topic, wait_flush=False)
        except StoreError as exc:
            metrics.SEND_ERRORS.labels(type(exc).__name__).inc()
            raise exc.prefixed(abort_prefix)
        if len(self.store.topics) != topics_before:
            self.on_topic_created()
        self.on_appended()
        for listener in self.append_listeners:
            listener()
        if wait_flush:
            await self.await_flushed(results)
        metrics.SEND_LATENCY.labels(rpc).observe(time.perf_counter() - t0)
        metrics.SENT_MESSAGES.labels(results[0].topic).inc(len(results))
        metrics.SENT_BYTES.inc(sum(r.size for r in results))
        metrics.STORE_MAX_OFFSET.set(self.store.write_offset)
        return results

    async def await_flushed(self, results: list[AppendResult]) -> None:
        """SYNC mode: return once the results are fsynced, or mark them not flushed at the timeout."""
        if self.store.config.flush_mode != "SYNC" or not results:
            return
        end = results[-1].physical_offset + results[-1].size
        if not await await_flushed(self.store.flusher, self.flushed, end, self.store.config.sync_flush_timeout_ms / 1000.0):
            for r in results:
                r.flushed = False
