"""RocketMQ 4's remoting protocol against real processes: the router as NameServer, each
commitlog as a broker, requests built as RocketMQ's clients and mqadmin build them."""
from __future__ import annotations

import asyncio
import json
import struct
import time
import zlib
from pathlib import Path
from typing import Any, Iterator

import pytest

from quarry.clients.admin import AdminClient
from quarry.clients.producer import Producer
from quarry.formats import offset_msg_id
from quarry.formats.record import MESSAGE_MAGIC, body_crc, decode_record
from quarry.services.commitlog.broker.message_mapping import split_properties
from quarry.formats.properties import message_properties
from quarry.formats.topic import is_valid_topic
from scripts.launcher import LocalCluster
from quarry.services.remoting import codes
from tests.remoting_client import RemotingClient
from tests.e2e import mqadmin
from tests.e2e.conftest import launch_with_acl, wait_until

GOLDEN = Path(__file__).resolve().parent.parent / "golden" / "messages"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = LocalCluster(root=tmp_path_factory.mktemp("remoting"), commitlog_args=["--segment-size", str(1 << 22)],
                     indexer_args=["--hash-slots", "101", "--index-num", "4000", "--flush-interval-ms", "100"])
    with c.running({"broker-a": "127.0.0.21", "broker-b": "127.0.0.22"}):
        yield c


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 60))


def ns(c: LocalCluster) -> str:
    assert c.router is not None
    return c.router.remoting_address


def broker_addr(c: LocalCluster, name: str) -> str:
    return c.brokers[name].commitlog.remoting_address


def v2_fields(topic: str, queue_id: int, properties: str, sys_flag: int = 0, flag: int = 0, born: int | None = None) -> dict[str, Any]:
    """SendMessageRequestHeaderV2 as the Java and Node clients fill it."""
    return {"a": "pg", "b": topic, "c": "TBW102", "d": 4, "e": queue_id, "f": sys_flag, "g": born or int(time.time() * 1000),
            "h": flag, "i": properties, "j": 0, "k": False}


async def send_v2(addr: str, topic: str, body: bytes, properties: str, queue_id: int = 0, **kw: Any) -> Any:
    async with RemotingClient(addr) as b:
        return await b.call(codes.SEND_MESSAGE_V2, v2_fields(topic, queue_id, properties, **kw), body)


def wait_route(c: LocalCluster, topic: str, brokers: int = 1) -> dict:  # type: ignore[type-arg]
    def ready() -> dict | None:  # type: ignore[type-arg]
        async def ask() -> Any:
            async with RemotingClient(ns(c)) as n:
                return await n.call(codes.GET_ROUTEINFO_BY_TOPIC, {"topic": topic})
        r = run(ask())
        return json.loads(r.body) if r.code == codes.SUCCESS and len(json.loads(r.body)["brokerDatas"]) >= brokers else None
    return wait_until(ready, what=f"route of {topic}")  # type: ignore[return-value]


def test_nameserver_routes_carry_remoting_addresses_cluster_and_topics(cluster: LocalCluster) -> None:
    auto = wait_route(cluster, "TBW102", brokers=2)  # a producer's fallback route: every broker
    assert {bd["brokerAddrs"]["0"] for bd in auto["brokerDatas"]} == {broker_addr(cluster, "broker-a"), broker_addr(cluster, "broker-b")}
    r = run(send_v2(broker_addr(cluster, "broker-a"), "RouteTopic", b"x", "KEYS\x01r1"))
    assert r.code == codes.SUCCESS, r.remark
    route = wait_route(cluster, "RouteTopic")
    assert route["queueDatas"] == [{"brokerName": "broker-a", "readQueueNums": 4, "writeQueueNums": 4, "perm": 6, "topicSysFlag": 0, "topicSynFlag": 0}]
    assert route["brokerDatas"] == [{"cluster": "DefaultCluster", "brokerName": "broker-a", "brokerAddrs": {"0": broker_addr(cluster, "broker-a")}}]

    async def rest() -> tuple[Any, Any, Any]:
        async with RemotingClient(ns(cluster), serialize_type=codes.SERIALIZE_ROCKETMQ) as n:
            return (await n.call(codes.GET_BROKER_CLUSTER_INFO), await n.call(codes.GET_ALL_TOPIC_LIST_FROM_NAMESERVER),
                    await n.call(codes.GET_ROUTEINFO_BY_TOPIC, {"topic": "NoSuchTopic"}))
    info, topics, missing = run(rest())
    assert info.serialize_type == codes.SERIALIZE_ROCKETMQ  # answered in the request's header form
    assert json.loads(info.body)["clusterAddrTable"] == {"DefaultCluster": ["broker-a", "broker-b"]}
    assert "RouteTopic" in json.loads(topics.body)["topicList"]
    assert missing.code == codes.TOPIC_NOT_EXIST and "NoSuchTopic" in (missing.remark or "")


