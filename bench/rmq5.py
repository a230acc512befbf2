"""RocketMQ 5 SDK path vs quarry.v1, same cluster, same run: the official Python SDK
(rocketmq-python-client) sending single messages, then N concurrent async sends, against
Quarry's own producer (quarry.v1) doing the same at the same concurrency. 1 KiB bodies, a key
and a tag each, ASYNC flush, router + one broker on loopback.

`.venv/bin/python -m bench rmq5 [--messages N] [--concurrency N] [--rounds N]` (after `make node-sdk`)
Target (issue 16): SDK single-send rate >= 70% of quarry.v1's, SDK p50 < 1 ms. Each rate is also
given as a ratio to the echo ceiling (bench/ceiling.py) at the same concurrency, same run (issue 21),
and the SDK's as a ratio to the same SDK sending to a MessagingService that answers at once
(bench/rmq5_echo.py): what the SDK itself can do on this machine in this run. The RocketMQ 5
path is also driven the way the echo ceiling is, by a lean grpc.aio client sending the SDK's
request (same message, same headers) straight to the broker: the server path's own ratio,
without the SDK's client-side cost. The SDK sends from a process of its own
(bench/sdk_driver.py): its event loop in this process slowed the ceiling's grpc.aio client.
The official Node.js SDK (`make node-sdk`; bench/node_sdk_driver.js) sends the same messages
at the same concurrency to Quarry and to the same echo: a second official client's ceiling.
"""
from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import threading
import time
from pathlib import Path

from bench.ceiling import EchoCeiling, Stats, drive, median_run, pct
from bench.rmq5_echo import SdkEcho
from bench.sdk_driver import BODY, TOPIC, NodeSdkDriver, SdkDriver, sequential
from bench.runner import Result, process_cpu_s
from quarry.clients.producer import Producer as QuarryProducer
from scripts.launcher import LocalCluster



