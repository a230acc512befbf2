"""Send rate over RocketMQ 4 remoting (the ali-ons npm producer, a Python remoting sender)
against the quarry.v1 gRPC send, same broker, same run: 1 KiB bodies with a key and a tag,
one send at a time per client (the way a 4.x producer's `send` works), plus the Python
sender with requests pipelined on one connection.

`.venv/bin/python -m bench remoting [--count N] [--pipeline N]` (ali-ons from `make node-clients`)
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path

from bench.runner import Result
from scripts.launcher import LocalCluster
from quarry.services.remoting import codes
from tests.remoting_client import RemotingClient
from quarry.v1 import commitlog_pb2, commitlog_pb2_grpc, common_pb2
from quarry.channels import open_channel

BODY = b"x" * 1024
NODE_DIR = Path(__file__).resolve().parent.parent / "tests" / "node"


def _grpc_rate(addr: str, count: int) -> float:
    with open_channel(addr) as ch:
        stub = commitlog_pb2_grpc.CommitLogServiceStub(ch)

        def send(i: int) -> None:
            m = common_pb2.MessageInput(topic="BenchGrpc", body=BODY, keys=[f"order-{i}"], tags="TagA", queue_id=-1)
            stub.SendMessage(commitlog_pb2.SendMessageRequest(message=m), timeout=10)
        for i in range(100):
            send(i)
        t0 = time.perf_counter()
        for i in range(count):
            send(i)
        return count / (time.perf_counter() - t0)


async def _remoting_rate(addr: str, count: int, in_flight: int) -> float:
    async with RemotingClient(addr) as client:
        async def send(i: int) -> None:
            fields = {"a": "bench", "b": "BenchRemoting", "c": "TBW102", "d": 4, "e": i % 4, "f": 0, "g": int(time.time() * 1000),
                      "h": 0, "i": f"KEYS\x01order-{i}\x02TAGS\x01TagA", "j": 0, "k": False}
            r = await client.call(codes.SEND_MESSAGE_V2, fields, BODY)
            assert r.code == codes.SUCCESS, r.remark
        for i in range(100):
            await send(i)
        t0 = time.perf_counter()
        sem = asyncio.Semaphore(in_flight)

        async def one(i: int) -> None:
            async with sem:
                await send(i)
        await asyncio.gather(*(one(i) for i in range(count)))
        return count / (time.perf_counter() - t0)


def _ons_rate(namesrv: str, count: int) -> float:
    env = {**os.environ, "NAMESRV_ADDR": namesrv, "ONS_TOPIC": "BenchOns", "ONS_COUNT": str(count), "ONS_BODY_BYTES": str(len(BODY))}
    out = subprocess.run(["node", str(NODE_DIR / "ons_send_rate.js")], env=env, capture_output=True, text=True, timeout=600, cwd=NODE_DIR, check=True)
    data = json.loads(out.stdout.strip().splitlines()[-1])
    return data["messages"] / data["seconds"]


def _create_topic(addr: str, topic: str) -> None:
    async def main() -> None:
        async with RemotingClient(addr) as c:
            r = await c.call(codes.UPDATE_AND_CREATE_TOPIC, {"topic": topic, "readQueueNums": 4, "writeQueueNums": 4, "perm": 6})
            assert r.code == codes.SUCCESS, r.remark
    asyncio.run(main())


def run(argv: list[str]) -> list[Result]:
    p = argparse.ArgumentParser(prog="bench remoting")
    p.add_argument("--count", type=int, default=3000)
    p.add_argument("--pipeline", type=int, default=32)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        cluster = LocalCluster(root=Path(tmp))
        try:
            cluster.start_router()
            broker = cluster.add_broker("broker-a", "127.0.0.1")
            assert cluster.router is not None
            _create_topic(broker.commitlog.remoting_address, "BenchOns")
            from quarry.clients.admin import AdminClient
            with AdminClient(cluster.router.address) as admin:
                deadline = time.monotonic() + 30
                while "BenchOns" not in admin.topics() and time.monotonic() < deadline:
                    time.sleep(0.05)
            grpc_rate = _grpc_rate(broker.commitlog.address, args.count)
            remoting_rate = asyncio.run(_remoting_rate(broker.commitlog.remoting_address, args.count, 1))
            pipelined = asyncio.run(_remoting_rate(broker.commitlog.remoting_address, args.count, args.pipeline))
            ons_rate = _ons_rate(cluster.router.remoting_address, args.count)
        finally:
            cluster.stop()
    params = {"messages": args.count, "body_bytes": len(BODY), "flush_mode": "ASYNC", "in_flight": 1}
    return [
        Result("quarry.v1 SendMessage (Python gRPC), baseline", grpc_rate, "msg/s", params),
        Result("remoting SEND_MESSAGE_V2 (Python sender)", remoting_rate, "msg/s", params),
        Result("remoting SEND_MESSAGE_V2 (ali-ons producer)", ons_rate, "msg/s", params),
        Result("remoting SEND_MESSAGE_V2 (Python sender, pipelined)", pipelined, "msg/s", {**params, "in_flight": args.pipeline}),
        Result("Python remoting sender / quarry.v1", remoting_rate / grpc_rate, "x", params),
        Result("ali-ons / quarry.v1", ons_rate / grpc_rate, "x", params),
    ]
