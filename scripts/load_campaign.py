"""Load: N concurrent clients mixing sends and the four queries for a fixed time against a
router and two brokers. Reports errors by code, p50/p99 per operation and each service's
peak RSS (VmHWM).

`python -m scripts.load_campaign --clients 16 --seconds 60`
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path

from quarry.clients.admin import AdminClient
from quarry.clients.errors import NotFoundError, QuarryError
from quarry.clients.producer import Producer
from scripts.launcher import LocalCluster, ServiceProcess

TOPIC = "LoadTopic"
BACK_PRESSURE = {"RESOURCE_EXHAUSTED"}  # the documented refusal; everything else is an error


def _peak_rss_mb(proc: ServiceProcess) -> float:
    assert proc.proc is not None
    for line in Path(f"/proc/{proc.proc.pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def run(root: Path, clients: int, seconds: float, router_args: tuple[str, ...] = ()) -> dict:
    cluster = LocalCluster(root=root, commitlog_args=["--segment-size", str(64 << 20)], indexer_args=["--hash-slots", "100003", "--index-num", "2000000"])
    latencies: dict[str, list[float]] = defaultdict(list)
    errors: Counter[str] = Counter()
    sent: list = []
    lock = threading.Lock()
    stop = threading.Event()
    try:
        router = cluster.start_router(*router_args).address
        cluster.add_broker("broker-a", "127.0.0.51")
        cluster.add_broker("broker-b", "127.0.0.52")
        with Producer(router) as p:
            for i in range(50):
                sent.append(p.send(TOPIC, b"seed", keys=[f"seed-{i}"]))

        def client(n: int) -> None:
            rng = random.Random(n)
            with Producer(router) as p, AdminClient(router) as admin:
                i = 0
                while not stop.is_set():
                    op = ["send", "send", "id", "key", "unique", "offset"][i % 6]
                    with lock:
                        target = rng.choice(sent)
                    t0 = time.perf_counter()
                    try:
                        if op == "send":
                            r = p.send(TOPIC, b"x" * 512, keys=[f"c{n}-{i}", "load"])
                            with lock:
                                sent.append(r)
                        elif op == "id":
                            admin.query_by_id(target.offset_msg_id)
                        elif op == "key":
                            admin.query_by_key(TOPIC, "load", max_num=16)
                        elif op == "unique":
                            admin.query_by_unique_key(TOPIC, target.msg_id)
                        else:
                            admin.query_by_offset(TOPIC, target.message_queue.broker_name, target.message_queue.queue_id, target.queue_offset)
                    except NotFoundError:
                        pass  # a unique key sent a moment ago may not be indexed yet
                    except QuarryError as exc:
                        errors[f"{op}:{exc.code}"] += 1
                    latencies[op].append((time.perf_counter() - t0) * 1000)
                    i += 1

        threads = [threading.Thread(target=client, args=(n,)) for n in range(clients)]
        for t in threads:
            t.start()
        stop.wait(seconds)
        stop.set()
        for t in threads:
            t.join(30)
        rss = {"router": _peak_rss_mb(cluster.router)}  # type: ignore[arg-type]
        for name, b in cluster.brokers.items():
            rss[f"{name}-commitlog"] = _peak_rss_mb(b.commitlog)
            rss[f"{name}-indexer"] = _peak_rss_mb(b.indexer)
    finally:
        stop.set()
        cluster.stop()
    ops = {
        op: {"count": len(v), "p50_ms": round(statistics.median(v), 2), "p99_ms": round(sorted(v)[int(len(v) * 0.99)], 2)}
        for op, v in latencies.items() if v
    }
    unexpected = {k: n for k, n in errors.items() if k.split(":")[1] not in BACK_PRESSURE}
    return {"clients": clients, "seconds": seconds, "operations": ops, "errors": dict(errors), "unexpected_errors": unexpected, "peak_rss_mb": {k: round(v, 1) for k, v in rss.items()}}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m scripts.load_campaign", description=__doc__)
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--seconds", type=float, default=60.0)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="quarry-load-") as tmp:
        report = run(Path(tmp), args.clients, args.seconds)
    print(json.dumps(report, indent=1))
    return 0 if not report["unexpected_errors"] else 1


if __name__ == "__main__":
    sys.exit(main())
