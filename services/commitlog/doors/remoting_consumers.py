"""The RocketMQ 4 door's consumer requests: PULL_MESSAGE (long polling), consumer offsets and
queue bounds, heartbeats and the client table (with NOTIFY_CONSUMER_IDS_CHANGED to a group's
consumers), messages sent back, orderly consumers' queue locks and filter checks."""
from __future__ import annotations

import json
import logging
import threading
import time
from typing import Iterator

from quarry.formats import tag_expression
from quarry.formats.java_hash import tags_code
from quarry.formats.topic import TopicError, retry_topic, validate_group
from quarry.services.commitlog.broker.broker_stats import GROUP_GET_NUMS, GROUP_GET_SIZE, BrokerStats, group_key
from quarry.services.commitlog.broker.client_table import ClientTable
from quarry.services.commitlog.broker.core import Broker
from quarry.services.commitlog.broker.flush_signal import FlushSignal
from quarry.services.commitlog.broker.pull_rates import PullRates
from quarry.services.commitlog.broker.queue_locks import QueueLocks
from quarry.services.commitlog.broker.send_back import DLQ_QUEUES, copy_for, destination
from quarry.services.commitlog.storage.consumer_offsets import ConsumerOffsets
from quarry.services.commitlog.storage.errors import StoreError
from quarry.services.commitlog.storage.store import CommitLogStore
from quarry.services.remoting import codes
from quarry.services.remoting.acl import require, require_group_of
from quarry.services.remoting.command import JAVA_INT, RemotingCommand
from quarry.services.remoting.server import Connection, RemotingError
from quarry.services.remoting.status import remoting_error

log = logging.getLogger("quarry.commitlog.remoting")

MAX_PULL_MSGS = 1024
MAX_SUSPEND_MS = 30_000  # longest a pull is held waiting for new messages


def queue_bounds(store: CommitLogStore, topic: str, queue_id: int) -> tuple[int, int]:
    """A queue's (min, max) offset; (0, 0) for a queue that holds nothing yet."""
    cq = store.cqs.existing(topic, queue_id)
    return (cq.min_offset, cq.max_offset) if cq is not None else (0, 0)


class Consumers:
    """The door's consumer handlers (a mixin of RemotingBroker, remoting.py, whose constructor
    sets the state below)."""

    broker: Broker
    store: CommitLogStore
    offsets: ConsumerOffsets
    appended: FlushSignal
    stopping: threading.Event
    clients: ClientTable
    locks: QueueLocks
    retry_queues: int
    stats: BrokerStats
    pull_rates: PullRates
    _opaques: Iterator[int]
    _pulled: list[float]
    _pulls_found: list[int]
    _pulls_missed: list[int]

    # -- pull and offsets -------------------------------------------------------------------
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
        queue_id = req.integer("queueId", lo=0, hi=JAVA_INT[1])
        offset = req.integer("queueOffset", lo=0)
        max_msgs = req.integer("maxMsgNums", lo=1, hi=JAVA_INT[1])
        sys_flag = req.integer("sysFlag", 0, *JAVA_INT)
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

    def query_consumer_offset(self, req: RemotingCommand, conn: Connection) -> RemotingCommand:
        group, topic = req.text("consumerGroup"), req.text("topic")
        queue_id = req.integer("queueId", lo=0, hi=JAVA_INT[1])
        found = self.offsets.get(group, topic, queue_id)
        if found is not None:
            return req.response(codes.SUCCESS, None, {"offset": found})
        # RocketMQ's rule for a group without an offset: a queue still holding its first
        # message starts at 0; otherwise the client decides (QUERY_NOT_FOUND).
        if queue_bounds(self.store, topic, queue_id)[0] == 0:
            return req.response(codes.SUCCESS, None, {"offset": 0})
        return req.response(codes.QUERY_NOT_FOUND, "Not found, maybe this group consumer boot first")

    def update_consumer_offset(self, req: RemotingCommand, conn: Connection) -> RemotingCommand:
        group, topic = req.text("consumerGroup"), req.text("topic")
        queue_id = req.integer("queueId", lo=0, hi=JAVA_INT[1])
        self.offsets.commit(group, topic, queue_id, req.integer("commitOffset", lo=0))
        return req.response(codes.SUCCESS)

    def max_offset(self, req: RemotingCommand, conn: Connection) -> RemotingCommand:
        return req.response(codes.SUCCESS, None, {"offset": queue_bounds(self.store, req.text("topic"), req.integer("queueId", lo=0, hi=JAVA_INT[1]))[1]})

    def min_offset(self, req: RemotingCommand, conn: Connection) -> RemotingCommand:
        return req.response(codes.SUCCESS, None, {"offset": queue_bounds(self.store, req.text("topic"), req.integer("queueId", lo=0, hi=JAVA_INT[1]))[0]})

    # -- clients --------------------------------------------------------------------------
    def heartbeat(self, req: RemotingCommand, conn: Connection) -> RemotingCommand:
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

    def unregister_client(self, req: RemotingCommand, conn: Connection) -> RemotingCommand:
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

    def consumer_list(self, req: RemotingCommand, conn: Connection) -> RemotingCommand:
        group = req.text("consumerGroup")
        ids = self.clients.consumers(group)
        if not ids:
            raise RemotingError(codes.SYSTEM_ERROR, f"no consumer for this group, {group}")
        return req.response(codes.SUCCESS, body=json.dumps({"consumerIdList": ids}).encode())

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
        delay_level = req.integer("delayLevel", 0, *JAVA_INT)
        max_times = req.integer("maxReconsumeTimes", -1, *JAVA_INT)
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

    def lock_queues(self, req: RemotingCommand, conn: Connection) -> RemotingCommand:
        """LOCK_BATCH_MQ: the queues the client now holds for its group (queue_locks.py)."""
        group, client_id, queues = self._lock_body(req)
        locked = self.locks.try_lock(group, queues, client_id)
        body = [{"topic": t, "brokerName": b, "queueId": q} for t, b, q in queues if (t, b, q) in locked]
        return req.response(codes.SUCCESS, body=json.dumps({"lockOKMQSet": body}).encode())

    def unlock_queues(self, req: RemotingCommand, conn: Connection) -> RemotingCommand | None:
        group, client_id, queues = self._lock_body(req)
        self.locks.unlock(group, queues, client_id)
        return req.response(codes.SUCCESS)

    def check_client_config(self, req: RemotingCommand, conn: Connection) -> RemotingCommand:
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
