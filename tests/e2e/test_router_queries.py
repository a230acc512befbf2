"""Queries through the router on three real broker processes (127.0.0.2/3/4) and a router
process: what needs processes. The same key found on every broker (sent, tailed, indexed,
heartbeats), a broker killed mid-run, re-registration at a new address. The query logic itself
(merge, collisions, unique keys, ids, offsets, pages, errors) is tested in process in
tests/unit/test_router_queries.py.
"""
from __future__ import annotations

from typing import Iterator

import pytest

from quarry.v1 import commitlog_pb2, common_pb2, router_pb2
from tests.e2e.conftest import wait_until
from tests.e2e.stubs import ClusterStubs

TOPIC = "OrderTopic"
HOSTS = {"broker-a": "127.0.0.2", "broker-b": "127.0.0.3", "broker-c": "127.0.0.4"}


class Env(ClusterStubs):
    def send(self, broker: str, body: bytes, keys: list[str] = (), unique_key: str = "", topic: str = TOPIC) -> common_pb2.SendResult:
        msg = common_pb2.MessageInput(topic=topic, body=body, keys=list(keys), unique_key=unique_key, queue_id=-1, tags="TagA")
        return self.commitlog(broker).SendMessage(commitlog_pb2.SendMessageRequest(message=msg), timeout=5).result

    def by_key(self, key: str, **kw: object) -> router_pb2.QueryResult:
        return self.router.QueryMsgByKey(router_pb2.QueryMsgByKeyRequest(topic=kw.pop("topic", TOPIC), key=key, **kw), timeout=10).result

    def by_uniq(self, uid: str, **kw: object) -> router_pb2.QueryResult:
        return self.router.QueryMsgByUniqueKey(router_pb2.QueryMsgByUniqueKeyRequest(topic=kw.pop("topic", TOPIC), unique_key=uid, **kw), timeout=10).result

    def wait_key(self, key: str, count: int, topic: str = TOPIC) -> router_pb2.QueryResult:
        return wait_until(lambda: (r := self.by_key(key, topic=topic)) and len(r.messages) >= count and r, what=f"{count} messages for key {key}")  # type: ignore[return-value]

    def wait_route(self, topic: str = TOPIC, brokers: int = 3) -> None:
        wait_until(lambda: len(self.router.GetTopicRoute(router_pb2.GetTopicRouteRequest(topic=topic), timeout=2).brokers) >= brokers, what=f"route of {topic} on {brokers} brokers")


@pytest.fixture
def env(cluster_factory) -> Iterator[Env]:  # type: ignore[no-untyped-def]
    # Tiny hash tables so distinct keys share slots, as they do in a full-size index.
    cluster = cluster_factory(commitlog_args=["--segment-size", str(1 << 20)], indexer_args=["--hash-slots", "7", "--index-num", "400", "--flush-interval-ms", "100"])
    # Time limits a loaded machine does not reach: a killed broker fails at once (refused).
    cluster.start_router("--query-timeout-ms", "10000", "--broker-call-timeout-ms", "5000")
    for name, host in HOSTS.items():
        cluster.add_broker(name, host)
    e = Env(cluster)
    yield e
    e.close()


def test_same_key_on_every_broker_is_found_on_all_newest_first(env: Env) -> None:
    sent = [env.send(b, f"order on {b}".encode(), keys=["order-1"]) for b in HOSTS]
    ids = {r.offset_msg_id for r in sent}
    assert len(ids) == 3  # distinct hosts give distinct offsetMsgIds
    result = env.wait_key("order-1", 3)
    assert {m.offset_msg_id for m in result.messages} == ids
    assert {m.broker_name for m in result.messages} == set(HOSTS)
    assert result.complete and all(o.answered for o in result.brokers) and len(result.brokers) == 3
    stamps = [m.store_timestamp for m in result.messages]
    assert stamps == sorted(stamps, reverse=True)


def test_killed_broker_is_reported_not_hidden(env: Env) -> None:
    for b in HOSTS:
        env.send(b, b"k", keys=["survivor"])
    env.wait_key("survivor", 3)
    env.cluster.brokers["broker-c"].indexer.kill()
    result = env.by_key("survivor", timeout_ms=8000)  # within the call's own 10 s timeout
    assert not result.complete
    failed = [o for o in result.brokers if not o.answered]
    assert [o.broker_name for o in failed] == ["broker-c"] and failed[0].error_code
    assert {m.broker_name for m in result.messages} == {"broker-a", "broker-b"}


def test_broker_reregistering_at_a_new_address_is_followed(env: Env) -> None:
    broker = env.cluster.brokers["broker-a"]
    broker.indexer.stop()
    broker.commitlog.stop()
    moved = env.cluster.add_broker("broker-a", "127.0.0.5")
    sent = env.send("broker-a", b"moved", keys=["moved"])
    assert sent.offset_msg_id.startswith("7F000005")
    found = env.wait_key("moved", 1)
    assert found.messages[0].offset_msg_id == sent.offset_msg_id
    brokers = env.router.ListBrokers(router_pb2.ListBrokersRequest(), timeout=5).brokers
    assert [b.commitlog_addr for b in brokers if b.broker_name == "broker-a"] == [moved.commitlog.address]
