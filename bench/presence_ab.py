"""Key presence, A/B in one run: one cluster of three brokers, two routers over it, one asking
a key or unique-key query only of the brokers whose key presence filter may hold the key
(`--key-presence on`, the default), the other asking every broker holding the topic (`off`);
all driven by the same client, the same queries, rounds interleaved (A, B, then B, A, ...) so
load on the shared machine falls on both alike. Besides rate and latency, the CPU time per
query of the router and of the six broker processes (utime + stime from /proc), which other
load disturbs far less than a rate does.

`.venv/bin/python -m bench presence_ab [--messages N] [--queries N] [--cycles N]`
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

import grpc

from bench.ceiling import Stats
from bench.router import HOSTS, _drive, _load, _requests
from bench.runner import Result, process_cpu_s
from quarry.v1 import commitlog_pb2, commitlog_pb2_grpc
from scripts.launcher import LocalCluster, ServiceProcess, free_port


def _static_brokers(cluster: LocalCluster) -> str:
    """The cluster's brokers as --static-brokers names them (for the second router)."""
    items = []
    for name, b in cluster.brokers.items():
        with grpc.insecure_channel(b.commitlog.address) as ch:
            status = commitlog_pb2_grpc.CommitLogServiceStub(ch).GetStoreStatus(commitlog_pb2.GetStoreStatusRequest(), timeout=10)
        items.append(f"{name}={b.commitlog.address},{b.indexer.address},{status.store_host.ip}:{status.store_host.port}")
    return ";".join(items)


def run_ab(argv: list[str], prog: str, variants: dict[str, list[str]], param: str, kinds: tuple[str, ...]) -> list[Result]:
    """One router per variant (its extra flags) over one cluster, rounds interleaved; `param`
    names the variant in the rows, `kinds` the query kinds driven (and "mixed")."""
    p = argparse.ArgumentParser(prog=f"python -m bench {prog}")
    p.add_argument("--messages", type=int, default=30_000)
    p.add_argument("--queries", type=int, default=400, help="queries per kind, concurrency and router in each cycle")
    p.add_argument("--cycles", type=int, default=3)
    args = p.parse_args(argv)
    names = list(variants)
    out: list[Result] = []
    with tempfile.TemporaryDirectory(prefix="quarry-bench-") as tmp:
        root = Path(tmp)
        cluster = LocalCluster(root=root, indexer_args=["--index-num", str(max(1000, args.messages))], indexer_reads_store=True)
        others: list[ServiceProcess] = []
        try:
            cluster.start_router(*variants[names[0]])
            for name, host in HOSTS.items():
                cluster.add_broker(name, host)
            samples = _load(cluster, args.messages, 500)
            cluster.wait_indexed(timeout_s=600)
            assert cluster.router is not None
            static = _static_brokers(cluster)
            routers = {names[0]: cluster.router}
            for mode in names[1:]:
                others.append(ServiceProcess("router", f"127.0.0.1:{free_port('127.0.0.1')}",
                                             [*variants[mode], "--static-brokers", static, "--remoting-bind", "off"],
                                             root / "logs" / f"router-{mode}.log").start())
                routers[mode] = others[-1]
            broker_pids = [p.proc.pid for b in cluster.brokers.values() for p in (b.commitlog, b.indexer) if p.proc is not None]
            requests = _requests(samples)
            work = {k: requests[k] for k in kinds if k != "mixed"}
            if "mixed" in kinds:
                work["mixed"] = [r for quad in zip(*requests.values()) for r in quad]
            stats: dict[tuple[str, int, str], list[tuple[Stats, float, float]]] = {}
            for cycle in range(args.cycles):
                for concurrency in (1, 16):
                    for kind, reqs in work.items():
                        for mode in (names if cycle % 2 == 0 else names[::-1]):
                            router = routers[mode]
                            assert router.proc is not None
                            r0, b0 = process_cpu_s(router.proc.pid), sum(process_cpu_s(pid) for pid in broker_pids)
                            s, _, _ = _drive(router.address, reqs, args.queries, concurrency)
                            r1, b1 = process_cpu_s(router.proc.pid), sum(process_cpu_s(pid) for pid in broker_pids)
                            done = args.queries + min(50, args.queries)  # _drive's warm-up calls run too
                            stats.setdefault((kind, concurrency, mode), []).append((s, (r1 - r0) / done * 1e6, (b1 - b0) / done * 1e6))
            for (kind, concurrency, mode), runs in stats.items():
                params = {"brokers": 3, "messages": args.messages, "cycles": args.cycles, "concurrency": concurrency, param: mode}
                out += [
                    Result(f"A/B {kind} rate", statistics.median(s.rate for s, _, _ in runs), "queries/s", params),
                    Result(f"A/B {kind} p50", statistics.median(s.p50_ms for s, _, _ in runs), "ms", params),
                    Result(f"A/B {kind} p99", statistics.median(s.p99_ms for s, _, _ in runs), "ms", params),
                    Result(f"A/B {kind} router CPU per query", statistics.median(r for _, r, _ in runs), "us", params),
                    Result(f"A/B {kind} brokers' CPU per query", statistics.median(b for _, _, b in runs), "us", params),
                ]
            for kind in work:
                for concurrency in (1, 16):
                    for a, b in [(a, b) for i, a in enumerate(names) for b in names[i + 1:]]:
                        ratio = (statistics.median(s.rate for s, _, _ in stats[(kind, concurrency, a)])
                                 / statistics.median(s.rate for s, _, _ in stats[(kind, concurrency, b)]))
                        out.append(Result(f"A/B {kind} rate, {a} / {b}", ratio, "x",
                                          {"brokers": 3, "messages": args.messages, "cycles": args.cycles, "concurrency": concurrency}))
        finally:
            for router in others:
                router.stop()
            cluster.stop()
    return out


KEY_PRESENCE = {"on": ["--key-presence", "on"], "off": ["--key-presence", "off"]}


def run(argv: list[str]) -> list[Result]:
    return run_ab(argv, "presence_ab", KEY_PRESENCE, "key_presence", ("by key", "by unique key", "mixed"))