def test_the_system_topic_list_names_clusters_and_brokers_and_a_broker_to_ask(cluster: LocalCluster) -> None:
    """GET_SYSTEM_TOPIC_LIST_FROM_NS as RocketMQ's NameServer answers it (rocketmq-dashboard's topic
    page asks it first): every cluster and broker name, and one broker's address."""
    async def ask() -> Any:
        async with RemotingClient(ns(cluster)) as n:
            return await n.call(codes.GET_SYSTEM_TOPIC_LIST_FROM_NS)
    answer = run(ask())
    assert answer.code == codes.SUCCESS, answer.remark
    body = json.loads(answer.body)
    assert body["topicList"] == ["DefaultCluster", "broker-a", "broker-b"]
    assert body["brokerAddr"] in {broker_addr(cluster, "broker-a"), broker_addr(cluster, "broker-b")}


def _batch_body(items: list[tuple[bytes, str]]) -> bytes:
    """MessageBatch.encode(): per message TOTALSIZE, MAGICCODE, BODYCRC, FLAG, BODY, PROPERTIES."""
    out = b""
    for body, props in items:
        p = props.encode()
        total = 4 + 4 + 4 + 4 + 4 + len(body) + 2 + len(p)
        out += struct.pack(">iiiii", total, 0, body_crc(body), 0, len(body)) + body + struct.pack(">h", len(p)) + p
    return out


def test_sends_store_the_same_record_and_id_as_the_grpc_path(cluster: LocalCluster) -> None:
    assert cluster.router is not None
    addr = broker_addr(cluster, "broker-b")
    props = "KEYS\x01same-1 same-2\x02TAGS\x01TagS\x02UNIQ_KEY\x01AC1100010000000000000000000000A1\x02color\x01red"
    v2 = run(send_v2(addr, "SameTopic", b"same body", props, queue_id=1, flag=7))
    assert v2.code == codes.SUCCESS, v2.remark

    async def v1_and_batch() -> tuple[Any, Any]:
        async with RemotingClient(addr) as b:
            v1 = await b.call(codes.SEND_MESSAGE, {"producerGroup": "pg", "topic": "SameTopic", "defaultTopic": "TBW102", "defaultTopicQueueNums": 4,
                                                   "queueId": 1, "sysFlag": 0, "bornTimestamp": int(time.time() * 1000), "flag": 7,
                                                   "properties": props, "reconsumeTimes": 0}, b"same body")
            batch = await b.call(codes.SEND_BATCH_MESSAGE, {**v2_fields("SameTopic", 2, ""), "m": True},
                                 _batch_body([(b"b0", "KEYS\x01bk-0\x02UNIQ_KEY\x01AC1100010000000000000000000000B0"), (b"b1", "KEYS\x01bk-1")]))
            return v1, batch
    v1, batch = run(v1_and_batch())
    assert v1.code == codes.SUCCESS and batch.code == codes.SUCCESS, (v1.remark, batch.remark)
    ids = batch.ext_fields["msgId"].split(",")
    assert len(ids) == 2 and batch.ext_fields["queueId"] == "2"

    with Producer(cluster.router.address) as producer:
        grpc_sent = producer.send("SameTopic", b"same body", keys=["same-1", "same-2"], tags="TagS",
                                  properties={"color": "red"}, unique_key="AC1100010000000000000000000000A1", flag=7)
    with AdminClient(cluster.router.address) as admin:
        via_remote = admin.query_by_id(v2.ext_fields["msgId"]).messages[0]
        via_v1 = admin.query_by_id(v1.ext_fields["msgId"]).messages[0]
        via_grpc = admin.query_by_id(grpc_sent.offset_msg_id).messages[0]
        batch_msgs = [admin.query_by_id(i).messages[0] for i in ids]
    for m in (via_remote, via_v1, via_grpc):
        assert (m.topic, m.body, m.keys, m.tags, m.unique_key, m.flag, m.property_pairs) == \
            ("SameTopic", b"same body", ["same-1", "same-2"], "TagS", "AC1100010000000000000000000000A1", 7, via_grpc.property_pairs)
    # The id answered over remoting is the record's offsetMsgId: store host + physical offset.
    assert via_remote.offset_msg_id == v2.ext_fields["msgId"] and via_remote.queue_offset == int(v2.ext_fields["queueOffset"])
    assert [m.body for m in batch_msgs] == [b"b0", b"b1"] and batch_msgs[0].unique_key == "AC1100010000000000000000000000B0"


