"""The official RocketMQ 5 Python SDK's SimpleConsumer (PyPI rocketmq-python-client, pinned)
against a real Quarry cluster (router + two brokers on loopback): everything a producer sent is
received and acked once, an unacked message comes back after its invisible duration with its
attempt raised, tag filters, dead-lettering after the group's max attempts, delayed delivery
and FIFO order; consume status checked through the CLI at each stage."""
from __future__ import annotations

import json
from pathlib import Path
import time
from typing import Iterator

import pytest
from rocketmq import FilterExpression, Message, Producer, SimpleConsumer

from quarry.clients.admin import AdminClient
from scripts.launcher import LocalCluster
from tests.e2e.conftest import wait_until
from tests.e2e.rmq5_sdk import acl_cluster, client_config

MAX_ATTEMPTS = 3


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = LocalCluster(root=tmp_path_factory.mktemp("rmq5c"), commitlog_args=["--segment-size", str(4 << 20), "--max-delivery-attempts", str(MAX_ATTEMPTS)],
                     indexer_args=["--hash-slots", "1001", "--index-num", "10000"])
    with c.running({"broker-a": "127.0.0.62", "broker-b": "127.0.0.63"}, router_host="127.0.0.61"):
        yield c


def send(cluster: LocalCluster, topic: str, bodies: list[bytes], tag: str = "", group: str = "", deliver_at_s: int = 0, key: str = "") -> list[str]:
    p = Producer(client_config(cluster), (topic,))
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
            if key:
                m.keys = key
            ids.append(p.send(m).message_id)
        return ids
    finally:
        p.shutdown()


def consumer(cluster: LocalCluster, group: str, topic: str, expression: str = "*", await_s: int = 2) -> SimpleConsumer:
    c = SimpleConsumer(client_config(cluster), group, {topic: FilterExpression(expression)}, await_duration=await_s)
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


def track(cluster: LocalCluster, topic: str, message_id: str, group: str, capsys: pytest.CaptureFixture[str]) -> dict:
    """The group's consume status of a message, through the CLI (queryMsgByUniqueKey --json)."""
    from quarry.clients import cli
    assert cluster.router is not None
    router = cluster.router.address

    def _query() -> str | None:
        capsys.readouterr()
        code = cli.main(["-n", router, "--json", "queryMsgByUniqueKey", "-t", topic, "-i", message_id])
        captured = capsys.readouterr()
        assert code in (0, 1), captured.err
        return captured.out if code == 0 else None  # 1: not indexed yet

    out = wait_until(_query, what=f"{message_id} indexed")
    (rows,) = json.loads(out)["tracks"]  # type: ignore[arg-type]
    return next((r for r in rows if r["group"] == group), {"state": "NO_GROUP"})


def state_is(cluster: LocalCluster, topic: str, message_id: str, group: str, capsys: pytest.CaptureFixture[str], state: str) -> dict | None:
    row = track(cluster, topic, message_id, group, capsys)
    return row if row["state"] == state else None


def wait_state(cluster: LocalCluster, topic: str, message_id: str, group: str, capsys: pytest.CaptureFixture[str], state: str, timeout_s: float = 20) -> dict:
    return wait_until(lambda: state_is(cluster, topic, message_id, group, capsys, state), timeout_s, what=f"{group} {state}")  # type: ignore[return-value]


def test_status_through_the_cli_and_the_text_track_section(cluster: LocalCluster, capsys: pytest.CaptureFixture[str]) -> None:
    from quarry.clients import cli
    (first,) = send(cluster, "CsTrack", [b"first"])
    c = consumer(cluster, "GTrack", "CsTrack", await_s=1)
    try:
        received_from = int(time.time() * 1000)  # the delivery's invisible time (30 s) counts from after this
        (m,) = drain(c, 1, ack=False)
        row = wait_state(cluster, "CsTrack", first, "GTrack", capsys, "IN_FLIGHT")
        assert row["attempt"] == 1 and row["invisible_until_ms"] >= received_from + 30_000 and row["online"] is True
        (second,) = send(cluster, "CsTrack", [b"second"])
        assert track(cluster, "CsTrack", second, "GTrack", capsys)["state"] == "NOT_YET_CONSUMED"
        c.ack(m)
        row = wait_state(cluster, "CsTrack", first, "GTrack", capsys, "CONSUMED")
        assert row["consumed_at_ms"] <= time.time() * 1000
    finally:
        c.shutdown()
    assert cluster.router is not None
    assert cli.main(["-n", cluster.router.address, "queryMsgByUniqueKey", "-t", "CsTrack", "-i", first]) == 0
    text = capsys.readouterr().out
    assert "#ConsumerGroup" in text and "GTrack" in text and "CONSUMED" in text and "acked at" in text


