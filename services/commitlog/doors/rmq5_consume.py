"""The SimpleConsumer RPCs at a commitlog: ReceiveMessage, AckMessage, ChangeInvisibleDuration,
ForwardMessageToDeadLetterQueue. They validate the request, call the store's pop rules
(services/commitlog/broker/pop.py) and make every change durable (the consumer-group journal is
fsynced) before answering; this module only translates.

Received messages carry what the SDKs read: an MD5 body digest in upper-case hex, as RocketMQ's
proxy sends (the SDKs flag a mismatch as corrupted; their CRC32 forms disagree: hex in Python and
Java, decimal in Node.js), IDENTITY encoding (a body stored compressed is inflated: formats/body.py), the receipt handle of this
delivery, the delivery attempt, the invisible duration and the system properties.
"""
from __future__ import annotations

import asyncio
import hashlib
import logging
import threading
import time
from typing import Any, AsyncIterator

from google.protobuf import duration_pb2, timestamp_pb2

from quarry.formats import tag_expression
from quarry.formats.body import readable_body
from quarry.formats.properties import BORN_HOST, DELAY, REAL_QID, REAL_TOPIC, SHARDING_KEY, SYSTEM_PROPERTY_NAMES, TIMER_DELIVER_MS, UNIQ_KEY
from quarry.formats.record import SYSFLAG_TRANSACTION_COMMIT, Record, transaction_type
from quarry.formats.topic import dlq_topic
from quarry.services.commitlog.broker import pop
from quarry.services.commitlog.broker.core import Broker
from quarry.services.commitlog.broker.flush_signal import FlushSignal
from quarry.services.commitlog.storage.flushing import CONSUMER_FLUSH_GAP_S
from quarry.services.commitlog.storage.message_input import Host, NewMessage, Property
from quarry.services.log import log_event
from quarry.services.progress import Progress
from quarry.services.rmq5.contract import Code, service, v2
from quarry.services.rmq5.status import check_group, check_topic, RmqError

log = logging.getLogger("quarry.rmq5.consume")

MAX_BATCH = 32  # RocketMQ proxy's receive batch limit
MIN_INVISIBLE_MS = 1_000  # RocketMQ's proxy asks 10 s; Quarry allows 1 s (tests, short jobs)
MAX_INVISIBLE_MS = 12 * 3_600_000
DEFAULT_INVISIBLE_MS = 30_000
MAX_POLLING_MS = 30_000
POLL_STEP_S = 0.25
REVIVE_EVERY_S = 1.0  # how often exhausted messages of idle groups are dead-lettered  # how often a long poll looks again for messages that came due by time


def ms_of(d: duration_pb2.Duration) -> int:
    return d.seconds * 1000 + d.nanos // 1_000_000


