"""The store's append alone, in process (no gRPC, no event loop): the main thread's CPU per
message for 1 KiB messages as the quarry.v1 door hands them over (protobuf MessageInput), in
batches of 500 (one topic), turns of 16 independent sends, and single sends. Thread CPU time,
which other load on the shared machine disturbs far less than a rate; median of `--rounds`.

`.venv/bin/python -m bench append [--rounds N] [--messages N] [--dir /dev/shm]`
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from bench.runner import Result
from quarry.services.commitlog.storage.store import CommitLogStore, StoreConfig
from quarry.v1 import common_pb2

BODY = b"x" * 1024
PEER = ("127.0.0.1", 50000)  # the caller's address, as the door passes it
LOADS = {"batch of 500": (500, False), "turn of 16": (16, True), "single": (1, False)}


def _msg(i: int, tags: str) -> common_pb2.MessageInput:
    return common_pb2.MessageInput(topic="BenchTopic", body=BODY, keys=[f"order-{i}"], unique_key=f"{i:032X}", queue_id=-1, tags=tags)


def _round(root: Path, size: int, independent: bool, messages: int) -> float:
    """CPU seconds of the appending thread per message, for one fresh store."""
    groups = [[_msg(g * size + i, f"tag{(g * size + i) % 8}") for i in range(size)] for g in range(max(1, 4096 // size))]
    store = CommitLogStore(StoreConfig(store_dir=root, segment_size=64 << 20, flush_interval_ms=200))
    try:
        for g in groups[:8]:  # warm up: buffers, queue files, tag codes
            store.append_many(g, same_topic=not independent, peer=PEER, independent=independent)
        calls = messages // size
        t0 = time.thread_time()
        for c in range(calls):
            store.append_many(groups[c % len(groups)], same_topic=not independent, peer=PEER, independent=independent)
        return (time.thread_time() - t0) / (calls * size)
    finally:
        store.close()


def run(argv: list[str]) -> list[Result]:
    p = argparse.ArgumentParser(prog="python -m bench append")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--messages", type=int, default=50_000, help="messages per round and load")
    p.add_argument("--dir", default=None, help="where the stores go (/dev/shm: without the disk's noise)")
    args = p.parse_args(argv)
    figs: dict[str, list[float]] = {name: [] for name in LOADS}
    with tempfile.TemporaryDirectory(prefix="quarry-bench-append-", dir=args.dir) as tmp:
        for r in range(args.rounds):  # loads interleaved, so a burst of load falls on all alike
            for name, (size, independent) in LOADS.items():
                figs[name].append(_round(Path(tmp) / f"{r}-{size}", size, independent, args.messages))
    return [Result(f"append CPU per message, {name}", statistics.median(v) * 1e6, "us",
                   {"body_bytes": 1024, "rounds": args.rounds, "spread": [round(min(v) * 1e6, 2), round(max(v) * 1e6, 2)]})
            for name, v in figs.items()]
