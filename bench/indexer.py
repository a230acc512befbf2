"""IndexFile put rate and select latency against SQLite doing the same work, side by side,
plus index lag while the commitlog takes batched sends.

`.venv/bin/python -m bench indexer [--keys N] [--selects N] [--lag-messages N]`
"""
from __future__ import annotations

import argparse
import random
import sqlite3
import statistics
import tempfile
import threading
import time
from pathlib import Path

import grpc

from bench.runner import Result
from quarry.formats.index_file import IndexFile
from quarry.formats.java_hash_batch import index_key_hashes
from quarry.v1 import commitlog_pb2, commitlog_pb2_grpc, common_pb2, indexer_pb2, indexer_pb2_grpc
from scripts.launcher import ServiceProcess, free_port


def _pct(values: list[float], p: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(len(values) * p))]


def _index_file(root: Path, n: int, selects: list[int], base: int) -> list[Result]:
    f = IndexFile(root / "index", 5_000_000, n + 1)
    keys = [(f"TopicTest#order-{i}", i * 1000, base + i) for i in range(n)]
    t0 = time.perf_counter()
    # As the indexer writes: batches of 1024 (one Tail response), hashed together.
    for start in range(0, n, 1024):
        chunk = keys[start:start + 1024]
        f.put_keys([(h, off, ts) for h, (_, off, ts) in zip(index_key_hashes([k for k, _, _ in chunk]), chunk)])
    put_s = time.perf_counter() - t0
    lat = []
    for i in selects:
        t = time.perf_counter()
        got = f.select_phy_offsets(f"TopicTest#order-{i}", 64, 0, 2**62)
        lat.append((time.perf_counter() - t) * 1e6)
        assert i * 1000 in got
    f.close()
    params = {"keys": n, "slots": 5_000_000}
    return [
        Result("IndexFile put rate", n / put_s, "keys/s", {**params, "batch": 1024}),
        Result("IndexFile select p50", statistics.median(lat), "us", params),
        Result("IndexFile select p99", _pct(lat, 0.99), "us", params),
    ]


def _sqlite(root: Path, n: int, selects: list[int], base: int) -> list[Result]:
    db = sqlite3.connect(root / "index.sqlite")
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("CREATE TABLE idx (key TEXT NOT NULL, phy INTEGER NOT NULL, ts INTEGER NOT NULL)")
    db.execute("CREATE INDEX idx_key ON idx (key)")
    rows = [(f"TopicTest#order-{i}", i * 1000, base + i) for i in range(n)]
    t0 = time.perf_counter()
    with db:
        db.executemany("INSERT INTO idx VALUES (?, ?, ?)", rows)
    put_s = time.perf_counter() - t0
    lat = []
    for i in selects:
        t = time.perf_counter()
        got = [r[0] for r in db.execute("SELECT phy FROM idx WHERE key = ? AND ts BETWEEN ? AND ? ORDER BY phy DESC LIMIT 64", (f"TopicTest#order-{i}", 0, 2**62))]
        lat.append((time.perf_counter() - t) * 1e6)
        assert i * 1000 in got
    db.close()
    params = {"keys": n, "journal": "WAL", "one transaction": True}
    return [
        Result("SQLite put rate", n / put_s, "keys/s", params),
        Result("SQLite select p50", statistics.median(lat), "us", params),
        Result("SQLite select p99", _pct(lat, 0.99), "us", params),
    ]


