"""Settings of the commitlog service (flags, else environment, else defaults)."""
from __future__ import annotations

import argparse
import socket

from quarry.formats.addresses import format_host_port, parse_router_addresses, split_host_port
from quarry.services.commitlog.broker.transaction_check import add_check_settings
from quarry.services.remoting.server import add_limit_settings
from quarry.services.rmq5.auth import add_auth_settings
from quarry.services.settings import (
    EnvArgumentParser, add_frames_setting, add_metrics_settings, add_process_settings, add_remoting_settings, parse_bool, remoting_bind,
)

REMOTING_PORT = 10931  # the remoting port's default, on the --bind host (RocketMQ's 10911 is the gRPC port here)
WILDCARDS = ("0.0.0.0", "::", "")


def _router_list(text: str) -> list[str]:
    return parse_router_addresses(text, "router address") if text.strip() else []


def build_parser() -> EnvArgumentParser:
    p = EnvArgumentParser(prog="quarry-commitlog", description="One broker's RocketMQ-compatible CommitLog over gRPC.")
    p.add_setting("--bind", "QUARRY_COMMITLOG_BIND", "127.0.0.1:10911", "host:port to listen on")
    p.add_setting("--advertise", "QUARRY_COMMITLOG_ADVERTISE", "", "address the router and clients dial (host:port); also the store host when neither --store-host nor the remoting port is set; default: --bind (this machine's address for a wildcard such as 0.0.0.0)")
    p.add_setting("--rmq5-advertise", "QUARRY_RMQ5_ADVERTISE", "", "host:port RocketMQ 5 SDKs reach this broker at (QueryRoute endpoints); default: --advertise")
    p.add_setting("--store-host", "QUARRY_STORE_HOST", "", "ip:port written into offsetMsgIds and announced as the store host (e.g. a dead broker's store served elsewhere); default: --remoting-advertise when the remoting port is on (RocketMQ's rule: mqadmin sends queryMsgById to it), else --advertise")
    p.add_setting("--store-dir", "QUARRY_STORE_DIR", "./var/store", "store directory (commitlog/, consumequeue/, ...)")
    p.add_setting("--broker-name", "QUARRY_BROKER_NAME", "broker-a", "broker name")
    p.add_setting("--cluster-name", "QUARRY_CLUSTER_NAME", "DefaultCluster", "cluster name")
    p.add_setting("--router", "QUARRY_ROUTER_ADDR", "", "query routers to register with, host:port or several as 'a:9876;b:9876' (registers with each; empty: do not register)", _router_list)
    p.add_setting("--indexer-addr", "QUARRY_INDEXER_ADDR", "", "this broker's indexer address, announced to the router")
    p.add_setting("--index-dir", "QUARRY_INDEX_DIR", "",
                  "this broker's indexer --index-dir, when on this host: RocketMQ 4 key queries (QUERY_MESSAGE) read its IndexFiles here, mapped read-only "
                  "and looked at again every 100 ms, instead of asking the indexer (one hop less); nothing there is written, locked or created. "
                  "Give the indexer's --hash-slots, --index-num and --max-msgs-num-batch too. Empty: ask the indexer; until the indexer has made it, or while "
                  "the files there may hold less than the indexer, the indexer is asked (said in the log). compose.yaml sets it: each indexer's volume "
                  "is mounted read-only in its commitlog")
    p.add_setting("--index-hash-slots", "QUARRY_INDEX_HASH_SLOTS", 5_000_000, "with --index-dir: the indexer's --hash-slots", int, minimum=1)
    p.add_setting("--index-num", "QUARRY_INDEX_NUM", 20_000_000, "with --index-dir: the indexer's --index-num", int, minimum=2)
    p.add_setting("--index-max-num", "QUARRY_INDEX_MAX_NUM", 64, "with --index-dir: the indexer's --max-msgs-num-batch (cap on a key query's answer)", int, minimum=1)
    p.add_setting("--heartbeat-interval-ms", "QUARRY_HEARTBEAT_INTERVAL_MS", 3000, "heartbeat interval to the router", int, minimum=100)
    p.add_setting("--segment-size", "QUARRY_SEGMENT_SIZE", 1024 * 1024 * 1024, "CommitLog segment size in bytes", int, minimum=4096)
    p.add_setting("--cq-units-per-file", "QUARRY_CQ_UNITS_PER_FILE", 300_000, "ConsumeQueue units per file", int, minimum=1)
    p.add_setting("--flush-mode", "QUARRY_FLUSH_MODE", "ASYNC", "ASYNC or SYNC (group commit)", str.upper, ["ASYNC", "SYNC"])
    p.add_setting("--flush-interval-ms", "QUARRY_FLUSH_INTERVAL_MS", 500, "ASYNC flush interval", int, minimum=1)
    p.add_setting("--sync-flush-timeout-ms", "QUARRY_SYNC_FLUSH_TIMEOUT_MS", 5000, "SYNC: longest wait for fsync before FLUSH_DISK_TIMEOUT", int, minimum=1)
    p.add_setting("--auto-create-topics", "QUARRY_AUTO_CREATE_TOPICS", True, "create a topic on first send", parse_bool)
    p.add_setting("--default-queues", "QUARRY_DEFAULT_QUEUES", 4, "queues of an auto-created topic", int, minimum=1)
    p.add_setting("--max-message-size", "QUARRY_MAX_MESSAGE_SIZE", 4 * 1024 * 1024, "largest body in bytes", int, minimum=1)
    p.add_setting("--file-reserved-hours", "QUARRY_FILE_RESERVED_HOURS", 72.0, "keep segments this long", float, minimum=0)
    p.add_setting("--tail-cache-records", "QUARRY_TAIL_CACHE_RECORDS", 32768, "newest records Tail serves from memory (0: always read the log)", int, minimum=0)
    p.add_setting("--recovery-verify-segments", "QUARRY_RECOVERY_VERIFY_SEGMENTS", 3,
                  "newest segments whose record CRCs are checked at every start (RocketMQ checks 3; 0: trust a clean checkpoint)", int, minimum=0)
    p.add_setting("--read-only", "QUARRY_READ_ONLY", False, "open the store read-only (e.g. an Apache RocketMQ store dir)", parse_bool)
    p.add_setting("--follow", "QUARRY_FOLLOW", False, "follow a store directory another process (a running RocketMQ broker) keeps writing: read-only, new records served within --follow-interval-ms, queues rebuilt in memory", parse_bool)
    p.add_setting("--follow-interval-ms", "QUARRY_FOLLOW_INTERVAL_MS", 100, "follow mode: how often the directory is checked for new records and segment files", int, minimum=10)
    add_remoting_settings(p, "QUARRY_COMMITLOG_REMOTING_BIND", REMOTING_PORT, "the RocketMQ 4 remoting (broker) port")
    add_limit_settings(p)
    p.add_setting("--remoting-advertise", "QUARRY_COMMITLOG_REMOTING_ADVERTISE", "",
                  "remoting address announced to the router (NameServer routes) and, by default, the store host; default: the --advertise host "
                  "with the --remoting-bind port when the remoting port listens on the --bind host or on every address, else --remoting-bind")
    p.add_setting("--offsets-persist-interval-ms", "QUARRY_OFFSETS_PERSIST_INTERVAL_MS", 1000, "how often changed consumer offsets are written to config/consumerOffset.json", int, minimum=10)
    p.add_setting("--max-delivery-attempts", "QUARRY_MAX_DELIVERY_ATTEMPTS", 17, "deliveries of a message to a RocketMQ 5 consumer group before it goes to %%DLQ%%<group> (RocketMQ's retryMaxTimes 16, plus the first)", int, minimum=1)
    add_check_settings(p)
    add_auth_settings(p)
    add_metrics_settings(p)
    add_frames_setting(p)
    add_process_settings(p)
    return p


