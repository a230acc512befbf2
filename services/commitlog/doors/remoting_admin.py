"""The RocketMQ 4 door's admin requests (mqadmin, rocketmq-dashboard): topics made, the
broker's runtime info, settings and stats, topic and consume stats, the groups known, who consumes
a topic and a group's connections."""
from __future__ import annotations

import json
from typing import Any

from quarry.services.commitlog.broker.broker_settings import BrokerSettings
from quarry.services.commitlog.broker.broker_stats import GROUP_GET_NUMS, GROUP_GET_SIZE, TOPIC_PUT_NUMS, TOPIC_PUT_SIZE, BrokerStats
from quarry.services.commitlog.broker.client_table import ClientTable
from quarry.services.commitlog.broker.core import Broker
from quarry.services.commitlog.broker.pull_rates import PullRates
from quarry.services.commitlog.broker.runtime_info import RuntimeInfo
from quarry.services.commitlog.broker.subscription_groups import group_configs, known_groups
from quarry.services.commitlog.doors.remoting_consumers import queue_bounds
from quarry.services.commitlog.storage.consumer_offsets import ConsumerOffsets
from quarry.services.commitlog.storage.errors import StoreError
from quarry.services.commitlog.storage.store import CommitLogStore
from quarry.services.remoting import bodies, codes
from quarry.services.remoting.acl import require, require_group_of
from quarry.services.remoting.command import RemotingCommand
from quarry.services.remoting.server import Connection, RemotingError
from quarry.services.remoting.status import remoting_error

# The names RocketMQ 4.9's TopicValidator calls system topics: its broker answers them whether
# they exist or not, and tools (rocketmq-dashboard's topic list) use them to tell topics apart.
ROCKETMQ_SYSTEM_TOPICS = ("TBW102", "SCHEDULE_TOPIC_XXXX", "BenchmarkTest", "RMQ_SYS_TRANS_HALF_TOPIC", "RMQ_SYS_TRACE_TOPIC",
                          "RMQ_SYS_TRANS_OP_HALF_TOPIC", "TRANS_CHECK_MAX_TIME_TOPIC", "SELF_TEST_TOPIC", "OFFSET_MOVED_EVENT")