def _lag(root: Path, messages: int, batch: int, rate: float, senders_n: int = 2) -> list[Result]:
    """Send batches (2 keys each: KEYS + UNIQ_KEY) at `rate` msg/s (0: as fast as the
    commitlog takes them) and measure how far the index trails."""
    cl = ServiceProcess("commitlog", f"127.0.0.1:{free_port()}", ["--store-dir", str(root / "store"), "--segment-size", str(512 << 20)], root / "cl.log").start()
    ix = ServiceProcess("indexer", f"127.0.0.1:{free_port()}", ["--index-dir", str(root / "ix"), "--commitlog", cl.address, "--hash-slots", "5000000", "--index-num", str(messages * 2 + 10)], root / "ix.log").start()
    lags: list[float] = []
    stop = threading.Event()
    try:
        with grpc.insecure_channel(cl.address, options=[("grpc.max_send_message_length", 128 << 20)]) as cch, grpc.insecure_channel(ix.address) as ich:
            cstub = commitlog_pb2_grpc.CommitLogServiceStub(cch)
            istub = indexer_pb2_grpc.IndexerServiceStub(ich)

            def sample() -> None:
                while not stop.is_set():
                    st = istub.GetIndexStatus(indexer_pb2.GetIndexStatusRequest(), timeout=5)
                    cst = cstub.GetStoreStatus(commitlog_pb2.GetStoreStatusRequest(), timeout=5)
                    if st.index_last_update_timestamp:
                        lags.append(max(0, time.time() * 1000 - st.index_last_update_timestamp) if st.checkpoint_offset < cst.max_offset else 0.0)
                    stop.wait(0.2)

            sampler = threading.Thread(target=sample)
            # Batches are built before the clock starts: the producer's own cost is not measured here.
            batches = [
                commitlog_pb2.SendBatchRequest(messages=[common_pb2.MessageInput(topic="TopicTest", body=b"x" * 1024, keys=[f"order-{i}"], unique_key=f"{i:032X}", queue_id=(start // batch) % 4) for i in range(start, min(messages, start + batch))])
                for start in range(0, messages, batch)
            ]
            sampler.start()
            t0 = time.perf_counter()

            def sender(k: int) -> None:
                pace = threading.Event()  # never set: a deadline-bounded pause between batches
                with grpc.insecure_channel(cl.address, options=[("grpc.max_send_message_length", 128 << 20)]) as ch:
                    stub = commitlog_pb2_grpc.CommitLogServiceStub(ch)
                    for n in range(k, len(batches), senders_n):
                        if rate:
                            due = t0 + n * batch / rate  # batch n's place in a steady stream
                            if due > time.perf_counter():
                                pace.wait(due - time.perf_counter())
                        stub.SendBatch(batches[n], timeout=60)

            senders = [threading.Thread(target=sender, args=(k,)) for k in range(senders_n)]
            for t in senders:
                t.start()
            for t in senders:
                t.join()
            send_s = time.perf_counter() - t0
            end_offset = cstub.GetStoreStatus(commitlog_pb2.GetStoreStatusRequest(), timeout=5).max_offset
            deadline = time.monotonic() + 300
            pause = threading.Event()
            while istub.GetIndexStatus(indexer_pb2.GetIndexStatusRequest(), timeout=5).checkpoint_offset < end_offset and time.monotonic() < deadline:
                pause.wait(0.05)
            catch_up_s = time.perf_counter() - t0
            stop.set()
            sampler.join()
    finally:
        stop.set()
        ix.stop()
        cl.stop()
    params = {"messages": messages, "keys_per_message": 2, "batch": batch, "senders": senders_n, "target_rate": rate or "max"}
    return [
        Result("send rate during lag test", messages / send_s, "msg/s", params),
        Result("index rate (sent → fully indexed)", messages / catch_up_s, "msg/s", params),
        Result("index lag p50 while sending", statistics.median(lags) if lags else 0.0, "ms", params),
        Result("index lag p99 while sending", _pct(lags, 0.99) if lags else 0.0, "ms", params),
        Result("index lag max while sending", max(lags) if lags else 0.0, "ms", params),
        Result("index catch-up after last send", (catch_up_s - send_s) * 1000, "ms", params),
        # The ceiling of indexing is the rate messages arrive at: 1 means the index keeps up.
        Result("index rate / send rate (its ceiling)", (messages / catch_up_s) / (messages / send_s), "x", params),
    ]


def run(argv: list[str]) -> list[Result]:
    p = argparse.ArgumentParser(prog="python -m bench indexer")
    p.add_argument("--keys", type=int, default=1_000_000)
    p.add_argument("--selects", type=int, default=20_000)
    p.add_argument("--lag-messages", type=int, default=300_000)
    p.add_argument("--batch", type=int, default=500)
    p.add_argument("--lag-rate", type=float, default=50_000, help="paced send rate of the lag test (msg/s); a second run goes flat out")
    args = p.parse_args(argv)
    rng = random.Random(7)
    selects = [rng.randrange(args.keys) for _ in range(args.selects)]
    base = 1_700_000_000_000
    out: list[Result] = []
    with tempfile.TemporaryDirectory(prefix="quarry-bench-") as tmp:
        root = Path(tmp)
        out += _index_file(root, args.keys, selects, base)
        out += _sqlite(root, args.keys, selects, base)
        out += _lag(root / "paced", args.lag_messages, args.batch, args.lag_rate)
        out += _lag(root / "max", args.lag_messages, args.batch, 0)
    by = {r.metric: r.value for r in out}
    out.append(Result("put rate IndexFile / SQLite", by["IndexFile put rate"] / by["SQLite put rate"], "x", {"target": ">= 1"}))
    out.append(Result("select p50 IndexFile / SQLite", by["IndexFile select p50"] / by["SQLite select p50"], "x", {"target": "<= 2"}))
    return out
