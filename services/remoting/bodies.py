"""JSON bodies of NameServer and broker answers, with RocketMQ 4's field names (TopicRouteData,
QueueData, BrokerData, ClusterInfo, TopicList, GroupList). Broker ids are map keys ("0" is the master)."""
from __future__ import annotations

import json
from dataclasses import dataclass

PERM_READ_WRITE = 6  # PermName.PERM_READ | PermName.PERM_WRITE
MASTER_ID = "0"


@dataclass(frozen=True)
class RouteBroker:
    name: str
    cluster: str
    remoting_addr: str
    queues: int


def _json(value: object) -> bytes:
    """Compact, as RocketMQ's fastjson writes: rocketmq-client-go splits brokerAddrs on ',' and
    ':' itself, so `{"0": "host:port"}` (with a space) gives it the address " host:port"."""
    return json.dumps(value, separators=(",", ":")).encode()


def _broker_data(b: RouteBroker) -> dict[str, object]:
    return {"cluster": b.cluster, "brokerName": b.name, "brokerAddrs": {MASTER_ID: b.remoting_addr}}


def topic_route_data(brokers: list[RouteBroker]) -> bytes:
    brokers = sorted(brokers, key=lambda b: b.name)
    return _json({
        "orderTopicConf": None,
        "queueDatas": [{"brokerName": b.name, "readQueueNums": b.queues, "writeQueueNums": b.queues, "perm": PERM_READ_WRITE,
                        "topicSysFlag": 0, "topicSynFlag": 0} for b in brokers],
        "brokerDatas": [_broker_data(b) for b in brokers],
        "filterServerTable": {},
    })


def cluster_info(brokers: list[RouteBroker]) -> bytes:
    clusters: dict[str, list[str]] = {}
    for b in brokers:
        clusters.setdefault(b.cluster, []).append(b.name)
    return _json({
        "brokerAddrTable": {b.name: _broker_data(b) for b in sorted(brokers, key=lambda b: b.name)},
        "clusterAddrTable": {c: sorted(names) for c, names in sorted(clusters.items())},
    })


def topic_list(topics: list[str], broker_addr: str = "") -> bytes:
    """TopicList; `broker_addr` set as the NameServer's system topic list sets it (a broker to ask)."""
    return _json({"topicList": sorted(topics), **({"brokerAddr": broker_addr} if broker_addr else {})})


def group_list(groups: list[str]) -> bytes:
    return _json({"groupList": sorted(groups)})
