"""Where the time goes: py-spy samples the router, the indexer and the commitlog while a mixed
query load (by id, key, unique key, queue offset; concurrency 16) runs, and the commitlog
while single sends run at concurrency 16. Each process's own-time leaders are written to
bench/profiles/<load>-<service>.txt and their shares as rows.

`.venv/bin/python -m bench profile [--seconds N]`
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import grpc

from bench.ceiling import drive
from bench.router import TOPIC, _load, _requests
from bench.runner import BENCH_DIR, Result
from quarry.v1 import commitlog_pb2, commitlog_pb2_grpc, common_pb2, router_pb2_grpc
from scripts.launcher import LocalCluster

PROFILES = BENCH_DIR / "profiles"
TOP = 12


def _py_spy() -> str:
    exe = Path(sys.executable).with_name("py-spy")
    return str(exe) if exe.exists() else (shutil.which("py-spy") or "py-spy")


def _record(pid: int, seconds: float, out: Path) -> subprocess.Popen[bytes]:
    # --gil: only the thread holding the GIL is sampled, i.e. Python-side CPU (threads waiting
    # in gRPC's C core or on a queue are not counted as busy).
    return subprocess.Popen([_py_spy(), "record", "--gil", "--format", "raw", "--rate", "200", "--nonblocking", "-d", str(int(seconds)),
                             "-p", str(pid), "-o", str(out)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _leaders(raw: Path) -> tuple[int, list[tuple[str, int]], list[tuple[str, int]]]:
    """(samples, [(frame, own samples)], [(Quarry function, inclusive samples)]) from py-spy's
    collapsed stacks."""
    own: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = stack.split(";")
        own[frames[-1]] += int(count)
        total += int(count)
        seen = {f.split(":")[0] for f in frames if "(services/" in f or "(formats/" in f or "(quarry/" in f}
        for f in seen:
            inclusive[f] += int(count)
    return total, own.most_common(TOP), inclusive.most_common(TOP)


def _write(name: str, raw: Path, params: dict) -> list[Result]:  # type: ignore[type-arg]
    PROFILES.mkdir(exist_ok=True)
    total, top, quarry = _leaders(raw)
    lines = [f"# {name}: {total} samples holding the GIL (py-spy --gil, 200 Hz)", "", "## own time by frame", ""]
    lines += [f"{n / total * 100:5.1f}%  {frame}" for frame, n in top] if total else ["(no busy samples)"]
    lines += ["", "## inclusive time by Quarry function", ""]
    lines += [f"{n / total * 100:5.1f}%  {frame}" for frame, n in quarry] if total else []
    (PROFILES / f"{name}.txt").write_text("\n".join(lines) + "\n")
    return [Result(f"{name}: {frame[:90]}", n / total * 100, "% of busy samples", params) for frame, n in top[:5]] if total else []


def run(argv: list[str]) -> list[Result]:
    p = argparse.ArgumentParser(prog="python -m bench profile")
    p.add_argument("--seconds", type=float, default=15)
    p.add_argument("--messages", type=int, default=60_000)
    args = p.parse_args(argv)
    out: list[Result] = []
    with tempfile.TemporaryDirectory(prefix="quarry-bench-") as tmp:
        root = Path(tmp)
        cluster = LocalCluster(root=root)
        try:
            cluster.start_router()
            cluster.add_broker("broker-a", "127.0.0.2")
            samples = _load(cluster, args.messages, 500)
            cluster.wait_indexed(timeout_s=600)
            assert cluster.router is not None
            b = cluster.brokers["broker-a"]
            pids = {"router": cluster.router.proc.pid, "indexer": b.indexer.proc.pid, "commitlog": b.commitlog.proc.pid}  # type: ignore[union-attr]
            kinds = _requests(samples)
            mixed = [r for quad in zip(*kinds.values()) for r in quad]
            stop = threading.Event()

            async def queries() -> None:
                async with grpc.aio.insecure_channel(cluster.router.address) as ch:  # type: ignore[union-attr]
                    stub = router_pb2_grpc.QueryRouterServiceStub(ch)
                    while not stop.is_set():
                        await drive(lambda i: getattr(stub, mixed[i % len(mixed)][0])(mixed[i % len(mixed)][1], timeout=10), 500, 16, warmup=0)

            async def sends() -> None:
                async with grpc.aio.insecure_channel(b.commitlog.address) as ch:
                    stub = commitlog_pb2_grpc.CommitLogServiceStub(ch)
                    req = commitlog_pb2.SendMessageRequest(message=common_pb2.MessageInput(topic=TOPIC, body=b"x" * 1024, keys=["k"], queue_id=-1))
                    while not stop.is_set():
                        await drive(lambda _i: stub.SendMessage(req, timeout=10), 500, 16, warmup=0)

            for load, driver, services in (("mixed-queries", queries, ("router", "indexer", "commitlog")), ("single-sends", sends, ("commitlog",))):
                stop.clear()
                t = threading.Thread(target=lambda d=driver: asyncio.run(d()))  # type: ignore[misc]
                t.start()
                recs = {s: (_record(pids[s], args.seconds, root / f"{load}-{s}.raw"), root / f"{load}-{s}.raw") for s in services}
                for proc, _ in recs.values():
                    proc.wait()
                stop.set()
                t.join()
                for s, (_, raw) in recs.items():
                    if raw.exists():
                        out += _write(f"{load}-{s}", raw, {"load": load, "concurrency": 16, "seconds": args.seconds})
        finally:
            cluster.stop()
    return out
