"""JSON bodies of NameServer and broker answers, with RocketMQ 4's field names (TopicRouteData,
QueueData, BrokerData, ClusterInfo, TopicList, GroupList, TopicConfig, SubscriptionGroupWrapper,
BrokerStatsData; a java Properties text). Broker ids are map keys ("0" is the master)."""
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


def data_version(timestamp_ms: int, counter: int = 0) -> dict[str, int]:
    """DataVersion: when a table was made and how often it changed since."""
    return {"counter": counter, "timestamp": timestamp_ms}


def java_properties(values: dict[str, str]) -> bytes:
    """key=value lines as RocketMQ's MixAll.properties2String writes them, escaped where
    java.util.Properties.load would otherwise read a value or key differently."""
    def escape(text: str, key: bool) -> str:
        text = text.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r")
        if key:
            for ch in "=: #!":
                text = text.replace(ch, "\\" + ch)
        elif text.startswith((" ", "\t")):  # (load drops a value's leading blanks)
            text = "\\" + text
        return text

    return "".join(f"{escape(k, True)}={escape(v, False)}\n" for k, v in values.items()).encode("utf-8")


def _topic_config(topic: str, queues: int) -> dict[str, object]:
    return {"attributes": {}, "order": False, "perm": PERM_READ_WRITE, "readQueueNums": queues, "topicFilterType": "SINGLE_TAG",
            "topicName": topic, "topicSysFlag": 0, "writeQueueNums": queues}


def topic_config(topic: str, queues: int) -> bytes:
    """TopicConfigAndQueueMapping without a mapping (no static topic): a TopicConfig."""
    return _json(_topic_config(topic, queues))


def topic_config_wrapper(topics: dict[str, int], version: dict[str, int]) -> bytes:
    """TopicConfigSerializeWrapper: every topic's TopicConfig by name, and the table's DataVersion."""
    return _json({"dataVersion": version, "topicConfigTable": {t: _topic_config(t, q) for t, q in sorted(topics.items())}})


def subscription_group_wrapper(table: dict[str, dict[str, object]], version: dict[str, int]) -> bytes:
    """SubscriptionGroupWrapper: SubscriptionGroupConfig by group name, and the table's DataVersion."""
    return _json({"dataVersion": version, "subscriptionGroupTable": table})


def broker_stats_data(minute: tuple[int, float, float], hour: tuple[int, float, float], day: tuple[int, float, float]) -> bytes:
    """BrokerStatsData: a BrokerStatsItem (sum, tps, avgpt) for each of the three windows."""
    def item(w: tuple[int, float, float]) -> dict[str, float]:
        return {"avgpt": w[2], "sum": w[0], "tps": w[1]}

    return _json({"statsDay": item(day), "statsHour": item(hour), "statsMinute": item(minute)})
