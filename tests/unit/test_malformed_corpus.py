"""A corpus of malformed requests for every RPC of the three services, served in this process
(tests/servicers.py: the services' own server start-up on loopback): each gets its documented
status with a message naming the field, and every service keeps serving."""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Callable

import grpc
import pytest

from quarry.v1 import commitlog_pb2, commitlog_pb2_grpc, common_pb2, indexer_pb2, indexer_pb2_grpc, router_pb2, router_pb2_grpc
from quarry.services.probe import wait_healthy
from quarry.services.query.registry import BrokerRegistry
from tests.servicers import InProcessBroker, in_process_router

T128 = "T" * 128
UNICODE = "订单\u0000\U0001F600\u200b"  # CJK, NUL, an astral character, a zero-width space

M = common_pb2.MessageInput
CL = commitlog_pb2
RT = router_pb2
IX = indexer_pb2

# (service, method, request, expected code, text the message must contain)
CORPUS: list[tuple[str, str, Any, str, str]] = [
    ("commitlog", "SendMessage", CL.SendMessageRequest(), "INVALID_ARGUMENT", "topic"),
    ("commitlog", "SendMessage", CL.SendMessageRequest(message=M(topic=T128, body=b"x", queue_id=-1)), "INVALID_ARGUMENT", "topic"),
    ("commitlog", "SendMessage", CL.SendMessageRequest(message=M(topic="订单", body=b"x", queue_id=-1)), "INVALID_ARGUMENT", "topic"),
    ("commitlog", "SendMessage", CL.SendMessageRequest(message=M(topic="T", body=b"x" * (5 << 20), queue_id=-1)), "INVALID_ARGUMENT", "body"),
    ("commitlog", "SendMessage", CL.SendMessageRequest(message=M(topic="T", body=b"x", queue_id=-7)), "INVALID_ARGUMENT", "queue_id"),
    ("commitlog", "SendMessage", CL.SendMessageRequest(message=M(topic="T", body=b"x", queue_id=-1, keys=["a\x02b"])), "INVALID_ARGUMENT", "keys[0]"),
    ("commitlog", "SendMessage", CL.SendMessageRequest(message=M(topic="T", body=b"x", queue_id=-1, tags="t\x01")), "INVALID_ARGUMENT", "tags"),
    ("commitlog", "SendMessage", CL.SendMessageRequest(message=M(topic="T", body=b"x", queue_id=-1, born_timestamp=-5)), "INVALID_ARGUMENT", "born_timestamp"),
    ("commitlog", "SendMessage", CL.SendMessageRequest(message=M(topic="T", body=b"x", queue_id=-1, born_host=common_pb2.HostAddress(ip="not-an-ip", port=1))), "INVALID_ARGUMENT", "born_host"),
    ("commitlog", "SendBatch", CL.SendBatchRequest(), "INVALID_ARGUMENT", "messages"),
    ("commitlog", "SendBatch", CL.SendBatchRequest(messages=[M(topic="T", body=b"x", queue_id=-1)] * 10_001), "INVALID_ARGUMENT", "messages"),
    ("commitlog", "ViewMessage", CL.ViewMessageRequest(physical_offset=-(2**63)), "INVALID_ARGUMENT", "physical_offset"),
    ("commitlog", "ViewMessage", CL.ViewMessageRequest(physical_offset=2**63 - 1), "NOT_FOUND", str(2**63 - 1)),
    ("commitlog", "GetMessages", CL.GetMessagesRequest(physical_offsets=[0] * 1025), "INVALID_ARGUMENT", "physical_offsets"),
    ("commitlog", "PullMessages", CL.PullMessagesRequest(topic="", queue_id=0, max_count=1), "INVALID_ARGUMENT", "topic"),
    ("commitlog", "PullMessages", CL.PullMessagesRequest(topic="T", queue_id=-1, max_count=1), "INVALID_ARGUMENT", "queue_id"),
    ("commitlog", "PullMessages", CL.PullMessagesRequest(topic="T", queue_id=0, max_count=10**6), "INVALID_ARGUMENT", "max_count"),
    ("commitlog", "Tail", CL.TailRequest(from_offset=0, max_batch=-1), "INVALID_ARGUMENT", "max_batch"),
    ("commitlog", "SearchOffsetByTime", CL.SearchOffsetByTimeRequest(topic=T128), "INVALID_ARGUMENT", "topic"),
    ("commitlog", "SearchOffsetByTime", CL.SearchOffsetByTimeRequest(topic="T", queue_id=-1), "INVALID_ARGUMENT", "queue_id"),
    ("commitlog", "SearchOffsetByTime", CL.SearchOffsetByTimeRequest(topic="T", timestamp=-1), "INVALID_ARGUMENT", "timestamp"),
    ("commitlog", "SearchOffsetByTime", CL.SearchOffsetByTimeRequest(topic="NeverSeen", timestamp=1), "NOT_FOUND", "NeverSeen"),
    ("commitlog", "BrowseMessages", CL.BrowseMessagesRequest(topic=UNICODE, end_timestamp=1, max_count=1), "INVALID_ARGUMENT", "topic"),
    ("commitlog", "BrowseMessages", CL.BrowseMessagesRequest(topic="T", tag_expression="||", end_timestamp=1, max_count=1), "INVALID_ARGUMENT", "tag_expression"),
    ("commitlog", "BrowseMessages", CL.BrowseMessagesRequest(topic="T", end_timestamp=1, max_count=0), "INVALID_ARGUMENT", "max_count"),
    ("commitlog", "BrowseMessages", CL.BrowseMessagesRequest(topic="T", begin_timestamp=5, end_timestamp=1, max_count=1), "INVALID_ARGUMENT", "end_timestamp"),
    ("commitlog", "BrowseMessages", CL.BrowseMessagesRequest(topic="T", end_timestamp=1, max_count=1, queue_ids=[99]), "NOT_FOUND", "does not exist"),
    ("indexer", "QueryMessage", IX.QueryMessageRequest(), "INVALID_ARGUMENT", "topic"),
    ("indexer", "QueryMessage", IX.QueryMessageRequest(topic=T128, key="k"), "INVALID_ARGUMENT", "topic"),
    ("indexer", "QueryMessage", IX.QueryMessageRequest(topic="T", key=UNICODE * 2000), "INVALID_ARGUMENT", "key"),
    ("indexer", "QueryMessage", IX.QueryMessageRequest(topic="T", key="k", max_num=-2**31), "INVALID_ARGUMENT", "max_num"),
    ("indexer", "QueryMessage", IX.QueryMessageRequest(topic="T", key="k", begin_timestamp=2**62, end_timestamp=1), "INVALID_ARGUMENT", "begin_timestamp"),
    ("router", "QueryMsgByKey", RT.QueryMsgByKeyRequest(topic="T", key="k", max_num=2**31 - 1), "INVALID_ARGUMENT", "max_num"),
    ("router", "QueryMsgByKey", RT.QueryMsgByKeyRequest(topic="T", key="a b"), "INVALID_ARGUMENT", "key"),
    ("router", "QueryMsgByKey", RT.QueryMsgByKeyRequest(topic="T", key="k", begin_timestamp=-1), "INVALID_ARGUMENT", "begin_timestamp"),
    ("router", "QueryMsgByKey", RT.QueryMsgByKeyRequest(topic="T", key="k", timeout_ms=-1), "INVALID_ARGUMENT", "timeout_ms"),
    ("router", "QueryMsgByUniqueKey", RT.QueryMsgByUniqueKeyRequest(topic="T", unique_key="U" * 500), "INVALID_ARGUMENT", "unique_key"),
    ("router", "QueryMsgById", RT.QueryMsgByIdRequest(offset_msg_id=UNICODE), "INVALID_ARGUMENT", "offset_msg_id"),
    ("router", "QueryMsgById", RT.QueryMsgByIdRequest(offset_msg_id="G" * 32), "INVALID_ARGUMENT", "offset_msg_id"),
    ("router", "QueryMsgByOffset", RT.QueryMsgByOffsetRequest(topic="T", broker_name="", queue_id=0), "INVALID_ARGUMENT", "broker_name"),
    ("router", "QueryMsgByOffset", RT.QueryMsgByOffsetRequest(topic="T", broker_name="nope", queue_id=0), "NOT_FOUND", "broker_name"),
    ("router", "BrowseTopic", RT.BrowseTopicRequest(topic=T128), "INVALID_ARGUMENT", "topic"),
    ("router", "BrowseTopic", RT.BrowseTopicRequest(topic="T", max_num=2**31 - 1), "INVALID_ARGUMENT", "max_num"),
    ("router", "BrowseTopic", RT.BrowseTopicRequest(topic="T", tag_expression="A || *"), "INVALID_ARGUMENT", "tag_expression"),
    ("router", "BrowseTopic", RT.BrowseTopicRequest(topic="T", continuation_token=UNICODE), "INVALID_ARGUMENT", "continuation_token"),
    ("router", "BrowseTopic", RT.BrowseTopicRequest(topic="T", queue_id=1, has_queue_id=True), "INVALID_ARGUMENT", "queue_id"),
    ("router", "BrowseTopic", RT.BrowseTopicRequest(topic="T", begin_timestamp=-(2**63)), "INVALID_ARGUMENT", "begin_timestamp"),
    ("router", "BrowseTopic", RT.BrowseTopicRequest(topic="T", broker_name="nope"), "NOT_FOUND", "broker_name"),
    ("router", "SearchOffset", RT.SearchOffsetRequest(topic="T", broker_name=""), "INVALID_ARGUMENT", "broker_name"),
    ("router", "SearchOffset", RT.SearchOffsetRequest(topic="T", broker_name="b", boundary=7), "INVALID_ARGUMENT", "boundary"),
    ("router", "SearchOffset", RT.SearchOffsetRequest(topic="T", broker_name="nope"), "NOT_FOUND", "broker_name"),
    ("router", "GetTopicRoute", RT.GetTopicRouteRequest(topic=T128), "INVALID_ARGUMENT", "topic"),
    ("router", "RegisterBroker", RT.RegisterBrokerRequest(broker_name="b", commitlog_addr="x:1", store_host="nocolon"), "INVALID_ARGUMENT", "store_host"),
    ("router", "RegisterBroker", RT.RegisterBrokerRequest(broker_name="b", commitlog_addr="x:1", store_host="1.2.3.4:5", topics=[RT.TopicQueues(topic="T", queue_count=0)]), "INVALID_ARGUMENT", "queue_count"),
    ("router", "UnregisterBroker", RT.UnregisterBrokerRequest(broker_name="never-registered"), "NOT_FOUND", "broker_name"),
]