def test_send_errors_answer_codes_naming_the_field(cluster: LocalCluster) -> None:
    addr = broker_addr(cluster, "broker-a")
    bad_topic = run(send_v2(addr, "bad topic!", b"x", ""))
    assert bad_topic.code == codes.MESSAGE_ILLEGAL and "topic" in (bad_topic.remark or "")
    empty = run(send_v2(addr, "ErrTopic", b"", ""))
    assert empty.code == codes.MESSAGE_ILLEGAL and "body" in (empty.remark or "")
    bad_queue = run(send_v2(addr, "ErrTopic", b"x", "", queue_id=99))
    assert bad_queue.code == codes.MESSAGE_ILLEGAL and "queue_id" in (bad_queue.remark or "")

    async def missing() -> Any:
        async with RemotingClient(addr) as b:
            return await b.call(codes.SEND_MESSAGE_V2, {"a": "pg"}, b"x")
    r = run(missing())
    assert r.code == codes.SYSTEM_ERROR and "header field topic: missing" in (r.remark or "")
    compressed = run(send_v2(addr, "ErrTopic", zlib.compress(b"inflated body " * 20), "KEYS\x01z", sys_flag=1))
    assert compressed.code == codes.SUCCESS
    with AdminClient(cluster.router.address) as admin:  # type: ignore[union-attr]
        assert admin.query_by_id(compressed.ext_fields["msgId"]).messages[0].body == b"inflated body " * 20


def _pull(b: RemotingClient, topic: str, offset: int, sys_flag: int = 0, sub: str | None = None, commit: int = 0, suspend_ms: int = 0) -> Any:
    fields = {"consumerGroup": "cg", "topic": topic, "queueId": 0, "queueOffset": offset, "maxMsgNums": 32, "sysFlag": sys_flag,
              "commitOffset": commit, "suspendTimeoutMillis": suspend_ms, "subscription": sub, "subVersion": 0}
    return b.call(codes.PULL_MESSAGE, fields)


def test_pull_offsets_flags_long_polling_and_offset_queries(cluster: LocalCluster) -> None:
    addr = broker_addr(cluster, "broker-a")
    sent = [run(send_v2(addr, "PullTopic", f"m{i}".encode(), f"TAGS\x01{'A' if i % 2 == 0 else 'B'}")) for i in range(5)]
    assert all(s.code == codes.SUCCESS for s in sent)

    async def main() -> None:
        async with RemotingClient(addr) as b:
            everything = await _pull(b, "PullTopic", 0)
            assert everything.code == codes.SUCCESS
            records = mqadmin.decodes(everything.body)
            assert [r.body for r in records] == [b"m0", b"m1", b"m2", b"m3", b"m4"]
            assert (everything.ext_fields["nextBeginOffset"], everything.ext_fields["minOffset"], everything.ext_fields["maxOffset"]) == ("5", "0", "5")
            only_a = await _pull(b, "PullTopic", 0, codes.PULL_SUBSCRIPTION | codes.PULL_COMMIT_OFFSET, "A", commit=2)
            assert [r.body for r in mqadmin.decodes(only_a.body)] == [b"m0", b"m2", b"m4"]
            committed = await b.call(codes.QUERY_CONSUMER_OFFSET, {"consumerGroup": "cg", "topic": "PullTopic", "queueId": 0})
            assert (committed.code, committed.ext_fields["offset"]) == (codes.SUCCESS, "2")
            await b.oneway(codes.UPDATE_CONSUMER_OFFSET, {"consumerGroup": "cg", "topic": "PullTopic", "queueId": 0, "commitOffset": 4})
            for _ in range(200):  # one-way: read back until applied (the same connection serves in order of arrival)
                q = await b.call(codes.QUERY_CONSUMER_OFFSET, {"consumerGroup": "cg", "topic": "PullTopic", "queueId": 0})
                if q.ext_fields.get("offset") == "4":
                    break
            assert q.ext_fields["offset"] == "4"
            at_end = await _pull(b, "PullTopic", 5)
            assert at_end.code == codes.PULL_NOT_FOUND and at_end.ext_fields["nextBeginOffset"] == "5"
            beyond = await _pull(b, "PullTopic", 9)
            assert beyond.code == codes.PULL_OFFSET_MOVED and beyond.ext_fields["nextBeginOffset"] == "5"
            waiting = asyncio.create_task(_pull(b, "PullTopic", 5, codes.PULL_SUSPEND, suspend_ms=20_000))
            async with RemotingClient(addr) as producer:
                r = await producer.call(codes.SEND_MESSAGE_V2, v2_fields("PullTopic", 0, "TAGS\x01A"), b"m5")
                assert r.code == codes.SUCCESS
            woke = await waiting
            assert woke.code == codes.SUCCESS and [x.body for x in mqadmin.decodes(woke.body)] == [b"m5"]
            lo = await b.call(codes.GET_MIN_OFFSET, {"topic": "PullTopic", "queueId": 0})
            hi = await b.call(codes.GET_MAX_OFFSET, {"topic": "PullTopic", "queueId": 0})
            assert (lo.ext_fields["offset"], hi.ext_fields["offset"]) == ("0", "6")
            ts = [r.store_timestamp for r in records]
            for i, t in enumerate(ts):
                found = await b.call(codes.SEARCH_OFFSET_BY_TIMESTAMP, {"topic": "PullTopic", "queueId": 0, "timestamp": t})
                assert int(found.ext_fields["offset"]) == ts.index(t)  # the first message stored at or after t
            after = await b.call(codes.SEARCH_OFFSET_BY_TIMESTAMP, {"topic": "PullTopic", "queueId": 0, "timestamp": 1 << 62})
            assert after.ext_fields["offset"] == "6"
            unknown = await _pull(b, "NoTopicHere", 0)
            assert unknown.code == codes.TOPIC_NOT_EXIST
    run(main())


