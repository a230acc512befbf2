"""Producer: retry elsewhere keeping UNIQ_KEY, no retry on bad input, validation, SendResult text.

Brokers and the router are real in-process gRPC servers with small servicers of their own."""
from __future__ import annotations

import time
from concurrent import futures
from datetime import timezone
from typing import Iterator

import grpc
import pytest

from quarry.clients.errors import InvalidArgumentError, UnavailableError
from quarry.clients.model import MessageQueue, SendResult
from quarry.clients import producer as producer_module
from quarry.clients.producer import Producer, unique_key_generator
from quarry.clients.errors import NotFoundError
from quarry.formats import unique_key
from quarry.v1 import commitlog_pb2, commitlog_pb2_grpc, common_pb2, router_pb2, router_pb2_grpc


class Broker(commitlog_pb2_grpc.CommitLogServiceServicer):
    def __init__(self, name: str, fail: grpc.StatusCode | None = None) -> None:
        self.name, self.fail, self.seen = name, fail, []

    def SendMessage(self, request, context):  # type: ignore[no-untyped-def]
        self.seen.append(request.message)
        if self.fail is not None:
            context.abort(self.fail, f"{self.name} says no")
        return commitlog_pb2.SendMessageResponse(result=common_pb2.SendResult(
            status=common_pb2.SEND_STATUS_SEND_OK, unique_key=request.message.unique_key, offset_msg_id="7F00000100002A9F0000000000000000",
            queue_id=request.message.queue_id, queue_offset=5, topic=request.message.topic, broker_name=self.name))


    def SendBatch(self, request, context):  # type: ignore[no-untyped-def]
        """Answers as a broker that knows compact_results does, unless `self.old` (one that predates it)."""
        self.seen.append(request)
        if self.fail is not None:
            context.abort(self.fail, f"{self.name} says no")
        n = len(request.messages)
        if request.compact_results and not getattr(self, "old", False):
            return commitlog_pb2.SendBatchResponse(compact=commitlog_pb2.SendResultColumns(
                status=common_pb2.SEND_STATUS_SEND_OK, broker_name=self.name, store_host=common_pb2.HostAddress(ip="127.0.0.1", port=10911),
                topic=request.messages[0].topic, physical_offsets=[100 * i for i in range(n)], queue_ids=[m.queue_id for m in request.messages],
                queue_offsets=list(range(7, 7 + n))))
        return commitlog_pb2.SendBatchResponse(results=[common_pb2.SendResult(
            status=common_pb2.SEND_STATUS_SEND_OK, unique_key=m.unique_key, offset_msg_id=f"7F00000100002A9F{100 * i:016X}", queue_id=m.queue_id,
            queue_offset=7 + i, physical_offset=100 * i, topic=m.topic, broker_name=self.name) for i, m in enumerate(request.messages)])


class Router(router_pb2_grpc.QueryRouterServiceServicer):
    def __init__(self, brokers: dict[str, str]) -> None:
        self.brokers = brokers

    def GetTopicRoute(self, request, context):  # type: ignore[no-untyped-def]
        return router_pb2.GetTopicRouteResponse(topic=request.topic, brokers=[router_pb2.BrokerQueues(broker_name=n, commitlog_addr=a, queue_count=2) for n, a in self.brokers.items()])


