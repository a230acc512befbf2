"""Round trips over a broker's RocketMQ 4 remoting port, A/B between source trees in one run.

Each tree runs its own cluster (router, commitlog reading its indexer's IndexFiles, indexer)
with its own interpreter, holding the same seeded messages (1 KiB bodies, a key and a unique
key each). One Python remoting client asks one request at a time, the trees taking turns
request by request so load on the shared machine falls on both alike: GET_MAX_OFFSET (the
transport and little else), VIEW_MESSAGE_BY_ID, QUERY_MESSAGE for a key present, a key absent
and a unique key. Per tree and kind: p50 and p99 of the round trip; the ratio of the last tree
to the first; and each commitlog's CPU per request (utime + stime over the measured requests).

`.venv/bin/python -m bench remoting_requests [--trees base=git:REV main=.] [--seed N] [--rounds N]`
(a tree is a checkout with `make setup` done, or `git:<revision>`: see bench.runner.source_tree;
one tree, this checkout, by default).
"""
from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

from bench.ceiling import pct
from bench.runner import Result, process_cpu_s, source_tree, tree_python
from quarry.channels import open_channel
from quarry.formats import offset_msg_id
from quarry.services.remoting import codes
from quarry.services.remoting.command import RemotingCommand
from quarry.v1 import commitlog_pb2, commitlog_pb2_grpc, common_pb2
from scripts.launcher import LocalCluster
from tests.remoting_client import RemotingClient

TOPIC = "BenchRemotingRequests"
KINDS = ("max offset", "by id", "key", "key absent", "unique key")


def _seed(address: str, n: int) -> list[tuple[str, str]]:
    """n messages in batches; their (offsetMsgId, unique key)."""
    msgs = [common_pb2.MessageInput(topic=TOPIC, body=b"x" * 1024, keys=[f"key-{i}"], unique_key=f"0A0000010000{i:020X}", queue_id=i % 4)
            for i in range(n)]
    out: list[tuple[str, str]] = []
    with open_channel(address) as ch:
        stub = commitlog_pb2_grpc.CommitLogServiceStub(ch)
        for j in range(0, n, 200):
            results = stub.SendBatch(commitlog_pb2.SendBatchRequest(messages=msgs[j:j + 200]), timeout=30).results
            out += [(r.offset_msg_id, r.unique_key) for r in results]
    return out


def _request(client: RemotingClient, kind: str, i: int, ids: list[tuple[str, str]]) -> RemotingCommand:
    end = int(time.time() * 1000) + 3_600_000
    if kind == "max offset":
        return client.request(codes.GET_MAX_OFFSET, {"topic": TOPIC, "queueId": i % 4})
    if kind == "by id":
        return client.request(codes.VIEW_MESSAGE_BY_ID, {"offset": offset_msg_id.decode(ids[i][0]).offset})
    key = {"key": f"key-{i}", "key absent": f"absent-{i}", "unique key": ids[i][1]}[kind]
    req = client.request(codes.QUERY_MESSAGE, {"topic": TOPIC, "key": key, "maxNum": 32, "beginTimestamp": 0, "endTimestamp": end})
    req.ext_fields[codes.UNIQUE_KEY_QUERY_FLAG] = "true" if kind == "unique key" else "false"
    return req


async def _measure(brokers: dict[str, str], ids: list[tuple[str, str]], rounds: int, pids: dict[str, int]) -> tuple[dict[tuple[str, str], list[float]], dict[str, float]]:
    lat: dict[tuple[str, str], list[float]] = {}
    cpu: dict[str, float] = {name: 0.0 for name in brokers}
    clients = {name: await RemotingClient(addr).connect() for name, addr in brokers.items()}
    try:
        names = list(brokers)
        for r in range(rounds + 1):  # round 0 warms up
            cpu0 = {name: process_cpu_s(pid) for name, pid in pids.items()}
            for i in range(len(ids)):
                for kind in KINDS:
                    for name in (names if (i + r) % 2 == 0 else names[::-1]):
                        client = clients[name]
                        req = _request(client, kind, i, ids)
                        t0 = time.perf_counter()
                        resp = await client.invoke(req)
                        took = time.perf_counter() - t0
                        if (resp.code == codes.SUCCESS) != (kind != "key absent"):
                            raise RuntimeError(f"{name} {kind} {i}: code {resp.code} {resp.remark}")
                        if r:
                            lat.setdefault((name, kind), []).append(took * 1e6)
            if r:
                for name, pid in pids.items():
                    cpu[name] += process_cpu_s(pid) - cpu0[name]
    finally:
        for client in clients.values():
            await client.close()
    return lat, cpu


def run(argv: list[str]) -> list[Result]:
    p = argparse.ArgumentParser(prog="bench remoting_requests")
    p.add_argument("--trees", nargs="+", default=["main=."], help="name=tree, name=git:<revision>, ... (the last is compared with the first)")
    p.add_argument("--seed", type=int, default=2000, help="messages, each asked for once a round by each kind")
    p.add_argument("--rounds", type=int, default=3, help="measured rounds (after one unmeasured)")
    args = p.parse_args(argv)
    trees = {name: source_tree(spec) for name, spec in (t.split("=", 1) for t in args.trees)}
    clusters: dict[str, LocalCluster] = {}
    with tempfile.TemporaryDirectory(prefix="bench-remoting-requests-") as tmp:
        try:
            brokers, pids, ids = {}, {}, []
            for n, (name, tree) in enumerate(trees.items()):
                cluster = clusters[name] = LocalCluster(root=Path(tmp) / name, python=tree_python(tree))
                cluster.start_router(host=f"127.0.0.{60 + 2 * n}")
                b = cluster.add_broker("broker-a", f"127.0.0.{61 + 2 * n}")
                ids = _seed(b.commitlog.address, args.seed)
                cluster.wait_indexed()
                brokers[name], pids[name] = b.commitlog.remoting_address, b.commitlog.proc.pid  # type: ignore[union-attr]
            lat, cpu = asyncio.run(_measure(brokers, ids, args.rounds, pids))
        finally:
            for cluster in clusters.values():
                cluster.stop()
    params: dict[str, object] = {"seed": args.seed, "rounds": args.rounds, "body_bytes": 1024, "client": "Python remoting, one request at a time",
                                 "trees": " ".join(args.trees)}
    results = []
    requests = args.seed * args.rounds * len(KINDS)
    for name in trees:
        for kind in KINDS:
            v = lat[(name, kind)]
            results += [Result(f"remoting round trip p50, {kind}, {name}", round(pct(v, 0.5), 1), "us", params),
                        Result(f"remoting round trip p99, {kind}, {name}", round(pct(v, 0.99), 1), "us", params)]
        results.append(Result(f"commitlog CPU per remoting request, {name}", round(cpu[name] / requests * 1e6, 1), "us", params))
    first, last = list(trees)[0], list(trees)[-1]
    if first != last:
        for kind in KINDS:
            results.append(Result(f"remoting round trip p50 {last} / {first}, {kind}",
                                  round(pct(lat[(last, kind)], 0.5) / pct(lat[(first, kind)], 0.5), 3), "x", params))
        results.append(Result(f"commitlog CPU per remoting request {last} / {first}", round(cpu[last] / cpu[first], 3), "x", params))
    return results