def test_a_delay_level_message_is_parked_then_stored_in_its_queue_when_due(cluster: LocalCluster) -> None:
    """RocketMQ 4's delay levels: parked under SCHEDULE_TOPIC_XXXX at put time (the id a
    producer gets names the parked record, as RocketMQ's), stored in its own queue when due
    (level 1: a second after it was stored), where a pull finds it."""
    addr = broker_addr(cluster, "broker-b")
    assert run(send_v2(addr, "DelayLevelTopic", b"now", "TAGS\x01A")).code == codes.SUCCESS
    sent = run(send_v2(addr, "DelayLevelTopic", b"later", "KEYS\x01order-9\x02UNIQ_KEY\x01UK-DELAY-1\x02DELAY\x011", queue_id=2))
    assert sent.code == codes.SUCCESS and sent.ext_fields["queueId"] == "2"  # the queue it was sent to (parked in 0), as RocketMQ answers
    code, _, body = run(mqadmin.view_message(sent.ext_fields["msgId"]))
    (parked,) = mqadmin.decodes(body)
    assert code == codes.SUCCESS and (parked.topic, parked.queue_id) == ("SCHEDULE_TOPIC_XXXX", 0)
    assert parked.properties["REAL_TOPIC"] == "DelayLevelTopic" and parked.properties["REAL_QID"] == "2" and parked.properties["DELAY"] == "1"

    def pulled() -> list[Any]:
        async def ask() -> list[Any]:
            async with RemotingClient(addr) as b:
                r = await b.call(codes.PULL_MESSAGE, {"consumerGroup": "cg", "topic": "DelayLevelTopic", "queueId": 2, "queueOffset": 0,
                                                      "maxMsgNums": 32, "sysFlag": 0, "commitOffset": 0, "suspendTimeoutMillis": 0,
                                                      "subscription": None, "subVersion": 0})
                return mqadmin.decodes(r.body) if r.code == codes.SUCCESS else []
        return run(ask())

    (later,) = wait_until(pulled, what="the delayed message in its queue")  # type: ignore[misc]
    assert later.body == b"later" and later.queue_id == 2
    assert later.store_timestamp >= parked.store_timestamp + 1000  # not before it was due
    # Stored as RocketMQ stores the copy: its level and REAL_TOPIC / REAL_QID kept.
    assert later.properties["UNIQ_KEY"] == "UK-DELAY-1" and later.properties["KEYS"] == "order-9"
    assert (later.properties["DELAY"], later.properties["REAL_TOPIC"], later.properties["REAL_QID"]) == ("1", "DelayLevelTopic", "2")
    assert later.born_timestamp == parked.born_timestamp


