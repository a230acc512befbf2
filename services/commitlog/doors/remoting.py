"""The broker role of RocketMQ 4's remoting protocol, over one commitlog's store.

Translation only: request headers become store calls and the answers become response
headers and bodies. Records go out as the bytes stored (what MessageDecoder decodes); sends go
through the same path as quarry.v1 (sending.SendPath.append_flushed, message_mapping), so a
message is the same record whichever door it came in by. Key queries ask this broker's
indexer, as the gRPC queries do, and hand back the stored records it points at.
"""
from __future__ import annotations

import asyncio
import itertools
import json
import logging
import random
import time
from typing import Any

import grpc

from quarry.channels import open_aio_channel
from quarry.formats import tag_expression
from quarry.formats.index_keys import answers_key
from quarry.formats.java_hash import tags_code
from quarry.formats.properties import PRODUCER_GROUP, REAL_TOPIC
from quarry.formats.topic import TopicError, retry_topic, validate_group
from quarry.formats.batch_body import batch_record_properties, decode_batch_body
from quarry.formats.record import (
    SYSFLAG_TRANSACTION_COMMIT, SYSFLAG_TRANSACTION_MASK, SYSFLAG_TRANSACTION_NOT_TYPE, SYSFLAG_TRANSACTION_PREPARED,
    SYSFLAG_TRANSACTION_ROLLBACK, Record,
)
from quarry.services.commitlog import metrics
from quarry.services.commitlog.broker.broker_settings import BrokerSettings
from quarry.services.commitlog.broker.broker_stats import GROUP_GET_NUMS, GROUP_GET_SIZE, TOPIC_PUT_NUMS, TOPIC_PUT_SIZE, group_key
from quarry.services.commitlog.broker.client_table import ClientTable
from quarry.services.commitlog.broker.core import Broker
from quarry.services.commitlog.storage.errors import StoreError
from quarry.services.commitlog.broker.message_mapping import from_client_message
from quarry.services.commitlog.broker.pull_rates import PullRates
from quarry.services.commitlog.broker.queue_locks import QueueLocks
from quarry.services.commitlog.broker.send_back import DLQ_QUEUES, copy_for, dead_lettered, destination, retried_send
from quarry.services.commitlog.storage.browse import search_offset_by_time
from quarry.services.commitlog.broker.runtime_info import RuntimeInfo, quarry_version
from quarry.services.commitlog.storage.store import Appended
from quarry.services.commitlog.broker.subscription_groups import group_configs, known_groups
from quarry.services.commitlog.broker.transactions import AlreadyResolved, NotAHalf, Transactions, as_half
from quarry.services.commitlog.broker.transaction_check import CheckRequest, as_sent
from quarry.services.remoting import bodies, codes
from quarry.services.remoting.acl import require, require_group_of
from quarry.services.remoting.command import RemotingCommand, to_ext_fields
from quarry.services.remoting.server import Connection, Handler, RemotingError
from quarry.services.remoting.status import remoting_error
from quarry.v1 import indexer_pb2, indexer_pb2_grpc

log = logging.getLogger("quarry.commitlog.remoting")

MAX_PULL_MSGS = 1024
MAX_SUSPEND_MS = 30_000  # longest a pull is held waiting for new messages
UNIQUE_KEY_QUERY_MAX_NUM = 32  # RocketMQ's defaultQueryMaxNum, used for unique-key queries
# The names RocketMQ 4.9's TopicValidator calls system topics: its broker answers them whether
# they exist or not, and tools (rocketmq-dashboard's topic list) use them to tell topics apart.
ROCKETMQ_SYSTEM_TOPICS = ("TBW102", "SCHEDULE_TOPIC_XXXX", "BenchmarkTest", "RMQ_SYS_TRANS_HALF_TOPIC", "RMQ_SYS_TRACE_TOPIC",
                          "RMQ_SYS_TRANS_OP_HALF_TOPIC", "TRANS_CHECK_MAX_TIME_TOPIC", "SELF_TEST_TOPIC", "OFFSET_MOVED_EVENT")

# SendMessageRequestHeaderV2's one-letter names.
_V2_FIELDS = {"a": "producerGroup", "b": "topic", "c": "defaultTopic", "d": "defaultTopicQueueNums", "e": "queueId", "f": "sysFlag",
              "g": "bornTimestamp", "h": "flag", "i": "properties", "j": "reconsumeTimes", "k": "unitMode", "l": "consumeRetryTimes",
              "m": "batch", "n": "brokerName"}
_I32 = (-(1 << 31), (1 << 31) - 1)


