"""The commitlog's send path, shared by every front door (quarry.v1, the RocketMQ 4 remoting
port, the RocketMQ 5 SDKs' door): append, count, announce new topics, wake long-polling pulls,
and (SYNC) await the fsync with the one wait (`flushing.await_flushed`). A StoreError
propagates: each protocol answers it in its own terms."""
from __future__ import annotations

import asyncio
import time
from typing import Any, Callable, Sequence

from quarry.services.commitlog import metrics
from quarry.services.commitlog.storage.append import Appended
from quarry.services.commitlog.broker.broker_stats import TOPIC_PUT_NUMS, TOPIC_PUT_SIZE, BrokerStats
from quarry.services.commitlog.storage.errors import DiskFull, ReadOnly, StoreError
from quarry.services.commitlog.broker.flush_signal import FlushSignal, await_flushed
from quarry.services.commitlog.storage.message_input import MessageFields
from quarry.services.commitlog.broker.parking import park
from quarry.services.commitlog.storage.store import CommitLogStore


_TOPICS_CACHED = 10_000


class SendPath:
    """One store's appends on the event loop; `topic_listeners` are told when a send created a
    topic (the process registers its heartbeat); readers waiting for new records wait on `appended_signal()` (a caught-up
    Tail, RocketMQ 4 long-polling pulls, RocketMQ 5 receives)."""

    def __init__(self, store: CommitLogStore, flushed: FlushSignal, has_company: Callable[[], bool] = lambda: True) -> None:
        self.store = store
        self.flushed = flushed
        self.topic_listeners: list[Callable[[], None]] = []  # told when a send created a topic (the heartbeat)
        self.append_listeners: list[Callable[[], None]] = []  # called after every append, on the loop
        self._appended: FlushSignal | None = None  # see appended_signal
        # Labelled metric series, resolved once each.
        self._latency: dict[str, Any] = {}
        self._sent: dict[str, tuple[list[float], list[int], list[int]]] = {}  # topic: its metric series, put counts and put bytes
        self.stats = BrokerStats()  # per topic puts (every door's), per group gets (the doors that hand messages)
        self._sent_bytes = metrics.SENT_BYTES.labels()
        # Whether other unary calls are in flight on the server (the process's call tracker):
        # append_in_turn waits for the turn's end only then.
        self.has_company = has_company
        # append_in_turn's callers waiting for this turn's append: (message, born host, answer)
        self._turn: list[tuple[MessageFields, tuple[str, int] | None, asyncio.Future[Appended]]] = []
        metrics.STORE_MAX_OFFSET.set_function(lambda: store.write_offset)

    def on_topic_created(self) -> None:
        for listener in self.topic_listeners:
            listener()

    def appended_signal(self) -> FlushSignal:
        """Fired by every append (on the loop): what a reader waiting for new records waits on
        (a caught-up Tail, a RocketMQ 5 receive). Made by the first caller, on the loop."""
        if self._appended is None:
            self._appended = FlushSignal(asyncio.get_running_loop())
            self.append_listeners.append(self._appended.fire_in_loop)
        return self._appended

    async def append_flushed(self, msgs: Sequence[MessageFields], rpc: str = "SendMessage", abort_prefix: str = "", wait_flush: bool = True,
                             same_topic: bool = True, peer: tuple[str, int] | None = None, delivered: bool = False) -> Appended:
        """Store, count, announce new topics and (SYNC, unless told otherwise) await the fsync.
        `msgs` are taken as they are (a request's own messages); `peer` is the born host of
        those without one. Delayed messages are parked (parking.py) unless `delivered`: due
        copies of parked ones (delayed_delivery.py), which keep their level as RocketMQ's do."""
        t0 = time.perf_counter()
        try:
            appended = self._append(msgs, same_topic, peer, parking=not delivered)
        except StoreError as exc:
            raise exc.prefixed(abort_prefix)
        if wait_flush and self.store.state.config.flush_mode == "SYNC":  # (ASYNC: no coroutine to build and await)
            await self.await_flushed(appended)
        self._observe(rpc, t0)
        return appended

    async def append_in_turn(self, msg: MessageFields, rpc: str, peer: tuple[str, int] | None = None, company: bool | None = None) -> Appended:
        """append_flushed of one message sent in a call of its own. With other calls in flight
        it is stored at the end of this turn of the event loop, with the other such calls'
        messages of the turn: one append (one write, one wake-up of the readers) for all,
        each answered with its own row or its own error. That pays even for a turn of one
        message: a handler appending at once holds up every other completion ready in the
        turn (requests read, answers written), and waiting lets the loop move those first
        (bench rmq5). A call alone is stored at once: waiting would only cost it a turn. So
        is every call in SYNC mode: it waits for its fsync anyway, and the loop moves the
        others meanwhile (waiting for the turn as well cost quarry.v1 ~10 % at 16 in flight).
        `company` says whether other calls are in flight, where the caller knows (None: the
        process's `has_company`)."""
        waiting = self._turn
        if not waiting and (self.store.state.config.flush_mode == "SYNC" or not (self.has_company() if company is None else company)):
            return await self.append_flushed((msg,), rpc, peer=peer)
        t0 = time.perf_counter()
        loop = asyncio.get_running_loop()
        answered = loop.create_future()
        waiting.append((msg, peer, answered))
        if len(waiting) == 1:
            loop.call_soon(self._append_turn)
        appended = await answered
        self._observe(rpc, t0)
        return appended

    def _append_turn(self) -> None:
        """Append what append_in_turn's callers queued this turn: one append per born host
        they gave (the callers whose calls ended before it are left out: not stored, not
        acknowledged); a group the store refuses is appended message by message, so only
        the messages at fault fail, unless nothing can be stored (closed, read-only, disk
        full): then all get that error. No caller is left waiting, whatever goes wrong."""
        waiting, self._turn = self._turn, []
        try:
            groups: dict[tuple[type, tuple[str, int] | None], list[tuple[MessageFields, asyncio.Future[Appended]]]] = {}
            for msg, peer, answered in waiting:
                if not answered.done():
                    groups.setdefault((type(msg), peer), []).append((msg, answered))
            for (_, peer), group in groups.items():
                if len(group) > 1:
                    try:
                        appended = self._append([msg for msg, _ in group], False, peer, independent=True, count_errors=False)
                    except (ReadOnly, DiskFull) as exc:
                        for _ in group:
                            metrics.SEND_ERRORS.labels(type(exc).__name__).inc()
                        _answer_all(group, exc)
                        continue
                    except StoreError:
                        pass  # one by one, below: each message's own error
                    except Exception as exc:
                        _answer_all(group, exc)
                        continue
                    else:
                        offset_msg_id = appended.offset_msg_id
                        for row, (_, answered) in zip(appended.rows, group):
                            if not answered.done():
                                answered.set_result(Appended([row], offset_msg_id, row[1]))
                        continue
                for msg, answered in group:
                    try:
                        result = self._append((msg,), True, peer)
                    except Exception as exc:
                        _answer_all([(msg, answered)], exc)
                    else:
                        if not answered.done():
                            answered.set_result(result)
        finally:
            _answer_all([(msg, answered) for msg, _, answered in waiting], RuntimeError("the send path failed before this message was stored"))

    def _append(self, msgs: Sequence[MessageFields], same_topic: bool, peer: tuple[str, int] | None, independent: bool = False,
                count_errors: bool = True, parking: bool = True) -> Appended:
        """Store `msgs` (no fsync wait), count them, announce new topics and wake the readers."""
        state = self.store.state  # (the store's properties read it: one lookup less each)
        topics_before = len(state.topics)
        try:
            real_topics: list[str] = []
            if parking:
                msgs, real_topics = park(self.store, msgs, same_topic, peer)  # delay levels: parking.py
                same_topic = same_topic and not real_topics
            appended = self.store.append_many(msgs, same_topic=same_topic, wait_flush=False, peer=peer, independent=independent)
            for topic in real_topics:  # a parked message's topic exists from its send, as any message's
                if topic not in state.topics:
                    self.store.create_topic(topic, self.store.config.default_queues)
        except StoreError as exc:
            if count_errors:
                metrics.SEND_ERRORS.labels(type(exc).__name__).inc()
            raise
        if len(state.topics) != topics_before:
            self.on_topic_created()
        for listener in self.append_listeners:
            listener()
        rows = appended.rows
        if same_topic:
            self._count_sent(rows[0][2], len(rows), appended.bytes)
        else:  # (a turn's calls, parked messages, delivered copies: topics may differ)
            for row in rows:
                self._count_sent(row[2], 1, row[1])
        self._sent_bytes[0] += appended.bytes
        return appended

    def _count_sent(self, topic: str, n: int, size: int) -> None:
        """One store call's messages of a topic (RocketMQ's TOPIC_PUT_NUMS counts one call a send)."""
        counters = self._sent.get(topic)
        if counters is None:
            counters = (metrics.SENT_MESSAGES.labels(topic), self.stats.counts(TOPIC_PUT_NUMS, topic), self.stats.counts(TOPIC_PUT_SIZE, topic))
            if len(self._sent) < _TOPICS_CACHED:
                self._sent[topic] = counters
        sent, puts, put_bytes = counters
        sent[0] += n
        puts[0] += n
        puts[1] += 1
        put_bytes[0] += size
        put_bytes[1] += 1

    def _observe(self, rpc: str, t0: float) -> None:
        latency = self._latency.get(rpc)
        if latency is None:
            latency = self._latency[rpc] = metrics.SEND_LATENCY.labels(rpc)  # a few RPC names
        latency.observe(time.perf_counter() - t0)

    async def await_flushed(self, appended: Appended) -> None:
        """SYNC mode: return once the records are fsynced, or mark them not flushed at the timeout."""
        if self.store.config.flush_mode != "SYNC" or not appended.rows:
            return
        if not await await_flushed(self.store.flusher, self.flushed, appended.end, self.store.config.sync_flush_timeout_ms / 1000.0):
            appended.flushed = False


def _answer_all(callers: Sequence[tuple[MessageFields, "asyncio.Future[Appended]"]], exc: BaseException) -> None:
    """Fail every caller not answered yet with `exc`."""
    for _, answered in callers:
        if not answered.done():
            answered.set_exception(exc)
