"""IndexFile put rate and select latency against SQLite doing the same work, side by side,
plus index lag while the commitlog takes batched sends.

Also the rate of IndexStore.index_records (what the tailer calls: two names per message, the
key filter's work included: built inline before, by build_pending now), against the same
driver run in other source trees (--baseline-tree git:<revision> or a checkout with its own
`make setup`; see bench.runner.source_tree), rounds interleaved.

`.venv/bin/python -m bench indexer [--keys N] [--selects N] [--lag-messages N] [--only-store] [--only-lag] [--baseline-tree git:REV ...]`
"""
from __future__ import annotations

import argparse
import json
import random
import sqlite3
import statistics
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import grpc

from bench.runner import Result, source_tree, tree_python
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


# Runs in a checkout of any version (only APIs every version has): index `messages` records
# (KEYS + UNIQ_KEY each) into a fresh store and build what the version builds for queries.
_STORE_DRIVER = """
import json, sys, tempfile, time
from pathlib import Path
from quarry.services.indexer.index_store import IndexStore, IndexStoreConfig
messages, index_num, slots = map(int, sys.argv[1:4])
class D:
    __slots__ = ("physical_offset", "topic", "keys", "unique_key", "store_timestamp", "sys_flag")
    def __init__(s, i):
        s.physical_offset, s.topic, s.keys, s.unique_key, s.store_timestamp, s.sys_flag = 1000 * (i + 1), "TopicTest", f"order-{i}", f"{i:032X}", 1_700_000_000_000 + i, 0
batches = [[D(i) for i in range(s, min(messages, s + 500))] for s in range(0, messages, 500)]
try:
    from quarry.services.indexer.filter_builder import build_pending
except ImportError:
    build_pending = None
with tempfile.TemporaryDirectory(prefix="quarry-bench-") as tmp:
    store = IndexStore.open(Path(tmp) / "index", IndexStoreConfig(hash_slot_num=slots, index_num=index_num))
    t0 = time.perf_counter()
    for b in batches:
        store.index_records(b)
    put_s = time.perf_counter() - t0
    if build_pending is not None:
        build_pending(store)
    total_s = time.perf_counter() - t0
    store.close()
print(json.dumps({"keys": 2 * messages, "put_s": put_s, "total_s": total_s}))
"""


