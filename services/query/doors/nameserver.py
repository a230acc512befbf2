"""The router's NameServer role for RocketMQ 4 remoting clients: topic routes, cluster info,
topic list, all read from the broker registry (brokers that create topics on first send
register TBW102, the route producers fall back to). Only brokers that announced a remoting
address appear (a gRPC-only broker cannot serve a remoting client)."""
from __future__ import annotations

from quarry.formats.topic import TopicError, validate_topic
from quarry.services.query.registry import Broker, BrokerRegistry
from quarry.services.remoting import codes
from quarry.services.remoting.bodies import RouteBroker, cluster_info, topic_list, topic_route_data
from quarry.services.remoting.command import RemotingCommand
from quarry.services.remoting.server import Connection, Handler, RemotingError

class NameServer:
    def __init__(self, registry: BrokerRegistry) -> None:
        self.registry = registry

    def handlers(self) -> dict[int, Handler]:
        return {
            codes.GET_ROUTEINFO_BY_TOPIC: self.route, codes.GET_BROKER_CLUSTER_INFO: self.cluster_info,
            codes.GET_ALL_TOPIC_LIST_FROM_NAMESERVER: self.topic_list, codes.GET_SYSTEM_TOPIC_LIST_FROM_NS: self.system_topic_list,
            codes.GET_KV_CONFIG: self.no_kv_config, codes.GET_KV_CONFIG_BY_VALUE: self.no_kv_config,
        }

    def _remoting_brokers(self) -> list[Broker]:
        return [b for b in self.registry.live() if b.remoting_addr]

    def route(self, req: RemotingCommand, conn: Connection) -> RemotingCommand:
        topic = req.text("topic")
        try:
            validate_topic(topic)
        except TopicError as exc:
            raise RemotingError(codes.SYSTEM_ERROR, str(exc)) from None
        brokers = [RouteBroker(b.name, b.cluster_name, b.remoting_addr, b.topics[topic]) for b in self._remoting_brokers() if topic in b.topics]
        if not brokers:
            raise RemotingError(codes.TOPIC_NOT_EXIST, f"No topic route info in name server for the topic: {topic}")
        return req.response(codes.SUCCESS, body=topic_route_data(brokers))

    def cluster_info(self, req: RemotingCommand, conn: Connection) -> RemotingCommand:
        brokers = [RouteBroker(b.name, b.cluster_name, b.remoting_addr, 0) for b in self._remoting_brokers()]
        return req.response(codes.SUCCESS, body=cluster_info(brokers))

    def topic_list(self, req: RemotingCommand, conn: Connection) -> RemotingCommand:
        return req.response(codes.SUCCESS, body=topic_list(self.registry.topics()))

    def system_topic_list(self, req: RemotingCommand, conn: Connection) -> RemotingCommand:
        """GET_SYSTEM_TOPIC_LIST_FROM_NS as RocketMQ's NameServer answers it: every cluster name and
        broker name (each is a topic a broker keeps for itself), and a broker's address to ask for
        the rest (rocketmq-dashboard's topic page asks this first)."""
        brokers = self._remoting_brokers()
        names = {b.cluster_name for b in brokers} | {b.name for b in brokers}
        return req.response(codes.SUCCESS, body=topic_list(sorted(names), brokers[0].remoting_addr if brokers else ""))

    def no_kv_config(self, req: RemotingCommand, conn: Connection) -> RemotingCommand:
        return req.response(codes.QUERY_NOT_FOUND, "No config item, Namespace: " + req.ext_fields.get("namespace", ""))
