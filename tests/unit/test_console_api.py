"""quarry-console's JSON layer in process (clients/console/api.py) over a fake AdminClient:
which kind the search box took, errors mapped once (400 naming the field, 404, 503, 403),
incomplete answers carried with the brokers that did not answer and why, expired ranges named,
the histogram's exact counts over sliced requests, and the HTTP server's routing of views,
static files and downloads."""
from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from quarry.clients.console.api import Api
from quarry.clients.console.server import make_server
from quarry.clients.errors import InvalidArgumentError, NotFoundError, QuarryError, UnavailableError
from quarry.clients.model import MessageQueue, QueryResult, SendResult
from quarry.formats import offset_msg_id
from quarry.v1 import commitlog_pb2, common_pb2, indexer_pb2, router_pb2

NOW = 1_800_000_000_000
OID = offset_msg_id.create("10.0.0.1", 10911, 4096)
UID4 = "0A000001000A1B2C3D4E5F6071820001"  # 32 hex: decodes as an offsetMsgId with a port no broker has
UID5 = "01" + "AB" * 16


def msg(i: int, topic: str = "T", broker: str = "broker-a", tags: str = "TagA", ts: int | None = None, **kw: Any) -> common_pb2.StoredMessage:
    return common_pb2.StoredMessage(topic=topic, body=f'{{"n": {i}}}'.encode(), keys=[f"k-{i}"], tags=tags, unique_key=kw.get("uid", ""),
                                    queue_id=i % 4, queue_offset=i, store_timestamp=NOW - 100_000 + i if ts is None else ts,
                                    offset_msg_id=kw.get("oid", f"{i:032X}"), broker_name=broker,
                                    properties=[common_pb2.Property(name="TAGS", value=tags)])


def result(messages: list[common_pb2.StoredMessage], failed: dict[str, str] | None = None, token: str = "", notes: list[str] | None = None,
           complete: bool | None = None) -> QueryResult:
    outcomes = [common_pb2.BrokerOutcome(broker_name="broker-a", answered=True)]
    outcomes += [common_pb2.BrokerOutcome(broker_name=b, answered=False, error_code=why.split(":")[0], error_message=why.split(": ", 1)[1])
                 for b, why in (failed or {}).items()]
    raw = router_pb2.QueryResult(messages=messages, brokers=outcomes, complete=not failed if complete is None else complete,
                                 next_continuation_token=token, notes=notes or [])
    return QueryResult.from_proto(raw)