class RemotingBroker:
    """Request handlers of one broker; `handlers()` is what the RemotingServer serves."""

    def __init__(self, broker: Broker, indexer_addr: str = "", retry_queues: int = 1, settings: BrokerSettings | None = None) -> None:
        self.broker = broker
        self.store = broker.store
        self.offsets = broker.store.consumer_offsets
        self.appended = broker.sending.appended_signal()  # long-polling pulls wait on it
        self.stopping = broker.stopping
        self.clients = ClientTable()
        self.locks = QueueLocks()  # orderly consumers' queue locks (LOCK_BATCH_MQ)
        self.retry_queues = retry_queues
        self._indexer_addr = indexer_addr
        self._indexer: indexer_pb2_grpc.IndexerServiceStub | None = None
        self._indexer_channel: grpc.aio.Channel | None = None
        self._opaques = itertools.count(1)  # requests this broker sends clients
        self._pulled = metrics.PULLED_MESSAGES.labels()
        self.pull_rates = PullRates()  # per group and topic: GET_CONSUME_STATS' consumeTps
        self.stats = broker.sending.stats  # VIEW_BROKER_STATS_DATA's counters (broker_stats.py): puts counted by the send path
        self.settings = settings or BrokerSettings()  # GET_BROKER_CONFIG's (broker_settings.py)
        self._pulls_found, self._pulls_missed = [0], [0]  # pull requests that handed messages, and those that did not
        self.runtime = RuntimeInfo(self.store, metrics.SENT_MESSAGES.total, metrics.PULLED_MESSAGES.total, quarry_version(),
                                   found_total=lambda: self._pulls_found[0], missed_total=lambda: self._pulls_missed[0])

    def handlers(self) -> dict[int, Handler]:
        return {
            codes.SEND_MESSAGE: self.send, codes.SEND_MESSAGE_V2: self.send, codes.SEND_BATCH_MESSAGE: self.send,
            codes.PULL_MESSAGE: self.pull, codes.QUERY_MESSAGE: self.query_message, codes.VIEW_MESSAGE_BY_ID: self.view_message,
            codes.QUERY_CONSUMER_OFFSET: self.query_consumer_offset, codes.UPDATE_CONSUMER_OFFSET: self.update_consumer_offset,
            codes.GET_MAX_OFFSET: self.max_offset, codes.GET_MIN_OFFSET: self.min_offset,
            codes.SEARCH_OFFSET_BY_TIMESTAMP: self.search_offset, codes.HEART_BEAT: self.heartbeat,
            codes.UNREGISTER_CLIENT: self.unregister_client, codes.GET_CONSUMER_LIST_BY_GROUP: self.consumer_list,
            codes.END_TRANSACTION: self.end_transaction, codes.UPDATE_AND_CREATE_TOPIC: self.create_topic,
            codes.QUERY_TOPIC_CONSUME_BY_WHO: self.topic_consumed_by, codes.GET_BROKER_RUNTIME_INFO: self.runtime_info,
            codes.GET_TOPIC_STATS_INFO: self.topic_stats, codes.GET_PRODUCER_CONNECTION_LIST: self.producer_connections,
            codes.GET_CONSUME_STATS: self.consume_stats, codes.GET_CONSUMER_CONNECTION_LIST: self.consumer_connections,
            codes.CONSUMER_SEND_MSG_BACK: self.send_back, codes.LOCK_BATCH_MQ: self.lock_queues, codes.UNLOCK_BATCH_MQ: self.unlock_queues,
            codes.CHECK_CLIENT_CONFIG: self.check_client_config,
            codes.GET_TOPIC_CONFIG: self.topic_config, codes.GET_ALL_SUBSCRIPTIONGROUP_CONFIG: self.subscription_groups,
            codes.GET_BROKER_CONFIG: self.broker_config, codes.VIEW_BROKER_STATS_DATA: self.stats_data,
            codes.GET_SYSTEM_TOPIC_LIST_FROM_BROKER: self.system_topics,
        }

    async def close(self) -> None:
        if self._indexer_channel is not None:
            await self._indexer_channel.close()

    # -- sends ------------------------------------------------------------------------------
    async def send(self, req: RemotingCommand, conn: Connection) -> RemotingCommand:
        if req.code != codes.SEND_MESSAGE:  # V2 and batch use the one-letter header names
            req.ext_fields = {_V2_FIELDS.get(k, k): v for k, v in req.ext_fields.items()}
        topic = req.text("topic")
        common = dict(
            queue_id=req.integer("queueId", lo=-1, hi=_I32[1]), born_timestamp=req.integer("bornTimestamp", lo=0),
            born_host=conn.peer, sys_flag=req.integer("sysFlag", 0, *_I32), reconsume_times=req.integer("reconsumeTimes", 0, 0, _I32[1]),
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
                msg = from_client_message(topic, req.body, properties, flag=req.integer("flag", 0, *_I32), **common)  # type: ignore[arg-type]
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
        except StoreError as exc:
            raise remoting_error(exc) from None
        return self._send_response(req, results, topic, common["queue_id"])  # type: ignore[arg-type]

    @staticmethod
    def _max_reconsume_times(req: RemotingCommand) -> int | None:
        """The header's maxReconsumeTimes (V2: field l), None when absent."""
        name = "maxReconsumeTimes" if "maxReconsumeTimes" in req.ext_fields else "consumeRetryTimes"
        return req.integer(name, lo=-1, hi=_I32[1]) if req.ext_fields.get(name) else None

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
        kind = req.integer("commitOrRollback", lo=0, hi=_I32[1])
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

    # -- reads --------------------------------------------------------------------------------
    def _record_bytes(self, physical_offset: int) -> bytes:
        return self.store.read_bytes(physical_offset)[1]

    async def view_message(self, req: RemotingCommand, conn: Connection) -> RemotingCommand:
        offset = req.integer("offset")
        try:
            return req.response(codes.SUCCESS, body=self._record_bytes(offset))
        except StoreError as exc:
            raise RemotingError(codes.SYSTEM_ERROR, f"can not find message by the offset, {offset}: {exc}") from None

    async def query_message(self, req: RemotingCommand, conn: Connection) -> RemotingCommand:
        """QUERY_MESSAGE: the records the indexer's entries for topic/key (a unique key with the
        flag) point at, read from this store. The indexer answers positions only (offsets_only:
        no second read of each record in its process); the exact-match rule and each record's
        own store time are applied here, so a hash collision is never handed out."""
        unique = req.ext_fields.get(codes.UNIQUE_KEY_QUERY_FLAG) == "true"
        topic, key = req.text("topic"), req.text("key")
        request = indexer_pb2.QueryMessageRequest(
            topic=topic, key=key, max_num=UNIQUE_KEY_QUERY_MAX_NUM if unique else req.integer("maxNum", lo=0, hi=_I32[1]),
            begin_timestamp=max(0, req.integer("beginTimestamp")), end_timestamp=req.integer("endTimestamp"),
            unique_key_flag=unique, offsets_only=True,
        )
        if not self._indexer_addr:
            raise RemotingError(codes.SYSTEM_ERROR, "this broker has no indexer configured (--indexer-addr): key queries cannot be answered")
        begin, end = request.begin_timestamp, request.end_timestamp or int(time.time() * 1000)
        try:
            answer = await self._indexer_stub().QueryMessage(request, timeout=10.0)
        except grpc.RpcError as exc:
            raise RemotingError(codes.SYSTEM_ERROR, f"indexer {self._indexer_addr}: {exc.code().name}: {exc.details()}") from None  # type: ignore[attr-defined]
        fields = {"indexLastUpdateTimestamp": answer.index_last_update_timestamp, "indexLastUpdatePhyoffset": answer.index_last_update_phy_offset}
        body = []
        for offset in answer.physical_offsets:  # newest entry first
            try:
                record, stored = self.store.read_bytes(offset)
            except StoreError:
                continue  # expired (or damaged) between the index read and now
            # The index holds whole seconds and answers by hash: the record itself decides.
            if begin <= record.store_timestamp <= end and answers_key(
                    record.topic, record.properties.get(REAL_TOPIC), record.keys, record.unique_key, topic, key, unique):
                body.append(stored)
        if not body:
            return req.response(codes.QUERY_NOT_FOUND, "can not find message, maybe time range not correct", fields)
        return req.response(codes.SUCCESS, None, fields, b"".join(body))

    def _indexer_stub(self) -> indexer_pb2_grpc.IndexerServiceStub:
        """The indexer's stub on an asyncio channel, opened in this loop at the first query."""
        if self._indexer is None:
            self._indexer_channel = open_aio_channel(self._indexer_addr)
            self._indexer = indexer_pb2_grpc.IndexerServiceStub(self._indexer_channel)
        return self._indexer

    # -- pull and offsets -------------------------------------------------------------------
    def _queue_bounds(self, topic: str, queue_id: int) -> tuple[int, int]:
        cq = self.store.cqs.existing(topic, queue_id)
        return (cq.min_offset, cq.max_offset) if cq is not None else (0, 0)

    def _check_queue(self, topic: str, queue_id: int, conn: Connection) -> None:
        queues = self.store.topics.get(topic)
        if queues is None:
            raise RemotingError(codes.TOPIC_NOT_EXIST, f"topic[{topic}] not exist, apply first please!")
        if not 0 <= queue_id < queues:
            raise RemotingError(codes.SYSTEM_ERROR, f"queueId[{queue_id}] is illegal, topic:[{topic}] readQueueNums:[{queues}] consumer:[{conn.peer[0]}]")

    def _filter(self, req: RemotingCommand, group: str, topic: str, sys_flag: int) -> tag_expression.TagFilter:
        if sys_flag & codes.PULL_SUBSCRIPTION:
            expression, kind = req.text("subscription", "*"), req.text("expressionType", "TAG")
        else:
            expression, kind = self.clients.subscriptions.get((group, topic), ("*", "TAG"))
        if kind.upper() != "TAG":  # (SQL92: a RocketMQ broker without enablePropertyFilter answers so)
            raise RemotingError(codes.SYSTEM_ERROR, f"The broker does not support consumer to filter message by {kind}")
        try:
            return tag_expression.parse(expression, "subscription")
        except tag_expression.TagExpressionError as exc:
            raise RemotingError(codes.SUBSCRIPTION_PARSE_FAILED, str(exc)) from None

    async def pull(self, req: RemotingCommand, conn: Connection) -> RemotingCommand:
        """PULL_MESSAGE, counted as found or missed (RocketMQ's getFoundTps / getMissTps)."""
        response = await self._pull(req, conn)
        (self._pulls_found if response.code == codes.SUCCESS else self._pulls_missed)[0] += 1
        return response

    async def _pull(self, req: RemotingCommand, conn: Connection) -> RemotingCommand:
        group, topic = req.text("consumerGroup"), req.text("topic")
        queue_id = req.integer("queueId", lo=0, hi=_I32[1])
        offset = req.integer("queueOffset", lo=0)
        max_msgs = req.integer("maxMsgNums", lo=1, hi=_I32[1])
        sys_flag = req.integer("sysFlag", 0, *_I32)
        self._check_queue(topic, queue_id, conn)
        tag_filter = self._filter(req, group, topic, sys_flag)
        if sys_flag & codes.PULL_COMMIT_OFFSET:
            commit = req.integer("commitOffset", -1)
            if commit >= 0:
                self.offsets.commit(group, topic, queue_id, commit)
        wait_ms = min(req.integer("suspendTimeoutMillis", 0, 0), MAX_SUSPEND_MS) if sys_flag & codes.PULL_SUSPEND else 0
        deadline = time.monotonic() + wait_ms / 1000.0
        while True:
            event = self.appended.current()
            try:
                records, next_offset, lo, hi = self.store.pull(topic, queue_id, offset, min(max_msgs, MAX_PULL_MSGS))
            except StoreError as exc:
                raise remoting_error(exc) from None
            left = deadline - time.monotonic()
            if records or offset != hi or left <= 0 or self.stopping.is_set():
                break
            await self.appended.wait(event, left)  # long polling: woken by the next append
        fields = {"suggestWhichBrokerId": 0, "nextBeginOffset": next_offset, "minOffset": lo, "maxOffset": hi}
        if offset < lo or offset > hi:
            return req.response(codes.PULL_OFFSET_MOVED, f"offset {offset} is outside {lo}..{hi}", fields)
        if not records:
            if next_offset > offset:  # units read, none readable
                return req.response(codes.PULL_RETRY_IMMEDIATELY, "no readable message in the units read", fields)
            return req.response(codes.PULL_NOT_FOUND, "no new message", fields)
        matching = [r for r in records if tag_filter.matches_code(tags_code(r.tags or ""))]
        if not matching:
            return req.response(codes.PULL_RETRY_IMMEDIATELY, "no message matches the subscription", fields)
        # The records were just read and checked by the pull: their bytes again, without a second decode.
        segments = [(r, self.store.segments.find(r.physical_offset)) for r in matching]
        body = b"".join(seg.read(r.physical_offset, r.store_size) for r, seg in segments if seg is not None)
        if not body:
            return req.response(codes.PULL_RETRY_IMMEDIATELY, "the messages expired while being read", fields)
        handed = sum(1 for _, seg in segments if seg is not None)
        self._pulled[0] += handed
        self.pull_rates.add(group, topic, handed)
        key = group_key(topic, group)
        self.stats.add(GROUP_GET_NUMS, key, handed)
        self.stats.add(GROUP_GET_SIZE, key, len(body))
        return req.response(codes.SUCCESS, None, fields, body)

    async def query_consumer_offset(self, req: RemotingCommand, conn: Connection) -> RemotingCommand:
        group, topic = req.text("consumerGroup"), req.text("topic")
        queue_id = req.integer("queueId", lo=0, hi=_I32[1])
        found = self.offsets.get(group, topic, queue_id)
        if found is not None:
            return req.response(codes.SUCCESS, None, {"offset": found})
        # RocketMQ's rule for a group without an offset: a queue still holding its first
        # message starts at 0; otherwise the client decides (QUERY_NOT_FOUND).
        if self._queue_bounds(topic, queue_id)[0] == 0:
            return req.response(codes.SUCCESS, None, {"offset": 0})
        return req.response(codes.QUERY_NOT_FOUND, "Not found, maybe this group consumer boot first")

    async def update_consumer_offset(self, req: RemotingCommand, conn: Connection) -> RemotingCommand:
        group, topic = req.text("consumerGroup"), req.text("topic")
        queue_id = req.integer("queueId", lo=0, hi=_I32[1])
        self.offsets.commit(group, topic, queue_id, req.integer("commitOffset", lo=0))
        return req.response(codes.SUCCESS)

    async def max_offset(self, req: RemotingCommand, conn: Connection) -> RemotingCommand:
        return req.response(codes.SUCCESS, None, {"offset": self._queue_bounds(req.text("topic"), req.integer("queueId", lo=0, hi=_I32[1]))[1]})

    async def min_offset(self, req: RemotingCommand, conn: Connection) -> RemotingCommand:
        return req.response(codes.SUCCESS, None, {"offset": self._queue_bounds(req.text("topic"), req.integer("queueId", lo=0, hi=_I32[1]))[0]})

    async def search_offset(self, req: RemotingCommand, conn: Connection) -> RemotingCommand:
        topic, queue_id, ts = req.text("topic"), req.integer("queueId", lo=0, hi=_I32[1]), req.integer("timestamp")
        cq = self.store.cqs.existing(topic, queue_id)
        offset = await asyncio.to_thread(search_offset_by_time, self.store, cq, ts) if cq is not None else 0
        return req.response(codes.SUCCESS, None, {"offset": offset})

    async def create_topic(self, req: RemotingCommand, conn: Connection) -> RemotingCommand:
        """mqadmin updateTopic: create the topic with max(read, write) queues (Quarry keeps one
        count for both); an existing topic keeps its queues, and asking for others is refused."""
        topic = req.text("topic")
        queues = max(req.integer("readQueueNums", 0, 0, 1024), req.integer("writeQueueNums", 0, 0, 1024)) or self.store.config.default_queues
        try:
            created = self.store.create_topic(topic, queues)
        except StoreError as exc:
            raise remoting_error(exc) from None
        if created:
            self.broker.sending.on_topic_created()
        elif self.store.topics[topic] != queues:
            raise RemotingError(codes.SYSTEM_ERROR, f"topic {topic} exists with {self.store.topics[topic]} queues; changing the queue count is not supported")
        return req.response(codes.SUCCESS)

    async def runtime_info(self, req: RemotingCommand, conn: Connection) -> RemotingCommand:
        """GET_BROKER_RUNTIME_INFO (mqadmin brokerStatus, clusterList): RocketMQ's KVTable of the
        broker's figures, from what Quarry counts (runtime_info.py)."""
        return req.response(codes.SUCCESS, body=json.dumps({"table": self.runtime.table()}).encode())

    async def topic_stats(self, req: RemotingCommand, conn: Connection) -> RemotingCommand:
        """GET_TOPIC_STATS_INFO (mqadmin topicStatus): each queue's min and max offset and the
        store time of its last message, as RocketMQ's AdminBrokerProcessor answers it."""
        topic = req.text("topic")
        queues = self.store.topics.get(topic)
        if queues is None:
            raise RemotingError(codes.TOPIC_NOT_EXIST, f"topic[{topic}] not exist")
        table = {}
        for queue_id in range(queues):
            lo, hi = self._queue_bounds(topic, queue_id)
            table[self._mq_key(topic, queue_id)] = {"lastUpdateTimestamp": self._store_time_at(topic, queue_id, hi - 1), "maxOffset": hi, "minOffset": lo}
        puts = self.stats.view(TOPIC_PUT_NUMS, topic)  # (RocketMQ 5 adds the last minute's put rate: topicStatus prints it)
        tps = json.dumps(puts[0].tps if puts is not None else 0.0)
        return req.response(codes.SUCCESS, body=('{"offsetTable":' + _mq_map(table) + ',"topicPutTps":' + tps + "}").encode())

    # -- admin reads: a topic's config, the groups known, the broker's settings and stats ---------
    async def topic_config(self, req: RemotingCommand, conn: Connection) -> RemotingCommand:
        """GET_TOPIC_CONFIG (RocketMQ 5's; rocketmq-tools 5 asks it before a topic's stats): the
        topic's TopicConfig as a TopicConfigAndQueueMapping, with no mapping (Quarry has no
        static topics). One queue count for reading and writing, read-write, tags filter."""
        topic = req.text("topic")
        queues = self.store.topics.get(topic)
        if queues is None:
            raise RemotingError(codes.TOPIC_NOT_EXIST, f"No topic in this broker. topic: {topic}")
        return req.response(codes.SUCCESS, body=bodies.topic_config(topic, queues))

    async def system_topics(self, req: RemotingCommand, conn: Connection) -> RemotingCommand:
        """GET_SYSTEM_TOPIC_LIST_FROM_BROKER (asked of the broker the NameServer's system topic
        list names; rocketmq-dashboard's topic list): RocketMQ's system topic names."""
        return req.response(codes.SUCCESS, body=bodies.topic_list(list(ROCKETMQ_SYSTEM_TOPICS)))

    async def subscription_groups(self, req: RemotingCommand, conn: Connection) -> RemotingCommand:
        """GET_ALL_SUBSCRIPTIONGROUP_CONFIG (mqadmin getConsumerConfig, the dashboard's consumer
        page): every group this broker knows (subscription_groups.py) with its settings."""
        groups = known_groups((g for _, g, _, _ in self.offsets.entries()), (g for g, _ in list(self.clients.subscriptions)),
                              (g for g, _, _ in self.store.consumer_groups.all()))
        table = {c.group_name: c.as_rocketmq() for c in group_configs(groups, self.retry_queues)}
        return req.response(codes.SUCCESS, body=bodies.subscription_group_wrapper(table, bodies.data_version(self.settings.since_ms)))

    async def broker_config(self, req: RemotingCommand, conn: Connection) -> RemotingCommand:
        """GET_BROKER_CONFIG (mqadmin getBrokerConfig): this broker's settings under RocketMQ's
        names (broker_settings.py) as java Properties text; the header's `version` is their
        DataVersion (fixed: they do not change while the process runs)."""
        version = json.dumps(bodies.data_version(self.settings.since_ms, self.settings.version), separators=(",", ":"))
        return req.response(codes.SUCCESS, None, {"version": version}, bodies.java_properties(self.settings.values))

    async def stats_data(self, req: RemotingCommand, conn: Connection) -> RemotingCommand:
        """VIEW_BROKER_STATS_DATA (mqadmin statsAll, the dashboard's topic charts): one counter's
        sum, tps and avgpt over the last minute, hour and day (broker_stats.py). statsKey is the
        topic (TOPIC_PUT_*) or topic@group (GROUP_GET_*): query permission on that topic, and the
        group's."""
        name, key = req.text("statsName"), req.text("statsKey")
        if name in (TOPIC_PUT_NUMS, TOPIC_PUT_SIZE):
            require(req, "query", [key])
        elif name in (GROUP_GET_NUMS, GROUP_GET_SIZE) and "@" in key:
            topic, group = key.rsplit("@", 1)
            require_group_of(req, group)
            require(req, "query", [topic])
        else:
            require(req, "query", [])
        view = self.stats.view(name, key)
        if view is None:
            raise RemotingError(codes.SYSTEM_ERROR, f"The stats <{name}> <{key}> not exist")
        return req.response(codes.SUCCESS, body=bodies.broker_stats_data(*((w.sum, w.tps, w.avgpt) for w in view)))

    def _mq_key(self, topic: str, queue_id: int) -> str:
        return json.dumps({"brokerName": self.broker.name, "queueId": queue_id, "topic": topic}, separators=(",", ":"))

    def _store_time_at(self, topic: str, queue_id: int, queue_offset: int) -> int:
        """The store time of the message at a queue offset; 0 when there is none (or it expired),
        as RocketMQ's getMessageStoreTimeStamp leaves it unset."""
        if queue_offset < 0:
            return 0
        try:
            records, _, _, _ = self.store.pull(topic, queue_id, queue_offset, 1)
        except StoreError:
            return 0
        return records[0].store_timestamp if records and records[0].queue_offset == queue_offset else 0

    async def consume_stats(self, req: RemotingCommand, conn: Connection) -> RemotingCommand:
        """GET_CONSUME_STATS (mqadmin consumerProgress), as RocketMQ's AdminBrokerProcessor answers
        it: for the header's topic, else each topic the group holds offsets for (one its live
        consumers no longer subscribe to left out), every queue's max offset (brokerOffset), the
        group's committed offset (consumerOffset, 0 when none) and the store time of the last
        message consumed (lastTimestamp, 0 when none); consumeTps: the messages the group pulled
        from those topics in the last minute, per second."""
        group, asked = req.text("consumerGroup"), req.text("topic", "")
        topics = [asked] if asked else sorted({t for t, g, _, _ in self.offsets.entries() if g == group})
        require(req, "query", topics)  # (a retry or dead-letter topic: the group's sub permission)
        live = self.clients.consumer_group(group)
        table: dict[str, dict[str, int]] = {}
        tps = 0.0
        for topic in topics:
            queues = self.store.topics.get(topic)
            if queues is None or (live is not None and live.subscriptions and topic not in live.subscriptions):
                continue
            for queue_id in range(queues):
                broker_offset = self._queue_bounds(topic, queue_id)[1]
                consumer_offset = max(self.offsets.get(group, topic, queue_id) or 0, 0)
                table[self._mq_key(topic, queue_id)] = {"brokerOffset": broker_offset, "consumerOffset": consumer_offset,
                                                       "lastTimestamp": self._store_time_at(topic, queue_id, consumer_offset - 1)}
            tps += self.pull_rates.per_second(group, topic)
        return req.response(codes.SUCCESS, body=('{"consumeTps":' + json.dumps(tps) + ',"offsetTable":' + _mq_map(table) + "}").encode())

    async def consumer_connections(self, req: RemotingCommand, conn: Connection) -> RemotingCommand:
        """GET_CONSUMER_CONNECTION_LIST (mqadmin consumerConnection): the group's live consumers
        (address, and the language and version their heartbeats carried) and what the newest
        heartbeat said of the group (consume type, message model, where to consume from,
        subscriptions), as RocketMQ's broker answers it from its ConsumerGroupInfo."""
        group = req.text("consumerGroup")
        view = self.clients.consumer_group(group)
        if view is None:
            raise RemotingError(codes.CONSUMER_NOT_ONLINE, f"the consumer group[{group}] not online")
        require(req, "query", list(view.subscriptions))  # (what it prints: the group's topics and expressions)
        connections = []
        for client_id, c in view.clients:
            if isinstance(c, Connection):
                connections.append({"clientAddr": f"{c.peer[0]}:{c.peer[1]}", "clientId": client_id,
                                    "language": c.attributes.get("language", "JAVA"), "version": c.attributes.get("version", 0)})
        body = {"connectionSet": connections, "consumeFromWhere": view.consume_from_where or None, "consumeType": view.consume_type or None,
                "messageModel": view.message_model or None, "subscriptionTable": view.subscriptions}
        return req.response(codes.SUCCESS, body=json.dumps({k: v for k, v in body.items() if v is not None}).encode())

    async def producer_connections(self, req: RemotingCommand, conn: Connection) -> RemotingCommand:
        """GET_PRODUCER_CONNECTION_LIST (mqadmin producerConnection): each live client whose
        heartbeat named the producer group, with its address and what its heartbeat said it runs."""
        group = req.text("producerGroup")
        connections = []
        for client_id, c, _ in self.clients.producers(group):
            if isinstance(c, Connection):
                connections.append({"clientId": client_id, "clientAddr": f"{c.peer[0]}:{c.peer[1]}",
                                    "language": c.attributes.get("language", "JAVA"), "version": c.attributes.get("version", 0)})
        if not connections:
            raise RemotingError(codes.SYSTEM_ERROR, f"the producer group[{group}] not exist")
        return req.response(codes.SUCCESS, body=json.dumps({"connectionSet": connections}).encode())

    # -- clients --------------------------------------------------------------------------
    async def heartbeat(self, req: RemotingCommand, conn: Connection) -> RemotingCommand:
        try:
            data = json.loads(req.body.decode("utf-8"))
            if not isinstance(data, dict):
                raise ValueError("expected a JSON object")
            before = self.clients.consumer_groups_of(str(data.get("clientID") or ""), conn)
            groups = self.clients.heartbeat(data, conn, req.caller)
            conn.attributes.update(language=req.language, version=req.version)  # (producerConnection prints them)
        except (UnicodeDecodeError, ValueError) as exc:
            raise RemotingError(codes.SYSTEM_ERROR, f"heartbeat body: {exc}") from None
        for group in set(groups) - before:  # a consumer joined: the group rebalances now
            self._notify_consumers(group)
        created = False
        for group in groups:  # as RocketMQ's broker does: each consumer group gets its retry topic
            try:
                created |= self.store.create_topic(retry_topic(group), self.retry_queues)
            except StoreError:
                pass  # read-only store or a group name that makes no topic: no retry topic
        if created:
            self.broker.sending.on_topic_created()
        return req.response(codes.SUCCESS)

    async def unregister_client(self, req: RemotingCommand, conn: Connection) -> RemotingCommand:
        """The client leaves the groups the header names (RocketMQ's unregisterClient): leaving
        a consumer group takes what joining it takes, query on the topics it subscribes to."""
        producer, consumer = req.text("producerGroup", ""), req.text("consumerGroup", "")
        if consumer:
            require(req, "query", self.clients.topics_of(consumer))
        left = consumer in self.clients.consumer_groups_of(req.text("clientID"), conn)
        self.clients.unregister(req.text("clientID"), conn, [g for g in (producer, consumer) if g])
        if left:
            self._notify_consumers(consumer)
        return req.response(codes.SUCCESS)

    async def consumer_list(self, req: RemotingCommand, conn: Connection) -> RemotingCommand:
        group = req.text("consumerGroup")
        ids = self.clients.consumers(group)
        if not ids:
            raise RemotingError(codes.SYSTEM_ERROR, f"no consumer for this group, {group}")
        return req.response(codes.SUCCESS, body=json.dumps({"consumerIdList": ids}).encode())

    async def topic_consumed_by(self, req: RemotingCommand, conn: Connection) -> RemotingCommand:
        """QUERY_TOPIC_CONSUME_BY_WHO (mqadmin's message track, after every queryMsgById): as
        RocketMQ's broker answers it, the groups with a live consumer subscribed to the topic and
        the groups holding consumer offsets for it."""
        topic = req.text("topic")
        online = {g for (g, t) in list(self.clients.subscriptions) if t == topic and self.clients.consumers(g)}
        return req.response(codes.SUCCESS, body=bodies.group_list(list(online | set(self.offsets.groups(topic)))))

    def connection_closed(self, conn: Connection) -> None:
        for group in self.clients.connection_closed(conn):
            self._notify_consumers(group)

    def _notify_consumers(self, group: str) -> None:
        """NOTIFY_CONSUMER_IDS_CHANGED one-way to every consumer of `group`, as RocketMQ's broker
        tells them when one joins or leaves: they rebalance now, not at their next 20 s round."""
        for conn in self.clients.consumer_connections(group):
            if isinstance(conn, Connection) and not conn.writer.is_closing():
                conn.send(RemotingCommand(codes.NOTIFY_CONSUMER_IDS_CHANGED, next(self._opaques), codes.FLAG_ONEWAY, None,
                                          {"consumerGroup": group}, language="JAVA"))

    # -- consumer groups: messages sent back, orderly consumers' queue locks, filter checks ----
    async def send_back(self, req: RemotingCommand, conn: Connection) -> RemotingCommand:
        """CONSUMER_SEND_MSG_BACK: the consumed message at commit log `offset` stored again for
        `group`, to %RETRY%<group> with a delay level or to %DLQ%<group> (send_back.py)."""
        group, offset = req.text("group"), req.integer("offset", lo=0)
        delay_level = req.integer("delayLevel", 0, *_I32)
        max_times = req.integer("maxReconsumeTimes", -1, *_I32)
        try:
            validate_group(group, "header field group")
        except TopicError as exc:
            raise RemotingError(codes.SYSTEM_ERROR, str(exc)) from None
        try:
            record = self.store.read(offset)
        except StoreError as exc:
            raise RemotingError(codes.SYSTEM_ERROR, f"look message by offset failed, {offset}: {exc}") from None
        require(req, "query", [record.topic])  # (what a consumer of the group could have pulled)
        where = destination(group, record.reconsume_times, None if max_times < 0 else max_times, delay_level)
        try:
            if self.store.create_topic(where.topic, DLQ_QUEUES if where.dead else self.retry_queues):
                self.broker.sending.on_topic_created()
            msg = copy_for(record, where, self.store.topics.get(where.topic, 1))
            await self.broker.sending.append_flushed([msg], "RemotingSendMsgBack")
        except StoreError as exc:
            raise remoting_error(exc) from None
        log.debug("sent back: group=%s offset=%d to=%s delay=%d", group, offset, where.topic, where.delay_level)
        return req.response(codes.SUCCESS)

    @staticmethod
    def _lock_body(req: RemotingCommand) -> tuple[str, str, list[tuple[str, str, int]]]:
        """LockBatchRequestBody / UnlockBatchRequestBody: (consumerGroup, clientId, mqSet as
        (topic, brokerName, queueId)), the ACL's group and query checks made."""
        try:
            data = json.loads(req.body.decode("utf-8"))
            group, client_id = str(data["consumerGroup"]), str(data["clientId"])
            queues = [(str(q["topic"]), str(q["brokerName"]), int(q["queueId"])) for q in data.get("mqSet") or []]
        except (UnicodeDecodeError, ValueError, TypeError, KeyError, AttributeError) as exc:
            raise RemotingError(codes.SYSTEM_ERROR, f"lock body: not a LockBatchRequestBody ({type(exc).__name__}: {exc})") from None
        require_group_of(req, group)
        require(req, "query", {q[0] for q in queues})
        return group, client_id, queues

    async def lock_queues(self, req: RemotingCommand, conn: Connection) -> RemotingCommand:
        """LOCK_BATCH_MQ: the queues the client now holds for its group (queue_locks.py)."""
        group, client_id, queues = self._lock_body(req)
        locked = self.locks.try_lock(group, queues, client_id)
        body = [{"topic": t, "brokerName": b, "queueId": q} for t, b, q in queues if (t, b, q) in locked]
        return req.response(codes.SUCCESS, body=json.dumps({"lockOKMQSet": body}).encode())

    async def unlock_queues(self, req: RemotingCommand, conn: Connection) -> RemotingCommand | None:
        group, client_id, queues = self._lock_body(req)
        self.locks.unlock(group, queues, client_id)
        return req.response(codes.SUCCESS)

    async def check_client_config(self, req: RemotingCommand, conn: Connection) -> RemotingCommand:
        """CHECK_CLIENT_CONFIG (a consumer's start, for a subscription not by TAG): this broker
        filters by tag only, so SQL92 is refused as by a RocketMQ broker without enablePropertyFilter."""
        try:
            data = json.loads(req.body.decode("utf-8")) if req.body else {}
            sub = data.get("subscriptionData") or {}
            group, topic, kind = str(data.get("group") or ""), str(sub.get("topic") or ""), str(sub.get("expressionType") or "TAG")
        except (UnicodeDecodeError, ValueError, AttributeError) as exc:
            raise RemotingError(codes.SYSTEM_ERROR, f"CheckClientRequestBody: {type(exc).__name__}: {exc}") from None
        if group:
            require_group_of(req, group)
        require(req, "query", [topic] if topic else [])
        if kind.upper() != "TAG":
            raise RemotingError(codes.SYSTEM_ERROR, f"The broker does not support consumer to filter message by {kind}")
        return req.response(codes.SUCCESS)



def _mq_map(table: dict[str, Any]) -> str:
    """fastjson's form of a map keyed by MessageQueue objects: {{"brokerName":..}:{..},..}
    (`table`'s keys are MessageQueue JSON already)."""
    return "{" + ",".join(f"{k}:{json.dumps(v, separators=(',', ':'))}" for k, v in table.items()) + "}"
