"""The official RocketMQ 5 SDK's producers in a process of their own, driven by `bench rmq5`.

Why a process of its own: grpc.aio binds its completion poller to the first event loop that
uses it, and the SDK runs one loop of its own for the process. With an SDK producer alive in
the bench process, every completion of the echo ceiling's and the lean client's calls first
woke the SDK's loop and hopped from there to theirs (and thousands of spurious wake-ups logged
BlockingIOError): the grpc.aio echo at 16 in flight fell from ~12,400 to 8,300-9,300 calls/s.
An application sending with the SDK has the SDK's loop to itself; so does this process.

One producer per target (`quarry`: the router's access point; `echo`: bench/rmq5_echo.py),
both on the SDK's one loop, as two producers of one application are. Commands come as JSON
lines on stdin, answers go as JSON lines on stdout:
  {"op": "sequential", "target": T, "n": N}         -> {"rate": sends/s, "lat_ms": [...]}
  {"op": "window", "target": T, "n": N, "c": C}     -> {"rate": sends/s, "lat_ms": [...]}  (send_async, C in flight)
"""
from __future__ import annotations

import json
import logging
import select
import subprocess
import sys
import threading
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any, Callable

from bench.ceiling import Stats

TOPIC = "BenchRmq5"
BODY = b"x" * 1024
WARMUP = 300  # sends per producer before "ready": routes, channels, telemetry, topic creation
ANSWER_S = 300.0  # the longest a command (or the start and warm-up) may take


def sdk_message(i: int):  # type: ignore[no-untyped-def]
    from rocketmq import Message
    m = Message()
    m.topic, m.body, m.tag = TOPIC, BODY, "bench"
    m.keys = f"order-{i}"
    return m


def sequential(send: Callable[[int], object], n: int) -> tuple[float, list[float]]:
    """(sends/s, latencies ms) of n sequential sends."""
    lat = []
    t0 = time.perf_counter()
    for i in range(n):
        s = time.perf_counter()
        send(i)
        lat.append((time.perf_counter() - s) * 1000)
    return n / (time.perf_counter() - t0), lat


def async_window(producer: Any, n: int, concurrency: int) -> tuple[float, list[float]]:
    """(sends/s, latencies ms from each send_async call to its answer) of SDK send_async with
    `concurrency` sends in flight."""
    slots = threading.Semaphore(concurrency)
    errors: list[BaseException] = []
    done = threading.Event()
    left = [n]
    lock = threading.Lock()
    lat: list[float] = []

    def finished(f: Future, started: float) -> None:  # type: ignore[type-arg]
        lat.append((time.perf_counter() - started) * 1000)
        if f.exception() is not None:
            errors.append(f.exception())  # type: ignore[arg-type]
        slots.release()
        with lock:
            left[0] -= 1
            if left[0] == 0:
                done.set()

    t0 = time.perf_counter()
    for i in range(n):
        slots.acquire()
        started = time.perf_counter()
        producer.send_async(sdk_message(i)).add_done_callback(lambda f, s=started: finished(f, s))
    if not done.wait(120):
        raise RuntimeError(f"send_async: {left[0]} of {n} sends unanswered after 120 s")
    elapsed = time.perf_counter() - t0
    if errors:
        raise RuntimeError(f"{len(errors)} async sends failed: {errors[0]}")
    return n / elapsed, lat