class FakeAdmin:
    router_addr = "127.0.0.1:9876"

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...]]] = []
        self.by_id: dict[str, QueryResult] = {}
        self.by_uid: dict[tuple[str, str], QueryResult] = {}
        self.by_key: Any = None
        self.pages: dict[str, QueryResult] = {}  # browse token -> page
        self.topic_list = ["T", "U"]
        self.fail: Exception | None = None
        self.index_fail: Exception | None = None

    def _log(self, name: str, *args: Any) -> None:
        self.calls.append((name, args))
        if self.fail is not None:
            raise self.fail

    def query_by_id(self, oid: str) -> QueryResult:
        self._log("query_by_id", oid)
        if oid not in self.by_id:
            raise NotFoundError("NOT_FOUND", f"no broker advertises the store host of {oid}")
        return self.by_id[oid]

    def query_by_unique_key(self, topic: str, uid: str, return_all: bool = False, begin: int = 0, end: int = 0) -> QueryResult:
        self._log("query_by_unique_key", topic, uid, return_all, begin, end)
        if (topic, uid) not in self.by_uid:
            raise NotFoundError("NOT_FOUND", f"no message with unique key {uid} in topic {topic}")
        return self.by_uid[(topic, uid)]

    def query_by_key(self, topic: str, key: str, max_num: int = 64, begin: int = 0, end: int = 0, continuation_token: str = "") -> QueryResult:
        self._log("query_by_key", topic, key, max_num, begin, end, continuation_token)
        return self.by_key

    def browse_topic(self, topic: str, begin: int = 0, end: int = 0, tag_expression: str = "", oldest_first: bool = False,
                     max_num: int = 0, continuation_token: str = "", **kw: Any) -> QueryResult:
        self._log("browse_topic", topic, begin, end, tag_expression, oldest_first, max_num, continuation_token)
        return self.pages[continuation_token]

    def query_by_offset(self, topic: str, broker: str, queue: int, offset: int) -> QueryResult:
        self._log("query_by_offset", topic, broker, queue, offset)
        return result([msg(offset, topic=topic, broker=broker)])

    def track(self, topic: str, broker: str, queue: int, offset: int) -> list[common_pb2.GroupConsumeStatus]:
        self._log("track", topic, broker, queue, offset)
        return [common_pb2.GroupConsumeStatus(group="g1", state=common_pb2.CONSUME_STATE_CONSUMED, online=True, source="offset")]

    def topics(self) -> list[str]:
        self._log("topics")
        return self.topic_list

    def brokers(self) -> list[router_pb2.BrokerInfo]:
        self._log("brokers")
        return [router_pb2.BrokerInfo(broker_name="broker-a", missing=False, commitlog_addr="10.0.0.1:7000", indexer_addr="10.0.0.1:7001"),
                router_pb2.BrokerInfo(broker_name="broker-b", missing=True)]

    # per broker, at its registered addresses
    def broker_status(self, addr: str) -> commitlog_pb2.GetStoreStatusResponse:
        self._log("broker_status", addr)
        return commitlog_pb2.GetStoreStatusResponse(
            broker_name="broker-a", min_offset=1 << 30, max_offset=(1 << 30) + 5000, corruption=["00000000001073741824 at 4096: bad CRC"],
            problems=["retention: stalled"], segments=[commitlog_pb2.SegmentInfo(file_name=f"{1 << 30:020d}", start_offset=1 << 30, written_bytes=5000, size=1 << 30)])

    def index_status(self, addr: str) -> indexer_pb2.GetIndexStatusResponse:
        self._log("index_status", addr)
        if self.index_fail is not None:
            raise self.index_fail
        return indexer_pb2.GetIndexStatusResponse(broker_name="broker-a", lag_bytes=1200, lag_ms=35, tail_connected=True, total_entries=7)

    def consumer_progress(self, addr: str, topic: str = "", group: str = "") -> commitlog_pb2.GetConsumerProgressResponse:
        self._log("consumer_progress", addr)
        return commitlog_pb2.GetConsumerProgressResponse(broker_name="broker-a", queues=[
            commitlog_pb2.QueueOffsetRange(topic="T", queue_id=0, min_queue_offset=0, max_queue_offset=10),
            commitlog_pb2.QueueOffsetRange(topic="T", queue_id=1, min_queue_offset=2, max_queue_offset=12),
            commitlog_pb2.QueueOffsetRange(topic="%DLQ%g1", queue_id=0, min_queue_offset=0, max_queue_offset=3),
        ], groups=[
            commitlog_pb2.GroupQueueProgress(group="g1", topic="T", queue_id=0, consumer_offset=4, max_queue_offset=10, lag=6, source="offset"),
            commitlog_pb2.GroupQueueProgress(group="g1", topic="T", queue_id=1, consumer_offset=12, max_queue_offset=12, lag=0, source="offset"),
        ])


class FakeProducer:
    def __init__(self) -> None:
        self.sent: list[tuple[Any, ...]] = []

    def send(self, topic: str, body: bytes, keys: Any = None, tags: str = "", properties: dict[str, str] | None = None, flag: int = 0) -> SendResult:
        self.sent.append((topic, body, keys, tags, properties, flag))
        n = len(self.sent)
        return SendResult("SEND_OK", f"NEW{n:029d}", offset_msg_id.create("10.0.0.1", 10911, 9000 + n), MessageQueue(topic, "broker-a", 2), 40 + n)


class Clock:
    """time.monotonic for the histogram's slices: each call advances by `step` seconds."""

    def __init__(self, step: float) -> None:
        self.t, self.step = 0.0, step

    def __call__(self) -> float:
        self.t += self.step
        return self.t


@pytest.fixture
def admin() -> FakeAdmin:
    return FakeAdmin()


@pytest.fixture
def api(admin: FakeAdmin) -> Api:
    return Api(admin, clock=lambda: NOW / 1000)


def get(api: Api, path: str, **params: Any) -> tuple[int, Any]:
    r = api.handle(path, {k: str(v) for k, v in params.items()})
    return r.status, r.body


# ---- the search box ------------------------------------------------------------------------

def test_an_offset_msg_id_is_read_as_one_and_says_so(api: Api, admin: FakeAdmin) -> None:
    admin.by_id[OID] = result([msg(1, oid=OID)])
    status, body = get(api, "/api/search", q=OID)
    assert status == 200 and body["kind"] == "offsetMsgId"
    assert "store host 10.0.0.1:10911, commit log offset 4096" in body["reading"]
    assert [m["offsetMsgId"] for m in body["messages"]] == [OID]


