"""The RocketMQ 4 door's sends: SEND_MESSAGE (V1, V2 and batch) and END_TRANSACTION, and the
transaction check's CHECK_TRANSACTION_STATE to a producer.

Sends go through the same path as quarry.v1 (sending.SendPath, message_mapping), so a message
is the same record whichever door it came in by; a single send joins its loop turn's append
(append_in_turn) when other requests of its connection are in flight.
"""
from __future__ import annotations

import asyncio
import random
from typing import Iterator

from quarry.formats.batch_body import batch_record_properties, decode_batch_body
from quarry.formats.properties import PRODUCER_GROUP, REAL_TOPIC
from quarry.formats.record import (
    SYSFLAG_TRANSACTION_COMMIT, SYSFLAG_TRANSACTION_MASK, SYSFLAG_TRANSACTION_NOT_TYPE, SYSFLAG_TRANSACTION_PREPARED,
    SYSFLAG_TRANSACTION_ROLLBACK, Record,
)
from quarry.services.commitlog.broker.client_table import ClientTable
from quarry.services.commitlog.broker.core import Broker
from quarry.services.commitlog.broker.message_mapping import from_client_message
from quarry.services.commitlog.broker.send_back import DLQ_QUEUES, dead_lettered, retried_send
from quarry.services.commitlog.broker.transaction_check import CheckRequest, as_sent
from quarry.services.commitlog.broker.transactions import AlreadyResolved, NotAHalf, Transactions, as_half
from quarry.services.commitlog.storage.errors import StoreError
from quarry.services.commitlog.storage.store import Appended, CommitLogStore
from quarry.services.remoting import codes
from quarry.services.remoting.acl import require
from quarry.services.remoting.command import JAVA_INT, RemotingCommand, to_ext_fields
from quarry.services.remoting.server import Connection, RemotingError
from quarry.services.remoting.status import remoting_error

# SendMessageRequestHeaderV2's one-letter names.
_V2_FIELDS = {"a": "producerGroup", "b": "topic", "c": "defaultTopic", "d": "defaultTopicQueueNums", "e": "queueId", "f": "sysFlag",
              "g": "bornTimestamp", "h": "flag", "i": "properties", "j": "reconsumeTimes", "k": "unitMode", "l": "consumeRetryTimes",
              "m": "batch", "n": "brokerName"}


