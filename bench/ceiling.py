"""The machine's ceiling for one gRPC call, taken in the same run as the figure it judges.

An echo service on `grpc.aio` (its own process, as Quarry's services are) answers each request
with a response of the size the request asks for and does nothing else. Driven by the same
asyncio client, at the same concurrency and with the same payload sizes as a Quarry call, it
is what the machine can do at best right now: a figure divided by it is comparable across
runs on a shared, noisy machine where the absolute figure is not.

`drive()` is that client: `concurrency` tasks on one loop, each awaiting its call in turn;
it is used for the ceiling and for the Quarry calls it is compared with.

`.venv/bin/python -m bench ceiling` measures the ceiling alone (payloads and concurrencies as
the other benchmarks use them).
"""
from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Awaitable, Callable, Self

import grpc

from bench.runner import Result

METHOD = "/bench.Echo/Echo"
_OPTIONS = [("grpc.max_receive_message_length", 128 << 20), ("grpc.max_send_message_length", 128 << 20)]


@dataclass
class Stats:
    """Calls/s and latency percentiles of one driven run."""

    rate: float
    p50_ms: float
    p99_ms: float
    calls: int
    concurrency: int

    @classmethod
    def of(cls, rate: float, lat_ms: list[float], concurrency: int) -> "Stats":
        """The Stats of a run at `rate` whose calls took `lat_ms` each."""
        return cls(rate, statistics.median(lat_ms), pct(lat_ms, 0.99), len(lat_ms), concurrency)


def pct(values: list[float], p: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(len(values) * p))]


async def drive(call: Callable[[int], Awaitable[object]], calls: int, concurrency: int, warmup: int = 50) -> Stats:
    """Run `calls` calls of call(i), `concurrency` at a time; rate and latency of each."""
    for i in range(min(warmup, calls)):
        await call(i)
    lat: list[float] = []
    counter = iter(range(calls))

    async def worker() -> None:
        for i in counter:
            t = time.perf_counter()
            await call(i)
            lat.append((time.perf_counter() - t) * 1000)

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall = time.perf_counter() - t0
    return Stats.of(len(lat) / wall, lat, concurrency)


def _serve(port_file: str) -> None:
    """The echo server process: response of the size in the request's first 4 bytes."""

    async def echo(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        size = int.from_bytes(request[:4], "big")
        return bytes(size)

    async def main() -> None:
        server = grpc.aio.server(options=_OPTIONS)
        handler = grpc.method_handlers_generic_handler("bench.Echo", {"Echo": grpc.unary_unary_rpc_method_handler(echo)})
        server.add_generic_rpc_handlers((handler,))
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        Path(port_file).write_text(str(port))
        await server.wait_for_termination()

    asyncio.run(main())


class ServerProcess:
    """A bench server in its own process: `module`'s `_serve(port_file)`, which writes the port
    it listens on to the file once serving; `address` is then 127.0.0.1:<port>."""

    module = ""

    def __init__(self) -> None:
        self._proc: subprocess.Popen[bytes] | None = None
        self.address = ""

    def __enter__(self) -> "Self":
        port_file = Path(os.environ.get("TMPDIR", "/tmp")) / f"quarry-{self.module}-{os.getpid()}-{id(self)}.port"
        port_file.unlink(missing_ok=True)
        self._proc = subprocess.Popen([sys.executable, "-c", f"from {self.module} import _serve; _serve({str(port_file)!r})"],
                                      cwd=Path(__file__).resolve().parent.parent)
        deadline = time.monotonic() + 30
        while not port_file.exists() or not port_file.read_text():
            if self._proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{self.module} server did not start")
            time.sleep(0.02)
        self.address = f"127.0.0.1:{port_file.read_text()}"
        port_file.unlink()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._proc is not None:
            self._proc.terminate()
            self._proc.wait(10)


class EchoCeiling(ServerProcess):
    """The echo server process and an asyncio client for it."""

    module = "bench.ceiling"

    def measure(self, request_bytes: int, response_bytes: int, concurrency: int, calls: int) -> Stats:
        """The ceiling for calls of these payload sizes at this concurrency."""
        request = response_bytes.to_bytes(4, "big") + bytes(max(0, request_bytes - 4))

        async def run() -> Stats:
            async with grpc.aio.insecure_channel(self.address, options=_OPTIONS) as ch:
                echo = ch.unary_unary(METHOD)
                return await drive(lambda _i: echo(request, timeout=30), calls, concurrency)

        return asyncio.run(run())


def median_run(runs: list[Stats]) -> Stats:
    """The run of median rate among interleaved rounds (a burst of load on the shared machine
    skews one round, not the median)."""
    return sorted(runs, key=lambda s: s.rate)[len(runs) // 2]


def compare(label: str, figure: Stats, ceiling: Stats, params: dict[str, object], unit_scale: float = 1.0, unit: str = "calls/s") -> list[Result]:
    """The rows for one figure: rate, p50, p99, the ceiling's, and rate / ceiling rate.

    unit_scale turns calls into what the figure counts (messages per batch)."""
    p = {**params, "concurrency": figure.concurrency}
    return [
        Result(f"{label} rate", figure.rate * unit_scale, unit, p),
        Result(f"{label} p50", figure.p50_ms, "ms", p),
        Result(f"{label} p99", figure.p99_ms, "ms", p),
        Result(f"{label} ceiling rate (echo)", ceiling.rate * unit_scale, unit, p),
        Result(f"{label} ceiling p50 (echo)", ceiling.p50_ms, "ms", p),
        Result(f"{label} / ceiling", figure.rate / ceiling.rate, "x", p),
    ]


def run(argv: list[str]) -> list[Result]:
    p = argparse.ArgumentParser(prog="python -m bench ceiling")
    p.add_argument("--calls", type=int, default=3000)
    args = p.parse_args(argv)
    out: list[Result] = []
    with EchoCeiling() as echo:
        for req, resp in ((1100, 60), (60, 500), (600_000, 30_000)):
            for c in (1, 16):
                s = echo.measure(req, resp, c, args.calls if req < 100_000 else args.calls // 20)
                params = {"request_bytes": req, "response_bytes": resp, "concurrency": c}
                out += [Result("echo rate", s.rate, "calls/s", params), Result("echo p50", s.p50_ms, "ms", params),
                        Result("echo p99", s.p99_ms, "ms", params)]
    return out
