"""The router's queries (`Queries`) over three real brokers served in this process: merge,
collision filter, unique-key copies, ids, offsets, paging, a broker that stops answering, and
errors. Processes are left to tests/e2e (lifecycle, crashes, re-registration)."""
from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path

import grpc
import pytest

from quarry.formats.unique_key import UniqueKeyGenerator
from quarry.v1 import router_pb2, router_pb2_grpc
from quarry.services.errors import InvalidArgument, NotFound
from quarry.services.query.queries import BODIES_FROM_COMMITLOG, BODIES_FROM_INDEXER, Queries, QuerySettings
from quarry.services.query.registry import BrokerRegistry
from tests.servicers import Blocking, InProcessBroker, in_process_router, send

TOPIC = "OrderTopic"
HOSTS = {"broker-a": ("10.0.0.2", 10911), "broker-b": ("10.0.0.3", 10911), "broker-c": ("10.0.0.4", 10911)}


class Env:
    def __init__(self, brokers: dict[str, InProcessBroker], registry: BrokerRegistry, queries: Queries, router_addr: str) -> None:
        self.brokers = brokers
        self.registry = registry
        self.queries = Blocking(queries)  # the router's coroutines, run on the servers' loop
        self.channels = {name: grpc.insecure_channel(b.commitlog_addr) for name, b in brokers.items()}
        self.router_channel = grpc.insecure_channel(router_addr)
        self.router = router_pb2_grpc.QueryRouterServiceStub(self.router_channel)

    def send(self, broker: str, body: bytes, keys: list[str] = (), unique_key: str = "", topic: str = TOPIC):  # type: ignore[no-untyped-def, assignment]
        result = send(self.brokers[broker], self.channels[broker], topic, body, list(keys), unique_key)
        self.registry.register(self.brokers[broker].registration())  # the heartbeat announcing its topics
        return result

    def index(self) -> None:
        for b in self.brokers.values():
            b.index_all()

    def by_key(self, key: str, topic: str = TOPIC, max_num: int = 0, token: str = ""):  # type: ignore[no-untyped-def]
        return self.queries.by_key(topic, key, max_num, 0, 0, token=token)

    def close(self) -> None:
        for ch in [*self.channels.values(), self.router_channel]:
            ch.close()