class Sends:
    """The door's send handlers (a mixin of RemotingBroker, remoting.py, whose constructor sets
    the state below)."""

    broker: Broker
    store: CommitLogStore
    clients: ClientTable
    _opaques: Iterator[int]

    async def send(self, req: RemotingCommand, conn: Connection) -> RemotingCommand:
        if req.code != codes.SEND_MESSAGE:  # V2 and batch use the one-letter header names
            req.ext_fields = {_V2_FIELDS.get(k, k): v for k, v in req.ext_fields.items()}
        topic = req.text("topic")
        common = dict(
            queue_id=req.integer("queueId", lo=-1, hi=JAVA_INT[1]), born_timestamp=req.integer("bornTimestamp", lo=0),
            born_host=conn.peer, sys_flag=req.integer("sysFlag", 0, *JAVA_INT), reconsume_times=req.integer("reconsumeTimes", 0, 0, JAVA_INT[1]),
            max_message_size=self.store.config.max_message_size,
        )
        properties = req.text("properties", "")
        try:
            if req.code == codes.SEND_BATCH_MESSAGE or req.boolean("batch"):
                try:
                    items = decode_batch_body(req.body)
                except ValueError as exc:
                    raise RemotingError(codes.MESSAGE_ILLEGAL, str(exc)) from None
                if not items:
                    raise RemotingError(codes.MESSAGE_ILLEGAL, "batch body: holds no message")
                msgs = [from_client_message(topic, it.body, batch_record_properties(it.properties, properties), flag=it.flag, **common)  # type: ignore[arg-type]
                        for it in items]
                results = await self.broker.sending.append_flushed(msgs, "RemotingSendBatch")
            else:
                msg = from_client_message(topic, req.body, properties, flag=req.integer("flag", 0, *JAVA_INT), **common)  # type: ignore[arg-type]
                dead = retried_send(topic, msg.reconsume_times, self._max_reconsume_times(req))
                if dead is not None:  # a client's own retry past its last attempt: to the DLQ (send_back.py)
                    if self.store.create_topic(dead.topic, DLQ_QUEUES):
                        self.broker.sending.on_topic_created()
                    msg = dead_lettered(msg, dead)
                if msg.sys_flag & SYSFLAG_TRANSACTION_MASK == SYSFLAG_TRANSACTION_PREPARED:
                    # A transaction's half, hidden under the half topic until it ends; its topic is
                    # made (as a RocketMQ broker's send does) and its queue chosen now.
                    msg.queue_id = self.store.queue_for(topic, msg.queue_id)
                    if topic not in self.store.topics and self.store.create_topic(topic, self.store.config.default_queues):
                        self.broker.sending.on_topic_created()
                    msg = as_half(msg)
                    results = await self.broker.sending.append_flushed([msg], "RemotingSend")
                elif dead is not None:
                    results = await self.broker.sending.append_flushed([msg], "RemotingSend")
                else:
                    # One append for the sends of a loop turn (a client's threads share its connection).
                    results = await self.broker.sending.append_in_turn(msg, "RemotingSend", company=conn.in_flight > 1)
        except StoreError as exc:
            raise remoting_error(exc) from None
        return self._send_response(req, results, topic, common["queue_id"])  # type: ignore[arg-type]

    @staticmethod
    def _max_reconsume_times(req: RemotingCommand) -> int | None:
        """The header's maxReconsumeTimes (V2: field l), None when absent."""
        name = "maxReconsumeTimes" if "maxReconsumeTimes" in req.ext_fields else "consumeRetryTimes"
        return req.integer(name, lo=-1, hi=JAVA_INT[1]) if req.ext_fields.get(name) else None

    @staticmethod
    def _send_response(req: RemotingCommand, results: Appended, topic: str, queue_id: int) -> RemotingCommand:
        first = results[0]
        code = codes.SUCCESS if results.flushed else codes.FLUSH_DISK_TIMEOUT
        # A parked (delayed) message is answered with the queue it was sent to, as RocketMQ
        # answers it; its id and queue offset are the parked record's.
        return req.response(code, None, {
            "msgId": ",".join(r.offset_msg_id for r in results), "queueId": first.queue_id if first.topic == topic else queue_id,
            "queueOffset": first.queue_offset,
            "MSG_REGION": "DefaultRegion", "TRACE_ON": "true",
        })

    async def end_transaction(self, req: RemotingCommand, conn: Connection) -> RemotingCommand | None:
        """Commit or roll back a half message (services/commitlog/broker/transactions.py): publish
        permission on its real topic, the header must name it as the producer stored it, and a
        half is resolved once."""
        kind = req.integer("commitOrRollback", lo=0, hi=JAVA_INT[1])
        offset = req.integer("commitLogOffset", lo=0)
        if kind == SYSFLAG_TRANSACTION_NOT_TYPE:
            return req.response(codes.SUCCESS)
        if kind not in (SYSFLAG_TRANSACTION_COMMIT, SYSFLAG_TRANSACTION_ROLLBACK):
            raise RemotingError(codes.SYSTEM_ERROR, f"header field commitOrRollback: {kind} is not 8 (commit), 12 (rollback) or 0")
        transactions: Transactions = self.broker.transactions
        try:
            half = transactions.half_at(offset)
        except NotAHalf:
            raise RemotingError(codes.SYSTEM_ERROR, f"the message at commitLogOffset {offset} is not a prepared transaction message") from None
        require(req, "publish", [half.properties.get(REAL_TOPIC, "")])
        group = half.properties.get(PRODUCER_GROUP)
        if group is not None and group != req.text("producerGroup", ""):
            raise RemotingError(codes.SYSTEM_ERROR, f"header field producerGroup: {req.text('producerGroup', '')!r} is not the group that sent the half message ({group!r})")
        if req.integer("tranStateTableOffset", half.queue_offset) != half.queue_offset:
            raise RemotingError(codes.SYSTEM_ERROR, f"header field tranStateTableOffset: {req.text('tranStateTableOffset')} is not the half message's queue offset ({half.queue_offset})")
        try:
            await asyncio.to_thread(transactions.claim, half)  # (its first use reads the op records: off the loop)
        except AlreadyResolved as exc:
            raise RemotingError(codes.SYSTEM_ERROR, str(exc)) from None
        try:
            await self.broker.sending.append_flushed(Transactions.resolution(half, kind == SYSFLAG_TRANSACTION_COMMIT), "RemotingEndTransaction", same_topic=False)
        except BaseException as exc:
            transactions.release(half)  # not stored: it may be ended again
            if isinstance(exc, StoreError):
                raise remoting_error(exc) from None
            raise
        return req.response(codes.SUCCESS)

    def ask_producer(self, half: Record, check: CheckRequest) -> bool:
        """The transaction check's asker (transaction_check.py), as RocketMQ's Broker2Client:
        CHECK_TRANSACTION_STATE one-way to a live client whose heartbeat named the half's
        producer group, with the half as its producer sent it (real topic and queue) as the body.
        With ACL on, only to a client whose account may publish to that topic: a check hands
        out nothing its receiver could not have sent."""
        real_topic = check.real_topic
        producers = [conn for _, conn, account in self.clients.producers(check.group)
                     if isinstance(conn, Connection) and not conn.writer.is_closing() and (account is None or account.allows("publish", [real_topic]))]  # type: ignore[attr-defined]
        if not producers or not real_topic:
            return False
        fields = {"tranStateTableOffset": check.tran_state_table_offset, "commitLogOffset": check.commit_log_offset,
                  "msgId": check.msg_id or None, "transactionId": check.transaction_id or None, "offsetMsgId": check.offset_msg_id}
        request = RemotingCommand(codes.CHECK_TRANSACTION_STATE, next(self._opaques), codes.FLAG_ONEWAY, None, to_ext_fields(fields),
                                  as_sent(half), language="JAVA")
        random.choice(producers).send(request)
        return True