class Admin:
    """The door's admin handlers (a mixin of RemotingBroker, remoting.py, whose constructor sets
    the state below)."""

    broker: Broker
    store: CommitLogStore
    offsets: ConsumerOffsets
    clients: ClientTable
    retry_queues: int
    stats: BrokerStats
    pull_rates: PullRates
    settings: BrokerSettings
    runtime: RuntimeInfo

    def create_topic(self, req: RemotingCommand, conn: Connection) -> RemotingCommand:
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

    def runtime_info(self, req: RemotingCommand, conn: Connection) -> RemotingCommand:
        """GET_BROKER_RUNTIME_INFO (mqadmin brokerStatus, clusterList): RocketMQ's KVTable of the
        broker's figures, from what Quarry counts (runtime_info.py)."""
        return req.response(codes.SUCCESS, body=json.dumps({"table": self.runtime.table()}).encode())

    def topic_stats(self, req: RemotingCommand, conn: Connection) -> RemotingCommand:
        """GET_TOPIC_STATS_INFO (mqadmin topicStatus): each queue's min and max offset and the
        store time of its last message, as RocketMQ's AdminBrokerProcessor answers it."""
        topic = req.text("topic")
        queues = self.store.topics.get(topic)
        if queues is None:
            raise RemotingError(codes.TOPIC_NOT_EXIST, f"topic[{topic}] not exist")
        table = {}
        for queue_id in range(queues):
            lo, hi = queue_bounds(self.store, topic, queue_id)
            table[self._mq_key(topic, queue_id)] = {"lastUpdateTimestamp": self._store_time_at(topic, queue_id, hi - 1), "maxOffset": hi, "minOffset": lo}
        puts = self.stats.view(TOPIC_PUT_NUMS, topic)  # (RocketMQ 5 adds the last minute's put rate: topicStatus prints it)
        tps = json.dumps(puts[0].tps if puts is not None else 0.0)
        return req.response(codes.SUCCESS, body=('{"offsetTable":' + _mq_map(table) + ',"topicPutTps":' + tps + "}").encode())

    # -- admin reads: a topic's config, the groups known, the broker's settings and stats ---------
    def topic_config(self, req: RemotingCommand, conn: Connection) -> RemotingCommand:
        """GET_TOPIC_CONFIG (RocketMQ 5's; rocketmq-tools 5 asks it before a topic's stats): the
        topic's TopicConfig as a TopicConfigAndQueueMapping, with no mapping (Quarry has no
        static topics). One queue count for reading and writing, read-write, tags filter."""
        topic = req.text("topic")
        queues = self.store.topics.get(topic)
        if queues is None:
            raise RemotingError(codes.TOPIC_NOT_EXIST, f"No topic in this broker. topic: {topic}")
        return req.response(codes.SUCCESS, body=bodies.topic_config(topic, queues))

    def all_topic_configs(self, req: RemotingCommand, conn: Connection) -> RemotingCommand:
        """GET_ALL_TOPIC_CONFIG (rocketmq-dashboard's topic list: each topic's type): every topic
        this broker holds, as a TopicConfigSerializeWrapper; its DataVersion is the process's start."""
        return req.response(codes.SUCCESS, body=bodies.topic_config_wrapper(dict(self.store.topics.items()), bodies.data_version(self.settings.since_ms)))

    def system_topics(self, req: RemotingCommand, conn: Connection) -> RemotingCommand:
        """GET_SYSTEM_TOPIC_LIST_FROM_BROKER (asked of the broker the NameServer's system topic
        list names; rocketmq-dashboard's topic list): RocketMQ's system topic names."""
        return req.response(codes.SUCCESS, body=bodies.topic_list(list(ROCKETMQ_SYSTEM_TOPICS)))

    def subscription_groups(self, req: RemotingCommand, conn: Connection) -> RemotingCommand:
        """GET_ALL_SUBSCRIPTIONGROUP_CONFIG (mqadmin getConsumerConfig, the dashboard's consumer
        page): every group this broker knows (subscription_groups.py) with its settings."""
        groups = known_groups((g for _, g, _, _ in self.offsets.entries()), (g for g, _ in list(self.clients.subscriptions)),
                              (g for g, _, _ in self.store.consumer_groups.all()))
        table = {c.group_name: c.as_rocketmq() for c in group_configs(groups, self.retry_queues)}
        return req.response(codes.SUCCESS, body=bodies.subscription_group_wrapper(table, bodies.data_version(self.settings.since_ms)))

    def broker_config(self, req: RemotingCommand, conn: Connection) -> RemotingCommand:
        """GET_BROKER_CONFIG (mqadmin getBrokerConfig): this broker's settings under RocketMQ's
        names (broker_settings.py) as java Properties text; the header's `version` is their
        DataVersion (fixed: they do not change while the process runs)."""
        version = json.dumps(bodies.data_version(self.settings.since_ms, self.settings.version), separators=(",", ":"))
        return req.response(codes.SUCCESS, None, {"version": version}, bodies.java_properties(self.settings.values))

    def stats_data(self, req: RemotingCommand, conn: Connection) -> RemotingCommand:
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

    def consume_stats(self, req: RemotingCommand, conn: Connection) -> RemotingCommand:
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
                broker_offset = queue_bounds(self.store, topic, queue_id)[1]
                consumer_offset = max(self.offsets.get(group, topic, queue_id) or 0, 0)
                table[self._mq_key(topic, queue_id)] = {"brokerOffset": broker_offset, "consumerOffset": consumer_offset,
                                                       "lastTimestamp": self._store_time_at(topic, queue_id, consumer_offset - 1)}
            tps += self.pull_rates.per_second(group, topic)
        return req.response(codes.SUCCESS, body=('{"consumeTps":' + json.dumps(tps) + ',"offsetTable":' + _mq_map(table) + "}").encode())

    def consumer_connections(self, req: RemotingCommand, conn: Connection) -> RemotingCommand:
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

    def producer_connections(self, req: RemotingCommand, conn: Connection) -> RemotingCommand:
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

    def topic_consumed_by(self, req: RemotingCommand, conn: Connection) -> RemotingCommand:
        """QUERY_TOPIC_CONSUME_BY_WHO (mqadmin's message track, after every queryMsgById): as
        RocketMQ's broker answers it, the groups with a live consumer subscribed to the topic and
        the groups holding consumer offsets for it."""
        topic = req.text("topic")
        online = {g for (g, t) in list(self.clients.subscriptions) if t == topic and self.clients.consumers(g)}
        return req.response(codes.SUCCESS, body=bodies.group_list(list(online | set(self.offsets.groups(topic)))))


def _mq_map(table: dict[str, Any]) -> str:
    """fastjson's form of a map keyed by MessageQueue objects: {{"brokerName":..}:{..},..}
    (`table`'s keys are MessageQueue JSON already)."""
    return "{" + ",".join(f"{k}:{json.dumps(v, separators=(',', ':'))}" for k, v in table.items()) + "}"
