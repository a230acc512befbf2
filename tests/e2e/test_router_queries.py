"""The four queries through the router, on three real brokers (127.0.0.2/3/4) and a router.

Covers: the same key on every broker; equal-hash keys (Aa/BB) and slot-sharing keys that
must not leak; multi-key messages; a unique key re-sent (two copies); an id made at the end
of the previous month; pages; a broker killed mid-run; re-registration at a new address;
malformed input.
"""
from __future__ import annotations

import time
from datetime import datetime, timezone
from typing import Iterator

import grpc
import pytest

from quarry.formats.unique_key import UniqueKeyGenerator
from quarry.v1 import commitlog_pb2, commitlog_pb2_grpc, common_pb2, router_pb2, router_pb2_grpc
from scripts.launcher import LocalCluster
from tests.e2e.conftest import wait_until

TOPIC = "OrderTopic"
HOSTS = {"broker-a": "127.0.0.2", "broker-b": "127.0.0.3", "broker-c": "127.0.0.4"}


class Env:
    def __init__(self, cluster: LocalCluster) -> None:
        self.cluster = cluster
        assert cluster.router is not None
        self.channel = grpc.insecure_channel(cluster.router.address)
        self.router = router_pb2_grpc.QueryRouterServiceStub(self.channel)
        self._cl: dict[str, grpc.Channel] = {}

    def commitlog(self, broker: str) -> commitlog_pb2_grpc.CommitLogServiceStub:
        addr = self.cluster.brokers[broker].commitlog.address
        if addr not in self._cl:
            self._cl[addr] = grpc.insecure_channel(addr)
        return commitlog_pb2_grpc.CommitLogServiceStub(self._cl[addr])

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

    def close(self) -> None:
        for ch in self._cl.values():
            ch.close()
        self.channel.close()


@pytest.fixture
def env(cluster_factory) -> Iterator[Env]:  # type: ignore[no-untyped-def]
    # Tiny hash tables so distinct keys share slots, as they do in a full-size index.
    cluster = cluster_factory(commitlog_args=["--segment-size", str(1 << 20)], indexer_args=["--hash-slots", "7", "--index-num", "400", "--flush-interval-ms", "100"])
    cluster.start_router("--query-timeout-ms", "2000", "--broker-call-timeout-ms", "1000")
    for name, host in HOSTS.items():
        cluster.add_broker(name, host)
    e = Env(cluster)
    yield e
    e.close()


def _uid_gen(now_ms: int) -> UniqueKeyGenerator:
    return UniqueKeyGenerator(ip="10.1.2.3", pid=4242, class_loader_hash=0x1234ABCD, tz=timezone.utc, clock=lambda: now_ms)


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


def test_equal_hash_and_shared_slot_keys_never_leak(env: Env) -> None:
    # "Aa" and "BB" have equal Java hash codes, so TOPIC#Aa and TOPIC#BB do too; with 7 slots
    # many other keys share a slot as well.
    env.send("broker-a", b"aa", keys=["Aa"])
    env.send("broker-a", b"bb", keys=["BB"])
    others = [f"slot-{i}" for i in range(12)]
    for k in others:
        env.send("broker-b", k.encode(), keys=[k])
    env.send("broker-c", b"other topic", keys=["Aa"], topic="OtherTopic")
    env.wait_key("slot-11", 1)
    aa = env.wait_key("Aa", 1)
    assert [m.body for m in aa.messages] == [b"aa"]
    assert aa.collisions_filtered >= 1  # BB came back from the index and was dropped
    bb = env.by_key("BB")
    assert [m.body for m in bb.messages] == [b"bb"]
    for k in others:
        assert [m.body for m in env.by_key(k).messages] == [k.encode()]


def test_multi_key_message_is_found_by_each_key(env: Env) -> None:
    r = env.send("broker-b", b"multi", keys=["k1", "k2", "k3"])
    for k in ("k1", "k2", "k3"):
        found = env.wait_key(k, 1)
        assert [m.offset_msg_id for m in found.messages] == [r.offset_msg_id]
        assert list(found.messages[0].keys) == ["k1", "k2", "k3"]


def test_resent_unique_key_returns_earliest_copy_and_counts_copies(env: Env) -> None:
    uid = _uid_gen(int(time.time() * 1000)).next_id()
    first = env.send("broker-a", b"v1", unique_key=uid)
    second = env.send("broker-c", b"v1", unique_key=uid)
    result = wait_until(lambda: (r := env.by_uniq(uid, return_all=True)) and r.copies == 2 and r, what="two copies")
    assert [m.offset_msg_id for m in result.messages] == [first.offset_msg_id, second.offset_msg_id]
    one = env.by_uniq(uid)
    assert one.copies == 2 and [m.offset_msg_id for m in one.messages] == [first.offset_msg_id]


def test_unique_key_made_at_the_end_of_the_previous_month_is_found(env: Env) -> None:
    now = datetime.now(timezone.utc)
    month_start = datetime(now.year, now.month, 1, tzinfo=timezone.utc)
    made_at = int(month_start.timestamp() * 1000) - 1500  # 1.5 s before this month began
    uid = _uid_gen(made_at).next_id()
    sent = env.send("broker-b", b"late", unique_key=uid)
    result = wait_until(lambda: env.by_uniq(uid), what="previous-month id")
    assert [m.offset_msg_id for m in result.messages] == [sent.offset_msg_id]


