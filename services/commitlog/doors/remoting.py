"""The broker role of RocketMQ 4's remoting protocol, over one commitlog's store.

Translation only: request headers become calls of the broker layer (services/commitlog/broker/)
and the answers become response headers and bodies. RemotingBroker is the door: its constructor
holds the door's state, `handlers()` maps each request code to its handler, and the handlers
live by concern in mixins, one module each:

- remoting_sends.py: sends and transactions (SEND_MESSAGE*, END_TRANSACTION, the check's ask);
- remoting_consumers.py: pull, consumer offsets, heartbeats and clients, send-back, queue locks;
- remoting_admin.py: mqadmin's and the dashboard's reads (runtime info, stats, configs, topic and
  consume stats, connections) and topic creation;
- remoting_queries.py: messages by key or offset (QUERY_MESSAGE, VIEW_MESSAGE_BY_ID) and offsets
  by time (SEARCH_OFFSET_BY_TIMESTAMP).

A new request code: one `async def handler(self, req, conn)` in the module of its concern, one
line in `handlers()` below, and its ACL rule in services/remoting/acl.py.
"""
from __future__ import annotations

import itertools

import grpc

from quarry.services.commitlog import metrics
from quarry.services.commitlog.broker.broker_settings import BrokerSettings
from quarry.services.commitlog.broker.client_table import ClientTable
from quarry.services.commitlog.broker.core import Broker
from quarry.services.commitlog.broker.pull_rates import PullRates
from quarry.services.commitlog.broker.queue_locks import QueueLocks
from quarry.services.commitlog.broker.runtime_info import RuntimeInfo, quarry_version
from quarry.services.commitlog.doors.remoting_admin import Admin
from quarry.services.commitlog.doors.remoting_consumers import Consumers
from quarry.services.commitlog.doors.remoting_queries import KeyIndex, Queries
from quarry.services.commitlog.doors.remoting_sends import Sends
from quarry.services.remoting import codes
from quarry.services.remoting.server import Handler
from quarry.v1 import indexer_pb2_grpc


class RemotingBroker(Sends, Consumers, Admin, Queries):
    """Request handlers of one broker; `handlers()` is what the RemotingServer serves."""

    def __init__(self, broker: Broker, indexer_addr: str = "", retry_queues: int = 1, settings: BrokerSettings | None = None,
                 key_index: KeyIndex | None = None) -> None:
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
        self._key_index, self._key_index_failing = key_index, ""  # QUERY_MESSAGE's IndexFiles read here (--index-dir), else the indexer
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
            # sends and transactions (remoting_sends.py)
            codes.SEND_MESSAGE: self.send, codes.SEND_MESSAGE_V2: self.send, codes.SEND_BATCH_MESSAGE: self.send,
            codes.END_TRANSACTION: self.end_transaction,
            # consumers: pull, offsets, clients, send-back, queue locks (remoting_consumers.py)
            codes.PULL_MESSAGE: self.pull,
            codes.QUERY_CONSUMER_OFFSET: self.query_consumer_offset, codes.UPDATE_CONSUMER_OFFSET: self.update_consumer_offset,
            codes.GET_MAX_OFFSET: self.max_offset, codes.GET_MIN_OFFSET: self.min_offset,
            codes.HEART_BEAT: self.heartbeat, codes.UNREGISTER_CLIENT: self.unregister_client,
            codes.GET_CONSUMER_LIST_BY_GROUP: self.consumer_list, codes.CONSUMER_SEND_MSG_BACK: self.send_back,
            codes.LOCK_BATCH_MQ: self.lock_queues, codes.UNLOCK_BATCH_MQ: self.unlock_queues,
            codes.CHECK_CLIENT_CONFIG: self.check_client_config,
            # admin: topics, runtime info, stats, configs, connections (remoting_admin.py)
            codes.UPDATE_AND_CREATE_TOPIC: self.create_topic, codes.GET_BROKER_RUNTIME_INFO: self.runtime_info,
            codes.GET_TOPIC_STATS_INFO: self.topic_stats, codes.GET_CONSUME_STATS: self.consume_stats,
            codes.GET_TOPIC_CONFIG: self.topic_config, codes.GET_ALL_TOPIC_CONFIG: self.all_topic_configs, codes.GET_ALL_SUBSCRIPTIONGROUP_CONFIG: self.subscription_groups,
            codes.GET_BROKER_CONFIG: self.broker_config, codes.VIEW_BROKER_STATS_DATA: self.stats_data,
            codes.GET_SYSTEM_TOPIC_LIST_FROM_BROKER: self.system_topics, codes.QUERY_TOPIC_CONSUME_BY_WHO: self.topic_consumed_by,
            codes.GET_PRODUCER_CONNECTION_LIST: self.producer_connections, codes.GET_CONSUMER_CONNECTION_LIST: self.consumer_connections,
            # messages by key or offset, offsets by time (remoting_queries.py)
            codes.QUERY_MESSAGE: self.query_message, codes.VIEW_MESSAGE_BY_ID: self.view_message,
            codes.SEARCH_OFFSET_BY_TIMESTAMP: self.search_offset,
        }

    async def close(self) -> None:
        if self._indexer_channel is not None:
            await self._indexer_channel.close()