def test_redelivery_after_the_invisible_duration_raises_the_attempt(cluster: LocalCluster, capsys: pytest.CaptureFixture[str]) -> None:
    (mid,) = send(cluster, "CsRedo", [b"again"])
    c = consumer(cluster, "GRedo", "CsRedo", await_s=1)
    try:
        (m1,) = drain(c, 1, invisible_s=2, ack=False)
        assert m1.delivery_attempt == 1
        wait_state(cluster, "CsRedo", mid, "GRedo", capsys, "RETRYING")
        (m2,) = drain(c, 1, invisible_s=30, ack=False)
        assert (m2.message_id, m2.delivery_attempt, m2.body) == (mid, 2, b"again")
        with pytest.raises(Exception, match="superseded"):
            c.ack(m1)  # the first delivery's handle no longer names the message
        c.ack(m2)
        wait_state(cluster, "CsRedo", mid, "GRedo", capsys, "CONSUMED")
        assert c.receive(16, 30) == []
    finally:
        c.shutdown()


def test_change_invisible_duration_keeps_the_message_hidden(cluster: LocalCluster, capsys: pytest.CaptureFixture[str]) -> None:
    (mid,) = send(cluster, "CsLonger", [b"slow job"])
    c = consumer(cluster, "GLonger", "CsLonger", await_s=3)
    try:
        (m,) = drain(c, 1, invisible_s=2, ack=False)
        changed_from = int(time.time() * 1000)
        c.change_invisible_duration(m, 60)
        row = track(cluster, "CsLonger", mid, "GLonger", capsys)
        assert row["state"] == "IN_FLIGHT" and row["invisible_until_ms"] >= changed_from + 60_000
        assert c.receive(16, 30) == []  # a 3 s long poll: past the first 2 s, still hidden
        c.ack(m)  # with the handle the change returned
        wait_state(cluster, "CsLonger", mid, "GLonger", capsys, "CONSUMED")
    finally:
        c.shutdown()


def test_tag_filters(cluster: LocalCluster, capsys: pytest.CaptureFixture[str]) -> None:
    a = send(cluster, "CsTags", [b"a1", b"a2"], tag="TagA")
    b = send(cluster, "CsTags", [b"b1", b"b2"], tag="TagB")
    other = send(cluster, "CsTags", [b"c1", b"c2"], tag="TagC", key="tag-c")
    c = consumer(cluster, "GTags", "CsTags", "TagA || TagB", await_s=1)
    try:
        got = drain(c, 4)
        assert sorted(m.message_id for m in got) == sorted(a + b)
        # A message the group does not take is FILTERED once the group's pop has passed it (as
        # RocketMQ's CONSUMED_BUT_FILTERED needs the offset passed). Each receive asks one broker
        # (the SDK turns over the route's queues) and a pop passes only what is flushed, so the
        # group receives until both brokers passed theirs; it must never get one meanwhile.
        extra: list[Message] = []

        def passed() -> bool:
            extra.extend(c.receive(16, 30))
            return all(track(cluster, "CsTags", mid, "GTags", capsys)["state"] == "FILTERED" for mid in other)

        wait_until(passed, what="the TagC messages passed on both brokers")
        assert extra == []
    finally:
        c.shutdown()
    row = track(cluster, "CsTags", other[0], "GTags", capsys)
    assert row["state"] == "FILTERED" and row["expression"] == "TagA || TagB"
    # by key too: queryMsgByKey --track
    from quarry.clients import cli
    assert cluster.router is not None
    router = cluster.router.address

    def by_key() -> dict | None:
        capsys.readouterr()
        code = cli.main(["-n", router, "--json", "queryMsgByKey", "-t", "CsTags", "-k", "tag-c", "--track"])
        out = json.loads(capsys.readouterr().out)
        return out if code == 0 and len(out["tracks"]) == 2 else None

    found = wait_until(by_key, what="both tag-c messages by key")
    for rows in found["tracks"]:  # type: ignore[index]
        assert {r["group"]: r["state"] for r in rows}["GTags"] == "FILTERED"
    every = consumer(cluster, "GTagsAll", "CsTags", "*", await_s=1)
    try:
        assert sorted(m.message_id for m in drain(every, 6)) == sorted(a + b + other)
    finally:
        every.shutdown()


