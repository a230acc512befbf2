"""What rocketmq-client-java's PushConsumer and TransactionChecker need of the RocketMQ 5 door,
without a network: a consumer's settings (batch, long polling, retry delays), QueryAssignment
(router and commitlog), and the transaction check's command on a producer's Telemetry stream."""
from __future__ import annotations

import asyncio
from pathlib import Path
from typing import AsyncIterator

import pytest

from quarry.formats.properties import REAL_TOPIC
from quarry.services.query.registry import Broker, BrokerRegistry
from quarry.services.rmq5 import telemetry
from quarry.services.commitlog.doors.rmq5_assignment import RouterAssignments
from quarry.services.rmq5.auth import Authenticator
from quarry.services.rmq5.contract import Code, service, v2
from quarry.services.query.doors.rmq5_route import ALL_QUEUES, assignments, query_route
from quarry.services.rmq5.sessions import Sessions
from quarry.services.rmq5.status import RmqError
from quarry.services.commitlog.doors.rmq5_transaction import half_message, orphan_command
from tests.unit.test_rmq5 import MSG_ID, _Ctx, _send_servicer, _store, sdk_message


def _registry() -> BrokerRegistry:
    reg = BrokerRegistry(expiry_ms=60_000)
    reg.register(Broker("broker-a", "127.0.0.2:10911", "", "127.0.0.2:10911", topics={"OrderTopic": 4}))
    reg.register(Broker("broker-b", "127.0.0.3:10911", "", "127.0.0.3:10911", topics={"OrderTopic": 2}))
    return reg


def test_a_consumer_is_given_a_batch_a_long_poll_and_retry_delays_from_one_second() -> None:
    client = v2.Settings(client_type=v2.ClientType.PUSH_CONSUMER, subscription=v2.Subscription(group=v2.Resource(name="G")))
    reply = telemetry.answer(service.TelemetryCommand(settings=client), "c1", Sessions(), telemetry.ServerPolicy(4096, consumer_max_attempts=5), "p")
    assert reply is not None and reply.status.code == Code.OK
    s = reply.settings
    assert s.subscription.receive_batch_size == 32 and s.subscription.long_polling_timeout.seconds == 20 and not s.subscription.fifo
    assert s.backoff_policy.max_attempts == 5 and s.backoff_policy.WhichOneof("strategy") == "customized_backoff"
    assert [d.seconds for d in s.backoff_policy.customized_backoff.next][:4] == [1, 5, 10, 30]  # Quarry hides a message 1 s at least


def test_router_assigns_every_broker_holding_the_topic_all_its_queues() -> None:
    from quarry.services.query.doors.rmq5_messaging import RouterMessagingServicer

    got = assignments(query_route(_registry(), v2.Resource(name="OrderTopic")))
    assert [(a.message_queue.broker.name, a.message_queue.id) for a in got] == [("broker-a", ALL_QUEUES), ("broker-b", ALL_QUEUES)]
    assert got[0].message_queue.broker.endpoints.addresses[0].host == "127.0.0.2"

    async def scenario() -> None:
        servicer = RouterMessagingServicer(_registry(), Authenticator(None), telemetry.ServerPolicy(4096))
        ok = await servicer.QueryAssignment(service.QueryAssignmentRequest(topic=v2.Resource(name="OrderTopic"), group=v2.Resource(name="G")), _Ctx())
        assert ok.status.code == Code.OK and len(ok.assignments) == 2
        no_group = await servicer.QueryAssignment(service.QueryAssignmentRequest(topic=v2.Resource(name="OrderTopic")), _Ctx())
        assert no_group.status.code == Code.ILLEGAL_CONSUMER_GROUP
        unknown = await servicer.QueryAssignment(service.QueryAssignmentRequest(topic=v2.Resource(name="Nowhere"), group=v2.Resource(name="G")), _Ctx())
        assert unknown.status.code == Code.TOPIC_NOT_FOUND

    asyncio.run(scenario())


