"""Query latency through the router over three brokers holding N messages, and queries/s
with concurrent clients.

`.venv/bin/python -m bench router [--messages N] [--queries N] [--clients N]`
"""
from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable

import grpc

from bench.runner import Result
from quarry.formats.unique_key import UniqueKeyGenerator
from quarry.v1 import commitlog_pb2, commitlog_pb2_grpc, common_pb2, router_pb2, router_pb2_grpc
from scripts.launcher import LocalCluster

TOPIC = "BenchTopic"
HOSTS = {"broker-a": "127.0.0.2", "broker-b": "127.0.0.3", "broker-c": "127.0.0.4"}


def _pct(values: list[float], p: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(len(values) * p))]


def _load(cluster: LocalCluster, messages: int, batch: int) -> list[tuple[str, str, str, str, int, int]]:
    """Send `messages` spread over the brokers; returns (broker, key, uniq, offsetMsgId, queue, queue offset) samples."""
    from datetime import timezone

    gen = UniqueKeyGenerator("10.0.0.1", 4242, 7, timezone.utc)
    samples: list[tuple[str, str, str, str, int, int]] = []
    names = list(cluster.brokers)

    def worker(name: str, start: int, stop: int) -> None:
        addr = cluster.brokers[name].commitlog.address
        with grpc.insecure_channel(addr, options=[("grpc.max_send_message_length", 128 << 20)]) as ch:
            stub = commitlog_pb2_grpc.CommitLogServiceStub(ch)
            for s in range(start, stop, batch):
                msgs = [common_pb2.MessageInput(topic=TOPIC, body=b"x" * 256, keys=[f"order-{i}"], unique_key=gen.next_id(), queue_id=(i // batch) % 4) for i in range(s, min(stop, s + batch))]
                results = stub.SendBatch(commitlog_pb2.SendBatchRequest(messages=msgs), timeout=60).results
                r, m = results[0], msgs[0]
                samples.append((name, m.keys[0], m.unique_key, r.offset_msg_id, r.queue_id, r.queue_offset))

    per = messages // len(names)
    threads = [threading.Thread(target=worker, args=(n, i * per, (i + 1) * per)) for i, n in enumerate(names)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return samples


def run(argv: list[str]) -> list[Result]:
    p = argparse.ArgumentParser(prog="python -m bench router")
    p.add_argument("--messages", type=int, default=1_000_000)
    p.add_argument("--queries", type=int, default=2000, help="queries per kind for latency")
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--seconds", type=float, default=10.0, help="duration of the concurrent run")
    args = p.parse_args(argv)
    out: list[Result] = []
    with tempfile.TemporaryDirectory(prefix="quarry-bench-") as tmp:
        cluster = LocalCluster(root=Path(tmp), indexer_args=["--index-num", str(max(1000, args.messages))])
        try:
            cluster.start_router()
            for name, host in HOSTS.items():
                cluster.add_broker(name, host)
            t0 = time.perf_counter()
            samples = _load(cluster, args.messages, 500)
            cluster.wait_indexed(timeout_s=1800)
            load_s = time.perf_counter() - t0
            params = {"messages": args.messages, "brokers": 3}
            out.append(Result("load: sent and indexed", args.messages / load_s, "msg/s", params))
            rng = random.Random(1)
            assert cluster.router is not None
            kinds: dict[str, Callable[[router_pb2_grpc.QueryRouterServiceStub, tuple], object]] = {
                "by id": lambda s, x: s.QueryMsgById(router_pb2.QueryMsgByIdRequest(offset_msg_id=x[3]), timeout=10),
                "by key": lambda s, x: s.QueryMsgByKey(router_pb2.QueryMsgByKeyRequest(topic=TOPIC, key=x[1]), timeout=10),
                "by unique key": lambda s, x: s.QueryMsgByUniqueKey(router_pb2.QueryMsgByUniqueKeyRequest(topic=TOPIC, unique_key=x[2]), timeout=10),
                "by queue offset": lambda s, x: s.QueryMsgByOffset(router_pb2.QueryMsgByOffsetRequest(topic=TOPIC, broker_name=x[0], queue_id=x[4], queue_offset=x[5]), timeout=10),
            }
            with grpc.insecure_channel(cluster.router.address) as ch:
                stub = router_pb2_grpc.QueryRouterServiceStub(ch)
                for kind, call in kinds.items():
                    for x in samples[:50]:
                        call(stub, x)  # warm up channels
                    lat = []
                    for _ in range(args.queries):
                        x = rng.choice(samples)
                        t = time.perf_counter()
                        res = call(stub, x)
                        lat.append((time.perf_counter() - t) * 1000)
                        assert res.result.messages, kind  # type: ignore[attr-defined]
                    out.append(Result(f"{kind} p50", statistics.median(lat), "ms", {**params, "clients": 1}))
                    out.append(Result(f"{kind} p99", _pct(lat, 0.99), "ms", {**params, "clients": 1}))
            counts: list[int] = []
            stop = threading.Event()

            def client(seed: int) -> None:
                r = random.Random(seed)
                n = 0
                with grpc.insecure_channel(cluster.router.address) as ch:  # type: ignore[union-attr]
                    s = router_pb2_grpc.QueryRouterServiceStub(ch)
                    calls = list(kinds.values())
                    while not stop.is_set():
                        calls[n % len(calls)](s, r.choice(samples))
                        n += 1
                counts.append(n)

            threads = [threading.Thread(target=client, args=(i,)) for i in range(args.clients)]
            t0 = time.perf_counter()
            for t in threads:
                t.start()
            stop.wait(args.seconds)
            stop.set()
            for t in threads:
                t.join()
            out.append(Result("mixed queries/s", sum(counts) / (time.perf_counter() - t0), "queries/s", {**params, "clients": args.clients, "mix": "id/key/uniq/offset"}))
        finally:
            cluster.stop()
    return out