def test_a_32_hex_id_that_is_no_offset_msg_id_is_searched_as_a_unique_key_in_every_topic(api: Api, admin: FakeAdmin) -> None:
    admin.by_uid[("U", UID4)] = result([msg(2, topic="U", uid=UID4)])
    status, body = get(api, "/api/search", q=UID4)
    assert status == 200 and body["kind"] == "uniqueKey"
    assert body["tried"] and "not an offsetMsgId" in body["tried"][0]
    assert body["searchedTopics"] == ["T", "U"] and [m["uniqueKey"] for m in body["messages"]] == [UID4]
    assert body["complete"] is True


def test_a_rocketmq5_message_id_with_a_topic_asks_only_that_topic(api: Api, admin: FakeAdmin) -> None:
    admin.by_uid[("T", UID5)] = result([msg(3, uid=UID5)])
    status, body = get(api, "/api/search", q=UID5, topic="T")
    assert status == 200 and body["kind"] == "uniqueKeyV5"
    assert [c for c in admin.calls if c[0] == "query_by_unique_key"] == [("query_by_unique_key", ("T", UID5, True, 0, 0))]
    assert not any(c[0] == "query_by_id" for c in admin.calls)  # 34 characters are never an offsetMsgId


def test_a_key_needs_a_topic_and_the_error_names_the_field(api: Api) -> None:
    status, body = get(api, "/api/search", q="order-1001")
    assert status == 400 and body["field"] == "topic" and "needs a topic" in body["error"]
    status, body = get(api, "/api/search", q="")
    assert status == 400 and body["field"] == "q"
    status, body = get(api, "/api/search", q="order-1", topic="bad topic!")
    assert status == 400 and body["field"] == "topic" and "must match" in body["error"]


def test_a_key_search_is_paged_with_the_routers_token_and_says_what_did_not_answer(api: Api, admin: FakeAdmin) -> None:
    admin.by_key = result([msg(i) for i in range(3)], failed={"broker-b": "UNAVAILABLE: connection refused"}, token="t2")
    status, body = get(api, "/api/search", q="k-1", topic="T", token="t1", pageSize=3)
    assert status == 200 and body["kind"] == "key"
    assert admin.calls[-1] == ("query_by_key", ("T", "k-1", 3, 0, 0, "t1"))
    assert body["complete"] is False and body["nextToken"] == "t2" and body["retryToken"] == "t1"
    assert body["failedBrokers"] == [{"broker": "broker-b", "code": "UNAVAILABLE", "message": "connection refused"}]


def test_a_unique_key_search_where_a_topic_failed_is_incomplete_naming_it(api: Api, admin: FakeAdmin) -> None:
    original = admin.query_by_unique_key

    def flaky(topic: str, uid: str, **kw: Any) -> QueryResult:
        if topic == "U":
            raise UnavailableError("UNAVAILABLE", "no broker holding U answered: broker-b (UNAVAILABLE)")
        return original(topic, uid, **kw)

    admin.query_by_unique_key = flaky  # type: ignore[method-assign]
    status, body = get(api, "/api/search", q=UID5)
    assert status == 200 and body["complete"] is False and body["messages"] == []
    assert body["failedBrokers"][0]["topic"] == "U" and "broker-b" in body["failedBrokers"][0]["message"]


# ---- errors, mapped once -----------------------------------------------------------------------

@pytest.mark.parametrize("error, status", [
    (UnavailableError("UNAVAILABLE", "no router answered: 127.0.0.1:9876 (UNAVAILABLE: failed to connect)"), 503),
    (QuarryError("PERMISSION_DENIED", "account ops may not query T"), 403),
    (QuarryError("UNAUTHENTICATED", "unknown or missing access key"), 401),
    (NotFoundError("NOT_FOUND", "no route for topic T"), 404),
])
def test_router_errors_map_to_one_status_each(api: Api, admin: FakeAdmin, error: Exception, status: int) -> None:
    admin.fail = error
    code, body = get(api, "/api/browse", topic="T")
    assert code == status and error.message in body["error"]  # type: ignore[attr-defined]
    if status == 503:
        assert "127.0.0.1:9876" in body["error"] and body["routers"] == "127.0.0.1:9876"