def test_dead_letter_after_max_attempts(cluster: LocalCluster, admin: AdminClient, capsys: pytest.CaptureFixture[str]) -> None:
    (mid,) = send(cluster, "CsPoison", [b"poison"])
    c = consumer(cluster, "GPoison", "CsPoison", await_s=1)
    try:
        attempts = []
        for _ in range(MAX_ATTEMPTS):
            (m,) = drain(c, 1, invisible_s=1, ack=False)
            attempts.append(m.delivery_attempt)
        assert attempts == [1, 2, 3]
    finally:
        c.shutdown()
    # no consumer polls any more: the broker forwards it itself once the last invisible time ran out
    row = wait_state(cluster, "CsPoison", mid, "GPoison", capsys, "DEAD_LETTERED", timeout_s=30)
    assert row["dead_lettered_at_ms"] and row["online"] in (True, False)
    dlq = wait_until(lambda: admin.query_by_unique_key("%DLQ%GPoison", mid).messages, what="found in the DLQ")
    assert dlq[0].body == b"poison" and dlq[0].properties["DLQ_ORIGIN_TOPIC"] == "CsPoison"  # type: ignore[index]


def test_delayed_message_is_delivered_at_its_time(cluster: LocalCluster, capsys: pytest.CaptureFixture[str]) -> None:
    c = consumer(cluster, "GLater", "CsLater", await_s=1)
    try:
        deliver_s = int(time.time()) + 4
        (mid,) = send(cluster, "CsLater", [b"later"], deliver_at_s=deliver_s)
        (m,) = drain(c, 1)
        received_ms = time.time() * 1000
        assert received_ms >= deliver_s * 1000 and m.message_id == mid
        assert m.delivery_timestamp == deliver_s * 1000
    finally:
        c.shutdown()


def test_fifo_group_next_only_after_previous_acked(cluster: LocalCluster, capsys: pytest.CaptureFixture[str]) -> None:
    ids = send(cluster, "CsFifo", [f"step {i}".encode() for i in range(5)], group="order-9")
    c = consumer(cluster, "GFifo", "CsFifo", await_s=1)
    try:
        order = []
        for i in range(5):
            got = drain(c, 1, ack=False)
            assert len(got) == 1, got  # one at a time, even with a batch of 16
            m = got[0]
            order.append(m.body)
            assert m.message_group == "order-9"
            if i < 4:
                row = track(cluster, "CsFifo", ids[i + 1], "GFifo", capsys)
                assert row["state"] == "NOT_YET_CONSUMED"
                assert c.receive(16, 30) == []  # nothing of the group while one is unacked
            c.ack(m)
        assert order == [f"step {i}".encode() for i in range(5)]
    finally:
        c.shutdown()