def _threads(send, n: int, concurrency: int) -> Stats:  # type: ignore[no-untyped-def]
    """sends/s and latencies of `concurrency` threads sending n in all."""
    per = max(1, n // concurrency)
    lat: list[float] = []  # list.append is atomic: the threads share it

    def worker(base: int) -> None:
        for i in range(per):
            s = time.perf_counter()
            send(base + i)
            lat.append((time.perf_counter() - s) * 1000)

    threads = [threading.Thread(target=worker, args=(k * per,)) for k in range(concurrency)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return Stats.of(per * concurrency / (time.perf_counter() - t0), lat, concurrency)


# The ceiling's sizes for a RocketMQ 5 send, as this bench has always taken them: the request (a
# 1 KiB body, topic, key, tag and system properties) measures ~1.12 KB, the answer ~0.1 KB.
# (bench commitlog's RocketMQ 5 row measures both from the calls it makes.)
LEAN_REQUEST_BYTES, LEAN_RESPONSE_BYTES = 1150, 200


def _latency(label: str, s: Stats, params: dict[str, object]) -> list[Result]:
    """The p50 and p99 rows of one figure."""
    return [Result(f"{label}, p50", s.p50_ms, "ms", params), Result(f"{label}, p99", s.p99_ms, "ms", params)]


def lean_rmq5(address: str, n: int, concurrency: int, pid: int, first: int) -> tuple[Stats, float, int, int]:
    """SendMessage as the SDK sends it (message, headers), from a grpc.aio client like the
    echo ceiling's, `concurrency` in flight: the stats and the broker's CPU seconds for the `n`
    measured sends (not the channel's set-up or the warm-up), and the serialized sizes of a
    request and of its answer. Message ids count from `first`."""
    import grpc

    from quarry.services.rmq5.contract import service, service_grpc, v2

    warmup = 50
    born = int(time.time())
    requests = []
    for i in range(first, first + warmup + n):  # every send its own id, as the SDK's
        m = v2.Message(topic=v2.Resource(name=TOPIC), body=BODY)
        sp = m.system_properties
        sp.tag, sp.message_id, sp.message_type, sp.born_host = "bench", f"0102FC000000016300000000{i:010X}", v2.MessageType.NORMAL, "192.0.2.2"
        sp.keys.append(f"order-{i}")
        sp.born_timestamp.seconds = born
        requests.append(service.SendMessageRequest(messages=[m]))
    headers = (("x-mq-language", "PYTHON"), ("x-mq-protocol", "GRPC_V2"), ("x-mq-client-version", "5.1.2"),
               ("x-mq-date-time", time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())), ("x-mq-client-id", "bench@1@0@lean"), ("x-mq-namespace", ""))

    async def go() -> tuple[Stats, float, int, int]:
        async with grpc.aio.insecure_channel(address) as ch:
            stub = service_grpc.MessagingServiceStub(ch)

            def sender(offset: int):  # type: ignore[no-untyped-def]
                async def send(i: int) -> int:
                    answer = await stub.SendMessage(requests[offset + i], timeout=10, metadata=(*headers, ("x-mq-request-id", str(first + offset + i))))
                    if answer.status.code != v2.Code.OK:
                        raise RuntimeError(f"SendMessage answered {answer.status}")
                    return answer.ByteSize()  # type: ignore[no-any-return]
                return send

            warm = sender(0)
            for i in range(warmup):
                answer_bytes = await warm(i)
            t = process_cpu_s(pid)
            stats = await drive(sender(warmup), n, concurrency, warmup=0)
            return stats, process_cpu_s(pid) - t, requests[0].ByteSize(), answer_bytes

    return asyncio.run(go())


def run(argv: list[str]) -> list[Result]:
    p = argparse.ArgumentParser(prog="bench rmq5")
    p.add_argument("--messages", type=int, default=6000)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds of every figure and ceiling (medians reported); each sends --messages / --rounds")
    args = p.parse_args(argv)

    results: list[Result] = []
    n, c, rounds = args.messages, args.concurrency, max(1, args.rounds)
    per = n // rounds  # sends (calls) of each figure in one round
    if per < 1:
        p.error(f"--messages ({n}) must be at least --rounds ({rounds})")
    NodeSdkDriver.check_installed()  # before the cluster starts, not after its warm-up
    params = {"body_bytes": 1024, "messages": n, "flush_mode": "ASYNC", "brokers": 1, **({"rounds": rounds} if rounds != 3 else {})}
    # The ceilings run beside the (then idle) cluster, each round interleaved with the figures.
    with tempfile.TemporaryDirectory() as tmp, EchoCeiling() as echo, SdkEcho() as sdk_echo:
        cluster = LocalCluster(root=Path(tmp), commitlog_args=["--segment-size", str(512 << 20)])
        try:
            cluster.start_router(host="127.0.0.71")
            cluster.add_broker("broker-a", "127.0.0.72")
            assert cluster.router is not None
            quarry = QuarryProducer(cluster.router.address)
            try:
                def v1(i: int) -> None:
                    quarry.send(TOPIC, BODY, keys=[f"order-{i}"], tags="bench")

                for i in range(300):  # warm the path (routes, channels, topic creation)
                    v1(i)
                # The SDK sends from a process of its own (bench/sdk_driver.py says why).
                with SdkDriver(cluster.router.address, sdk_echo.address) as sdk, NodeSdkDriver(cluster.router.address, sdk_echo.address) as node:
                    pid = cluster.brokers["broker-a"].commitlog.proc.pid  # type: ignore[union-attr]
                    cpu = {"v1": 0.0, "v2": 0.0}
                    # Interleaved rounds (medians reported), so drift (page cache, the indexer's
                    # tailing, other load on the machine) hits the figures and the ceilings alike.
                    v1_rates, v2_rates, v1_lat, v2_lat, ceil1s, sdk_echo1s = [], [], [], [], [], []
                    for _ in range(rounds):
                        t = process_cpu_s(pid)
                        r, lat = sequential(v1, per)
                        cpu["v1"] += process_cpu_s(pid) - t
                        v1_rates.append(r)
                        v1_lat += lat
                        t = process_cpu_s(pid)
                        r, lat = sdk.sequential("quarry", per)
                        cpu["v2"] += process_cpu_s(pid) - t
                        v2_rates.append(r)
                        v2_lat += lat
                        ceil1s.append(echo.measure(LEAN_REQUEST_BYTES, LEAN_RESPONSE_BYTES, 1, per))
                        sdk_echo1s.append(sdk.sequential("echo", per)[0])
                    v1_rate, v2_rate, sdk_echo1 = statistics.median(v1_rates), statistics.median(v2_rates), statistics.median(sdk_echo1s)
                    ceil1 = median_run(ceil1s)
                    v1_concs, v2_concs, ceilcs, sdk_echocs, cpu_v1_conc, cpu_v2_conc = [], [], [], [], 0.0, 0.0
                    leans, cpu_lean, node_concs, node_echocs = [], 0.0, [], []
                    broker = cluster.brokers["broker-a"].commitlog.address  # type: ignore[union-attr]
                    for _ in range(rounds):
                        t = process_cpu_s(pid)
                        v1_concs.append(_threads(v1, per, c))
                        cpu_v1_conc += process_cpu_s(pid) - t
                        t = process_cpu_s(pid)
                        v2_concs.append(sdk.window("quarry", per, c))
                        cpu_v2_conc += process_cpu_s(pid) - t
                        ceilcs.append(echo.measure(LEAN_REQUEST_BYTES, LEAN_RESPONSE_BYTES, c, per))
                        sdk_echocs.append(sdk.window("echo", per, c))
                        node_concs.append(node.window("quarry", per, c))
                        node_echocs.append(node.window("echo", per, c))
                        stats, cpu_s, _, _ = lean_rmq5(broker, per, c, pid, first=len(leans) * (per + 50))
                        leans.append(stats)
                        cpu_lean += cpu_s
                    v1_conc, v2_conc, sdk_echoc = median_run(v1_concs), median_run(v2_concs), median_run(sdk_echocs).rate
                    node_conc, node_echoc = median_run(node_concs), median_run(node_echocs).rate
                    lean = median_run(leans)
                    ceilc = median_run(ceilcs)
            finally:
                quarry.close()
        finally:
            cluster.stop()
    results += [
        Result("quarry.v1 single sends (1 in flight)", v1_rate, "msg/s", {**params, "concurrency": 1}),
        Result("quarry.v1 single send p50", statistics.median(v1_lat), "ms", {**params, "concurrency": 1}),
        Result("SDK single sends (1 in flight)", v2_rate, "msg/s", {**params, "concurrency": 1}),
        Result("SDK single send p50", statistics.median(v2_lat), "ms", {**params, "concurrency": 1, "target": "< 1 ms"}),
        Result("SDK single send p99", pct(v2_lat, 0.99), "ms", {**params, "concurrency": 1}),
        Result("quarry.v1 single send p99", pct(v1_lat, 0.99), "ms", {**params, "concurrency": 1}),
        Result("SDK / quarry.v1 single-send rate", v2_rate / v1_rate, "x", {**params, "concurrency": 1, "target": ">= 0.7"}),
        Result("echo ceiling rate", ceil1.rate, "calls/s", {**params, "concurrency": 1}),
        Result("echo ceiling p50", ceil1.p50_ms, "ms", {**params, "concurrency": 1}),
        Result("quarry.v1 single sends / ceiling", v1_rate / ceil1.rate, "x", {**params, "concurrency": 1}),
        Result("SDK single sends / ceiling", v2_rate / ceil1.rate, "x", {**params, "concurrency": 1}),
        Result("echo ceiling rate", ceilc.rate, "calls/s", {**params, "concurrency": c}),
        Result("echo ceiling p50", ceilc.p50_ms, "ms", {**params, "concurrency": c}),
        # quarry.v1 here is the blocking Producer from 16 threads of one process (its calls share
        # one stream); the asyncio client's c16 figure, the target's, is bench commitlog's.
        Result(f"quarry.v1 sends, {c} threads / ceiling", v1_conc.rate / ceilc.rate, "x", {**params, "concurrency": c}),
        Result(f"SDK send_async, {c} in flight / ceiling", v2_conc.rate / ceilc.rate, "x", {**params, "concurrency": c, "target": ">= 0.6",
                                                                              "round_ratios": sorted(round(v.rate / e.rate, 3) for v, e in zip(v2_concs, ceilcs))}),
        Result(f"quarry.v1 sends, {c} threads", v1_conc.rate, "msg/s", {**params, "concurrency": c}),
        *_latency(f"quarry.v1 sends, {c} threads", v1_conc, {**params, "concurrency": c}),
        Result(f"SDK send_async, {c} in flight", v2_conc.rate, "msg/s", {**params, "concurrency": c}),
        *_latency(f"SDK send_async, {c} in flight", v2_conc, {**params, "concurrency": c}),
        Result(f"SDK / quarry.v1 rate at concurrency {c}", v2_conc.rate / v1_conc.rate, "x", {**params, "concurrency": c, "target": ">= 0.7"}),
        Result("SDK single sends to the SDK echo (bench/rmq5_echo.py)", sdk_echo1, "msg/s", {**params, "concurrency": 1}),
        Result("SDK single sends / SDK echo", v2_rate / sdk_echo1, "x", {**params, "concurrency": 1}),
        Result(f"SDK send_async, {c} in flight, to the SDK echo", sdk_echoc, "msg/s", {**params, "concurrency": c}),
        Result(f"SDK send_async, {c} in flight / SDK echo", v2_conc.rate / sdk_echoc, "x", {**params, "concurrency": c}),
        # The SDK's own ceiling against the grpc.aio echo: what the SDK ratio could reach
        # with a server that costs nothing.
        Result(f"SDK echo / grpc.aio echo, {c} in flight", sdk_echoc / ceilc.rate, "x", {**params, "concurrency": c}),
        # The other official SDK this machine can install (npm): is the SDK row's gap the server's
        # or the client's? Same messages, same echo, same rounds.
        Result(f"Node.js SDK send, {c} in flight", node_conc.rate, "msg/s", {**params, "concurrency": c}),
        *_latency(f"Node.js SDK send, {c} in flight", node_conc, {**params, "concurrency": c}),
        Result(f"Node.js SDK send, {c} in flight / ceiling", node_conc.rate / ceilc.rate, "x", {**params, "concurrency": c, "target": ">= 0.6",
                                                                            "round_ratios": sorted(round(v.rate / e.rate, 3) for v, e in zip(node_concs, ceilcs))}),
        Result(f"Node.js SDK send, {c} in flight / Node.js SDK echo", node_conc.rate / node_echoc, "x", {**params, "concurrency": c}),
        Result(f"Node.js SDK echo / grpc.aio echo, {c} in flight", node_echoc / ceilc.rate, "x", {**params, "concurrency": c}),
        Result(f"RocketMQ 5 SendMessage from a grpc.aio client, {c} in flight", lean.rate, "msg/s", {**params, "concurrency": c}),
        Result(f"RocketMQ 5 SendMessage from a grpc.aio client, {c} in flight / ceiling", lean.rate / ceilc.rate, "x",
               {**params, "concurrency": c, "target": ">= 0.6", "round_ratios": sorted(round(v.rate / e.rate, 3) for v, e in zip(leans, ceilcs))}),
        *_latency(f"RocketMQ 5 SendMessage from a grpc.aio client, {c} in flight", lean, {**params, "concurrency": c}),
        # Where the gap comes from: the commitlog's own CPU per message on each path.
        Result("commitlog CPU per message, quarry.v1 single sends", cpu["v1"] / (rounds * per) * 1e6, "us", {**params, "concurrency": 1}),
        Result("commitlog CPU per message, SDK single sends", cpu["v2"] / (rounds * per) * 1e6, "us", {**params, "concurrency": 1}),
        Result(f"commitlog CPU per message, quarry.v1, {c} threads", cpu_v1_conc / (rounds * per) * 1e6, "us", {**params, "concurrency": c}),
        Result(f"commitlog CPU per message, SDK, {c} in flight", cpu_v2_conc / (rounds * per) * 1e6, "us", {**params, "concurrency": c}),
        Result(f"commitlog CPU per message, RocketMQ 5 from a grpc.aio client, {c} in flight", cpu_lean / (rounds * per) * 1e6, "us",
               {**params, "concurrency": c}),
    ]
    return results