def test_the_routers_invalid_argument_is_read_back_to_the_consoles_field(api: Api, admin: FakeAdmin) -> None:
    admin.fail = InvalidArgumentError("INVALID_ARGUMENT", "continuation_token: does not belong to this browse")
    status, body = get(api, "/api/browse", topic="T", begin=1, end=2, token="zzz")
    assert status == 400 and body["field"] == "token"


@pytest.mark.parametrize("params, field", [
    ({"topic": "T", "begin": "x"}, "begin"), ({"topic": "T", "begin": "5", "end": "4"}, "end"), ({"topic": "T", "pageSize": "1025"}, "pageSize"),
    ({"topic": "T", "order": "sideways"}, "order"), ({"topic": "T", "tags": "A || *"}, "tags"), ({}, "topic"),
])
def test_bad_browse_input_is_400_naming_the_field(api: Api, params: dict[str, str], field: str) -> None:
    status, body = api.handle("/api/browse", params).status, api.handle("/api/browse", params).body
    assert status == 400 and body["field"] == field, body


def test_an_unknown_endpoint_is_404(api: Api) -> None:
    assert get(api, "/api/nope")[0] == 404


# ---- browse ------------------------------------------------------------------------------------

def test_a_browse_page_carries_failed_brokers_expired_ranges_and_a_retry_token(api: Api, admin: FakeAdmin) -> None:
    page = result([msg(1)], failed={"broker-b": "DEADLINE_EXCEEDED: no answer in 1000 ms"}, token="next", notes=["broker broker-a: messages gone"])
    page.expired = [common_pb2.ExpiredRange(broker_name="broker-a", from_physical_offset=0, to_physical_offset=4096, stored_at_or_before=NOW - 5,
                                            queues=[common_pb2.ExpiredQueueRange(topic="T", queue_id=0, from_queue_offset=0, to_queue_offset=7)])]
    admin.pages["tok"] = page
    status, body = get(api, "/api/browse", topic="T", begin=1, end=NOW, tags="TagA || TagB", order="oldest", pageSize=10, token="tok")
    assert status == 200 and body["complete"] is False
    assert admin.calls[-1] == ("browse_topic", ("T", 1, NOW, "TagA || TagB", True, 10, "tok"))
    assert body["failedBrokers"] == [{"broker": "broker-b", "code": "DEADLINE_EXCEEDED", "message": "no answer in 1000 ms"}]
    assert body["retryToken"] == "tok" and body["nextToken"] == "next"
    assert body["expired"] == [{"broker": "broker-a", "fromPhysicalOffset": 0, "toPhysicalOffset": 4096, "storedAtOrBefore": NOW - 5,
                                "queues": [{"topic": "T", "queueId": 0, "fromQueueOffset": 0, "toQueueOffset": 7}]}]
    m = body["messages"][0]
    assert m["bodyPreview"] == '{"n": 1}' and "bodyBase64" not in m and m["keys"] == ["k-1"]


def test_without_begin_the_window_starts_at_the_oldest_message_and_end_is_fixed_at_now(api: Api, admin: FakeAdmin) -> None:
    admin.pages[""] = result([msg(5, ts=NOW - 777)])
    status, body = get(api, "/api/browse", topic="T")
    assert status == 200 and body["window"] == {"begin": NOW - 777, "end": NOW}
    assert admin.calls[0] == ("browse_topic", ("T", 0, NOW, "", True, 1, ""))  # the oldest message, one
    assert any("oldest message" in n for n in body["notes"])


# ---- histogram ------------------------------------------------------------------------------

def test_the_histogram_counts_every_message_across_slices(admin: FakeAdmin) -> None:
    begin, end = NOW - 1000, NOW - 1  # 1,000 ms in 10 buckets of 100 ms
    stamps = [begin + i * 7 for i in range(143)]
    pages = [stamps[:50], stamps[50:100], stamps[100:]]
    for i, chunk in enumerate(pages):
        admin.pages["" if i == 0 else f"p{i}"] = result([msg(j, ts=t) for j, t in enumerate(chunk)], token=f"p{i + 1}" if i < 2 else "")
    api = Api(admin, histogram_slice_s=0.5, clock=lambda: NOW / 1000, monotonic=Clock(1.0))  # one page per slice
    totals, token, requests = [0] * 10, "", 0
    while True:
        status, h = get(api, "/api/histogram", topic="T", begin=begin, end=end, buckets=10, token=token)
        assert status == 200 and h["bucketMs"] == 100 and h["sampled"] is False
        totals = [a + b for a, b in zip(totals, h["counts"])]
        requests += 1
        if h["done"]:
            break
        token = h["nextToken"]
    assert requests == 3 and sum(totals) == 143
    assert totals == [sum(1 for t in stamps if begin + b * 100 <= t < begin + (b + 1) * 100) for b in range(10)]
    assert h["edges"][0] == begin and h["edges"][-1] == end + 1


