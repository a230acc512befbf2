"""The consumer groups a broker knows, each with its settings as RocketMQ's
SubscriptionGroupConfig names them (GET_ALL_SUBSCRIPTIONGROUP_CONFIG: `mqadmin
getConsumerConfig`, rocketmq-dashboard's consumer page).

A RocketMQ broker makes a group's config when a consumer of it first heartbeats or pulls, and
keeps it. Quarry keeps no such table: a group is known here when it holds committed offsets,
has consumers whose heartbeats named it, or has RocketMQ 5 pop state. Every group has the same
settings: the ones this broker applies to all (RocketMQ's defaults, which Quarry follows).
Protocol-free: the remoting door writes the JSON.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from quarry.services.commitlog.broker.send_back import DEFAULT_MAX_RECONSUME_TIMES


@dataclass(frozen=True)
class GroupConfig:
    """SubscriptionGroupConfig's fields; what Quarry does for every group, RocketMQ's defaults."""

    group_name: str
    retry_queue_nums: int = 1  # queues of %RETRY%<group>
    retry_max_times: int = DEFAULT_MAX_RECONSUME_TIMES  # a sent-back message's attempts before %DLQ%<group>
    consume_enable: bool = True  # (no group is ever barred from pulling)
    consume_from_min_enable: bool = True
    consume_broadcast_enable: bool = True
    broker_id: int = 0  # pulls are served by the master: there is no other
    which_broker_when_consume_slowly: int = 1
    notify_consumer_ids_changed_enable: bool = True  # consumers are told when one joins or leaves

    def as_rocketmq(self) -> dict[str, object]:
        return {"brokerId": self.broker_id, "consumeBroadcastEnable": self.consume_broadcast_enable, "consumeEnable": self.consume_enable,
                "consumeFromMinEnable": self.consume_from_min_enable, "groupName": self.group_name,
                "notifyConsumerIdsChangedEnable": self.notify_consumer_ids_changed_enable, "retryMaxTimes": self.retry_max_times,
                "retryQueueNums": self.retry_queue_nums, "whichBrokerWhenConsumeSlowly": self.which_broker_when_consume_slowly}


def known_groups(*sources: Iterable[str]) -> list[str]:
    """Every group named by any source (offsets, heartbeats, pop state), once, sorted."""
    return sorted({g for source in sources for g in source if g})


def group_configs(groups: Iterable[str], retry_queues: int) -> list[GroupConfig]:
    return [GroupConfig(g, retry_queue_nums=retry_queues) for g in groups]
