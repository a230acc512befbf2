"""Crash under load: producers send to two brokers while broker-a's commitlog and indexer
are killed with SIGKILL at random moments and restarted. Afterwards every acknowledged
message must read back by offsetMsgId and be found by each key and by its unique key, no
query may return a record twice, and every queue's offsets must be gapless and unique.

`python -m scripts.crash_campaign --kills 20 --flush-mode SYNC [--seed N]` (kills per process).
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from quarry.clients.admin import AdminClient
from quarry.clients.errors import QuarryError
from quarry.clients.producer import Producer
from quarry.v1 import commitlog_pb2, commitlog_pb2_grpc
from scripts.launcher import LocalCluster, ServiceProcess

TOPIC = "CrashTopic"


@dataclass
class Report:
    flush_mode: str
    kills: dict[str, int] = field(default_factory=lambda: {"commitlog": 0, "indexer": 0})
    acked: int = 0
    send_failures: int = 0
    lost: list[str] = field(default_factory=list)
    not_found_by_key: list[str] = field(default_factory=list)
    not_found_by_unique_key: list[str] = field(default_factory=list)
    duplicates_returned: int = 0
    queue_problems: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not (self.lost or self.not_found_by_key or self.not_found_by_unique_key or self.duplicates_returned or self.queue_problems)


def _restart(proc: ServiceProcess) -> None:
    proc.kill()
    proc.start(wait_s=60)


def run(root: Path, kills: int, flush_mode: str, seed: int = 1, rate: float = 0.0) -> Report:
    rng = random.Random(seed)
    report = Report(flush_mode)
    t_start = time.monotonic()
    cluster = LocalCluster(root=root, commitlog_args=["--flush-mode", flush_mode, "--segment-size", str(1 << 20), "--flush-interval-ms", "200"],
                           indexer_args=["--hash-slots", "1009", "--index-num", "200000", "--flush-interval-ms", "200"], heartbeat_ms=300)
    acked: list = []
    lock = threading.Lock()
    stop = threading.Event()
    try:
        cluster.start_router("--broker-call-timeout-ms", "1500", "--query-timeout-ms", "4000")
        cluster.add_broker("broker-a", "127.0.0.21")
        cluster.add_broker("broker-b", "127.0.0.22")
        assert cluster.router is not None
        router = cluster.router.address

        def producer(n: int) -> None:
            i = 0
            t0 = time.monotonic()
            with Producer(router, retries=4, timeout_s=3) as p:
                while not stop.is_set():
                    if rate and i > rate * (time.monotonic() - t0):
                        stop.wait(1.0 / rate)  # pacing, not synchronisation
                        continue
                    keys = [f"p{n}-{i}", f"grp{n}-{i % 50}"]
                    try:
                        r = p.send(TOPIC, f"{n}:{i}".encode(), keys=keys)
                        with lock:
                            acked.append((r, keys))
                    except QuarryError:
                        report.send_failures += 1
                    i += 1

        threads = [threading.Thread(target=producer, args=(n,), daemon=True) for n in range(2)]
        for t in threads:
            t.start()
        broker = cluster.brokers["broker-a"]
        schedule = ["commitlog"] * kills + ["indexer"] * kills
        rng.shuffle(schedule)
        pause = threading.Event()
        for which in schedule:
            pause.wait(rng.uniform(0.05, 0.6))  # a random moment in the load
            _restart(broker.commitlog if which == "commitlog" else broker.indexer)
            report.kills[which] += 1
        stop.set()
        for t in threads:
            t.join(30)
        report.acked = len(acked)
        _verify(cluster, acked, report)
    finally:
        stop.set()
        cluster.stop()
        report.seconds = round(time.monotonic() - t_start, 1)
    return report


def _verify(cluster: LocalCluster, acked: list, report: Report) -> None:
    cluster.wait_indexed()
    assert cluster.router is not None
    with AdminClient(cluster.router.address) as admin:
        for r, keys in acked:
            try:
                got = admin.query_by_id(r.offset_msg_id).messages
                if not got or got[0].unique_key != r.msg_id:
                    report.lost.append(r.offset_msg_id)
            except QuarryError:
                report.lost.append(r.offset_msg_id)
                continue
            res = admin.query_by_key(TOPIC, keys[0])
            ids = [(m.broker_name, m.commit_log_offset) for m in res.messages]
            report.duplicates_returned += len(ids) - len(set(ids))
            if r.offset_msg_id not in {m.offset_msg_id for m in res.messages}:
                report.not_found_by_key.append(keys[0])
            try:
                copies = admin.query_by_unique_key(TOPIC, r.msg_id, return_all=True).messages
                if r.offset_msg_id not in {m.offset_msg_id for m in copies}:
                    report.not_found_by_unique_key.append(r.msg_id)
            except QuarryError:
                report.not_found_by_unique_key.append(r.msg_id)
    # Every queue: offsets 0..max-1 each exactly once, every acked message in its queue.
    for name, b in cluster.brokers.items():
        with grpc.insecure_channel(b.commitlog.address) as ch:
            stub = commitlog_pb2_grpc.CommitLogServiceStub(ch)
            status = stub.GetStoreStatus(commitlog_pb2.GetStoreStatusRequest(), timeout=10)
            for topic in status.topics:
                for qid, max_off in enumerate(topic.max_queue_offsets):
                    seen: list[int] = []
                    off = 0
                    while off < max_off:
                        resp = stub.PullMessages(commitlog_pb2.PullMessagesRequest(topic=topic.topic, queue_id=qid, queue_offset=off, max_count=512), timeout=10)
                        if not resp.messages:
                            report.queue_problems.append(f"{name}/{topic.topic}/{qid}: hole at queue offset {off} (max {max_off})")
                            break
                        seen += [m.queue_offset for m in resp.messages]
                        off = resp.next_queue_offset
                    if seen != list(range(len(seen))):
                        report.queue_problems.append(f"{name}/{topic.topic}/{qid}: offsets not gapless/unique")
            acked_here = {(r.message_queue.queue_id, r.queue_offset) for r, _ in acked if r.message_queue.broker_name == name}
            if len(acked_here) != len([1 for r, _ in acked if r.message_queue.broker_name == name]):
                report.queue_problems.append(f"{name}: two acknowledged messages share a queue offset")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m scripts.crash_campaign", description=__doc__)
    p.add_argument("--kills", type=int, default=20, help="SIGKILLs per process (commitlog and indexer each)")
    p.add_argument("--flush-mode", choices=["ASYNC", "SYNC"], default="ASYNC")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--rate", type=float, default=0.0, help="messages/s per producer (0: as fast as possible)")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="quarry-crash-") as tmp:
        report = run(Path(tmp), args.kills, args.flush_mode, args.seed, args.rate)
    print(json.dumps({**report.__dict__, "ok": report.ok}, indent=1))
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
