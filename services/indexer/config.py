"""Settings of the indexer service (flags, else environment, else defaults)."""
from __future__ import annotations

import argparse

from quarry.services.settings import EnvArgumentParser, add_frames_setting, add_process_settings, parse_bool, add_metrics_settings


def build_parser() -> EnvArgumentParser:
    p = EnvArgumentParser(prog="quarry-indexer", description="RocketMQ IndexFiles for one broker, kept current from its commitlog.")
    p.add_setting("--bind", "QUARRY_INDEXER_BIND", "127.0.0.1:10921", "host:port to listen on")
    p.add_setting("--index-dir", "QUARRY_INDEX_DIR", "./var/index", "directory holding index/ and the checkpoint")
    p.add_setting("--commitlog", "QUARRY_COMMITLOG_ADDR", "127.0.0.1:10911", "this broker's commitlog address")
    p.add_setting("--commitlog-store-dir", "QUARRY_COMMITLOG_STORE_DIR", "", "this broker's commitlog --store-dir, when on this host: key queries read the records from its segment files instead of calling the commitlog (one hop less); records not read cleanly there are still asked of the commitlog. Empty: always ask the commitlog")
    p.add_setting("--broker-name", "QUARRY_BROKER_NAME", "broker-a", "broker name")
    p.add_setting("--hash-slots", "QUARRY_INDEX_HASH_SLOTS", 5_000_000, "hash slots per IndexFile", int, minimum=1)
    p.add_setting("--index-num", "QUARRY_INDEX_NUM", 20_000_000, "entries per IndexFile (holds index-num - 1)", int, minimum=2)
    p.add_setting("--max-msgs-num-batch", "QUARRY_INDEX_MAX_NUM", 64, "cap on max_num of a query", int, minimum=1)
    p.add_setting("--max-files", "QUARRY_INDEX_MAX_FILES", 256, "cap on IndexFiles kept; the oldest is dropped beyond it (0: no cap)", int, minimum=0)
    p.add_setting("--flush-interval-ms", "QUARRY_INDEX_FLUSH_INTERVAL_MS", 1000, "how often index + checkpoint are flushed", int, minimum=1)
    p.add_setting("--read-only", "QUARRY_READ_ONLY", False, "open index/ read-only and do not tail", parse_bool)
    p.add_setting("--follow-index", "QUARRY_INDEX_FOLLOW", False, "answer from a running RocketMQ broker's own IndexFiles (--index-dir: the broker's store root, holding index/): read-only, no Tail, re-read every --follow-interval-ms", parse_bool)
    p.add_setting("--follow-interval-ms", "QUARRY_INDEX_FOLLOW_INTERVAL_MS", 200, "--follow-index: how often the broker's IndexFiles are looked at again", int, minimum=10)
    add_metrics_settings(p)
    add_frames_setting(p)
    add_process_settings(p)
    return p


def parse_args(argv: list[str]) -> argparse.Namespace:
    # The indexer does not register with the router: its commitlog's heartbeat carries the
    # indexer's address (commitlog --indexer-addr).
    args = build_parser().parse_args(argv)
    if args.follow_index:
        args.read_only = True  # the broker's files: never written
    return args