def test_the_histogram_stops_at_a_broker_that_did_not_answer(admin: FakeAdmin) -> None:
    admin.pages[""] = result([msg(1, ts=NOW - 10)], token="p1")
    admin.pages["p1"] = result([msg(2, ts=NOW - 5)], failed={"broker-b": "UNAVAILABLE: down"}, token="p2")
    api = Api(admin, clock=lambda: NOW / 1000, monotonic=Clock(0.0))
    status, h = get(api, "/api/histogram", topic="T", begin=NOW - 1000, end=NOW)
    assert status == 200 and h["counted"] == 1 and h["done"] is False and h["complete"] is False
    assert h["retryToken"] == "p1" and h["nextToken"] == "" and h["failedBrokers"][0]["broker"] == "broker-b"


def test_the_histogram_needs_its_window(api: Api) -> None:
    status, body = get(api, "/api/histogram", topic="T", end=NOW)
    assert status == 400 and body["field"] == "begin"


# ---- message, track, cluster -----------------------------------------------------------------

def test_a_message_by_position_has_every_field_and_its_body(api: Api, admin: FakeAdmin) -> None:
    status, body = get(api, "/api/message", topic="T", broker="broker-b", queue=2, offset=9)
    assert status == 200 and ("query_by_offset", ("T", "broker-b", 2, 9)) in admin.calls
    m = body["message"]
    for name in ("topic", "flag", "properties", "keys", "tags", "uniqueKey", "queueId", "queueOffset", "commitLogOffset", "storeSize", "sysFlag",
                 "bornTimestamp", "bornHost", "storeTimestamp", "storeHost", "reconsumeTimes", "preparedTransactionOffset", "bodyCrc", "offsetMsgId",
                 "brokerName", "scheduled", "deliverTimestamp", "realTopic", "bodyBase64"):
        assert name in m, name
    assert body["stored"]["broker"] == "broker-b" and body["stored"]["queueOffset"] == 9
    assert get(api, "/api/message", topic="T", queue=2, offset=9)[1]["field"] == "broker"
    assert get(api, "/api/message", id="XYZ")[1]["field"] == "id"


def test_the_body_downloads_as_bytes(api: Api) -> None:
    r = api.handle("/api/body", {"topic": "T", "broker": "broker-a", "queue": "0", "offset": "4"})
    assert r.status == 200 and r.body == b'{"n": 4}' and "attachment" in r.headers["Content-Disposition"]


def test_track_and_cluster(api: Api) -> None:
    status, body = get(api, "/api/track", topic="T", broker="broker-a", queue=0, offset=1)
    assert status == 200 and body["groups"][0]["group"] == "g1" and body["groups"][0]["state"] == "CONSUMED"
    status, body = get(api, "/api/cluster")
    assert status == 200 and [b["missing"] for b in body["brokers"]] == [False, True]


# ---- dead letters, cluster status, trace, copies ----------------------------------------------

def dead_letter(i: int, **props: str) -> common_pb2.StoredMessage:
    m = msg(i, topic="%DLQ%g1", uid=f"{i:032X}", oid=offset_msg_id.create("10.0.0.1", 10911, 100 + i))
    m.properties.extend([common_pb2.Property(name=k, value=v) for k, v in props.items()])
    m.properties.extend([common_pb2.Property(name="UNIQ_KEY", value=m.unique_key), common_pb2.Property(name="DELAY", value="0"),
                         common_pb2.Property(name="color", value="red")])
    return m


def post(api: Api, doc: Any, content_type: str = "application/json") -> tuple[int, Any]:
    r = api.handle_post("/api/resend", json.dumps(doc).encode(), content_type)
    return r.status, r.body


