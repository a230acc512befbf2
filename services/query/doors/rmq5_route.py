"""QueryRoute: the topic's queues on every live broker that holds it, each with the broker's
own endpoint, so an SDK sends straight to the commitlog that stores the queue (RocketMQ 5's
local mode). A topic no broker holds yet is offered along TBW102's route (the brokers that
create topics on first send, with their default queue count), as a quarry.v1 producer does.
"""
from __future__ import annotations

import ipaddress

from quarry.formats.addresses import split_host_port
from quarry.formats.topic import AUTO_CREATE_TOPIC_KEY, TopicError, validate_topic
from quarry.services.query.registry import Broker, BrokerRegistry
from quarry.services.rmq5.contract import Code, v2
from quarry.services.rmq5.status import RmqError

MASTER_ID = 0  # the SDKs send only to queues of broker id 0 (RocketMQ's MixAll.MASTER_ID)
# Quarry's topics carry no message type: every queue takes every type a producer sends.
ACCEPTED_TYPES = (v2.MessageType.NORMAL, v2.MessageType.FIFO, v2.MessageType.DELAY, v2.MessageType.TRANSACTION)


def endpoints(address: str) -> v2.Endpoints:
    """host:port (or [v6]:port) as the SDKs' Endpoints: IPv4, IPv6 or a domain name."""
    try:
        host, port = split_host_port(address)
    except ValueError:
        raise RmqError(Code.INTERNAL_SERVER_ERROR, f"broker endpoint {address!r}: expected host:port") from None
    try:
        scheme = v2.AddressScheme.IPv6 if ipaddress.ip_address(host).version == 6 else v2.AddressScheme.IPv4
    except ValueError:
        scheme = v2.AddressScheme.DOMAIN_NAME
    return v2.Endpoints(scheme=scheme, addresses=[v2.Address(host=host, port=int(port))])


def sdk_endpoint(broker: Broker) -> str:
    return broker.rmq5_endpoint or broker.commitlog_addr


def send_targets(registry: BrokerRegistry, topic: str) -> list[tuple[Broker, int]]:
    """(broker, queue count) pairs a producer of `topic` may send to: the brokers holding it,
    else TBW102's route (brokers that create topics on first send), as RocketMQ's producers do."""
    for name in (topic, AUTO_CREATE_TOPIC_KEY):
        holding = [(b, b.topics[name]) for b in registry.holding(name) if name in b.topics]
        if holding:
            return holding
    return []


def query_route(registry: BrokerRegistry, resource: v2.Resource) -> list[v2.MessageQueue]:
    if resource.resource_namespace:
        raise RmqError(Code.BAD_REQUEST, f"topic.resource_namespace: namespaces are not supported (got {resource.resource_namespace!r})")
    try:
        validate_topic(resource.name, "topic.name")
    except TopicError as exc:
        raise RmqError(Code.ILLEGAL_TOPIC, str(exc)) from None
    targets = send_targets(registry, resource.name)
    if not targets:
        raise RmqError(Code.TOPIC_NOT_FOUND, f"topic.name: no live broker holds topic {resource.name}, and none creates topics on first send")
    queues = []
    for broker, count in targets:
        b = v2.Broker(name=broker.name, id=MASTER_ID, endpoints=endpoints(sdk_endpoint(broker)))
        for qid in range(count):
            queues.append(v2.MessageQueue(topic=resource, id=qid, permission=v2.Permission.READ_WRITE, broker=b, accept_message_types=ACCEPTED_TYPES))
    return queues


READABLE = (v2.Permission.READ, v2.Permission.READ_WRITE)
ALL_QUEUES = -1  # an assignment's queue id: the broker pops from every queue of the topic it holds


def assignments(queues: list[v2.MessageQueue]) -> list[v2.Assignment]:
    """QueryAssignment's answer from a topic's route, as RocketMQ's proxy answers a group that
    does not consume in order: one assignment per readable broker, queue id -1, so every
    PushConsumer of the group receives from every broker (ReceiveMessage pops its queues)."""
    by_broker: dict[str, v2.Assignment] = {}
    for q in queues:
        if q.permission in READABLE and q.broker.id == MASTER_ID and q.broker.name not in by_broker:
            mq = v2.MessageQueue(topic=q.topic, id=ALL_QUEUES, permission=q.permission, broker=q.broker, accept_message_types=q.accept_message_types)
            by_broker[q.broker.name] = v2.Assignment(message_queue=mq)
    return list(by_broker.values())
