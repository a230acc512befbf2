"""Commitlog send throughput and latency, 1 KiB messages, ASYNC vs SYNC, on a real process,
each figure beside the echo ceiling (bench/ceiling.py) taken in the same run.

`.venv/bin/python -m bench commitlog [--single N] [--batches N] [--batch-size N] [--clients N] [--rounds N]`
"""
from __future__ import annotations

import argparse
import asyncio
import tempfile
from pathlib import Path

import grpc

from bench.ceiling import EchoCeiling, Stats, compare, drive, median_run
from bench.rmq5 import lean_rmq5
from bench.runner import Result
from quarry.v1 import commitlog_pb2, commitlog_pb2_grpc, common_pb2
from scripts.launcher import ServiceProcess, free_port

BODY = b"x" * 1024
_OPTIONS = [("grpc.max_send_message_length", 128 << 20), ("grpc.max_receive_message_length", 128 << 20)]


def _msg(i: int) -> common_pb2.MessageInput:
    return common_pb2.MessageInput(topic="BenchTopic", body=BODY, keys=[f"order-{i}"], unique_key=f"{i:032X}", queue_id=-1)


def _batch(size: int) -> commitlog_pb2.SendBatchRequest:
    """A batch as Quarry's producer sends it: answered with compact results (SendResultColumns)."""
    return commitlog_pb2.SendBatchRequest(messages=[_msg(i) for i in range(size)], compact_results=True)


def _sizes(address: str, request: object, method: str) -> int:
    """The serialized size of the answer to one `request` (for the ceiling's response)."""
    with grpc.insecure_channel(address, options=_OPTIONS) as ch:
        stub = commitlog_pb2_grpc.CommitLogServiceStub(ch)
        return getattr(stub, method)(request, timeout=30).ByteSize()  # type: ignore[no-any-return]


def _drive_sends(address: str, concurrency: int, calls: int) -> Stats:
    async def go() -> Stats:
        async with grpc.aio.insecure_channel(address, options=_OPTIONS) as ch:
            stub = commitlog_pb2_grpc.CommitLogServiceStub(ch)
            reqs = [commitlog_pb2.SendMessageRequest(message=_msg(i)) for i in range(256)]
            return await drive(lambda i: stub.SendMessage(reqs[i % 256], timeout=10), calls, concurrency)

    return asyncio.run(go())


def _drive_batches(address: str, batch: commitlog_pb2.SendBatchRequest, concurrency: int, calls: int) -> Stats:
    async def go() -> Stats:
        async with grpc.aio.insecure_channel(address, options=_OPTIONS) as ch:
            stub = commitlog_pb2_grpc.CommitLogServiceStub(ch)
            return await drive(lambda _i: stub.SendBatch(batch, timeout=60), calls, concurrency, warmup=2)

    return asyncio.run(go())


def _rmq5_single(proc: ServiceProcess, args: argparse.Namespace, echo: EchoCeiling) -> list[Result]:
    """RocketMQ 5 SendMessage to the same standalone commitlog as the quarry.v1 rows, 1 and 16
    in flight, from a grpc.aio client as the echo's (bench/rmq5.py's lean client), each round
    beside an echo of the sizes its calls measured; medians of `--rounds` rounds. `bench rmq5`
    measures it again in a cluster, beside the official SDKs."""
    pid = proc.proc.pid  # type: ignore[union-attr]
    out: list[Result] = []
    first = 0
    for c in (1, 16):
        calls = args.single * (1 if c == 1 else 2)
        figs, ceils, cpu = [], [], 0.0
        for _ in range(args.rounds):
            stats, cpu_s, request_bytes, answer_bytes = lean_rmq5(proc.address, calls, c, pid, first=first)
            first += calls + 50  # every send its own message id
            figs.append(stats)
            cpu += cpu_s
            ceils.append(echo.measure(request_bytes, answer_bytes, c, calls))
        params = {"flush_mode": "ASYNC", "body_bytes": 1024, "rounds": args.rounds,
                  "round_ratios": sorted(round(f.rate / e.rate, 3) for f, e in zip(figs, ceils))}
        out += compare("RocketMQ 5 single send", median_run(figs), median_run(ceils), params)
        out.append(Result("RocketMQ 5 single send, commitlog CPU per message", cpu / (args.rounds * calls) * 1e6, "us", {**params, "concurrency": c}))
    return out


def _run_mode(mode: str, args: argparse.Namespace, root: Path, echo: EchoCeiling) -> list[Result]:
    proc = ServiceProcess("commitlog", f"127.0.0.1:{free_port()}", ["--store-dir", str(root / mode), "--flush-mode", mode, "--segment-size", str(256 << 20)], root / f"{mode}.log").start()
    results: list[Result] = []
    try:
        params = {"flush_mode": mode, "body_bytes": 1024}
        single = commitlog_pb2.SendMessageRequest(message=_msg(0))
        resp_bytes = _sizes(proc.address, single, "SendMessage")
        for c in (1, 16):
            calls = args.single * (1 if c == 1 else 2)
            # Ceiling and figure interleaved, twice, so a burst of load on the shared box hits both.
            figs, ceils = [], []
            for _ in range(2):
                figs.append(_drive_sends(proc.address, c, calls))
                ceils.append(echo.measure(single.ByteSize(), resp_bytes, c, calls))
            results += compare("single send", median_run(figs), median_run(ceils), params)
        if mode == "ASYNC":
            results += _rmq5_single(proc, args, echo)
        batch = _batch(args.batch_size)
        batch_resp = _sizes(proc.address, batch, "SendBatch")
        figs, ceils = [], []
        for _ in range(args.rounds):
            figs.append(_drive_batches(proc.address, batch, args.clients, args.batches))
            ceils.append(echo.measure(batch.ByteSize(), batch_resp, args.clients, args.batches))
        bparams = {**params, "batch_size": args.batch_size, "messages": args.batches * args.batch_size, "rounds": args.rounds}
        results += compare("batched send", median_run(figs), median_run(ceils), bparams, unit_scale=args.batch_size, unit="msg/s")
        results.append(Result("batched send msg/s, slowest round", min(s.rate for s in figs) * args.batch_size, "msg/s", {**bparams, "concurrency": args.clients}))
    finally:
        proc.stop()
    return results


def run(argv: list[str]) -> list[Result]:
    p = argparse.ArgumentParser(prog="python -m bench commitlog")
    p.add_argument("--single", type=int, default=2000, help="single sends per run at concurrency 1 (twice that at 16)")
    p.add_argument("--batches", type=int, default=100, help="batches per round")
    p.add_argument("--batch-size", type=int, default=500)
    p.add_argument("--clients", type=int, default=2, help="batches in flight")
    p.add_argument("--rounds", type=int, default=3, help="batched rounds; the median is reported")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="quarry-bench-") as tmp, EchoCeiling() as echo:
        out = []
        for mode in ("ASYNC", "SYNC"):
            out += _run_mode(mode, args, Path(tmp), echo)
    by = {(r.metric, r.params["flush_mode"]): r.value for r in out if "flush_mode" in r.params}
    ratio = by[("batched send rate", "ASYNC")] / by[("batched send rate", "SYNC")]
    out.append(Result("batched ASYNC/SYNC throughput ratio", ratio, "x", {"target": "<= 3"}))
    out.append(Result("batched ASYNC rate vs target 150,000 msg/s", by[("batched send rate", "ASYNC")] / 150_000, "x", {"target": ">= 1"}))
    return out
