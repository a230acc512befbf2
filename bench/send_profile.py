"""Where the commitlog's CPU goes on the send path: the service runs under bench.cpu_sampler
(CPU-time samples of the process) while one fixed load runs, batched sends (2 batches of 500 x
1 KiB in flight) or single sends at concurrency 16; the own-time and inclusive leaders are
written to bench/profiles/send-<load>-commitlog.txt, the top inclusive Quarry functions as rows.

`.venv/bin/python -m bench send_profile [--batches N] [--singles N]`
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc

from bench.ceiling import drive
from bench.commitlog import _OPTIONS, _batch, _msg
from bench.runner import BENCH_DIR, REPO_DIR, Result, wait_for_commitlog
from quarry.v1 import commitlog_pb2, commitlog_pb2_grpc
from scripts.launcher import free_port

PROFILES = BENCH_DIR / "profiles"
TOP = 25


def _profile(load: str, calls: int, root: Path) -> Path:
    raw = root / f"{load}.stacks"
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.cpu_sampler", str(raw), "-m", "quarry.services.commitlog", "--bind", f"127.0.0.1:{port}",
         "--store-dir", str(root / load), "--flush-mode", "ASYNC", "--segment-size", str(1 << 30), "--remoting-bind", f"127.0.0.1:{free_port()}"],
        cwd=REPO_DIR, stdout=open(root / f"{load}.log", "wb"), stderr=subprocess.STDOUT)
    address = f"127.0.0.1:{port}"
    wait_for_commitlog(proc, address, root / f"{load}.log")
    raw.unlink(missing_ok=True)

    async def go() -> None:
        async with grpc.aio.insecure_channel(address, options=_OPTIONS) as ch:
            stub = commitlog_pb2_grpc.CommitLogServiceStub(ch)
            if load == "batched":
                batch = _batch(500)
                await drive(lambda _i: stub.SendBatch(batch, timeout=60), 5, 2, warmup=0)  # warm: imports, first segment
                proc.send_signal(signal.SIGUSR1)  # start-up and warm-up samples are written, then subtracted
                await drive(lambda _i: stub.SendBatch(batch, timeout=60), calls, 2, warmup=0)
            else:
                reqs = [commitlog_pb2.SendMessageRequest(message=_msg(i)) for i in range(256)]
                await drive(lambda i: stub.SendMessage(reqs[i % 256], timeout=10), 500, 16, warmup=0)
                proc.send_signal(signal.SIGUSR1)
                await drive(lambda i: stub.SendMessage(reqs[i % 256], timeout=10), calls, 16, warmup=0)

    asyncio.run(go())
    time.sleep(0.5)
    warm = _read(raw)
    proc.terminate()
    proc.wait(30)
    total = _read(raw)
    total.subtract(warm)
    steady = root / f"{load}.steady"
    steady.write_text("".join(f"{s} {n}\n" for s, n in total.items() if n > 0))
    return steady


def _read(raw: Path) -> collections.Counter[str]:
    out: collections.Counter[str] = collections.Counter()
    for line in raw.read_text().splitlines() if raw.exists() else []:
        stack, _, n = line.rpartition(" ")
        out[stack] += int(n)
    return out


def _write(load: str, stacks: Path, params: dict) -> list[Result]:  # type: ignore[type-arg]
    own: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    total = 0
    for stack, n in _read(stacks).items():
        frames = stack.split(";")
        own[frames[-1]] += n
        total += n
        for f in set(frames):
            inclusive[f] += n
    quarry = [(f, n) for f, n in inclusive.most_common() if "bench" not in f and not f.startswith(("<module>", "run", "_run", "main ("))]
    lines = [f"# send-{load}-commitlog: {total} CPU-time samples (bench.cpu_sampler, 1 per ms of process CPU), steady load only", "",
             "## own time by frame", ""]
    lines += [f"{n / total * 100:5.1f}%  {f}" for f, n in own.most_common(TOP)]
    lines += ["", "## inclusive time by function", ""]
    lines += [f"{n / total * 100:5.1f}%  {f}" for f, n in quarry[:TOP * 2]]
    PROFILES.mkdir(exist_ok=True)
    (PROFILES / f"send-{load}-commitlog.txt").write_text("\n".join(lines) + "\n")
    mine = [(f, n) for f, n in quarry if any(k in f for k in ("append", "send", "Send", "stored_properties", "record_struct", "tracked", "write"))]
    return [Result(f"send-{load}-commitlog: {f}", n / total * 100, "% of CPU samples", params) for f, n in mine[:6]]


def run(argv: list[str]) -> list[Result]:
    p = argparse.ArgumentParser(prog="python -m bench send_profile")
    p.add_argument("--batches", type=int, default=300, help="batches of 500 x 1 KiB, 2 in flight")
    p.add_argument("--singles", type=int, default=20000, help="single sends at concurrency 16")
    args = p.parse_args(argv)
    out: list[Result] = []
    with tempfile.TemporaryDirectory(prefix="quarry-bench-") as tmp:
        for load, calls in (("batched", args.batches), ("single-c16", args.singles)):
            out += _write(load, _profile(load, calls, Path(tmp)), {"load": load, "calls": calls, "flush_mode": "ASYNC"})
    return out