def _store_rates(trees: dict[str, Path], messages: int, index_num: int, rounds: int) -> list[Result]:
    """IndexStore.index_records keys/s in each checkout, one run of each per round."""
    got: dict[str, list[float]] = {label: [] for label in trees}
    for _ in range(rounds):
        for label, tree in trees.items():
            cp = subprocess.run([tree_python(tree), "-c", _STORE_DRIVER, str(messages), str(index_num), str(max(1, index_num // 4))],
                                cwd=tree, capture_output=True, text=True, check=True)
            r = json.loads(cp.stdout.strip().splitlines()[-1])
            got[label].append(r["keys"] / r["total_s"])
    params = {"messages": messages, "keys_per_message": 2, "index_num": index_num, "rounds": rounds}
    out = [Result(f"IndexStore put rate, {label}", statistics.median(v), "keys/s", params) for label, v in got.items()]
    this = statistics.median(got["this tree"])
    out += [Result(f"IndexStore put rate this tree / {label}", this / statistics.median(v), "x", params) for label, v in got.items() if label != "this tree"]
    return out


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


class _Watchers:
    """`n` router processes over the broker, each watching the indexer's key presence filter:
    every indexing batch then waits for their acknowledgements, as in a cluster."""

    def __init__(self, root: Path, commitlog: str, indexer: str, n: int) -> None:
        with grpc.insecure_channel(commitlog) as ch:
            stub = commitlog_pb2_grpc.CommitLogServiceStub(ch)
            host = stub.GetStoreStatus(commitlog_pb2.GetStoreStatusRequest(), timeout=10).store_host
            # The topic must exist for a router to ask this broker at all.
            stub.SendMessage(commitlog_pb2.SendMessageRequest(message=common_pb2.MessageInput(topic="TopicTest", body=b"w", keys=["warm-up"], queue_id=0)), timeout=10)
        static = f"broker-a={commitlog},{indexer},{host.ip}:{host.port}"
        self.routers = [ServiceProcess("router", f"127.0.0.1:{free_port()}", ["--static-brokers", static, "--remoting-bind", "off"], root / f"router-{i}.log").start()
                        for i in range(n)]

    def wait_watching(self, timeout_s: float = 60.0) -> None:
        """Until every router rules the broker out for an absent key (its copy is trusted)."""
        from quarry.v1 import router_pb2, router_pb2_grpc

        deadline, pause = time.monotonic() + timeout_s, threading.Event()
        for r in self.routers:
            with grpc.insecure_channel(r.address) as ch:
                stub = router_pb2_grpc.QueryRouterServiceStub(ch)
                while not any(o.ruled_out_by_key_filter for o in stub.QueryMsgByKey(
                        router_pb2.QueryMsgByKeyRequest(topic="TopicTest", key="absent"), timeout=10).result.brokers):
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"router {r.address} did not watch the indexer's key presence")
                    pause.wait(0.05)

    def close(self) -> None:
        for r in self.routers:
            r.stop()


def _lag(root: Path, messages: int, batch: int, rate: float, senders_n: int = 2, watchers: int = 0) -> list[Result]:
    """Send batches (2 keys each: KEYS + UNIQ_KEY) at `rate` msg/s (0: as fast as the
    commitlog takes them) and measure how far the index trails; with `watchers` router
    processes watching the indexer's key presence (each batch waits for their acknowledgements)."""
    cl = ServiceProcess("commitlog", f"127.0.0.1:{free_port()}", ["--store-dir", str(root / "store"), "--segment-size", str(512 << 20)], root / "cl.log").start()
    ix = ServiceProcess("indexer", f"127.0.0.1:{free_port()}", ["--index-dir", str(root / "ix"), "--commitlog", cl.address, "--hash-slots", "5000000", "--index-num", str(messages * 2 + 10)], root / "ix.log").start()
    lags: list[float] = []
    stop = threading.Event()
    watching = _Watchers(root, cl.address, ix.address, watchers) if watchers else None
    try:
        if watching is not None:
            watching.wait_watching()
        with grpc.insecure_channel(cl.address, options=[("grpc.max_send_message_length", 128 << 20)]) as cch, grpc.insecure_channel(ix.address) as ich:
            cstub = commitlog_pb2_grpc.CommitLogServiceStub(cch)
            istub = indexer_pb2_grpc.IndexerServiceStub(ich)

            def sample() -> None:
                while not stop.is_set():
                    st = istub.GetIndexStatus(indexer_pb2.GetIndexStatusRequest(), timeout=5)
                    cst = cstub.GetStoreStatus(commitlog_pb2.GetStoreStatusRequest(), timeout=5)
                    if st.index_last_update_timestamp:
                        # Behind since sending began at the earliest (a warm-up record is older).
                        behind_since = max(st.index_last_update_timestamp, started_ms)
                        lags.append(max(0, time.time() * 1000 - behind_since) if st.checkpoint_offset < cst.max_offset else 0.0)
                    stop.wait(0.2)

            sampler = threading.Thread(target=sample)
            # Batches are built before the clock starts: the producer's own cost is not measured here.
            batches = [
                commitlog_pb2.SendBatchRequest(messages=[common_pb2.MessageInput(topic="TopicTest", body=b"x" * 1024, keys=[f"order-{i}"], unique_key=f"{i:032X}", queue_id=(start // batch) % 4) for i in range(start, min(messages, start + batch))])
                for start in range(0, messages, batch)
            ]
            started_ms = time.time() * 1000
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
        if watching is not None:
            watching.close()
        ix.stop()
        cl.stop()
    params = {"messages": messages, "keys_per_message": 2, "batch": batch, "senders": senders_n, "target_rate": rate or "max", "presence_watchers": watchers}
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


def _lag_runs(root: Path, args: argparse.Namespace) -> list[Result]:
    """Paced and flat out, each without and with three routers watching the indexer's key presence."""
    return [r for rate in (args.lag_rate, 0) for w in (0, 3)
            for r in _lag(root / f"{rate or 'max'}-{w}", args.lag_messages, args.batch, rate, watchers=w)]


def run(argv: list[str]) -> list[Result]:
    p = argparse.ArgumentParser(prog="python -m bench indexer")
    p.add_argument("--keys", type=int, default=1_000_000)
    p.add_argument("--selects", type=int, default=20_000)
    p.add_argument("--lag-messages", type=int, default=300_000)
    p.add_argument("--batch", type=int, default=500)
    p.add_argument("--lag-rate", type=float, default=50_000, help="paced send rate of the lag test (msg/s); a second run goes flat out")
    p.add_argument("--baseline-tree", action="append", default=[], help="git:<revision> or another checkout (with its .venv) whose IndexStore put rate is measured in the same rounds")
    p.add_argument("--store-messages", type=int, default=300_000)
    p.add_argument("--store-rounds", type=int, default=5)
    p.add_argument("--only-store", action="store_true", help="only the IndexStore put rates (A/B against --baseline-tree)")
    p.add_argument("--only-lag", action="store_true", help="only the lag runs, each without and with key presence watchers")
    args = p.parse_args(argv)
    trees = {"this tree": Path(__file__).resolve().parent.parent}
    for spec in args.baseline_tree:
        tree = source_tree(spec)
        rev = subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
        trees[rev] = tree
    # RocketMQ's 20 M entries per file (the filter's matrix at full size), then small files
    # (100 k entries) so that files fill and their filters are built within the run.
    if args.only_lag:
        with tempfile.TemporaryDirectory(prefix="quarry-bench-") as tmp:
            return _lag_runs(Path(tmp), args)
    store_rates = [r for n in (20_000_000, 100_001) for r in _store_rates(trees, args.store_messages, n, args.store_rounds)]
    if args.only_store:
        return store_rates
    rng = random.Random(7)
    selects = [rng.randrange(args.keys) for _ in range(args.selects)]
    base = 1_700_000_000_000
    out: list[Result] = list(store_rates)
    with tempfile.TemporaryDirectory(prefix="quarry-bench-") as tmp:
        root = Path(tmp)
        out += _index_file(root, args.keys, selects, base)
        out += _sqlite(root, args.keys, selects, base)
        out += _lag_runs(root, args)
    by = {r.metric: r.value for r in out}
    out.append(Result("put rate IndexFile / SQLite", by["IndexFile put rate"] / by["SQLite put rate"], "x", {"target": ">= 1"}))
    out.append(Result("select p50 IndexFile / SQLite", by["IndexFile select p50"] / by["SQLite select p50"], "x", {"target": "<= 2"}))
    return out