@pytest.fixture(scope="module")
def services(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """Addresses of a commitlog, an indexer and a router, each a real gRPC server in this process."""
    broker = InProcessBroker("broker-a", tmp_path_factory.mktemp("corpus"), ("127.0.0.61", 10911), hash_slots=101, index_num=500).start()
    registry = BrokerRegistry(expiry_ms=600_000)
    registry.register(broker.registration())
    try:
        with in_process_router(registry) as (router, _queries):
            yield {"commitlog": broker.commitlog_addr, "indexer": broker.indexer_addr, "router": router}
    finally:
        broker.close()


def _stub(services: dict[str, str], service: str) -> tuple[Any, grpc.Channel]:
    channel = grpc.insecure_channel(services[service], options=[("grpc.max_send_message_length", 256 << 20)])
    factory: Callable[[grpc.Channel], Any] = {"commitlog": commitlog_pb2_grpc.CommitLogServiceStub, "indexer": indexer_pb2_grpc.IndexerServiceStub, "router": router_pb2_grpc.QueryRouterServiceStub}[service]
    return factory(channel), channel


@pytest.mark.parametrize(("service", "method", "request_", "code", "needle"), CORPUS, ids=[f"{s}.{m}-{i}" for i, (s, m, *_rest) in enumerate(CORPUS)])
def test_malformed_request_gets_its_documented_status(services: dict[str, str], service: str, method: str, request_: Any, code: str, needle: str) -> None:
    stub, channel = _stub(services, service)
    with channel, pytest.raises(grpc.RpcError) as err:
        result = getattr(stub, method)(request_, timeout=10)
        if method == "Tail":
            next(iter(result))
    assert err.value.code().name == code, err.value.details()
    assert needle in (err.value.details() or "")


def test_every_service_still_serves_after_the_corpus(services: dict[str, str]) -> None:
    for address in services.values():
        wait_healthy(address, deadline_s=5)
    stub, channel = _stub(services, "commitlog")
    with channel:  # and still stores: a good request after the bad ones
        sent = stub.SendMessage(CL.SendMessageRequest(message=M(topic="T", body=b"fine", queue_id=-1)), timeout=5).result
        assert stub.ViewMessage(CL.ViewMessageRequest(physical_offset=sent.physical_offset), timeout=5).message.body == b"fine"