def _main(quarry_addr: str, echo_addr: str) -> None:
    answers, sys.stdout = sys.stdout, sys.stderr  # stdout carries the answers only, whatever else prints
    logging.getLogger("rocketmq-python-client").setLevel(logging.WARNING)
    from rocketmq import ClientConfiguration, Credentials, Producer

    producers = {name: Producer(ClientConfiguration(addr, Credentials(), request_timeout=10), (TOPIC,))
                 for name, addr in (("quarry", quarry_addr), ("echo", echo_addr))}
    started = []
    try:
        for p in producers.values():
            p.startup()
            started.append(p)
        for i in range(WARMUP):
            for p in producers.values():
                p.send(sdk_message(i))
        print(json.dumps({"ready": True}), file=answers, flush=True)
        for line in sys.stdin:
            cmd = json.loads(line)
            producer = producers[cmd["target"]]
            if cmd["op"] == "sequential":
                rate, lat = sequential(lambda i: producer.send(sdk_message(i)), cmd["n"])
                answer: dict[str, Any] = {"rate": rate, "lat_ms": lat}
            else:
                rate, lat = async_window(producer, cmd["n"], cmd["c"])
                answer = {"rate": rate, "lat_ms": lat}
            print(json.dumps(answer), file=answers, flush=True)
    finally:
        for p in started:
            p.shutdown()


class SdkDriver:
    """The driver process: `sequential` and `window` run in it and return what it measured."""

    def __init__(self, quarry_addr: str, echo_addr: str) -> None:
        self._args = [sys.executable, "-m", "bench.sdk_driver", quarry_addr, echo_addr]
        self._cwd: Path | None = None
        self._proc: subprocess.Popen[str] | None = None

    def __enter__(self) -> "SdkDriver":
        self._proc = subprocess.Popen(self._args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=self._cwd)
        self._read()  # ready: warmed up
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._proc is not None
        if self._proc.stdin is not None:
            self._proc.stdin.close()
        try:
            self._proc.wait(30)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()

    def _read(self) -> dict[str, Any]:
        """The driver's next answer; a driver that ends or answers nothing within ANSWER_S is
        stopped and the bench fails, rather than waiting for ever."""
        assert self._proc is not None and self._proc.stdout is not None
        ready, _, _ = select.select([self._proc.stdout], [], [], ANSWER_S)
        if not ready:
            self._proc.kill()
            raise RuntimeError(f"the SDK driver answered nothing within {ANSWER_S:g} s; stopped")
        line = self._proc.stdout.readline()  # (it writes whole lines, each flushed)
        if not line:
            raise RuntimeError(f"the SDK driver ended (exit {self._proc.wait()}); its stderr says why")
        return json.loads(line)  # type: ignore[no-any-return]

    def _ask(self, cmd: dict[str, Any]) -> dict[str, Any]:
        assert self._proc is not None and self._proc.stdin is not None
        self._proc.stdin.write(json.dumps(cmd) + "\n")
        self._proc.stdin.flush()
        return self._read()

    def sequential(self, target: str, n: int) -> tuple[float, list[float]]:
        answer = self._ask({"op": "sequential", "target": target, "n": n})
        return answer["rate"], answer["lat_ms"]

    def window(self, target: str, n: int, concurrency: int) -> Stats:
        answer = self._ask({"op": "window", "target": target, "n": n, "c": concurrency})
        return Stats.of(float(answer["rate"]), answer["lat_ms"], concurrency)


NODE_SDK_DIR = Path(__file__).resolve().parent.parent / "tests" / "e2e" / "node"


class NodeSdkDriver(SdkDriver):
    """The same commands (`window` only) answered by the official Node.js SDK
    (bench/node_sdk_driver.js, the SDK `make node-sdk` installs)."""

    @staticmethod
    def check_installed() -> None:
        if not (NODE_SDK_DIR / "node_modules" / "rocketmq-client-nodejs").is_dir():
            raise RuntimeError(f"the Node.js SDK is not installed in {NODE_SDK_DIR}: run `make node-sdk` first")

    def __init__(self, quarry_addr: str, echo_addr: str) -> None:
        super().__init__(quarry_addr, echo_addr)
        self.check_installed()
        self._args = ["node", str(Path(__file__).with_name("node_sdk_driver.js")), quarry_addr, echo_addr]
        self._cwd = NODE_SDK_DIR

    def sequential(self, target: str, n: int) -> tuple[float, list[float]]:
        raise NotImplementedError("the Node.js SDK driver measures windows only")


if __name__ == "__main__":
    _main(sys.argv[1], sys.argv[2])