def test_consumer_offsets_survive_a_broker_restart(cluster: LocalCluster) -> None:
    addr = broker_addr(cluster, "broker-b")
    assert run(send_v2(addr, "DurableOffsets", b"x", "")).code == codes.SUCCESS

    async def commit() -> None:
        async with RemotingClient(addr) as b:
            r = await b.call(codes.UPDATE_CONSUMER_OFFSET, {"consumerGroup": "dg", "topic": "DurableOffsets", "queueId": 0, "commitOffset": 1})
            assert r.code == codes.SUCCESS
    run(commit())
    offsets_file = cluster.brokers["broker-b"].store_dir / "config" / "consumerOffset.json"
    # Written on the interval (--offsets-persist-interval-ms, 1 s), before any stop.
    wait_until(lambda: offsets_file.exists() and "DurableOffsets@dg" in json.loads(offsets_file.read_text())["offsetTable"], what="offsets written")
    broker = cluster.brokers["broker-b"].commitlog
    assert broker.stop() == 0
    broker.start()
    saved = json.loads((cluster.brokers["broker-b"].store_dir / "config" / "consumerOffset.json").read_text())
    assert saved["offsetTable"]["DurableOffsets@dg"] == {"0": 1}

    async def read() -> Any:
        async with RemotingClient(addr) as b:
            return await b.call(codes.QUERY_CONSUMER_OFFSET, {"consumerGroup": "dg", "topic": "DurableOffsets", "queueId": 0})
    assert run(read()).ext_fields["offset"] == "1"


def test_mqadmin_queries_by_key_unique_key_and_id(cluster: LocalCluster) -> None:
    a, b = broker_addr(cluster, "broker-a"), broker_addr(cluster, "broker-b")
    uniq = "AC110001000000000000000000000C01"
    sa = run(send_v2(a, "AdminTopic", b"on a", f"KEYS\x01shared-key ka\x02UNIQ_KEY\x01{uniq}"))
    sb = run(send_v2(b, "AdminTopic", b"on b", "KEYS\x01shared-key kb"))
    assert sa.code == sb.code == codes.SUCCESS
    cluster.wait_indexed()
    wait_route(cluster, "AdminTopic", brokers=2)
    found, answers = run(mqadmin.query_message(ns(cluster), "AdminTopic", "shared-key", 64, 0, mqadmin.LONG_MAX, False))
    assert sorted(r.body for r in found) == [b"on a", b"on b"]
    assert all(x.code == codes.SUCCESS and x.index_last_update_timestamp and x.index_last_update_phy_offset is not None for x in answers)
    by_uniq, _ = run(mqadmin.query_message(ns(cluster), "AdminTopic", uniq, 32, 0, mqadmin.LONG_MAX, True))
    assert [r.body for r in by_uniq] == [b"on a"]
    binary, answers = run(mqadmin.query_message(ns(cluster), "AdminTopic", "shared-key", 64, 0, mqadmin.LONG_MAX, False,
                                                serialize_type=codes.SERIALIZE_ROCKETMQ))
    assert sorted(r.body for r in binary) == [b"on a", b"on b"] and all(x.index_last_update_timestamp for x in answers)
    none, answers = run(mqadmin.query_message(ns(cluster), "AdminTopic", "no-such-key", 64, 0, mqadmin.LONG_MAX, False))
    assert none == [] and {x.code for x in answers} == {codes.QUERY_NOT_FOUND}
    assert all(x.index_last_update_timestamp is not None for x in answers)  # the header fields come with a miss too
    code, _, body = run(mqadmin.view_message(sa.ext_fields["msgId"]))  # the id names broker-a's remoting address
    assert code == codes.SUCCESS and decode_record(body).body == b"on a"
    host = offset_msg_id.decode(sa.ext_fields["msgId"])
    code, remark, _ = run(mqadmin.view_message(offset_msg_id.create(host.ip, host.port, 0xFFFFF)))  # no record there
    assert code == codes.SYSTEM_ERROR and "can not find message by the offset" in (remark or "")


def _golden_cases() -> list[tuple[str, dict]]:  # type: ignore[type-arg]
    """Single IPv4 messages a RocketMQ 4 producer sends as such: no broker rewrite (delay,
    compression, multi-tags, transactions) and properties already in the order Quarry stores them."""
    out = []
    for scenario in sorted(GOLDEN.glob("*/scenario.json")):
        for m in json.loads(scenario.read_text())["messages"]:
            i = m["input"]
            if m["kind"] != "single" or m.get("put_status") != "PUT_OK" or i.get("sys_flag") != 0 or "[" in i["born_host"] + i["store_host"]:
                continue
            given = i["properties_string_before_put"]
            if "DELAY\x01" in given or not i["body_hex"]:
                continue
            if not is_valid_topic(i["topic"]):  # RocketMQ's client refuses other topics before sending
                continue
            keys, tags, uk, rest = split_properties(given)
            try:
                ours = message_properties(keys, tags, uk, rest).decode()
            except ValueError:
                continue
            if ours != m["records"][0]["stored_properties_string"]:
                continue
            out.append((f"{scenario.parent.name}-{m['seq']}", m))
    return out


