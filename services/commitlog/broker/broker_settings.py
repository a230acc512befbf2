"""The commitlog's own settings under the names a RocketMQ broker gives its configuration
(BrokerConfig, NettyServerConfig, MessageStoreConfig: what GET_BROKER_CONFIG answers, `mqadmin
getBrokerConfig` and rocketmq-dashboard's broker config page print). Only settings Quarry has,
each in RocketMQ's unit; RocketMQ settings Quarry has no counterpart for are left out, not
made up. Fixed for the process's life (no UPDATE_BROKER_CONFIG): one data version, from start.
Protocol-free: the remoting door writes the text.
"""
from __future__ import annotations

import argparse
import os
import time
from dataclasses import dataclass, field

CQ_UNIT_BYTES = 20  # a ConsumeQueue unit: RocketMQ's mappedFileSizeConsumeQueue is in bytes


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


def rocketmq_settings(args: argparse.Namespace, acl_enabled: bool) -> dict[str, str]:
    """RocketMQ's name: the value, as text, of the commitlog's settings `args` (config.parse_args)."""
    store_dir = os.path.abspath(str(args.store_dir))
    settings = {
        "brokerName": args.broker_name,
        "brokerClusterName": args.cluster_name,
        "brokerId": "0",  # Quarry's brokers are masters (their routes name them "0"); no replicas
        "storePathRootDir": store_dir,
        "storePathCommitLog": os.path.join(store_dir, "commitlog"),
        "mappedFileSizeCommitLog": str(args.segment_size),
        "mappedFileSizeConsumeQueue": str(args.cq_units_per_file * CQ_UNIT_BYTES),
        "flushDiskType": "SYNC_FLUSH" if args.flush_mode == "SYNC" else "ASYNC_FLUSH",
        "flushIntervalCommitLog": str(args.flush_interval_ms),
        "syncFlushTimeout": str(args.sync_flush_timeout_ms),
        "fileReservedTime": _number(args.file_reserved_hours),
        "maxMessageSize": str(args.max_message_size),
        "autoCreateTopicEnable": str(bool(args.auto_create_topics)).lower(),
        "defaultTopicQueueNums": str(args.default_queues),
        "transactionTimeOut": str(args.transaction_timeout_ms),
        "transactionCheckInterval": str(args.transaction_check_interval_ms),
        "transactionCheckMax": str(args.transaction_check_max),
        "aclEnable": str(acl_enabled).lower(),
        "enablePropertyFilter": "false",  # tags only: SQL92 subscriptions are refused
    }
    if args.remoting_bind:
        settings["listenPort"] = args.remoting_bind.rsplit(":", 1)[-1]
    if getattr(args, "remoting_advertise", ""):
        settings["brokerIP1"] = args.remoting_advertise.rsplit(":", 1)[0].strip("[]")
    return settings


@dataclass(frozen=True)
class BrokerSettings:
    values: dict[str, str] = field(default_factory=dict)
    since_ms: int = field(default_factory=lambda: int(time.time() * 1000))  # the data version's timestamp
    version: int = 0  # RocketMQ's DataVersion counter: never moves, nothing changes them
