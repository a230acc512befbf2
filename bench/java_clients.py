"""Apache RocketMQ's Java clients sending to Quarry (issue 35), beside quarry.v1's own Python
client in the same run: send rate, p50 and p99 of

- RocketMQ 4.9.8's `DefaultMQProducer` (namesrvAddr: the router's remoting port), 1 and 16
  threads of sync sends, as RocketMQ's benchmark `Producer` sends: 1 KiB bodies, keys on (the
  benchmark's key: the send's second), no compression. The benchmark `Producer` itself
  (rocketmq-example 4.7.0, the last 4.x on Maven Central; it runs unchanged on the 4.9.8 jars)
  runs too, for its own figure: it prints the rate, mean and max latency over its last 10 s
  every 10 s and runs until stopped, no percentiles, so the percentiles come from
  tests/java/.../bench/Bench4.java, the same loop keeping each send's latency.
- rocketmq-client-java 5.0.8 (`Producer.send`, endpoint: the router's gRPC port), 1 and 16
  threads, the same messages (Bench5.java).
- quarry.v1's blocking `Producer` (bench rmq5's measurement: 1 thread, and 16 threads sharing
  one client), the same messages.

Router + one broker (commitlog and indexer) on loopback; the figures of every client interleaved
over `--rounds` rounds, medians reported; the benchmark Producer after them. Each JVM sends for
5 s before it measures (routes, connections, the JIT), with the e2e tests' JVM flags (small heap)
but the full JIT.

`.venv/bin/python -m bench java_clients [--messages N] [--rounds N] [--example-seconds S]` (after
`make java-clients`)
"""
from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from bench.ceiling import Stats, median_run
from bench.rmq5 import _threads
from bench.runner import Result
from quarry.clients.producer import Producer as QuarryProducer
from scripts.launcher import LocalCluster
from tests.e2e import java

TOPIC = "BenchJavaClients"
BODY_BYTES = 1024
THREADS = (1, 16)
EXAMPLE = "org.apache.rocketmq.example.benchmark.Producer"
WARMUP_MS = 5000  # each JVM sends this long before it measures (the benchmark Producer's reports start at 10 s)
# The e2e tests' flags less -XX:TieredStopAtLevel=1 (C1 only: quick to start, slow to run).
JVM_FLAGS = [f for f in java.JVM_FLAGS if not f.startswith("-XX:TieredStopAtLevel")]