def test_a_dead_letter_is_planned_then_resent_to_its_original_topic_with_a_new_id(admin: FakeAdmin) -> None:
    producer = FakeProducer()
    api = Api(admin, producer=producer)
    a, b, c = dead_letter(1, RETRY_TOPIC="Orders"), dead_letter(2, DLQ_ORIGIN_TOPIC="Payments"), dead_letter(3)
    for m in (a, b, c):
        admin.by_id[m.offset_msg_id] = result([m])
    ids = [a.offset_msg_id, b.offset_msg_id, c.offset_msg_id]
    status, plan = post(api, {"ids": ids})
    assert status == 200 and plan["confirmed"] is False and producer.sent == []  # the plan only: nothing sent before confirmation
    assert [r.get("toTopic") for r in plan["results"]] == ["Orders", "Payments", None]
    assert "original topic is not known" in plan["results"][2]["refused"]
    status, done = post(api, {"ids": ids, "confirm": True})
    assert status == 200 and done["resent"] == 2 and done["refused"] == 1
    assert [s[0] for s in producer.sent] == ["Orders", "Payments"]
    topic, body, keys, tags, props, _ = producer.sent[0]
    assert (body, keys, tags) == (a.body, ["k-1"], "TagA")
    assert props == {"color": "red", "RESENT_FROM": a.offset_msg_id}  # RocketMQ's own properties left out: a new UNIQ_KEY
    first = done["results"][0]["sent"]
    assert first["topic"] == "Orders" and first["msgId"] == "NEW" + "0" * 28 + "1" and first["queueOffset"] == 41


@pytest.mark.parametrize("doc,content_type,field", [
    ({"ids": []}, "application/json", "ids"),
    ({"ids": ["nothex"]}, "application/json", "ids"),
    ({"ids": ["A" * 32, "A" * 32]}, "application/json", "ids"),
    ({"ids": ["A" * 32], "confirm": "yes"}, "application/json", "confirm"),
    ({"ids": ["A" * 32]}, "application/x-www-form-urlencoded", "Content-Type"),
])
def test_bad_resend_input_is_400_naming_the_field(api: Api, doc: Any, content_type: str, field: str) -> None:
    status, body = post(api, doc, content_type)
    assert status == 400 and body["field"] == field, body


class CaseBlindAdmin(FakeAdmin):
    def query_by_id(self, oid: str) -> QueryResult:  # as the router: the hex read whatever its case
        return super().query_by_id(oid.upper())


def test_one_dead_letter_named_twice_in_different_case_is_refused_not_resent_twice() -> None:
    admin, producer = CaseBlindAdmin(), FakeProducer()
    m = dead_letter(1, RETRY_TOPIC="Orders")
    admin.by_id[m.offset_msg_id.upper()] = result([m])
    status, body = post(Api(admin, producer=producer), {"ids": [m.offset_msg_id.upper(), m.offset_msg_id.lower()], "confirm": True})
    assert status == 400 and body["field"] == "ids" and "twice" in body["error"] and producer.sent == []
    status, body = post(Api(admin, producer=producer), {"ids": [m.offset_msg_id.lower()], "confirm": True})
    assert status == 200 and body["resent"] == 1 and body["results"][0]["offsetMsgId"] == m.offset_msg_id.upper()


def test_a_dead_letter_already_resent_by_this_console_is_refused_naming_the_earlier_resend() -> None:
    admin, producer = CaseBlindAdmin(), FakeProducer()
    m = dead_letter(1, RETRY_TOPIC="Orders")
    admin.by_id[m.offset_msg_id] = result([m])
    server = make_server("127.0.0.1:0", admin, make_admin=lambda account: CaseBlindAdmin())
    try:
        process_api = server.RequestHandlerClass.api  # type: ignore[attr-defined]
        process_api._producer = producer
        _, first = post(process_api, {"ids": [m.offset_msg_id], "confirm": True})
        assert first["resent"] == 1
        session_api = server.RequestHandlerClass.sessions.make_api(("ops", "x"))  # type: ignore[attr-defined]
        session_api.admin.by_id = admin.by_id
        session_api._producer = producer
        for doc in ({"ids": [m.offset_msg_id.lower()]}, {"ids": [m.offset_msg_id.lower()], "confirm": True}):  # the plan says so too
            for api in (process_api, session_api):  # another click, another browser's session
                status, again = post(api, doc)
                (row,) = again["results"]
                assert status == 200 and again["resent"] == 0 and again["refused"] == 1
                assert first["results"][0]["sent"]["msgId"] in row["refused"] and row["resentBefore"] == first["results"][0]["sent"]
        assert len(producer.sent) == 1
    finally:
        server.server_close()