def test_bad_consumer_requests_answer_in_band_naming_the_field(cluster: LocalCluster) -> None:
    """Raw apache.rocketmq.v2 calls (as any SDK could send them): each refusal names the field."""
    import grpc

    from quarry.services.rmq5.contract import Code, service, service_grpc, v2
    send(cluster, "CsBad", [b"x"])
    broker = cluster.brokers["broker-a"].commitlog.address
    md = (("x-mq-client-id", "raw-test"),)

    def receive(**kw: object) -> v2.Status:
        req = service.ReceiveMessageRequest(group=v2.Resource(name="GBad"), message_queue=v2.MessageQueue(topic=v2.Resource(name="CsBad")), batch_size=1)
        for k, v in kw.items():
            if k == "group":
                req.group.name = v  # type: ignore[assignment]
            elif k == "sql":
                req.filter_expression.CopyFrom(v2.FilterExpression(type=v2.FilterType.SQL, expression="a > 1"))
            elif k == "invisible_s":
                req.invisible_duration.seconds = v  # type: ignore[assignment]
            else:
                setattr(req, k, v)
        statuses = [r.status for r in stub.ReceiveMessage(req, metadata=md, timeout=10) if r.HasField("status")]
        return statuses[0]

    with grpc.insecure_channel(broker) as ch:
        stub = service_grpc.MessagingServiceStub(ch)
        cases = [
            (receive(batch_size=0), Code.BAD_REQUEST, "batch_size"),
            (receive(batch_size=33), Code.BAD_REQUEST, "batch_size"),
            (receive(group="bad group!"), Code.ILLEGAL_CONSUMER_GROUP, "group.name"),
            (receive(group=""), Code.ILLEGAL_CONSUMER_GROUP, "group.name"),
            (receive(sql=True), Code.ILLEGAL_FILTER_EXPRESSION, "SQL92"),
            (receive(invisible_s=100_000), Code.ILLEGAL_INVISIBLE_TIME, "invisible_duration"),
        ]
        ack = stub.AckMessage(service.AckMessageRequest(group=v2.Resource(name="GBad"), topic=v2.Resource(name="CsBad"),
                                                        entries=[service.AckMessageEntry(message_id="m", receipt_handle="nonsense")]), metadata=md, timeout=10)
        cases.append((ack.status, Code.INVALID_RECEIPT_HANDLE, "entries[0].receipt_handle"))
        ack = stub.AckMessage(service.AckMessageRequest(group=v2.Resource(name="GBad"), topic=v2.Resource(name="CsBad"),
                                                        entries=[service.AckMessageEntry(message_id="m", receipt_handle="Q1.0.999.5")]), metadata=md, timeout=10)
        cases.append((ack.status, Code.INVALID_RECEIPT_HANDLE, "not in flight"))
        change = stub.ChangeInvisibleDuration(service.ChangeInvisibleDurationRequest(
            group=v2.Resource(name="GBad"), topic=v2.Resource(name="CsBad"), receipt_handle="Q1.0.0.1"), metadata=md, timeout=10)
        cases.append((change.status, Code.ILLEGAL_INVISIBLE_TIME, "invisible_duration"))
    for status, code, words in cases:
        assert status.code == code and words in status.message, (status, code, words)


def test_acl_consumer_needs_query_permission(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from rocketmq import Credentials
    from rocketmq.v5.exception import ForbiddenException

    accounts = [
        {"access_key": "reader", "secret_key": "reader-secret", "topics": {"CsAcl": ["publish", "query"]}},
        {"access_key": "writer", "secret_key": "writer-secret", "topics": {"CsAcl": ["publish"]}},
    ]
    with acl_cluster(tmp_path, monkeypatch, accounts, "127.0.0.64", "127.0.0.65") as c:

        def config(ak: str):  # type: ignore[no-untyped-def]
            return client_config(c, Credentials(ak, f"{ak}-secret"))

        p = Producer(config("writer"), ("CsAcl",))
        p.startup()
        try:
            m = Message()
            m.topic, m.body = "CsAcl", b"guarded"
            mid = p.send(m).message_id
        finally:
            p.shutdown()
        writer = SimpleConsumer(config("writer"), "GAclW", {"CsAcl": FilterExpression("*")}, await_duration=1)
        writer.startup()
        try:
            with pytest.raises(ForbiddenException) as refused:
                writer.receive(16, 30)
            assert "writer" in str(refused.value) and "query" in str(refused.value)
        finally:
            writer.shutdown()
        reader = SimpleConsumer(config("reader"), "GAclR", {"CsAcl": FilterExpression("*")}, await_duration=1)
        reader.startup()
        try:
            (got,) = drain(reader, 1)
            assert got.message_id == mid and got.body == b"guarded"
        finally:
            reader.shutdown()