def _host(address: str) -> str:
    return address.rsplit(":", 1)[0].strip("[]")


def _machine_address(address: str) -> str:
    """`address` with a wildcard host (listen on every address) replaced by this machine's
    address, as RocketMQ's brokerIP1: what the router and clients dial must be a real one."""
    if _host(address) not in WILDCARDS:
        return address
    return format_host_port(socket.gethostbyname(socket.gethostname()), split_host_port(address)[1])


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.advertise:
        args.advertise = _machine_address(args.bind)
    if isinstance(args.router, str):  # the default, not converted
        args.router = _router_list(args.router)
    args.remoting_bind = remoting_bind(parser, args, REMOTING_PORT)
    if not args.remoting_advertise and args.remoting_bind:
        # Behind the address others dial this broker at (--advertise), the remoting port is
        # reached the same way: on that host, unless it listens on another host of its own.
        on_bind_host = _host(args.remoting_bind) in (_host(args.bind), *WILDCARDS)
        host = _host(args.advertise) if on_bind_host else _host(args.remoting_bind)
        args.remoting_advertise = format_host_port(host, args.remoting_bind.rsplit(":", 1)[-1])
    if args.remoting_bind and args.remoting_advertise.rsplit(":", 1)[-1] in ("0", ""):
        parser.error("--remoting-bind/--remoting-advertise: give a port (not 0): brokers announce it to the NameServer and write it in offsetMsgIds")
    # Which setting the store host comes from: a name that does not resolve is reported under it.
    args.store_host_flag = "--store-host [env QUARRY_STORE_HOST]"
    if not args.store_host:
        args.store_host = args.remoting_advertise or args.advertise
        args.store_host_flag = ("--remoting-advertise [env QUARRY_COMMITLOG_REMOTING_ADVERTISE]" if args.remoting_advertise else
                                "--advertise [env QUARRY_COMMITLOG_ADVERTISE]")
        if args.remoting_advertise and _host(args.remoting_advertise) == _host(args.advertise):
            args.store_host_flag = "--advertise [env QUARRY_COMMITLOG_ADVERTISE] (the remoting address's host)"
    return args
