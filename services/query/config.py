"""Settings of the query router (flags, else environment, else defaults)."""
from __future__ import annotations

import argparse

from quarry.services.remoting.server import add_limit_settings
from quarry.services.rmq5.auth import add_auth_settings
from quarry.services.settings import EnvArgumentParser, add_process_settings, add_remoting_settings, remoting_bind, add_metrics_settings


NAMESERVER_PORT = 9877  # the remoting port's default, on the --bind host (9876 is the router's gRPC port)


def build_parser() -> EnvArgumentParser:
    p = EnvArgumentParser(prog="quarry-router", description="Quarry query router: broker registry, routes and the four queries.")
    p.add_setting("--bind", "QUARRY_ROUTER_BIND", "127.0.0.1:9876", "host:port to listen on")
    p.add_setting("--heartbeat-interval-ms", "QUARRY_HEARTBEAT_INTERVAL_MS", 3000, "expected broker heartbeat interval", int, minimum=100)
    p.add_setting("--missed-heartbeats", "QUARRY_MISSED_HEARTBEATS", 3, "heartbeats a broker may miss before it leaves the routes and is reported missing", int, minimum=1)
    p.add_setting("--forget-missing-after-ms", "QUARRY_FORGET_MISSING_AFTER_MS", 0, "how long a missing broker stays reported (queries incomplete, clusterList shows it) before it is forgotten; 0: until unregistered", int, minimum=0)
    p.add_setting("--static-brokers", "QUARRY_STATIC_BROKERS", "", "brokers known at start: name=commitlog_addr,indexer_addr,store_host;...")
    p.add_setting("--query-timeout-ms", "QUARRY_QUERY_TIMEOUT_MS", 3000, "overall deadline of a query", int, minimum=1)
    p.add_setting("--broker-call-timeout-ms", "QUARRY_BROKER_CALL_TIMEOUT_MS", 1000, "deadline of one call to a broker", int, minimum=1)
    p.add_setting("--clock-skew-ms", "QUARRY_CLOCK_SKEW_MS", 3_600_000, "producer/broker clock skew tolerated by unique-key queries", int, minimum=0)
    p.add_setting("--fallback-window-ms", "QUARRY_FALLBACK_WINDOW_MS", 7 * 24 * 3_600_000, "window searched when a unique key's time cannot be trusted", int, minimum=1)
    p.add_setting("--read-bodies-from", "QUARRY_READ_BODIES_FROM", "indexer", "key and unique-key queries: the indexers answer with the records they read from their commitlogs (indexer), or with offsets and the router reads the records from each commitlog (commitlog); the answers are the same", choices=("indexer", "commitlog"))
    p.add_setting("--key-presence", "QUARRY_KEY_PRESENCE", "on", "key and unique-key queries ask only the brokers whose key presence filter (kept current by each indexer) may hold the key (on), or every broker holding the topic (off); the answers are the same", choices=("on", "off"))
    p.add_setting("--max-message-size", "QUARRY_MAX_MESSAGE_SIZE", 4 * 1024 * 1024, "largest body, announced to RocketMQ 5 SDKs (set it as the commitlogs')", int, minimum=1)
    add_auth_settings(p)
    add_remoting_settings(p, "QUARRY_ROUTER_REMOTING_BIND", NAMESERVER_PORT, "the RocketMQ 4 NameServer (remoting) port, the -n of RocketMQ 4 clients")
    add_limit_settings(p)
    add_metrics_settings(p)
    add_process_settings(p)
    return p


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.remoting_bind = remoting_bind(parser, args, NAMESERVER_PORT)
    return args