def test_unique_key_that_is_an_offset_msg_id_is_read_directly(env: Env) -> None:
    sent = env.send("broker-c", b"direct")
    result = env.by_uniq(sent.offset_msg_id)
    assert [m.body for m in result.messages] == [b"direct"]


def test_pages_return_every_match_exactly_once(env: Env) -> None:
    expected = set()
    for i in range(30):
        expected.add(env.send(list(HOSTS)[i % 3], f"p{i}".encode(), keys=["paged"]).offset_msg_id)
    env.wait_key("paged", 30)
    seen: list[str] = []
    token = ""
    for _ in range(20):
        page = env.by_key("paged", max_num=7, continuation_token=token)
        seen += [m.offset_msg_id for m in page.messages]
        token = page.next_continuation_token
        if not token:
            break
    assert len(seen) == len(set(seen)) == 30
    assert set(seen) == expected


def test_by_id_and_by_offset(env: Env) -> None:
    sent = env.send("broker-b", b"where am i", keys=["x"])
    got = env.router.QueryMsgById(router_pb2.QueryMsgByIdRequest(offset_msg_id=sent.offset_msg_id), timeout=5).result
    assert [m.body for m in got.messages] == [b"where am i"] and got.messages[0].broker_name == "broker-b"
    env.wait_route(brokers=1)
    at = env.router.QueryMsgByOffset(
        router_pb2.QueryMsgByOffsetRequest(topic=TOPIC, broker_name="broker-b", queue_id=sent.queue_id, queue_offset=sent.queue_offset), timeout=5
    ).result
    assert [m.offset_msg_id for m in at.messages] == [sent.offset_msg_id]
    with pytest.raises(grpc.RpcError) as err:
        env.router.QueryMsgByOffset(router_pb2.QueryMsgByOffsetRequest(topic=TOPIC, broker_name="broker-b", queue_id=sent.queue_id, queue_offset=10_000), timeout=5)
    assert err.value.code() == grpc.StatusCode.NOT_FOUND and "valid range" in err.value.details()


def test_killed_broker_is_reported_within_the_deadline(env: Env) -> None:
    for b in HOSTS:
        env.send(b, b"k", keys=["survivor"])
    env.wait_key("survivor", 3)
    env.cluster.brokers["broker-c"].indexer.kill()
    t0 = time.monotonic()
    result = env.by_key("survivor", timeout_ms=2000)
    assert time.monotonic() - t0 < 3.5
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


@pytest.mark.parametrize(
    ("call", "field"),
    [
        (lambda r: r.QueryMsgByKey(router_pb2.QueryMsgByKeyRequest(topic="bad topic!", key="k"), timeout=5), "topic"),
        (lambda r: r.QueryMsgByKey(router_pb2.QueryMsgByKeyRequest(topic=TOPIC, key=""), timeout=5), "key"),
        (lambda r: r.QueryMsgByKey(router_pb2.QueryMsgByKeyRequest(topic=TOPIC, key="k", max_num=65), timeout=5), "max_num"),
        (lambda r: r.QueryMsgByKey(router_pb2.QueryMsgByKeyRequest(topic=TOPIC, key="k", begin_timestamp=10, end_timestamp=5), timeout=5), "end_timestamp"),
        (lambda r: r.QueryMsgByKey(router_pb2.QueryMsgByKeyRequest(topic=TOPIC, key="k", continuation_token="garbage!"), timeout=5), "continuation_token"),
        (lambda r: r.QueryMsgById(router_pb2.QueryMsgByIdRequest(offset_msg_id="XYZ"), timeout=5), "offset_msg_id"),
        (lambda r: r.QueryMsgById(router_pb2.QueryMsgByIdRequest(offset_msg_id="0A00000100002A9F00000000000000"), timeout=5), "offset_msg_id"),
        (lambda r: r.QueryMsgByUniqueKey(router_pb2.QueryMsgByUniqueKeyRequest(topic=TOPIC, unique_key=""), timeout=5), "unique_key"),
        (lambda r: r.QueryMsgByOffset(router_pb2.QueryMsgByOffsetRequest(topic=TOPIC, broker_name="broker-a", queue_id=-1), timeout=5), "queue_id"),
        (lambda r: r.QueryMsgByOffset(router_pb2.QueryMsgByOffsetRequest(topic=TOPIC, broker_name="broker-a", queue_offset=-1), timeout=5), "queue_offset"),
        (lambda r: r.RegisterBroker(router_pb2.RegisterBrokerRequest(broker_name=""), timeout=5), "broker_name"),
    ],
)
def test_malformed_input_is_invalid_argument_naming_the_field(env: Env, call, field: str) -> None:  # type: ignore[no-untyped-def]
    env.send("broker-a", b"x", keys=["k"])
    env.wait_route(brokers=1)
    with pytest.raises(grpc.RpcError) as err:
        call(env.router)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value.details()
    assert field in err.value.details()


def test_unknown_store_host_and_unknown_topic_are_not_found(env: Env) -> None:
    with pytest.raises(grpc.RpcError) as err:
        env.router.QueryMsgById(router_pb2.QueryMsgByIdRequest(offset_msg_id="0A0000010000270F0000000000000000"), timeout=5)
    assert err.value.code() == grpc.StatusCode.NOT_FOUND and "10.0.0.1:9999" in err.value.details()
    with pytest.raises(grpc.RpcError) as err:
        env.by_key("k", topic="NoSuchTopic")
    assert err.value.code() == grpc.StatusCode.NOT_FOUND and "no route" in err.value.details()
