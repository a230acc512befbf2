"""RocketMQ 5 SimpleConsumer path, next to the send figures of `bench rmq5`: the official Python
SDK receiving (batches of 32) and acking every message (each ack durable: one journal fsync,
group-committed), against the same run's baseline of quarry.v1 PullMessages reading the same
messages 32 at a time (the store read with no consumer state); and send→receive latency: a
consumer long-polls while the SDK producer sends one message at a time, latency from the start
of the send to the message in the consumer's hands, beside the send's own latency.

`.venv/bin/python -m bench rmq5_consume [--messages N] [--latency-samples N]`
1 KiB bodies, ASYNC flush, router + one broker on loopback.
"""
from __future__ import annotations

import argparse
import logging
import statistics
import tempfile
import threading
import time
from pathlib import Path

from bench.runner import Result
from quarry.channels import open_channel
from quarry.v1 import commitlog_pb2, commitlog_pb2_grpc
from scripts.launcher import LocalCluster

BODY = b"x" * 1024
TOPIC = "BenchConsume"
LAT_TOPIC = "BenchConsumeLatency"


def _pct(values: list[float], p: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(len(values) * p))]


def run(argv: list[str]) -> list[Result]:
    p = argparse.ArgumentParser(prog="bench rmq5_consume")
    p.add_argument("--messages", type=int, default=3000)
    p.add_argument("--latency-samples", type=int, default=300)
    args = p.parse_args(argv)
    logging.getLogger("rocketmq-python-client").setLevel(logging.WARNING)
    from rocketmq import ClientConfiguration, Credentials, FilterExpression, Message, Producer, SimpleConsumer

    n = args.messages
    params = {"body_bytes": 1024, "messages": n, "flush_mode": "ASYNC", "brokers": 1, "batch": 32}
    with tempfile.TemporaryDirectory() as tmp:
        cluster = LocalCluster(root=Path(tmp), commitlog_args=["--segment-size", str(512 << 20), "--default-queues", "4"])
        try:
            cluster.start_router(host="127.0.0.73")
            broker = cluster.add_broker("broker-a", "127.0.0.74")
            assert cluster.router is not None
            config = ClientConfiguration(cluster.router.address, Credentials(), request_timeout=10)
            producer = Producer(config, (TOPIC, LAT_TOPIC))
            producer.startup()
            try:
                def message(topic: str) -> Message:
                    m = Message()
                    m.topic, m.body, m.tag = topic, BODY, "bench"
                    return m

                futures = [producer.send_async(message(TOPIC)) for _ in range(n)]
                for f in futures:
                    f.result(timeout=120)
                producer.send(message(LAT_TOPIC))  # the topic exists before the consumer polls it

                # Baseline: quarry.v1 PullMessages over every queue, 32 at a time.
                with open_channel(broker.commitlog.address) as ch:
                    stub = commitlog_pb2_grpc.CommitLogServiceStub(ch)
                    t0 = time.perf_counter()
                    pulled = 0
                    for q in range(4):
                        offset = 0
                        while True:
                            r = stub.PullMessages(commitlog_pb2.PullMessagesRequest(topic=TOPIC, queue_id=q, queue_offset=offset, max_count=32))
                            if not r.messages:
                                break
                            pulled += len(r.messages)
                            offset = r.next_queue_offset
                    pull_rate = pulled / (time.perf_counter() - t0)

                consumer = SimpleConsumer(config, "BenchGroup", {TOPIC: FilterExpression("*")}, await_duration=2)
                consumer.startup()
                try:
                    got = 0
                    t0 = time.perf_counter()
                    receive_s = 0.0
                    while got < n:
                        s = time.perf_counter()
                        batch = consumer.receive(32, 60)
                        receive_s += time.perf_counter() - s
                        for m in batch:
                            consumer.ack(m)
                        got += len(batch)
                    elapsed = time.perf_counter() - t0
                    consume_rate = got / elapsed
                    receive_only = got / receive_s
                finally:
                    consumer.shutdown()

                # Latency: a long-polling consumer, one send at a time.
                lat_consumer = SimpleConsumer(config, "BenchLatency", {LAT_TOPIC: FilterExpression("*")}, await_duration=5)
                lat_consumer.startup()
                sent_at: dict[str, float] = {}
                seen: list[float] = []
                done = threading.Event()
                total = args.latency_samples

                def consume() -> None:
                    while not done.is_set():
                        for m in lat_consumer.receive(16, 60):
                            now = time.perf_counter()
                            start = next((sent_at[k] for k in m.keys if k in sent_at), None)
                            if start is not None:
                                seen.append((now - start) * 1000)
                            lat_consumer.ack(m)
                        if len(seen) >= total:
                            done.set()

                try:
                    while lat_consumer.receive(16, 60):  # the warm-up message
                        pass
                    worker = threading.Thread(target=consume, daemon=True)
                    worker.start()
                    send_lat = []
                    pace = threading.Event()
                    for i in range(total):
                        m = message(LAT_TOPIC)
                        m.keys = f"lat-{i}"  # the start is recorded under a key the consumer reads back
                        s = time.perf_counter()
                        sent_at[f"lat-{i}"] = s
                        producer.send(m)
                        send_lat.append((time.perf_counter() - s) * 1000)
                        pace.wait(0.01)  # one message at a time, not a burst
                    done.wait(60)
                    done.set()
                    worker.join(15)
                finally:
                    lat_consumer.shutdown()
            finally:
                producer.shutdown()
        finally:
            cluster.stop()
    lat_params = {"body_bytes": 1024, "samples": len(seen), "flush_mode": "ASYNC", "brokers": 1, "long_polling_s": 5}
    return [
        Result("quarry.v1 PullMessages, 32 at a time (baseline)", pull_rate, "msg/s", params),
        Result("SDK SimpleConsumer receive + ack", consume_rate, "msg/s", {**params, "ack": "one durable ack per message"}),
        Result("SDK receive only (time in receive calls)", receive_only, "msg/s", params),
        Result("SDK receive + ack / quarry.v1 pull", consume_rate / pull_rate, "x", params),
        Result("send → receive latency p50", statistics.median(seen), "ms", lat_params),
        Result("send → receive latency p99", _pct(seen, 0.99), "ms", lat_params),
        Result("SDK send latency p50 (same run)", statistics.median(send_lat), "ms", lat_params),
    ]
