"""Crash during consumption: the official Python SDK's SimpleConsumer receives and acks what a
producer sent while the broker's commitlog is killed with SIGKILL at random moments and
restarted on the same store. Afterwards every sent message must have been acked (nothing lost,
nothing skipped), no message may be delivered again after an ack the broker confirmed, and
redeliveries of unconfirmed deliveries are counted (at-least-once).

`python -m scripts.consume_campaign --kills 20 [--messages N] [--seed N]` (docs/reliability.md).
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

from quarry.clients.admin import AdminClient
from quarry.clients.errors import QuarryError
from quarry.v1 import common_pb2
from scripts.launcher import LocalCluster

TOPIC = "ConsumeCrashTopic"
GROUP = "ConsumeCrashGroup"


@dataclass
class Report:
    kills: int = 0
    sent: int = 0
    deliveries: int = 0
    acked: int = 0
    redelivered_unconfirmed: int = 0  # deliveries again of messages whose ack was not confirmed (allowed)
    ack_failures: int = 0
    receive_failures: int = 0
    acked_unconfirmed: int = 0  # ack applied by the broker, its answer lost to the kill (status CONSUMED)
    lost: list[str] = field(default_factory=list)
    delivered_after_ack: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not (self.lost or self.delivered_after_ack) and self.sent > 0


def _state(admin: AdminClient, message_id: str) -> str:
    """The group's consume status of a message, as the CLI's track section shows it."""
    try:
        found = admin.query_by_unique_key(TOPIC, message_id).messages
        if not found:
            return "NOT_FOUND"
        m = found[0]
        for g in admin.track(TOPIC, m.broker_name, m.queue_id, m.queue_offset):
            if g.group == GROUP:
                return common_pb2.ConsumeState.Name(g.state).removeprefix("CONSUME_STATE_")
    except QuarryError as exc:
        return f"UNAVAILABLE ({exc})"
    return "NO_GROUP"


def run(root: Path, kills: int, messages: int = 400, seed: int = 1, drain_s: float = 180.0) -> Report:
    # The SDK is imported here: it starts its own machinery on import.
    from rocketmq import ClientConfiguration, Credentials, FilterExpression, Message, Producer, SimpleConsumer

    rng = random.Random(seed)
    report = Report()
    t_start = time.monotonic()
    cluster = LocalCluster(root=root, commitlog_args=["--flush-mode", "SYNC", "--segment-size", str(1 << 20)],
                           indexer_args=["--hash-slots", "1009", "--index-num", "20000"], heartbeat_ms=300)
    confirmed: dict[str, float] = {}  # message id -> when its ack was confirmed
    delivered: dict[str, int] = {}
    stop = threading.Event()
    try:
        cluster.start_router()
        cluster.add_broker("broker-a", "127.0.0.71")
        assert cluster.router is not None
        config = ClientConfiguration(cluster.router.address, Credentials(), request_timeout=3)
        producer = Producer(config, (TOPIC,))
        producer.startup()
        sent: set[str] = set()
        try:
            for i in range(messages):
                m = Message()
                m.topic, m.body, m.tag = TOPIC, f"m{i}".encode(), "T"
                sent.add(producer.send(m).message_id)
        finally:
            producer.shutdown()
        report.sent = len(sent)
        consumer = SimpleConsumer(config, GROUP, {TOPIC: FilterExpression("*")}, await_duration=1)
        consumer.startup()

        def consume() -> None:
            while not stop.is_set():
                try:
                    batch = consumer.receive(16, 3)
                except Exception:
                    report.receive_failures += 1
                    stop.wait(0.2)  # the broker is restarting
                    continue
                for m in batch:
                    report.deliveries += 1
                    if m.message_id in confirmed:
                        report.delivered_after_ack.append(m.message_id)
                    elif delivered.get(m.message_id):
                        report.redelivered_unconfirmed += 1
                    delivered[m.message_id] = delivered.get(m.message_id, 0) + 1
                    try:
                        consumer.ack(m)
                        confirmed[m.message_id] = time.monotonic()
                    except Exception:
                        report.ack_failures += 1

        worker = threading.Thread(target=consume, daemon=True)
        worker.start()
        commitlog = cluster.brokers["broker-a"].commitlog
        pause = threading.Event()
        for _ in range(kills):
            pause.wait(rng.uniform(0.1, 1.0))  # a random moment in the consumption
            commitlog.kill()
            commitlog.start(wait_s=60)
            report.kills += 1
        end = time.monotonic() + drain_s
        with AdminClient(cluster.router.address) as admin:
            unresolved = sent - set(confirmed)
            while unresolved and time.monotonic() < end:
                pause.wait(1.0)
                # An ack whose answer the kill swallowed was still applied: the broker says CONSUMED.
                unresolved = {mid for mid in sent - set(confirmed) if _state(admin, mid) != "CONSUMED"}
            stop.set()
            worker.join(30)
            consumer.shutdown()
            report.acked = len(confirmed)
            report.acked_unconfirmed = len(sent - set(confirmed)) - len(unresolved)
            report.lost = sorted(unresolved)
    finally:
        stop.set()
        cluster.stop()
        report.seconds = round(time.monotonic() - t_start, 1)
    return report


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m scripts.consume_campaign", description=__doc__)
    p.add_argument("--kills", type=int, default=20, help="SIGKILLs of the commitlog during consumption")
    p.add_argument("--messages", type=int, default=400)
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="quarry-consume-crash-") as tmp:
        report = run(Path(tmp), args.kills, args.messages, args.seed)
    print(json.dumps({**report.__dict__, "ok": report.ok}, indent=1))
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