GOLDEN_CASES = _golden_cases()


def test_golden_cases_are_found() -> None:
    assert len(GOLDEN_CASES) >= 10, [n for n, _ in GOLDEN_CASES]


@pytest.mark.parametrize("name, case", GOLDEN_CASES, ids=[n for n, _ in GOLDEN_CASES])
def test_records_answered_over_remoting_are_rocketmqs_bytes(cluster: LocalCluster, name: str, case: dict) -> None:  # type: ignore[type-arg]
    """Sent over remoting, read back by QUERY_MESSAGE and VIEW_MESSAGE_BY_ID: the record is the
    golden one byte for byte, once the fields only the environment decides (queue and physical
    offset, born host, store time, store host) are taken from the golden record."""
    i = case["input"]
    golden = bytes.fromhex(case["records"][0]["hex"])
    topic = i["topic"]
    addr = broker_addr(cluster, "broker-a")
    sent = run(send_v2(addr, topic, bytes.fromhex(i["body_hex"]), i["properties_string_before_put"], queue_id=i["queue_id"] % 4,
                       flag=i["flag"], born=i["born_timestamp"]))
    assert sent.code == codes.SUCCESS, sent.remark
    code, _, viewed = run(mqadmin.view_message(sent.ext_fields["msgId"]))
    assert code == codes.SUCCESS

    def normalized(ours: bytes) -> bytes:
        assert struct.unpack_from(">I", ours, 4)[0] == MESSAGE_MAGIC and len(ours) == len(golden)
        b = bytearray(ours)
        b[12:16] = golden[12:16]  # QUEUEID (the golden queue may not exist here)
        b[20:36] = golden[20:36]  # QUEUEOFFSET, PHYSICALOFFSET
        b[48:72] = golden[48:72]  # BORNHOST, STORETIMESTAMP, STOREHOST
        return bytes(b)
    assert normalized(viewed) == golden
    uk = split_properties(i["properties_string_before_put"])[2]
    if uk:
        cluster.wait_indexed()
        found, answers = run(mqadmin.query_message(ns(cluster), topic, uk, 32, 0, mqadmin.LONG_MAX, True))
        at = decode_record(viewed).physical_offset
        raw = [b for a in answers for r, b in zip(a.records, a.raw) if r.physical_offset == at and r.unique_key == uk]
        assert found and len(raw) == 1, f"{uk} not answered by QUERY_MESSAGE"
        assert normalized(raw[0]) == golden  # the bytes QUERY_MESSAGE answered, not the ones viewed