def _serve(add) -> tuple[grpc.Server, str]:  # type: ignore[no-untyped-def]
    server = grpc.server(futures.ThreadPoolExecutor(4))
    add(server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, f"127.0.0.1:{port}"


@pytest.fixture
def world() -> Iterator[tuple[str, Broker, Broker]]:
    down, up = Broker("broker-a", fail=grpc.StatusCode.UNAVAILABLE), Broker("broker-b")
    s1, a1 = _serve(lambda s: commitlog_pb2_grpc.add_CommitLogServiceServicer_to_server(down, s))
    s2, a2 = _serve(lambda s: commitlog_pb2_grpc.add_CommitLogServiceServicer_to_server(up, s))
    s3, a3 = _serve(lambda s: router_pb2_grpc.add_QueryRouterServiceServicer_to_server(Router({"broker-a": a1, "broker-b": a2}), s))
    yield a3, down, up
    for s in (s1, s2, s3):
        s.stop(0)


def test_unavailable_broker_is_retried_on_another_with_the_same_unique_key(world, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    router, down, up = world
    monkeypatch.setattr(producer_module.random, "randrange", lambda n: 0)
    with Producer(router, retries=2) as p:
        r = p.send("T", b"x", keys="k")  # round robin starts at broker-a's first queue
    assert r.message_queue.broker_name == "broker-b"
    assert len(down.seen) == 1 and len(up.seen) == 1
    assert down.seen[0].unique_key == up.seen[0].unique_key == r.msg_id


@pytest.mark.parametrize("retries", [0, 1, 2])
def test_a_send_makes_retries_plus_one_attempts_when_every_broker_is_down(world, retries: int) -> None:  # type: ignore[no-untyped-def]
    router, down, up = world
    up.fail = grpc.StatusCode.UNAVAILABLE
    with Producer(router, retries=retries) as p, pytest.raises(UnavailableError):
        p.send("T", b"x")
    assert len(down.seen) + len(up.seen) == retries + 1
    assert len({m.unique_key for m in down.seen + up.seen}) == 1  # one message, sent again


def test_invalid_argument_is_never_retried(world) -> None:  # type: ignore[no-untyped-def]
    router, down, up = world
    up.fail = grpc.StatusCode.INVALID_ARGUMENT
    down.fail = grpc.StatusCode.INVALID_ARGUMENT
    with Producer(router, retries=3) as p, pytest.raises(InvalidArgumentError):
        p.send("T", b"x")
    assert len(down.seen) + len(up.seen) == 1


@pytest.mark.parametrize(
    ("kw", "needle"),
    [({"topic": "a b"}, "topic"), ({"body": b""}, "body"), ({"keys": ["has space"]}, "keys[0]"), ({"properties": {"a": "b\x02"}}, "\\x02"), ({"properties": {"KEYS": "x"}}, "own field")],
)
def test_bad_input_is_rejected_before_sending(world, kw: dict, needle: str) -> None:  # type: ignore[no-untyped-def]
    router, down, up = world
    args = {"topic": "T", "body": b"x", **kw}
    with Producer(router) as p, pytest.raises(InvalidArgumentError, match=needle.replace("\\", "\\\\").replace("[", r"\[").replace("]", r"\]")):
        p.send(args.pop("topic"), args.pop("body"), **args)
    assert not down.seen and not up.seen


def test_caller_set_unique_key_is_kept(world) -> None:  # type: ignore[no-untyped-def]
    router, _, up = world
    with Producer(router) as p:
        r = p.send("T", b"x", unique_key="MY-OWN-ID", selector=lambda qs, _: next(q for q in qs if q.broker_name == "broker-b"))
    assert r.msg_id == "MY-OWN-ID" == up.seen[0].unique_key


def test_generated_unique_keys_have_the_4x_layout_and_decode_to_now() -> None:
    uid = unique_key_generator().next_id()
    assert unique_key.id_kind(uid) == "v4" and uid == uid.upper()
    now = int(time.time() * 1000)
    assert abs(unique_key.nearly_time_from_id(uid, now + 1000, timezone.utc) - now) < 15 * 3600 * 1000


def test_send_result_prints_like_rocketmq() -> None:
    r = SendResult("SEND_OK", "AB", "CD", MessageQueue("T", "broker-a", 3), 7)
    assert str(r) == "SendResult [sendStatus=SEND_OK, msgId=AB, offsetMsgId=CD, messageQueue=MessageQueue [topic=T, brokerName=broker-a, queueId=3], queueOffset=7]"


def test_round_robin_starts_at_a_random_queue(world, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    """RocketMQ's ThreadLocalIndex: a new producer's first send does not always hit the first queue."""
    router, down, up = world
    down.fail = None
    monkeypatch.setattr(producer_module.random, "randrange", lambda n: 3)
    with Producer(router) as p:
        # Queues interleave brokers: a0 b0 a1 b1; the count starts at 3, so b1 then a0.
        picked = [p.send("T", b"x").message_queue for _ in range(2)]
    assert [(q.broker_name, q.queue_id) for q in picked] == [("broker-b", 1), ("broker-a", 0)]
    monkeypatch.undo()
    starts = set()
    for _ in range(40):  # fresh producers, as 40 CLI runs: (1/4)^39 odds of one queue only
        with Producer(router) as p:
            q = p.send("T", b"x").message_queue
            starts.add((q.broker_name, q.queue_id))
    assert len(starts) > 1


class AutoCreateRouter(router_pb2_grpc.QueryRouterServiceServicer):
    """Knows no topic but TBW102, held by the brokers that create topics on first send."""

    def __init__(self, auto_create: dict[str, tuple[str, int]]) -> None:
        self.auto_create = auto_create

    def GetTopicRoute(self, request, context):  # type: ignore[no-untyped-def]
        if request.topic != "TBW102" or not self.auto_create:
            context.abort(grpc.StatusCode.NOT_FOUND, f"no route for topic {request.topic}")
        return router_pb2.GetTopicRouteResponse(topic=request.topic, brokers=[
            router_pb2.BrokerQueues(broker_name=n, commitlog_addr=a, queue_count=q) for n, (a, q) in self.auto_create.items()])


def test_a_new_topic_goes_to_the_brokers_that_create_topics_with_at_most_four_queues_each() -> None:
    a, b = Broker("broker-a"), Broker("broker-b")
    s1, a1 = _serve(lambda s: commitlog_pb2_grpc.add_CommitLogServiceServicer_to_server(a, s))
    s2, a2 = _serve(lambda s: commitlog_pb2_grpc.add_CommitLogServiceServicer_to_server(b, s))
    router = AutoCreateRouter({"broker-a": (a1, 8), "broker-b": (a2, 2)})
    s3, a3 = _serve(lambda s: router_pb2_grpc.add_QueryRouterServiceServicer_to_server(router, s))
    try:
        with Producer(a3) as p:
            route = p.route("NewTopic")
            for _ in range(len(route)):
                p.send("NewTopic", b"x")
        assert sorted((q.broker_name, q.queue_id) for q, _ in route) == [("broker-a", i) for i in range(4)] + [("broker-b", 0), ("broker-b", 1)]
        assert len(a.seen) == 4 and len(b.seen) == 2  # every broker of the route got (and so created) the topic
        router.auto_create.clear()
        with Producer(a3) as p, pytest.raises(NotFoundError, match="no live broker creates topics"):
            p.send("OtherTopic", b"x")
    finally:
        for s in (s1, s2, s3):
            s.stop(0)


@pytest.mark.parametrize("old_broker", [False, True])
def test_a_batch_asks_for_the_compact_answer_and_reads_either(world, old_broker: bool) -> None:  # type: ignore[no-untyped-def]
    router, _, up = world
    up.old = old_broker
    with Producer(router) as p:
        sent = p.send_batch("T", [b"a", b"b", b"c"], keys=["k1", None, "k3"])
        # The batch went to broker-b (broker-a is down) and asked for columns.
    request = next(r for r in up.seen if isinstance(r, commitlog_pb2.SendBatchRequest))
    assert request.compact_results
    assert [(r.send_status, r.msg_id, r.offset_msg_id, r.queue_offset, r.message_queue.broker_name) for r in sent] == [
        ("SEND_OK", m.unique_key, f"7F00000100002A9F{100 * i:016X}", 7 + i, "broker-b") for i, m in enumerate(request.messages)]
    assert all(r.raw is not None and r.raw.topic == "T" and r.raw.physical_offset == 100 * i for i, r in enumerate(sent))
