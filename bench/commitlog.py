"""Commitlog send throughput and latency, 1 KiB messages, ASYNC vs SYNC, on a real process.

`.venv/bin/python -m bench commitlog [--single N] [--batches N] [--batch-size N] [--clients N] [--rounds N]`
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable

import grpc

from bench.runner import Result
from quarry.v1 import commitlog_pb2, commitlog_pb2_grpc, common_pb2
from scripts.launcher import ServiceProcess, free_port

BODY = b"x" * 1024


def _msg(i: int) -> common_pb2.MessageInput:
    return common_pb2.MessageInput(topic="BenchTopic", body=BODY, keys=[f"order-{i}"], unique_key=f"{i:032X}", queue_id=-1)


def _pct(values: list[float], p: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(len(values) * p))]


def _concurrent_rate(worker: Callable[[int, list[int]], None], n: int, clients: int) -> float:
    """Run `clients` workers at once; items they report per second of wall time."""
    done: list[int] = []
    threads = [threading.Thread(target=worker, args=(n, done)) for _ in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(done) / (time.perf_counter() - t0)


def _run_mode(mode: str, args: argparse.Namespace, root: Path) -> list[Result]:
    proc = ServiceProcess("commitlog", f"127.0.0.1:{free_port()}", ["--store-dir", str(root / mode), "--flush-mode", mode, "--segment-size", str(256 << 20)], root / f"{mode}.log").start()
    results: list[Result] = []
    try:
        params = {"flush_mode": mode, "body_bytes": 1024}
        # Single-message sends: one client, sequential, for latency; then N clients for calls/s.
        with grpc.insecure_channel(proc.address) as ch:
            stub = commitlog_pb2_grpc.CommitLogServiceStub(ch)
            for i in range(200):
                stub.SendMessage(commitlog_pb2.SendMessageRequest(message=_msg(i)), timeout=10)
            lat = []
            for i in range(args.single):
                t0 = time.perf_counter()
                stub.SendMessage(commitlog_pb2.SendMessageRequest(message=_msg(i)), timeout=10)
                lat.append((time.perf_counter() - t0) * 1000)
        results.append(Result("single send p50 latency", statistics.median(lat), "ms", {**params, "clients": 1}))
        results.append(Result("single send p99 latency", _pct(lat, 0.99), "ms", {**params, "clients": 1}))
        results.append(Result("single send calls/s (1 client)", len(lat) / (sum(lat) / 1000), "calls/s", {**params, "clients": 1}))

        def single_worker(n: int, out: list[int]) -> None:
            with grpc.insecure_channel(proc.address) as ch:
                stub = commitlog_pb2_grpc.CommitLogServiceStub(ch)
                for i in range(n):
                    stub.SendMessage(commitlog_pb2.SendMessageRequest(message=_msg(i)), timeout=10)
            out.append(n)

        results.append(Result(f"single send calls/s ({args.clients} clients)", _concurrent_rate(single_worker, args.single, args.clients), "calls/s", {**params, "clients": args.clients}))

        # Batched sends: N clients each sending batches.
        batch = commitlog_pb2.SendBatchRequest(messages=[_msg(i) for i in range(args.batch_size)])

        def batch_worker(n: int, out: list[int]) -> None:
            with grpc.insecure_channel(proc.address, options=[("grpc.max_send_message_length", 128 << 20)]) as ch:
                stub = commitlog_pb2_grpc.CommitLogServiceStub(ch)
                for _ in range(n):
                    stub.SendBatch(batch, timeout=30)
            out.append(n * args.batch_size)

        # Several rounds: on a shared 2-core box one run is noisy; report the median and the slowest.
        rates = [_concurrent_rate(batch_worker, args.batches, args.clients) for _ in range(args.rounds)]
        rate = statistics.median(rates)
        bparams = {**params, "clients": args.clients, "batch_size": args.batch_size, "messages": args.clients * args.batches * args.batch_size, "rounds": args.rounds}
        results.append(Result("batched send messages/s", rate, "msg/s", bparams))
        results.append(Result("batched send messages/s, slowest round", min(rates), "msg/s", bparams))
        results.append(Result("batched send MB/s (bodies)", rate * 1024 / 1e6, "MB/s", bparams))
    finally:
        proc.stop()
    return results


def run(argv: list[str]) -> list[Result]:
    p = argparse.ArgumentParser(prog="python -m bench commitlog")
    p.add_argument("--single", type=int, default=2000, help="single sends per client")
    p.add_argument("--batches", type=int, default=100, help="batches per client")
    p.add_argument("--batch-size", type=int, default=500)
    p.add_argument("--clients", type=int, default=2)
    p.add_argument("--rounds", type=int, default=5, help="batched rounds; the median is reported")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="quarry-bench-") as tmp:
        out = []
        for mode in ("ASYNC", "SYNC"):
            out += _run_mode(mode, args, Path(tmp))
    by = {(r.metric, r.params["flush_mode"]): r.value for r in out}
    ratio = by[("batched send messages/s", "ASYNC")] / by[("batched send messages/s", "SYNC")]
    out.append(Result("batched ASYNC/SYNC throughput ratio", ratio, "x", {"target": "<= 3"}))
    return out
