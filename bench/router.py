"""Query latency through the router over three brokers holding N messages: each of the four
kinds and the mixed load at concurrency 1 and 16, each beside the echo ceiling
(bench/ceiling.py) of the same request and response sizes at the same concurrency, same run.

`.venv/bin/python -m bench router [--messages N] [--queries N] [--read-bodies-from indexer|commitlog] [--indexer-reads store|commitlog]`

`--read-bodies-from` is the router's setting of that name: key and unique-key queries get the
records from the indexers (which read them from their commitlogs), or the indexers answer
offsets and the router reads the records from each commitlog itself. `--indexer-reads store`
(the default) has each indexer read them from its commitlog's segment files (same host,
indexer --commitlog-store-dir); `commitlog` has it call GetMessages.
"""
from __future__ import annotations

import argparse
import asyncio
import random
import tempfile
import threading
import time
from pathlib import Path

import grpc

from bench.ceiling import EchoCeiling, Stats, compare, drive, median_run
from bench.runner import Result
from quarry.formats.unique_key import UniqueKeyGenerator
from quarry.v1 import commitlog_pb2, commitlog_pb2_grpc, common_pb2, router_pb2, router_pb2_grpc
from scripts.launcher import LocalCluster

TOPIC = "BenchTopic"
HOSTS = {"broker-a": "127.0.0.2", "broker-b": "127.0.0.3", "broker-c": "127.0.0.4"}


def _load(cluster: LocalCluster, messages: int, batch: int) -> list[tuple[str, str, str, str, int, int]]:
    """Send `messages` spread over the brokers; returns (broker, key, uniq, offsetMsgId, queue, queue offset) samples."""
    from datetime import timezone

    gen = UniqueKeyGenerator("10.0.0.1", 4242, 7, timezone.utc)
    samples: list[tuple[str, str, str, str, int, int]] = []
    names = list(cluster.brokers)

    def worker(name: str, start: int, stop: int) -> None:
        addr = cluster.brokers[name].commitlog.address
        with grpc.insecure_channel(addr, options=[("grpc.max_send_message_length", 128 << 20)]) as ch:
            stub = commitlog_pb2_grpc.CommitLogServiceStub(ch)
            for s in range(start, stop, batch):
                msgs = [common_pb2.MessageInput(topic=TOPIC, body=b"x" * 256, keys=[f"order-{i}"], unique_key=gen.next_id(), queue_id=(i // batch) % 4) for i in range(s, min(stop, s + batch))]
                results = stub.SendBatch(commitlog_pb2.SendBatchRequest(messages=msgs), timeout=60).results
                r, m = results[0], msgs[0]
                samples.append((name, m.keys[0], m.unique_key, r.offset_msg_id, r.queue_id, r.queue_offset))

    per = messages // len(names)
    threads = [threading.Thread(target=worker, args=(n, i * per, (i + 1) * per)) for i, n in enumerate(names)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return samples


Sample = tuple[str, str, str, str, int, int]


def _requests(samples: list[Sample]) -> dict[str, list[tuple[str, object]]]:
    """(method, request) per kind, over the samples in a fixed random order."""
    rng = random.Random(1)
    picked = [rng.choice(samples) for _ in range(2000)]
    return {
        "by id": [("QueryMsgById", router_pb2.QueryMsgByIdRequest(offset_msg_id=x[3])) for x in picked],
        "by key": [("QueryMsgByKey", router_pb2.QueryMsgByKeyRequest(topic=TOPIC, key=x[1])) for x in picked],
        "by unique key": [("QueryMsgByUniqueKey", router_pb2.QueryMsgByUniqueKeyRequest(topic=TOPIC, unique_key=x[2])) for x in picked],
        "by queue offset": [("QueryMsgByOffset", router_pb2.QueryMsgByOffsetRequest(topic=TOPIC, broker_name=x[0], queue_id=x[4], queue_offset=x[5])) for x in picked],
    }


def _drive(address: str, reqs: list[tuple[str, object]], calls: int, concurrency: int) -> tuple[Stats, int, int]:
    """Drive the router with these requests; also their mean request and response sizes."""
    async def go() -> tuple[Stats, int, int]:
        async with grpc.aio.insecure_channel(address) as ch:
            stub = router_pb2_grpc.QueryRouterServiceStub(ch)
            sizes = [0, 0, 0]

            async def one(i: int) -> None:
                method, req = reqs[i % len(reqs)]
                res = await getattr(stub, method)(req, timeout=10)
                assert res.result.messages, method
                sizes[0] += req.ByteSize()  # type: ignore[attr-defined]
                sizes[1] += res.ByteSize()
                sizes[2] += 1

            s = await drive(one, calls, concurrency)
            return s, sizes[0] // sizes[2], sizes[1] // sizes[2]

    return asyncio.run(go())


def _queries(address: str, samples: list[Sample], args: argparse.Namespace, params: dict) -> list[Result]:  # type: ignore[type-arg]
    out: list[Result] = []
    kinds = _requests(samples)
    mixed = [r for quad in zip(*kinds.values()) for r in quad]
    with EchoCeiling() as echo:
        for c in (1, 16):
            for kind, reqs in [*kinds.items(), ("mixed", mixed)]:
                calls = args.queries * (2 if kind == "mixed" else 1)
                # Figure and ceiling interleaved, round after round, and the median round of
                # each taken: a burst of other load on the shared machine skews one round.
                figs, ceils = [], []
                for _ in range(args.rounds):
                    fig, req_b, resp_b = _drive(address, reqs, calls, c)
                    figs.append(fig)
                    ceils.append(echo.measure(req_b, resp_b, c, calls))
                rows = compare(kind, median_run(figs), median_run(ceils), {**params, "request_bytes": req_b, "response_bytes": resp_b, "rounds": args.rounds})
                rows[-1].params = {**rows[-1].params, "round_ratios": sorted(round(f.rate / e.rate, 3) for f, e in zip(figs, ceils))}
                out += rows
    return out


def run(argv: list[str]) -> list[Result]:
    p = argparse.ArgumentParser(prog="python -m bench router")
    p.add_argument("--messages", type=int, default=1_000_000)
    p.add_argument("--queries", type=int, default=2000, help="queries per kind for latency")
    p.add_argument("--read-bodies-from", choices=("indexer", "commitlog"), default="indexer")
    p.add_argument("--indexer-reads", choices=("store", "commitlog"), default="store")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds of figure and ceiling per kind (medians reported)")
    args = p.parse_args(argv)
    out: list[Result] = []
    with tempfile.TemporaryDirectory(prefix="quarry-bench-") as tmp:
        cluster = LocalCluster(root=Path(tmp), indexer_args=["--index-num", str(max(1000, args.messages))],
                               indexer_reads_store=args.indexer_reads == "store")
        try:
            cluster.start_router("--read-bodies-from", args.read_bodies_from)
            for name, host in HOSTS.items():
                cluster.add_broker(name, host)
            t0 = time.perf_counter()
            samples = _load(cluster, args.messages, 500)
            cluster.wait_indexed(timeout_s=1800)
            load_s = time.perf_counter() - t0
            params = {"messages": args.messages, "brokers": 3, "bodies_from": args.read_bodies_from, "indexer_reads": args.indexer_reads}
            out.append(Result("load: sent and indexed", args.messages / load_s, "msg/s", params))
            assert cluster.router is not None
            out += _queries(cluster.router.address, samples, args, params)
        finally:
            cluster.stop()
    return out