@pytest.fixture(scope="module", params=[BODIES_FROM_INDEXER, BODIES_FROM_COMMITLOG])
def env(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    """Every test runs twice: records read by the indexers, and read by the router itself."""
    root = Path(tmp_path_factory.mktemp("in-process"))
    # Tiny hash tables so distinct keys share slots, as they do in a full-size index.
    brokers = {name: InProcessBroker(name, root, host, hash_slots=7, index_num=400).start() for name, host in HOSTS.items()}
    registry = BrokerRegistry(expiry_ms=600_000)
    for b in brokers.values():
        registry.register(b.registration())
    try:
        settings = QuerySettings(query_timeout_ms=2000, broker_call_timeout_ms=1000, bodies_from=request.param)
        with in_process_router(registry, settings) as (address, queries):
            e = Env(brokers, registry, queries, address)
            yield e
            e.close()
    finally:
        for b in brokers.values():
            b.close()


def _uid_gen(now_ms: int) -> UniqueKeyGenerator:
    return UniqueKeyGenerator(ip="10.1.2.3", pid=4242, class_loader_hash=0x1234ABCD, tz=timezone.utc, clock=lambda: now_ms)


def test_same_key_on_every_broker_is_found_on_all_newest_first(env: Env) -> None:
    sent = [env.send(b, f"order on {b}".encode(), keys=["order-1"]) for b in HOSTS]
    env.index()
    answer = env.by_key("order-1")
    assert {m.offset_msg_id for m in answer.messages} == {r.offset_msg_id for r in sent} and len(sent) == 3
    assert {m.broker_name for m in answer.messages} == set(HOSTS)
    assert answer.complete and len(answer.outcomes) == 3
    stamps = [m.store_timestamp for m in answer.messages]
    assert stamps == sorted(stamps, reverse=True)


def test_equal_hash_and_shared_slot_keys_never_leak(env: Env) -> None:
    # "Aa" and "BB" have equal Java hash codes, so TOPIC#Aa and TOPIC#BB do too.
    env.send("broker-a", b"aa", keys=["Aa"])
    env.send("broker-a", b"bb", keys=["BB"])
    others = [f"slot-{i}" for i in range(12)]
    for k in others:
        env.send("broker-b", k.encode(), keys=[k])
    env.send("broker-c", b"other topic", keys=["Aa"], topic="OtherTopic")
    env.index()
    aa = env.by_key("Aa")
    assert [m.body for m in aa.messages] == [b"aa"]
    assert aa.collisions >= 1  # BB came back from the index and was dropped
    assert [m.body for m in env.by_key("BB").messages] == [b"bb"]
    for k in others:
        assert [m.body for m in env.by_key(k).messages] == [k.encode()]


def test_multi_key_message_is_found_by_each_key(env: Env) -> None:
    r = env.send("broker-b", b"multi", keys=["k1", "k2", "k3"])
    env.index()
    for k in ("k1", "k2", "k3"):
        found = env.by_key(k)
        assert [m.offset_msg_id for m in found.messages] == [r.offset_msg_id]
        assert list(found.messages[0].keys) == ["k1", "k2", "k3"]


def test_resent_unique_key_returns_earliest_copy_and_counts_copies(env: Env) -> None:
    uid = _uid_gen(int(time.time() * 1000)).next_id()
    first = env.send("broker-a", b"v1", unique_key=uid)
    second = env.send("broker-c", b"v1", unique_key=uid)
    env.index()
    every = env.queries.by_unique_key(TOPIC, uid, return_all=True)
    assert every.copies == 2 and [m.offset_msg_id for m in every.messages] == [first.offset_msg_id, second.offset_msg_id]
    one = env.queries.by_unique_key(TOPIC, uid)
    assert one.copies == 2 and [m.offset_msg_id for m in one.messages] == [first.offset_msg_id]


def test_unique_key_made_at_the_end_of_the_previous_month_is_found(env: Env) -> None:
    now = datetime.now(timezone.utc)
    made_at = int(datetime(now.year, now.month, 1, tzinfo=timezone.utc).timestamp() * 1000) - 1500
    uid = _uid_gen(made_at).next_id()
    sent = env.send("broker-b", b"late", unique_key=uid)
    env.index()
    assert [m.offset_msg_id for m in env.queries.by_unique_key(TOPIC, uid).messages] == [sent.offset_msg_id]


def test_unique_key_that_is_an_offset_msg_id_is_read_directly(env: Env) -> None:
    sent = env.send("broker-c", b"direct")  # not indexed: read by its id
    assert [m.body for m in env.queries.by_unique_key(TOPIC, sent.offset_msg_id).messages] == [b"direct"]


def test_pages_return_every_match_exactly_once(env: Env) -> None:
    expected = {env.send(list(HOSTS)[i % 3], f"p{i}".encode(), keys=["paged"]).offset_msg_id for i in range(30)}
    env.index()
    seen: list[str] = []
    token = ""
    for _ in range(20):
        page = env.by_key("paged", max_num=7, token=token)
        assert len(page.messages) <= 7
        seen += [m.offset_msg_id for m in page.messages]
        token = page.next_token
        if not token:
            break
    assert len(seen) == len(set(seen)) == 30 and set(seen) == expected


def test_by_id_and_by_offset(env: Env) -> None:
    sent = env.send("broker-b", b"where am i", keys=["x"])
    got = env.queries.by_id(sent.offset_msg_id)
    assert [m.body for m in got.messages] == [b"where am i"] and got.messages[0].broker_name == "broker-b"
    at = env.queries.by_offset(TOPIC, "broker-b", sent.queue_id, sent.queue_offset)
    assert [m.offset_msg_id for m in at.messages] == [sent.offset_msg_id]
    with pytest.raises(NotFound, match="valid range"):
        env.queries.by_offset(TOPIC, "broker-b", sent.queue_id, 10_000)


def test_unknown_store_host_and_unknown_topic_are_not_found(env: Env) -> None:
    with pytest.raises(NotFound, match="10.0.0.1:9999"):
        env.queries.by_id("0A0000010000270F0000000000000000")
    with pytest.raises(NotFound, match="no route"):
        env.by_key("k", topic="NoSuchTopic")


@pytest.mark.parametrize(("call", "field"), [
    (lambda q: q.by_key("bad topic!", "k", 0, 0, 0), "topic"),
    (lambda q: q.by_key(TOPIC, "", 0, 0, 0), "key"),
    (lambda q: q.by_key(TOPIC, "k", 2049, 0, 0), "max_num"),
    (lambda q: q.by_key(TOPIC, "k", 0, 10, 5), "end_timestamp"),
    (lambda q: q.by_key(TOPIC, "k", 0, 0, 0, token="garbage!"), "continuation_token"),
    (lambda q: q.by_id("XYZ"), "offset_msg_id"),
    (lambda q: q.by_id("0A00000100002A9F00000000000000"), "offset_msg_id"),
    (lambda q: q.by_unique_key(TOPIC, ""), "unique_key"),
    (lambda q: q.by_offset(TOPIC, "broker-a", -1, 0), "queue_id"),
    (lambda q: q.by_offset(TOPIC, "broker-a", 0, -1), "queue_offset"),
])
def test_malformed_input_is_invalid_argument_naming_the_field(env: Env, call, field: str) -> None:  # type: ignore[no-untyped-def]
    env.send("broker-a", b"x", keys=["k"])
    with pytest.raises(InvalidArgument) as err:
        call(env.queries)
    assert err.value.field == field, str(err.value)


def test_the_router_servicer_reports_answers_and_errors_over_grpc(env: Env) -> None:
    sent = env.send("broker-a", b"over grpc", keys=["wire"])
    env.index()
    result = env.router.QueryMsgByKey(router_pb2.QueryMsgByKeyRequest(topic=TOPIC, key="wire"), timeout=5).result
    assert [m.offset_msg_id for m in result.messages] == [sent.offset_msg_id] and result.complete
    assert {o.broker_name for o in result.brokers} == set(HOSTS) and all(o.answered for o in result.brokers)
    with pytest.raises(grpc.RpcError) as err:
        env.router.QueryMsgByKey(router_pb2.QueryMsgByKeyRequest(topic=TOPIC, key=""), timeout=5)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "key" in err.value.details()
    with pytest.raises(grpc.RpcError) as err:
        env.router.QueryMsgById(router_pb2.QueryMsgByIdRequest(offset_msg_id="0A0000010000270F0000000000000000"), timeout=5)
    assert err.value.code() == grpc.StatusCode.NOT_FOUND


def test_a_broker_whose_indexer_stops_answering_is_reported_not_hidden(env: Env) -> None:
    # Last in the module: broker-c's indexer stays down.
    for b in HOSTS:
        env.send(b, b"k", keys=["survivor"])
    env.index()
    assert len(env.by_key("survivor").messages) == 3
    env.brokers["broker-c"].stop_indexer()
    answer = env.queries.by_key(TOPIC, "survivor", 0, 0, 0, timeout_ms=2000)
    assert not answer.complete
    failed = [o for o in answer.outcomes if not o.ok]
    assert [o.key for o in failed] == ["broker-c"] and failed[0].error_code in ("UNAVAILABLE", "DEADLINE_EXCEEDED")
    assert {m.broker_name for m in answer.messages} == {"broker-a", "broker-b"}