def _body() -> bytes:
    """Bench4's body: "hello baby" repeated, cut at 1 KiB (the benchmark Producer's, whole words)."""
    return (b"hello baby" * (BODY_BYTES // 10 + 1))[:BODY_BYTES]


def _jvm(main: str, args: list[str], flavor: str, work: Path, timeout_s: float) -> subprocess.CompletedProcess[str]:
    work.mkdir(parents=True, exist_ok=True)
    cmd = [java.java_binary(), *JVM_FLAGS, f"-Drocketmq.client.logRoot={work / 'logs'}", "-Drocketmq.client.logLevel=WARN",
           f"-Drocketmq.log.root={work / 'logs'}", f"-Duser.home={work}", "-cp", java.classpath(flavor), main, *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, cwd=work)


def java_send(client: str, address: str, threads: int, n: int, work: Path) -> Stats:
    """One JVM of Bench4 ("rmq4": `address` is the NameServer) or Bench5 ("rmq5": the gRPC endpoint)."""
    main = {"rmq4": "quarry.bench.Bench4", "rmq5": "quarry.bench.Bench5"}[client]
    run = _jvm(main, [address, TOPIC, str(threads), str(n), str(WARMUP_MS), str(BODY_BYTES)], client, work, 600)
    lines = [line for line in run.stdout.splitlines() if line.startswith("{")]
    if run.returncode != 0 or not lines:
        raise RuntimeError(f"{main} exited {run.returncode}: {run.stdout[-2000:]} {run.stderr[-3000:]}")
    answer = json.loads(lines[-1])
    if answer["failed"]:
        raise RuntimeError(f"{main}: {answer['failed']} of {answer['messages']} sends failed")
    return Stats.of(float(answer["rate"]), answer["latMs"], threads)


def benchmark_producer(namesrv: str, threads: int, seconds: float, work: Path) -> dict[str, float]:
    """RocketMQ's own benchmark Producer for `seconds`, then stopped (it never ends by itself):
    its last report (Send TPS, Max RT, Average RT over the last 10 s, failures)."""
    work.mkdir(parents=True, exist_ok=True)
    cmd = [java.java_binary(), *JVM_FLAGS, f"-Drocketmq.client.logRoot={work / 'logs'}", "-Drocketmq.client.logLevel=WARN",
           f"-Duser.home={work}", "-cp", java.classpath("rmq4"), EXAMPLE,
           "-n", namesrv, "-t", TOPIC, "-w", str(threads), "-s", str(BODY_BYTES), "-k", "true"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=work)
    reports: list[dict[str, float]] = []
    deadline = time.monotonic() + seconds
    assert proc.stdout is not None
    try:
        for line in proc.stdout:  # a report every 10 s
            m = re.match(r"Send TPS: (\d+) Max RT: (\d+) Average RT:\s+([\d.]+) Send Failed: (\d+) Response Failed: (\d+)", line)
            if m:
                reports.append({"tps": float(m[1]), "max_rt_ms": float(m[2]), "avg_rt_ms": float(m[3]), "failed": float(m[4]) + float(m[5])})
                if time.monotonic() >= deadline:
                    break
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    if not reports:
        raise RuntimeError(f"{EXAMPLE} printed no report: {proc.stderr.read()[-3000:] if proc.stderr else ''}")
    return reports[-1]


def run(argv: list[str]) -> list[Result]:
    p = argparse.ArgumentParser(prog="bench java_clients")
    p.add_argument("--messages", type=int, default=6000, help="sends of each client at each thread count in one round")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (medians reported)")
    p.add_argument("--example-seconds", type=float, default=20, help="how long the benchmark Producer runs at each thread count")
    args = p.parse_args(argv)
    n, rounds = args.messages, max(1, args.rounds)
    params = {"body_bytes": BODY_BYTES, "messages": n, "rounds": rounds, "brokers": 1, "flush_mode": "ASYNC", "keys": "on"}
    body = _body()
    load_before = os.getloadavg()[0]  # the machine is shared: what else ran is part of the figure
    runs: dict[tuple[str, int], list[Stats]] = {}
    example: dict[int, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        cluster = LocalCluster(root=root / "cluster", commitlog_args=["--segment-size", str(512 << 20)])
        try:
            cluster.start_router(host="127.0.0.173")
            cluster.add_broker("broker-a", "127.0.0.174")
            assert cluster.router is not None
            namesrv, endpoint = cluster.router.remoting_address, cluster.router.address
            quarry = QuarryProducer(endpoint)
            try:
                def v1(i: int) -> None:
                    quarry.send(TOPIC, body, keys=[str(int(time.time()))])

                for i in range(300):  # the topic made, routes and channels warm
                    v1(i)
                for r in range(rounds):
                    for threads in THREADS:
                        runs.setdefault(("quarry.v1", threads), []).append(_threads(v1, n, threads))
                        runs.setdefault(("rmq4", threads), []).append(java_send("rmq4", namesrv, threads, n, root / f"jvm4-{r}-{threads}"))
                        runs.setdefault(("rmq5", threads), []).append(java_send("rmq5", endpoint, threads, n, root / f"jvm5-{r}-{threads}"))
                for threads in THREADS:
                    example[threads] = benchmark_producer(namesrv, threads, args.example_seconds, root / f"example-{threads}")
            finally:
                quarry.close()
        finally:
            cluster.stop()
    params["loadavg_1m"] = f"{load_before:.1f} before, {os.getloadavg()[0]:.1f} after"
    labels = {"rmq4": "RocketMQ 4.9.8 DefaultMQProducer (Bench4)", "rmq5": "rocketmq-client-java 5.0.8 Producer (Bench5)",
              "quarry.v1": "quarry.v1 Producer (Python)"}
    results: list[Result] = []
    for threads in THREADS:
        at = {**params, "threads": threads}
        v1_rate = median_run(runs[("quarry.v1", threads)]).rate
        for client in ("rmq4", "rmq5", "quarry.v1"):
            s = median_run(runs[(client, threads)])
            label = f"{labels[client]}, {threads} thread{'s' if threads > 1 else ''} of sync sends"
            results += [Result(label, s.rate, "msg/s", {**at, "round_rates": sorted(round(x.rate) for x in runs[(client, threads)])}),
                        Result(f"{label}, p50", s.p50_ms, "ms", at), Result(f"{label}, p99", s.p99_ms, "ms", at)]
            if client != "quarry.v1":
                results.append(Result(f"{label} / quarry.v1", s.rate / v1_rate, "x", at))
        e = example[threads]
        ex_params = {**at, "seconds": args.example_seconds, "failed": e["failed"], "messages": "until stopped"}
        label = f"RocketMQ's benchmark Producer (rocketmq-example 4.7.0 on the 4.9.8 jars), -w {threads} -s 1024 -k true"
        results += [Result(f"{label}: Send TPS", e["tps"], "msg/s", ex_params),
                    Result(f"{label}: Average RT", e["avg_rt_ms"], "ms", ex_params),
                    Result(f"{label}: Max RT", e["max_rt_ms"], "ms", ex_params)]
    return results