def test_a_resend_that_failed_may_be_confirmed_again(admin: FakeAdmin) -> None:
    class Failing(FakeProducer):
        fail = True

        def send(self, *args: Any, **kwargs: Any) -> SendResult:
            if self.fail:
                self.fail = False
                raise UnavailableError("UNAVAILABLE", "no broker took it")
            return super().send(*args, **kwargs)

    producer = Failing()
    m = dead_letter(1, RETRY_TOPIC="Orders")
    admin.by_id[m.offset_msg_id] = result([m])
    api = Api(admin, producer=producer)
    _, done = post(api, {"ids": [m.offset_msg_id], "confirm": True})
    assert done["resent"] == 0 and done["results"][0]["error"]["code"] == "UNAVAILABLE"
    _, done = post(api, {"ids": [m.offset_msg_id], "confirm": True})
    assert done["resent"] == 1 and len(producer.sent) == 1


def test_a_retry_or_dead_letter_topic_is_no_origin_and_the_plan_says_why(admin: FakeAdmin) -> None:
    producer = FakeProducer()
    pop = dead_letter(1, RETRY_TOPIC="%RETRY%g1", DLQ_ORIGIN_TOPIC="Orders")  # a RocketMQ 5 pop revive's dead letter
    retry_only = dead_letter(2, RETRY_TOPIC="%RETRY%g1")
    dlq_only = dead_letter(3, DLQ_ORIGIN_TOPIC="%DLQ%g0")
    for m in (pop, retry_only, dlq_only):
        admin.by_id[m.offset_msg_id] = result([m])
    status, done = post(Api(admin, producer=producer), {"ids": [pop.offset_msg_id, retry_only.offset_msg_id, dlq_only.offset_msg_id], "confirm": True})
    assert status == 200 and [r.get("toTopic") for r in done["results"]] == ["Orders", None, None]
    assert [s[0] for s in producer.sent] == ["Orders"]
    assert "RETRY_TOPIC is %RETRY%g1, a retry topic" in done["results"][1]["refused"]
    assert "DLQ_ORIGIN_TOPIC is %DLQ%g0, a dead-letter topic" in done["results"][2]["refused"]


def test_a_message_not_in_a_dlq_topic_is_not_resent(admin: FakeAdmin) -> None:
    producer = FakeProducer()
    m = msg(5, oid=offset_msg_id.create("10.0.0.1", 10911, 5))
    m.properties.append(common_pb2.Property(name="RETRY_TOPIC", value="Orders"))
    admin.by_id[m.offset_msg_id] = result([m])
    status, done = post(Api(admin, producer=producer), {"ids": [m.offset_msg_id], "confirm": True})
    assert status == 200 and "not a dead-letter topic" in done["results"][0]["refused"] and producer.sent == []


def test_the_cluster_status_has_store_index_queues_groups_lag_and_dead_letters(api: Api, admin: FakeAdmin) -> None:
    status, body = get(api, "/api/status")
    assert status == 200
    a, b = body["brokers"]
    assert b["missing"] and b["error"]["code"] == "MISSING"
    st = a["store"]
    assert st["damaged"] == ["00000000001073741824 at 4096: bad CRC"] and st["problems"] == ["retention: stalled"]
    assert st["expired"] == {"fromPhysicalOffset": 0, "toPhysicalOffset": 1 << 30} and st["writtenBytes"] == 5000 and st["allocatedBytes"] == 1 << 30
    assert a["index"]["lagBytes"] == 1200 and a["index"]["lagMs"] == 35
    assert {(q["topic"], q["queueId"]): (q["minOffset"], q["maxOffset"]) for q in a["queues"]}[("T", 1)] == (2, 12)
    assert body["groups"] == [{"group": "g1", "topic": "T", "source": "offset", "lag": 6, "queues": 2, "brokers": ["broker-a"]}]
    assert body["deadLetters"] == [{"topic": "%DLQ%g1", "group": "g1", "messages": 3}]
    assert body["complete"] is False and [u["broker"] for u in body["unanswered"]] == ["broker-b"]


def test_a_part_that_does_not_answer_is_named_and_the_rest_still_shown(api: Api, admin: FakeAdmin) -> None:
    admin.index_fail = UnavailableError("UNAVAILABLE", "indexer down")
    body = get(api, "/api/status")[1]
    a = body["brokers"][0]
    assert a["index"] is None and a["indexError"] == {"code": "UNAVAILABLE", "message": "indexer down"} and a["store"] is not None
    assert {"broker": "broker-a", "part": "index", "code": "UNAVAILABLE", "message": "indexer down"} in body["unanswered"]