def _ts(ms: int) -> timestamp_pb2.Timestamp:
    return timestamp_pb2.Timestamp(seconds=ms // 1000, nanos=(ms % 1000) * 1_000_000)


def filter_of(expr: v2.FilterExpression) -> tuple[str, tag_expression.TagFilter]:
    if expr.type == v2.FilterType.SQL:
        raise RmqError(Code.ILLEGAL_FILTER_EXPRESSION, "filter_expression.type: SQL92 filters are not supported by Quarry; use a TAG expression (TagA || TagB, or *)")
    try:
        return expr.expression or "*", tag_expression.parse(expr.expression, "filter_expression.expression")
    except tag_expression.TagExpressionError as exc:
        raise RmqError(Code.ILLEGAL_FILTER_EXPRESSION, str(exc)) from None


def invisible_ms(d: duration_pb2.Duration, present: bool, field: str = "invisible_duration") -> int:
    if not present:
        return DEFAULT_INVISIBLE_MS
    ms = ms_of(d)
    if not MIN_INVISIBLE_MS <= ms <= MAX_INVISIBLE_MS:
        raise RmqError(Code.ILLEGAL_INVISIBLE_TIME, f"{field}: must be between {MIN_INVISIBLE_MS // 1000} s and {MAX_INVISIBLE_MS // 3_600_000} h, got {ms} ms")
    return ms


def handle_of(text: str, field: str = "receipt_handle") -> pop.Handle:
    try:
        return pop.Handle.parse(text)
    except ValueError as exc:
        raise RmqError(Code.INVALID_RECEIPT_HANDLE, f"{field}: {exc}") from None


def message_type(record: Record) -> int:
    if transaction_type(record.sys_flag) == SYSFLAG_TRANSACTION_COMMIT:
        return v2.MessageType.TRANSACTION
    if pop.message_group(record):
        return v2.MessageType.FIFO
    if pop.due_time(record):
        return v2.MessageType.DELAY
    return v2.MessageType.NORMAL


def to_sdk_message(record: Record, delivered: pop.Pending, invisible: int, store_host: str) -> v2.Message:
    props = record.properties
    body = readable_body(record.body, record.sys_flag)  # IDENTITY: what the producer sent
    sp = v2.SystemProperties(
        message_id=props.get(UNIQ_KEY) or record.offset_msg_id,
        body_digest=v2.Digest(type=v2.DigestType.MD5, checksum=hashlib.md5(body).hexdigest().upper()),
        body_encoding=v2.Encoding.IDENTITY, message_type=message_type(record),
        born_timestamp=_ts(record.born_timestamp), born_host=props.get(BORN_HOST) or record.born_host[0],
        store_timestamp=_ts(record.store_timestamp), store_host=store_host,
        receipt_handle=pop.Handle(record.queue_id, record.queue_offset, delivered.nonce).text(),
        queue_id=record.queue_id, queue_offset=record.queue_offset,
        invisible_duration=duration_pb2.Duration(seconds=invisible // 1000, nanos=(invisible % 1000) * 1_000_000),
        delivery_attempt=delivered.attempt)
    if record.tags:
        sp.tag = record.tags
    sp.keys.extend(record.keys)
    if delivered.msg_group:
        sp.message_group = delivered.msg_group
    due = pop.due_time(record)
    if due:
        sp.delivery_timestamp.CopyFrom(_ts(due))
    m = v2.Message(topic=v2.Resource(name=record.topic), system_properties=sp, body=body)
    for name, value in record.properties.items():
        if name not in SYSTEM_PROPERTY_NAMES and name != SHARDING_KEY:  # (the message group is sp.message_group)
            m.user_properties[name] = value
    return m


# What a dead-letter copy does not take from its record: the fields of their own, and what
# would make it a delayed message again (a delivery time, a level and its real topic).
_NOT_KEPT_IN_DLQ = ("KEYS", "TAGS", UNIQ_KEY, TIMER_DELIVER_MS, DELAY, REAL_TOPIC, REAL_QID)


def dead_letter_copy(record: Record, group: str, attempts: int) -> NewMessage:
    """The group's dead-letter record of `record`: same body, keys, tag and UNIQ_KEY (found by
    the SDK's message id under %DLQ%<group>), with where it came from."""
    keep = [(n, v) for n, v in record.properties_pairs if n not in _NOT_KEPT_IN_DLQ]
    keep += [("DLQ_ORIGIN_TOPIC", record.topic), ("DLQ_ORIGIN_MESSAGE_ID", record.unique_key or record.offset_msg_id),
             ("ORIGIN_MESSAGE_ID", record.offset_msg_id), ("RECONSUME_TIME", str(attempts))]
    return NewMessage(dlq_topic(group), readable_body(record.body, record.sys_flag), record.keys, record.tags or "", record.unique_key or "", [Property(*p) for p in keep],
                      record.flag, 0, record.born_timestamp, Host(*record.born_host), 0, attempts)


class Consumption:
    """The four RPCs over one broker's store; `core` is the broker (store, send path, flush
    signal). Runs on the commitlog's event loop; fsyncs run on worker threads."""

    def __init__(self, core: Broker, max_attempts: int) -> None:
        self.core = core
        self.store = core.store
        self.groups = core.store.consumer_groups
        self.max_attempts = max_attempts
        self._reviver: asyncio.Future[None] | None = None  # started on the loop at the first receive
        # Rounds that found exhausted messages against rounds that dead-lettered them all: one
        # that fails leaves the loop behind until a later round succeeds (it is found again after
        # its hold), and a stop in between says so. Rounds run on worker threads: counted under a lock.
        self.dead_lettering = Progress("dead-lettering", unit="rounds")
        self._rounds = 0
        self._rounds_lock = threading.Lock()

    def _store_host(self) -> str:
        host = self.store.config.store_host
        return f"{host[0]}:{host[1]}"

    async def _sync(self) -> None:
        await asyncio.to_thread(self.groups.sync)

    def _queues(self, topic: str, first: int) -> list[int]:
        n = self.store.topics.get(topic)
        if n is None and self.store.config.auto_create_topics:
            return []  # the route offered this broker because it creates the topic on first send
        if n is None:
            raise RmqError(Code.TOPIC_NOT_FOUND, f"message_queue.topic.name: this broker holds no topic {topic}")
        first = first if 0 <= first < n else 0
        return [(first + i) % n for i in range(n)]

    async def receive(self, request: service.ReceiveMessageRequest, context: Any) -> AsyncIterator[service.ReceiveMessageResponse]:
        group = check_group(request.group)
        topic = check_topic(request.message_queue.topic, "message_queue.topic.name")
        if self.store.read_only:
            raise RmqError(Code.FORBIDDEN, "broker: this store is read-only (it answers queries, not consumers)")
        expression, filt = filter_of(request.filter_expression)
        batch = request.batch_size
        if not 1 <= batch <= MAX_BATCH:
            raise RmqError(Code.BAD_REQUEST, f"batch_size: must be between 1 and {MAX_BATCH}, got {batch}")
        invisible = invisible_ms(request.invisible_duration, request.HasField("invisible_duration"))
        polling = ms_of(request.long_polling_timeout) if request.HasField("long_polling_timeout") else 0
        if not 0 <= polling <= MAX_POLLING_MS:
            raise RmqError(Code.ILLEGAL_POLLING_TIME, f"long_polling_timeout: must be between 0 and {MAX_POLLING_MS // 1000} s, got {polling} ms")
        remaining = context.time_remaining() if hasattr(context, "time_remaining") else None
        if remaining is not None:  # answer before the client's own deadline
            polling = max(0, min(polling, int((remaining - 1.0) * 1000)))
        self._queues(topic, request.message_queue.id)  # refuses a topic this broker will never hold
        self.groups.subscribe(group, topic, expression)
        deadline = time.monotonic() + polling / 1000
        appended = self.core.sending.appended_signal()
        if self._reviver is None:
            self._reviver = asyncio.ensure_future(self._revive_forever())
        while True:
            wake = (self.core.flushed.current(), appended.current())
            queues = self._queues(topic, request.message_queue.id)
            got = await asyncio.to_thread(self._pop, group, topic, queues, filt, batch, invisible) if queues else []
            if got or time.monotonic() >= deadline or self.core.stopping.is_set():
                break
            if self.store.write_offset > self.store.committed_offset:
                self.store.request_flush(CONSUMER_FLUSH_GAP_S)  # ASYNC: a waiting consumer should not wait a flush interval
            await FlushSignal.wait_first(wake, min(POLL_STEP_S, max(0.0, deadline - time.monotonic())))
        if not got:
            yield service.ReceiveMessageResponse(status=v2.Status(code=Code.MESSAGE_NOT_FOUND, message="no new message"))
            return
        yield service.ReceiveMessageResponse(status=v2.Status(code=Code.OK, message="OK"))
        yield service.ReceiveMessageResponse(delivery_timestamp=_ts(int(time.time() * 1000)))
        host = self._store_host()
        for d in got:
            yield service.ReceiveMessageResponse(message=to_sdk_message(d.record, d.pending, invisible, host))

    def _pop(self, group: str, topic: str, queues: list[int], filt: tag_expression.TagFilter, batch: int, invisible: int) -> list[pop.Delivery]:
        """One look over the queues (worker thread): deliveries made durable, dead letters forwarded."""
        out: list[pop.Delivery] = []
        dead: list[tuple[int, Record, pop.Pending]] = []
        now = int(time.time() * 1000)
        for qid in queues:
            if len(out) >= batch:
                break
            r = pop.pop_queue(self.store, self.groups, group, topic, qid, filt, batch - len(out), invisible, self.max_attempts, now)
            out.extend(r.deliveries)
            dead.extend((qid, rec, p) for rec, p in r.to_dead_letter)
        self.groups.sync()
        if dead:
            round_ = self._round_begins()
            for qid, rec, p in dead:
                self._dead_letter(group, topic, qid, rec, p.attempt)
            self._round_done(round_)
        if out or dead:
            self._commit_offsets(group, topic, {q for q, _, _ in dead} | {d.record.queue_id for d in out})
        return out

    async def _revive_forever(self) -> None:
        """Every second: dead-letter exhausted messages of groups no consumer polls right now."""
        failing = ""
        while not self.core.stopping.is_set():
            await asyncio.sleep(REVIVE_EVERY_S)
            try:
                await asyncio.to_thread(self._revive_once)
            except Exception as exc:  # said once, tried again each round
                why = f"{type(exc).__name__}: {exc}"
                if why != failing:
                    log_event(log, "dead-lettering of exhausted messages failed; retried each round", logging.ERROR, error=why)
                failing = why
                self.dead_lettering.block(why)
            else:
                if failing:
                    log_event(log, "dead-lettering works again")
                failing = ""
                self.dead_lettering.block("")

    def _round_begins(self) -> int:
        with self._rounds_lock:
            self._rounds += 1
            self.dead_lettering.input(self._rounds)
            return self._rounds

    def _round_done(self, round_: int) -> None:
        with self._rounds_lock:
            self.dead_lettering.advanced(max(self.dead_lettering.position, round_))

    def _revive_once(self) -> None:
        now = int(time.time() * 1000)
        for group, topic, gt in self.groups.all():
            for qid in list(gt.queues):
                exhausted = pop.take_exhausted(self.store, self.groups, group, topic, qid, self.max_attempts, now)
                if not exhausted:
                    continue
                self.groups.sync()
                round_ = self._round_begins()
                for record, p in exhausted:
                    self._dead_letter(group, topic, qid, record, p.attempt)
                self._round_done(round_)
                self._commit_offsets(group, topic, {qid})

    def _dead_letter(self, group: str, topic: str, queue_id: int, record: Record, attempts: int) -> None:
        """Append the DLQ copy (durably), then mark the message dead-lettered (worker thread)."""
        dlq = dlq_topic(group)
        if self.store.create_topic(dlq, 1):
            self.core.sending.on_topic_created()  # the router learns the topic (a thread-safe heartbeat)
        self.store.append_many([dead_letter_copy(record, group, attempts)], same_topic=True, wait_flush=False)
        self.store.flush()
        pop.mark_dead(self.groups, group, topic, queue_id, record.queue_offset, int(time.time() * 1000))
        self.groups.sync()
        log_event(log, "dead-lettered", group=group, topic=topic, queue=queue_id, offset=record.queue_offset, attempts=attempts, dlq=dlq)

    def _commit_offsets(self, group: str, topic: str, queues: set[int]) -> None:
        """The group's consumer offsets (shared with the remoting path): all below is done."""
        for qid in queues:
            self.store.consumer_offsets.commit(group, topic, qid, pop.committed(self.groups, group, topic, qid))

    async def ack(self, request: service.AckMessageRequest) -> service.AckMessageResponse:
        group = check_group(request.group)
        topic = check_topic(request.topic)
        if not request.entries:
            raise RmqError(Code.BAD_REQUEST, "entries: must not be empty")
        now = int(time.time() * 1000)
        response = service.AckMessageResponse()
        touched: set[int] = set()
        failed = 0
        for i, e in enumerate(request.entries):
            entry = service.AckMessageResultEntry(message_id=e.message_id, receipt_handle=e.receipt_handle)
            try:
                h = handle_of(e.receipt_handle, f"entries[{i}].receipt_handle")
                pop.ack(self.groups, group, topic, h, now)
                touched.add(h.queue_id)
                entry.status.CopyFrom(v2.Status(code=Code.OK, message="OK"))
            except RmqError as exc:
                failed += 1
                entry.status.CopyFrom(v2.Status(code=exc.code, message=exc.message))
            except pop.HandleError as exc:
                failed += 1
                entry.status.CopyFrom(v2.Status(code=Code.INVALID_RECEIPT_HANDLE, message=f"entries[{i}].receipt_handle: {exc}"))
            response.entries.append(entry)
        await self._sync()  # the ack is durable before the client hears OK
        self._commit_offsets(group, topic, touched)
        if failed == 0:
            response.status.CopyFrom(v2.Status(code=Code.OK, message="OK"))
        elif failed == len(request.entries):
            response.status.CopyFrom(response.entries[0].status)
        else:
            response.status.CopyFrom(v2.Status(code=Code.MULTIPLE_RESULTS, message=f"{failed} of {len(request.entries)} entries failed"))
        return response

    async def change_invisible(self, request: service.ChangeInvisibleDurationRequest) -> service.ChangeInvisibleDurationResponse:
        group = check_group(request.group)
        topic = check_topic(request.topic)
        ms = invisible_ms(request.invisible_duration, True)
        h = handle_of(request.receipt_handle)
        try:
            new = pop.change_invisible(self.groups, group, topic, h, ms, int(time.time() * 1000))
        except pop.HandleError as exc:
            raise RmqError(Code.INVALID_RECEIPT_HANDLE, f"receipt_handle: {exc}") from None
        await self._sync()
        return service.ChangeInvisibleDurationResponse(status=v2.Status(code=Code.OK, message="OK"), receipt_handle=new.text())

    async def forward_to_dlq(self, request: service.ForwardMessageToDeadLetterQueueRequest) -> service.ForwardMessageToDeadLetterQueueResponse:
        group = check_group(request.group)
        topic = check_topic(request.topic)
        h = handle_of(request.receipt_handle)
        try:
            held = pop.take_for_dead_letter(self.groups, group, topic, h, int(time.time() * 1000))
        except pop.HandleError as exc:
            raise RmqError(Code.INVALID_RECEIPT_HANDLE, f"receipt_handle: {exc}") from None
        record = pop._read(self.store, topic, h.queue_id, h.offset)
        if record is None:
            raise RmqError(Code.MESSAGE_NOT_FOUND, f"receipt_handle: queue {h.queue_id} offset {h.offset} of {topic} is no longer stored")
        await asyncio.to_thread(self._dead_letter, group, topic, h.queue_id, record, held.attempt)
        self._commit_offsets(group, topic, {h.queue_id})
        return service.ForwardMessageToDeadLetterQueueResponse(status=v2.Status(code=Code.OK, message="OK"))
