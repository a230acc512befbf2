"""The commitlog's send path, shared by every front door (quarry.v1, the RocketMQ 4 remoting
port, the RocketMQ 5 SDKs' door): append, count, announce new topics, wake long-polling pulls,
and (SYNC) await the fsync with the one wait (`flushing.await_flushed`). A StoreError
propagates: each protocol answers it in its own terms."""
from __future__ import annotations

import asyncio
import time
from typing import Any, Callable, Sequence

from quarry.services.commitlog import metrics
from quarry.services.commitlog.append import Appended
from quarry.services.commitlog.errors import StoreError
from quarry.services.commitlog.flush_signal import FlushSignal
from quarry.services.commitlog.flushing import await_flushed
from quarry.services.commitlog.message_input import MessageFields
from quarry.services.commitlog.store import CommitLogStore


_TOPICS_CACHED = 10_000


class SendPath:
    """One store's appends on the event loop; `on_topic_created` is a hook the process wires
    (the heartbeat); readers waiting for new records wait on `appended_signal()` (a caught-up
    Tail, RocketMQ 4 long-polling pulls, RocketMQ 5 receives)."""

    def __init__(self, store: CommitLogStore, flushed: FlushSignal) -> None:
        self.store = store
        self.flushed = flushed
        self.on_topic_created: Callable[[], None] = lambda: None
        self.append_listeners: list[Callable[[], None]] = []  # called after every append, on the loop
        self._appended: FlushSignal | None = None  # see appended_signal
        # Labelled metric series, resolved once each.
        self._latency: dict[str, Any] = {}
        self._sent: dict[str, list[float]] = {}
        self._sent_bytes = metrics.SENT_BYTES.labels()
        metrics.STORE_MAX_OFFSET.set_function(lambda: store.write_offset)

    def appended_signal(self) -> FlushSignal:
        """Fired by every append (on the loop): what a reader waiting for new records waits on
        (a caught-up Tail, a RocketMQ 5 receive). Made by the first caller, on the loop."""
        if self._appended is None:
            self._appended = FlushSignal(asyncio.get_running_loop())
            self.append_listeners.append(self._appended.fire_in_loop)
        return self._appended

    async def append_flushed(self, msgs: Sequence[MessageFields], rpc: str = "SendMessage", abort_prefix: str = "", wait_flush: bool = True,
                             same_topic: bool = True, peer: tuple[str, int] | None = None) -> Appended:
        """Store, count, announce new topics and (SYNC, unless told otherwise) await the fsync.
        `msgs` are taken as they are (a request's own messages); `peer` is the born host of
        those without one."""
        state = self.store.state  # (the store's properties read it: one lookup less each)
        topics_before = len(state.topics)
        t0 = time.perf_counter()
        try:
            appended = self.store.append_many(msgs, same_topic=same_topic, wait_flush=False, peer=peer)
        except StoreError as exc:
            metrics.SEND_ERRORS.labels(type(exc).__name__).inc()
            raise exc.prefixed(abort_prefix)
        if len(state.topics) != topics_before:
            self.on_topic_created()
        for listener in self.append_listeners:
            listener()
        if wait_flush and state.config.flush_mode == "SYNC":  # (ASYNC: no coroutine to build and await)
            await self.await_flushed(appended)
        latency = self._latency.get(rpc)
        if latency is None:
            latency = self._latency[rpc] = metrics.SEND_LATENCY.labels(rpc)  # a few RPC names
        latency.observe(time.perf_counter() - t0)
        topic = appended.rows[0][2]
        sent = self._sent.get(topic)
        if sent is None:
            sent = metrics.SENT_MESSAGES.labels(topic)
            if len(self._sent) < _TOPICS_CACHED:
                self._sent[topic] = sent
        sent[0] += len(appended.rows)
        self._sent_bytes[0] += appended.bytes
        return appended

    async def await_flushed(self, appended: Appended) -> None:
        """SYNC mode: return once the records are fsynced, or mark them not flushed at the timeout."""
        if self.store.config.flush_mode != "SYNC" or not appended.rows:
            return
        if not await await_flushed(self.store.flusher, self.flushed, appended.end, self.store.config.sync_flush_timeout_ms / 1000.0):
            appended.flushed = False