def test_the_message_names_its_segment_file(api: Api) -> None:
    admin_msg = get(api, "/api/message", topic="T", broker="broker-a", queue=0, offset=4)[1]
    assert admin_msg["stored"]["segmentError"]["code"] == "NOT_FOUND"  # the fake's record is at offset 0, below the segment
    assert "segment" not in get(api, "/api/message", topic="T", broker="broker-b", queue=0, offset=4)[1]["stored"]


def test_the_trace_is_decoded_oldest_first(api: Api, admin: FakeAdmin) -> None:
    mid = "0A0000010000000000000000000000AB"
    pub = f"Pub\x01{NOW}\x01DefaultRegion\x01pg\x01T\x01{mid}\x01TagA\x01k1\x0110.0.0.1:10911\x0110\x013\x010\x01OID\x01true\x02"
    sub = f"SubAfter\x01req\x01{mid}\x015\x01true\x01k1\x010\x02"
    sub_before = f"SubBefore\x01{NOW + 20}\x01DefaultRegion\x01cg\x01req\x01{mid}\x010\x01k1\x02"
    trace_msg = common_pb2.StoredMessage(topic="RMQ_SYS_TRACE_TOPIC", body=(sub_before + sub + pub).encode(), broker_name="broker-a",
                                         born_host=common_pb2.HostAddress(ip="10.0.0.9", port=5555))
    admin.by_key = result([trace_msg])
    status, body = get(api, "/api/trace", id=mid)
    assert status == 200 and admin.calls[-1][1][:2] == ("RMQ_SYS_TRACE_TOPIC", mid)
    assert [(c["traceType"], c["group"], c["timestamp"]) for c in body["contexts"]] == [("Pub", "pg", NOW), ("SubBefore", "cg", NOW + 20), ("SubAfter", "cg", NOW + 25)]
    assert [c["timeInferred"] for c in body["contexts"]] == [False, False, True]  # an old client's SubAfter: placed after its SubBefore
    assert get(api, "/api/trace")[1]["field"] == "id"


def test_copies_are_every_message_with_the_unique_key_in_every_topic_oldest_first(api: Api, admin: FakeAdmin) -> None:
    uid = "0A000001000A1B2C3D4E5F6071820002"
    admin.by_uid[("T", uid)] = result([msg(2, uid=uid, ts=NOW - 5), msg(1, uid=uid, ts=NOW - 9)])
    admin.by_uid[("U", uid)] = result([msg(3, topic="U", uid=uid, ts=NOW - 7)])
    status, body = get(api, "/api/copies", uniqueKey=uid)
    assert status == 200 and [m["queueOffset"] for m in body["messages"]] == [1, 3, 2] and body["searchedTopics"] == ["T", "U"]


# ---- the HTTP server ----------------------------------------------------------------------------

@pytest.fixture
def server(admin: FakeAdmin) -> Iterator[str]:
    srv = make_server("127.0.0.1:0", admin)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def fetch(url: str) -> tuple[int, dict[str, str], bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def test_every_view_path_serves_the_page_and_static_files_their_types(server: str) -> None:
    for view in ("/", "/search?q=x", "/browse?topic=T", "/message?id=1", "/cluster"):
        status, headers, body = fetch(server + view)
        assert status == 200 and headers["Content-Type"].startswith("text/html") and b"/static/app.js" in body
    status, headers, _ = fetch(server + "/static/app.js")
    assert status == 200 and "javascript" in headers["Content-Type"]
    assert fetch(server + "/static/../api.py")[0] == 404
    assert fetch(server + "/nowhere")[0] == 404


def test_the_api_over_http_answers_json_with_the_mapped_status(server: str, admin: FakeAdmin) -> None:
    status, headers, body = fetch(server + "/api/search?q=order-1")
    assert status == 400 and headers["Content-Type"].startswith("application/json") and json.loads(body)["field"] == "topic"
    admin.fail = UnavailableError("UNAVAILABLE", "failed to connect to all addresses")
    assert fetch(server + "/api/topics")[0] == 503
    admin.fail = None
    status, headers, body = fetch(server + "/api/body?topic=T&broker=broker-a&queue=0&offset=3")
    assert status == 200 and body == b'{"n": 3}' and headers["Content-Type"] == "application/octet-stream"