def test_a_commitlog_without_a_router_or_with_none_answering_says_so() -> None:
    async def scenario() -> None:
        request = service.QueryAssignmentRequest(topic=v2.Resource(name="T"), group=v2.Resource(name="G"))
        with pytest.raises(RmqError) as alone:
            await RouterAssignments([]).query(request, {})
        assert alone.value.code == Code.ILLEGAL_ACCESS_POINT and "--router" in alone.value.message
        gone = RouterAssignments(["127.0.0.1:1"], timeout_s=0.5)
        try:
            with pytest.raises(RmqError) as unanswered:
                await gone.query(request, {"authorization": "x"})
            assert unanswered.value.code == Code.PROXY_TIMEOUT and "127.0.0.1:1" in unanswered.value.message
        finally:
            await gone.close()

    asyncio.run(scenario())


def test_the_check_of_an_orphaned_half_goes_to_a_producer_of_its_topic_over_telemetry(tmp_path: Path) -> None:
    from quarry.services.commitlog.broker.transaction_check import TransactionCheck

    store = _store(tmp_path)

    async def scenario() -> None:
        servicer = _send_servicer(store, asyncio.get_running_loop())
        m = sdk_message(tag="tx", keys=["tx-key"], message_type=v2.MessageType.TRANSACTION)
        m.user_properties["origin"] = "unit"
        (stored,) = store.append_many([half_message(m, ("127.0.0.1", 5))])
        half = store.read(stored.physical_offset)
        request = TransactionCheck.request(half, 1)
        assert servicer.ask_producer(half, request) is False  # no producer connected

        hold = asyncio.Event()

        def producer(topics: list[str]) -> AsyncIterator[service.TelemetryCommand]:
            async def commands() -> AsyncIterator[service.TelemetryCommand]:
                yield service.TelemetryCommand(settings=v2.Settings(client_type=v2.ClientType.PRODUCER,
                                                                    publishing=v2.Publishing(topics=[v2.Resource(name=t) for t in topics])))
                await hold.wait()
            return commands()

        other = servicer.Telemetry(producer(["Elsewhere"]), _Ctx({"x-mq-client-id": "other"}))
        mine = servicer.Telemetry(producer(["OrderTopic"]), _Ctx({"x-mq-client-id": "mine"}))
        assert (await other.__anext__()).status.code == Code.OK and (await mine.__anext__()).status.code == Code.OK
        assert servicer.ask_producer(half, request) is True
        command = (await asyncio.wait_for(mine.__anext__(), 5)).recover_orphaned_transaction_command
        assert command.transaction_id == half.offset_msg_id
        sent = command.message
        assert (sent.topic.name, sent.system_properties.message_id, sent.body) == ("OrderTopic", MSG_ID, b"paid")
        assert sent.system_properties.message_type == v2.MessageType.TRANSACTION and list(sent.system_properties.keys) == ["tx-key"]
        assert dict(sent.user_properties) == {"origin": "unit"} and REAL_TOPIC not in sent.user_properties
        servicer.close()
        for s in (other, mine):
            async for _ in s:
                pass
        assert servicer.outboxes == {}  # a closed stream is asked no more
        assert servicer.ask_producer(half, request) is False

    try:
        asyncio.run(scenario())
    finally:
        store.close()


def test_orphan_command_carries_what_the_sdk_verifies(tmp_path: Path) -> None:
    import hashlib

    store = _store(tmp_path)
    try:
        (stored,) = store.append_many([half_message(sdk_message(message_type=v2.MessageType.TRANSACTION), ("127.0.0.1", 5))])
        half = store.read(stored.physical_offset)
        sp = orphan_command(half, "127.0.0.9:10911").recover_orphaned_transaction_command.message.system_properties
        assert sp.body_digest.type == v2.DigestType.MD5 and sp.body_digest.checksum == hashlib.md5(b"paid").hexdigest().upper()
        assert sp.body_encoding == v2.Encoding.IDENTITY and sp.store_host == "127.0.0.9:10911"
    finally:
        store.close()