def test_acl_signature_and_permissions_on_the_broker(tmp_path: Path, launch, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    """RocketMQ 4's ACL: AccessKey + Signature (HMAC-SHA1 over the sorted header values and the
    body) checked against the accounts of QUARRY_ACL_FILE, then the account's topic permissions."""
    cl = launch_with_acl(launch, tmp_path, monkeypatch, [
        {"access_key": "ops", "secret_key": "ops-secret-123", "admin": True},
        {"access_key": "orders", "secret_key": "orders-secret-789", "topics": {"OrderTopic": ["publish"]}},
    ], "commitlog", "--store-dir", str(tmp_path / "store"))
    addr = cl.remoting_address

    async def send(topic: str, **auth: str) -> Any:
        async with RemotingClient(addr, **auth) as b:
            return await b.call(codes.SEND_MESSAGE_V2, v2_fields(topic, 0, "KEYS\x01acl"), b"guarded")

    async def tampered() -> Any:
        async with RemotingClient(addr) as b:
            req = b.request(codes.SEND_MESSAGE_V2, v2_fields("OrderTopic", 0, ""), b"original")
            from quarry.services.remoting.acl import sign
            sign(req, "orders", "orders-secret-789")
            req.body = b"altered"
            return await b.invoke(req)

    async def pull(**auth: str) -> Any:
        async with RemotingClient(addr, **auth) as b:
            return await _pull(b, "OrderTopic", 0)

    orders = {"access_key": "orders", "secret_key": "orders-secret-789"}
    assert run(send("OrderTopic", **orders)).code == codes.SUCCESS
    unsigned = run(send("OrderTopic"))
    assert unsigned.code == codes.NO_PERMISSION and "AccessKey" in (unsigned.remark or "")
    wrong = run(send("OrderTopic", access_key="orders", secret_key="guess"))
    assert wrong.code == codes.NO_PERMISSION and "Signature" in (wrong.remark or "")
    assert run(tampered()).code == codes.NO_PERMISSION
    other = run(send("OtherTopic", **orders))
    assert other.code == codes.NO_PERMISSION and "publish" in (other.remark or "") and "OtherTopic" in (other.remark or "")
    denied_pull = run(pull(**orders))
    assert denied_pull.code == codes.NO_PERMISSION and "query" in (denied_pull.remark or "")
    assert run(pull(access_key="ops", secret_key="ops-secret-123")).code == codes.SUCCESS
    log = cl.log_path.read_text()
    assert "access denied" in log and "orders-secret-789" not in log


def test_end_transaction_commits_or_rolls_back_a_prepared_message(cluster: LocalCluster) -> None:
    """A 4.x transactional producer: the half message is stored prepared (no queue offset, not
    pulled), END_TRANSACTION commits it (a commit record enters the queue, pointing back at the
    prepared one) or rolls it back (nothing enters the queue)."""
    addr = broker_addr(cluster, "broker-a")
    props = "TRAN_MSG\x01true\x02PGROUP\x01tx-group\x02KEYS\x01tx-{n}"
    half_c = run(send_v2(addr, "TxTopic", b"to commit", props.format(n="c"), sys_flag=0x4))
    half_r = run(send_v2(addr, "TxTopic", b"to roll back", props.format(n="r"), sys_flag=0x4))
    assert half_c.code == half_r.code == codes.SUCCESS

    async def main() -> None:
        async with RemotingClient(addr) as b:
            before = await _pull(b, "TxTopic", 0)
            assert before.code == codes.PULL_NOT_FOUND  # prepared messages are not consumable
            for half, kind in ((half_c, 8), (half_r, 12)):
                offset = offset_msg_id.decode(half.ext_fields["msgId"]).offset
                # END_TRANSACTION goes one-way from RocketMQ's producer; asked two-way here to see the answer.
                r = await b.call(codes.END_TRANSACTION, {"producerGroup": "tx-group", "tranStateTableOffset": half.ext_fields["queueOffset"],
                                                         "commitLogOffset": offset, "commitOrRollback": kind, "fromTransactionCheck": False,
                                                         "msgId": half.ext_fields["msgId"]})
                assert r.code == codes.SUCCESS, r.remark
            after = await _pull(b, "TxTopic", 0)
            assert after.code == codes.SUCCESS
            (committed,) = mqadmin.decodes(after.body)
            assert committed.body == b"to commit" and committed.sys_flag & 0xC == 0x8
            assert committed.prepared_transaction_offset == offset_msg_id.decode(half_c.ext_fields["msgId"]).offset
            again = await b.call(codes.END_TRANSACTION, {"producerGroup": "tx-group", "tranStateTableOffset": 0,
                                                         "commitLogOffset": committed.physical_offset, "commitOrRollback": 8, "msgId": ""})
            assert again.code == codes.SYSTEM_ERROR and "not a prepared transaction message" in (again.remark or "")
    run(main())


async def ask_key(addr: str, topic: str, key: str, max_num: int = 64, begin: int = 0, end: int = mqadmin.LONG_MAX, unique: bool = False) -> tuple[int, list[bytes]]:
    """QUERY_MESSAGE at one broker: the code and the bodies, in the order answered."""
    async with RemotingClient(addr) as b:
        req = b.request(codes.QUERY_MESSAGE, {"topic": topic, "key": key, "maxNum": max_num, "beginTimestamp": begin, "endTimestamp": end})
        req.ext_fields[codes.UNIQUE_KEY_QUERY_FLAG] = "true" if unique else "false"
        resp = await b.invoke(req)
    return resp.code, [r.body for r, _ in mqadmin.decodes_raw(resp.body)] if resp.code == codes.SUCCESS else []


def test_key_queries_from_the_index_files_read_by_the_commitlog(tmp_path: Path) -> None:
    """commitlog --index-dir (the launcher's default): QUERY_MESSAGE answered from the indexer's
    IndexFiles mapped in the commitlog answers exactly as asking the indexer does (cap, unique
    keys, time window, misses), answers with the indexer stopped (so the files are what
    answered), and a key sent just now is found through the files as soon as the indexer has it."""
    c = LocalCluster(root=tmp_path, commitlog_args=["--segment-size", str(1 << 22)],
                     indexer_args=["--hash-slots", "101", "--index-num", "4000", "--flush-interval-ms", "100"])
    with c.running({"broker-v": "127.0.0.23"}):
        b = c.brokers["broker-v"]
        addr = b.commitlog.remoting_address
        assert "--index-dir" in b.commitlog.args and "key queries read the indexer's files here" in b.commitlog.log_tail(200)

        async def send_all() -> list[str]:
            ids = []
            async with RemotingClient(addr) as cl:
                for i in range(70):  # more than the 64 cap under one key
                    r = await cl.call(codes.SEND_MESSAGE_V2, v2_fields("ViewTopic", i % 4, f"KEYS\x01many k{i}\x02UNIQ_KEY\x01AC1100010000000000000000000{i:05X}"), b"m%d" % i)
                    assert r.code == codes.SUCCESS
                    ids.append(r.ext_fields["msgId"])
                r = await cl.call(codes.SEND_MESSAGE_V2, v2_fields("OtherTopic", 0, "KEYS\x01many"), b"other topic")
                assert r.code == codes.SUCCESS
            return ids
        run(send_all())
        c.wait_indexed()
        now = int(time.time() * 1000)
        queries = [("ViewTopic", "many", 64, 0, mqadmin.LONG_MAX, False), ("ViewTopic", "many", 5, 0, mqadmin.LONG_MAX, False),
                   ("ViewTopic", "k7", 64, 0, mqadmin.LONG_MAX, False), ("ViewTopic", f"AC1100010000000000000000000{10:05X}", 32, 0, mqadmin.LONG_MAX, True),
                   ("OtherTopic", "many", 64, 0, mqadmin.LONG_MAX, False), ("ViewTopic", "many", 64, now + 3_600_000, mqadmin.LONG_MAX, False),
                   ("ViewTopic", "absent", 64, 0, mqadmin.LONG_MAX, False)]

        def answers() -> list[tuple[int, list[bytes]]]:
            return [run(ask_key(addr, *q)) for q in queries]
        with_view = answers()
        assert [len(bodies) for _, bodies in with_view] == [64, 5, 1, 1, 1, 0, 0]
        assert with_view[2][1] == [b"m7"] and with_view[3][1] == [b"m10"] and with_view[4][1] == [b"other topic"]
        assert with_view[5][0] == with_view[6][0] == codes.QUERY_NOT_FOUND

        # A key sent now: seen through the files as soon as the indexer has it (each query reads
        # the newest file's header again), within the polling pace and a loaded machine's slack.
        async def first_seen(key: str) -> tuple[float, float]:
            async with RemotingClient(addr) as cl:
                assert (await cl.call(codes.SEND_MESSAGE_V2, v2_fields("ViewTopic", 0, f"KEYS\x01{key}"), b"fresh")).code == codes.SUCCESS
            sent = time.monotonic()
            from quarry.channels import open_aio_channel
            from quarry.v1 import indexer_pb2, indexer_pb2_grpc
            indexed = viewed = 0.0
            async with open_aio_channel(b.indexer.address) as ch:
                stub = indexer_pb2_grpc.IndexerServiceStub(ch)
                while not viewed and time.monotonic() - sent < 10:
                    if not indexed and (await stub.QueryMessage(indexer_pb2.QueryMessageRequest(topic="ViewTopic", key=key, offsets_only=True), timeout=5)).physical_offsets:
                        indexed = time.monotonic() - sent
                    if (await ask_key(addr, "ViewTopic", key))[1] == [b"fresh"]:
                        viewed = time.monotonic() - sent
                    await asyncio.sleep(0.005)  # a polling pace; the deadline above decides
            return indexed, viewed
        indexed, viewed = run(first_seen("fresh-key"))
        assert indexed and viewed, f"not found in 10 s (indexer {indexed:.3f} s, commitlog {viewed:.3f} s)"
        assert viewed - indexed < 0.3, f"the files read by the commitlog lag the indexer by {viewed - indexed:.3f} s"

        b.indexer.stop()  # the files alone answer now
        assert answers() == with_view
        b.indexer.start()
        b.commitlog.stop()  # and without --index-dir (the last one wins): the indexer answers, the same
        b.commitlog.args = [*b.commitlog.args, "--index-dir", ""]
        b.commitlog.start()
        c.wait_indexed()
        assert answers() == with_view
        b.indexer.stop()
        assert {code for code, _ in answers()} == {codes.SYSTEM_ERROR}  # proof it asked the indexer
