"""The commitlog's send path, A/B between source trees in one run: each tree's own commitlog
process (its own .venv), driven by the same client, rounds interleaved (A, B, echo; then B, A,
echo; ...) so load on the shared machine falls on all alike. Besides rate and p50, the server
process's CPU time per message (utime + stime from /proc), which other load disturbs far less
than a rate does.

`.venv/bin/python -m bench commitlog_ab --trees base=git:81ec4de main=. [--cycles N] [--batches N] [--single N]`
(a tree is a checkout with `make setup` done, or `git:<revision>`: see bench.runner.source_tree).
"""
from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import tempfile
from pathlib import Path

import grpc

from bench.ceiling import EchoCeiling, Stats, drive
from bench.commitlog import _OPTIONS, _batch, _msg
from bench.runner import Result, process_cpu_s, source_tree, tree_python, wait_for_commitlog
from quarry.v1 import commitlog_pb2, commitlog_pb2_grpc
from scripts.launcher import free_port


def _start(tree: Path, root: Path) -> tuple[subprocess.Popen[bytes], str]:
    """The tree's commitlog (ASYNC), started with the tree's own interpreter; (process, address)."""
    port = free_port()
    d = root / f"{tree.name}-{port}"
    d.mkdir()
    python = tree_python(tree)
    args = [python, "-m", "quarry.services.commitlog", "--bind", f"127.0.0.1:{port}", "--store-dir", str(d / "store"),
            "--flush-mode", "ASYNC", "--segment-size", str(256 << 20)]
    if "--remoting-bind" in subprocess.run([python, "-m", "quarry.services.commitlog", "--help"], capture_output=True, text=True, cwd=d).stdout:
        args += ["--remoting-bind", f"127.0.0.1:{free_port()}"]  # older trees have no remoting port
    proc = subprocess.Popen(args, cwd=d, stdout=open(d / "log", "wb"), stderr=subprocess.STDOUT)
    address = f"127.0.0.1:{port}"
    wait_for_commitlog(proc, address, d / "log")
    return proc, address


async def _batches(address: str, batch: commitlog_pb2.SendBatchRequest, calls: int) -> Stats:
    async with grpc.aio.insecure_channel(address, options=_OPTIONS) as ch:
        stub = commitlog_pb2_grpc.CommitLogServiceStub(ch)
        return await drive(lambda _i: stub.SendBatch(batch, timeout=60), calls, 2, warmup=2)


async def _singles(address: str, concurrency: int, calls: int) -> Stats:
    async with grpc.aio.insecure_channel(address, options=_OPTIONS) as ch:
        stub = commitlog_pb2_grpc.CommitLogServiceStub(ch)
        reqs = [commitlog_pb2.SendMessageRequest(message=_msg(i)) for i in range(256)]
        return await drive(lambda i: stub.SendMessage(reqs[i % 256], timeout=10), calls, concurrency)


def run(argv: list[str]) -> list[Result]:
    p = argparse.ArgumentParser(prog="python -m bench commitlog_ab")
    p.add_argument("--trees", nargs="+", required=True, help="name=path of each source tree (with its .venv), or name=git:<revision>")
    p.add_argument("--cycles", type=int, default=6)
    p.add_argument("--batches", type=int, default=60, help="batches of --batch-size per round, 2 in flight")
    p.add_argument("--batch-size", type=int, default=500)
    p.add_argument("--single", type=int, default=1000, help="single sends per round at concurrency 1 (twice that at 16)")
    args = p.parse_args(argv)
    trees = {name: source_tree(path) for name, path in (t.split("=", 1) for t in args.trees)}
    batch = _batch(args.batch_size)  # a tree that predates compact_results answers in full
    single = commitlog_pb2.SendMessageRequest(message=_msg(0))
    loads = {"batched send": (args.batches, args.batch_size), "single send c1": (args.single, 1), "single send c16": (args.single * 2, 1)}
    runs: dict[tuple[str, str], list[tuple[Stats, float]]] = {(n, w): [] for n in [*trees, "echo"] for w in loads}
    with tempfile.TemporaryDirectory(prefix="quarry-bench-") as tmp, EchoCeiling() as echo:
        procs = {name: _start(tree, Path(tmp)) for name, tree in trees.items()}
        try:
            with grpc.insecure_channel(next(iter(procs.values()))[1], options=_OPTIONS) as ch:
                stub = commitlog_pb2_grpc.CommitLogServiceStub(ch)
                batch_resp, single_resp = stub.SendBatch(batch).ByteSize(), stub.SendMessage(single).ByteSize()
            for cycle in range(args.cycles):
                order = list(trees) if cycle % 2 == 0 else list(reversed(trees))
                for name in [*order, "echo"]:
                    for what, (calls, per_call) in loads.items():
                        conc = 16 if what.endswith("c16") else (2 if what.startswith("batched") else 1)
                        if name == "echo":
                            req, resp = (batch.ByteSize(), batch_resp) if per_call > 1 else (single.ByteSize(), single_resp)
                            runs[(name, what)].append((echo.measure(req, resp, conc, calls), 0.0))
                            continue
                        proc, address = procs[name]
                        cpu0 = process_cpu_s(proc.pid)
                        s = asyncio.run(_batches(address, batch, calls) if per_call > 1 else _singles(address, conc, calls))
                        warm = 2 if per_call > 1 else 50
                        runs[(name, what)].append((s, (process_cpu_s(proc.pid) - cpu0) / ((calls + warm) * per_call) * 1e6))
        finally:
            for proc, _ in procs.values():
                proc.terminate()
                proc.wait(10)
    out: list[Result] = []
    for what, (calls, per_call) in loads.items():
        echo_rate = statistics.median(s.rate for s, _ in runs[("echo", what)]) * per_call
        for name in trees:
            stats = runs[(name, what)]
            rate = statistics.median(s.rate for s, _ in stats) * per_call
            params = {"tree": name, "cycles": args.cycles, "body_bytes": 1024, "flush_mode": "ASYNC"}
            unit = "msg/s" if per_call > 1 else "calls/s"
            out += [Result(f"A/B {what} rate", rate, unit, params),
                    Result(f"A/B {what} p50", statistics.median(s.p50_ms for s, _ in stats), "ms", params),
                    Result(f"A/B {what} / ceiling", rate / echo_rate, "x", params),
                    Result(f"A/B {what} server CPU per message", statistics.median(c for _, c in stats), "us", params)]
    return out
