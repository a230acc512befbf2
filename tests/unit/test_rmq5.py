"""RocketMQ 5 protocol pieces without a network: message mapping, statuses, the SDK's
signature (made by the real SDK's own signer), routes, settings, transactions on a real store."""
from __future__ import annotations

import asyncio
from pathlib import Path
from typing import AsyncIterator

import pytest
from google.protobuf import timestamp_pb2

from quarry.formats.record import SYSFLAG_TRANSACTION_COMMIT
from quarry.services.commitlog.storage.errors import InvalidArgument, NotFound, ReadOnly
from quarry.services.commitlog.storage.store import CommitLogStore, StoreConfig
from quarry.services.query.registry import Broker, BrokerRegistry
from quarry.services.rmq5 import telemetry
from quarry.services.rmq5.auth import Authenticator, authorization_header
from quarry.services.rmq5.contract import Code, service, v2
from quarry.services.query.doors.rmq5_route import endpoints, query_route
from quarry.services.commitlog.doors.rmq5_send import to_new_message
from quarry.services.rmq5.sessions import Sessions
from quarry.services.rmq5.status import RmqError, from_store_error
from quarry.services.commitlog.broker.transactions import HALF_TOPIC, OP_TOPIC, Transactions
from quarry.services.commitlog.doors.rmq5_transaction import claim, half_message
from quarry.services.rmq5.unsupported import METHODS, fill_unsupported
from quarry.services.security import Account

MSG_ID = "0102FC00000001316C0B161CB900000007"


def sdk_message(**sp: object) -> v2.Message:
    m = v2.Message(topic=v2.Resource(name="OrderTopic"), body=b"paid")
    m.system_properties.message_id = MSG_ID
    m.system_properties.message_type = v2.MessageType.NORMAL
    for k, v in sp.items():
        if k == "keys":
            m.system_properties.keys.extend(v)  # type: ignore[arg-type]
        elif k in ("born_timestamp", "delivery_timestamp"):
            getattr(m.system_properties, k).CopyFrom(timestamp_pb2.Timestamp(seconds=int(v) // 1000, nanos=(int(v) % 1000) * 1_000_000))  # type: ignore[call-overload]
        else:
            setattr(m.system_properties, k, v)
    return m


def test_sdk_message_becomes_the_record_the_proxy_writes() -> None:
    now = 1_800_000_000_000
    m = sdk_message(tag="TagA", keys=["order-1", "order-2"], born_host="10.0.0.7", born_timestamp=now - 5, queue_id=2,
                    message_group="g1", message_type=v2.MessageType.FIFO)
    m.user_properties.update({"zeta": "1", "color": "blue"})
    msg = to_new_message(m, ("127.0.0.9", 4242), now_ms=now)
    assert (msg.topic, msg.body, msg.keys, msg.tags, msg.unique_key, msg.queue_id) == ("OrderTopic", b"paid", ["order-1", "order-2"], "TagA", MSG_ID, 2)
    assert msg.born_timestamp == now - 5 and msg.born_host == ("127.0.0.9", 4242)
    assert msg.properties == [("__SHARDINGKEY", "g1"), ("__BORNHOST", "10.0.0.7"), ("BORN_TIMESTAMP", str(now - 5)), ("color", "blue"), ("zeta", "1")]


def test_delayed_message_carries_its_deliver_time_under_its_own_topic() -> None:
    now = 1_800_000_000_000
    msg = to_new_message(sdk_message(delivery_timestamp=now + 60_000, message_type=v2.MessageType.DELAY), ("127.0.0.1", 1), now_ms=now)
    assert msg.topic == "OrderTopic" and ("TIMER_DELIVER_MS", str(now + 60_000)) in msg.properties
    with pytest.raises(RmqError) as err:
        to_new_message(sdk_message(delivery_timestamp=now + 2 * 86_400_000, message_type=v2.MessageType.DELAY), ("127.0.0.1", 1), now_ms=now)
    assert err.value.code == Code.ILLEGAL_DELIVERY_TIME and "delivery_timestamp" in err.value.message


@pytest.mark.parametrize("change, code, field", [
    (lambda m: m.user_properties.update({"UNIQ_KEY": "x"}), Code.ILLEGAL_MESSAGE_PROPERTY_KEY, "user_properties['UNIQ_KEY']"),
    (lambda m: m.user_properties.update({"a": "b\x01"}), Code.ILLEGAL_MESSAGE_PROPERTY_KEY, "user_properties['a']"),
    (lambda m: setattr(m.system_properties, "message_id", ""), Code.ILLEGAL_MESSAGE_ID, "system_properties.message_id"),
    (lambda m: setattr(m.system_properties, "tag", "a|b"), Code.ILLEGAL_MESSAGE_TAG, "system_properties.tag"),
    (lambda m: setattr(m.system_properties, "tag", "  "), Code.ILLEGAL_MESSAGE_TAG, "system_properties.tag"),
    (lambda m: setattr(m.system_properties, "message_type", v2.MessageType.FIFO), Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE, "system_properties.message_group"),
    (lambda m: setattr(m.system_properties, "message_group", "g" * 65), Code.ILLEGAL_MESSAGE_GROUP, "system_properties.message_group"),
    (lambda m: setattr(m.topic, "resource_namespace", "ns"), Code.BAD_REQUEST, "topic.resource_namespace"),
])
def test_bad_sdk_messages_are_refused_naming_field_and_rule(change, code, field) -> None:  # type: ignore[no-untyped-def]
    m = sdk_message()
    change(m)
    with pytest.raises(RmqError) as err:
        to_new_message(m, ("127.0.0.1", 1), "messages[0]")
    assert err.value.code == code and f"messages[0].{field}" in err.value.message


def test_store_errors_map_to_rocketmq5_codes() -> None:
    assert from_store_error(InvalidArgument("body", "5000 bytes exceeds the max message size 4096")).code == Code.MESSAGE_BODY_TOO_LARGE
    assert from_store_error(InvalidArgument("body", "must not be empty")).code == Code.MESSAGE_BODY_EMPTY
    bad_topic = from_store_error(InvalidArgument("topic", "'a b' must match ^[%|a-zA-Z0-9_-]+$"))
    assert bad_topic.code == Code.ILLEGAL_TOPIC and bad_topic.message.startswith("topic:")
    key = from_store_error(InvalidArgument("keys[1]", "must not contain a space"))
    assert key.code == Code.ILLEGAL_MESSAGE_KEY and key.message.startswith("system_properties.keys[1]:")
    assert from_store_error(NotFound("topic T does not exist and auto-creation is off")).code == Code.TOPIC_NOT_FOUND
    assert from_store_error(ReadOnly("store is read-only")).code == Code.FORBIDDEN


class _Config:
    """What the SDK's signer reads from a ClientConfiguration."""

    class credentials:
        ak, sk = "alice", "alice-secret"
    namespace = ""


def test_the_sdks_own_signature_is_accepted_and_checked() -> None:
    from rocketmq.v5.util.signature import Signature  # the real SDK's signer
    md = dict(Signature.metadata(_Config, "client-1"))
    auth = Authenticator({"alice": Account("alice", "alice-secret", topics={"OrderTopic": {"publish"}})})
    auth.check(md, "SendMessage", "publish", ["OrderTopic"])
    with pytest.raises(RmqError) as forbidden:
        auth.check(md, "SendMessage", "publish", ["Payroll"])
    assert forbidden.value.code == Code.FORBIDDEN and "Payroll" in forbidden.value.message
    tampered = dict(md, **{"x-mq-date-time": "20200101T000000Z"})
    with pytest.raises(RmqError) as bad:
        auth.check(tampered, "SendMessage", "publish", ["OrderTopic"])
    assert bad.value.code == Code.UNAUTHORIZED and "bad signature" in bad.value.message
    for md_wrong in ({}, {"authorization": authorization_header("mallory", "x", "20240101T000000Z"), "x-mq-date-time": "20240101T000000Z"},
                     {"authorization": "Basic abc", "x-mq-date-time": "20240101T000000Z"}):
        with pytest.raises(RmqError) as err:
            auth.check(md_wrong, "Heartbeat", None)
        assert err.value.code == Code.UNAUTHORIZED
    Authenticator(None).check({}, "SendMessage", "publish", ["Anything"])  # ACL off


def test_route_lists_every_holding_broker_or_every_live_one_for_a_new_topic() -> None:
    reg = BrokerRegistry(expiry_ms=60_000)
    reg.register(Broker("broker-a", "127.0.0.2:10911", "", "127.0.0.2:10911", topics={"OrderTopic": 2, "TBW102": 4}))
    reg.register(Broker("broker-b", "broker-b.local:10911", "", "10.0.0.3:10911", topics={"TBW102": 4}, rmq5_endpoint="[::1]:10999"))
    reg.register(Broker("broker-c", "127.0.0.4:10911", "", "127.0.0.4:10911"))  # creates no topics
    queues = query_route(reg, v2.Resource(name="OrderTopic"))
    assert [(q.broker.name, q.id) for q in queues] == [("broker-a", 0), ("broker-a", 1)]
    q = queues[0]
    assert q.permission == v2.Permission.READ_WRITE and q.broker.id == 0 and v2.MessageType.TRANSACTION in q.accept_message_types
    assert q.broker.endpoints == v2.Endpoints(scheme=v2.AddressScheme.IPv4, addresses=[v2.Address(host="127.0.0.2", port=10911)])
    fresh = query_route(reg, v2.Resource(name="NewTopic"))
    assert sorted({q.broker.name for q in fresh}) == ["broker-a", "broker-b"] and len(fresh) == 8
    assert next(q for q in fresh if q.broker.name == "broker-b").broker.endpoints.scheme == v2.AddressScheme.IPv6
    assert endpoints("commitlog-a:10911").scheme == v2.AddressScheme.DOMAIN_NAME
    with pytest.raises(RmqError) as err:
        query_route(reg, v2.Resource(name="bad topic"))
    assert err.value.code == Code.ILLEGAL_TOPIC
    with pytest.raises(RmqError) as none:
        query_route(BrokerRegistry(expiry_ms=1), v2.Resource(name="T"))
    assert none.value.code == Code.TOPIC_NOT_FOUND


def test_settings_answer_carries_the_server_policy() -> None:
    client = v2.Settings(client_type=v2.ClientType.PRODUCER, publishing=v2.Publishing(max_body_size=128 << 20, validate_message_type=False))
    sessions = Sessions()
    reply = telemetry.answer(service.TelemetryCommand(settings=client), "c1", sessions, telemetry.ServerPolicy(max_body_size=65536), "ipv4:127.0.0.1:1")
    assert reply is not None and reply.status.code == Code.OK
    s = reply.settings
    assert s.publishing.max_body_size == 65536 and s.publishing.validate_message_type
    assert s.backoff_policy.WhichOneof("strategy") == "exponential_backoff" and s.backoff_policy.max_attempts == 3
    assert s.backoff_policy.exponential_backoff.initial.nanos == 10_000_000 and s.backoff_policy.exponential_backoff.multiplier == 2
    assert sessions.get("c1") is not None and sessions.heartbeat("c1", v2.ClientType.PRODUCER)
    no_id = telemetry.answer(service.TelemetryCommand(settings=client), "", sessions, telemetry.ServerPolicy(1), "p")
    assert no_id is not None and no_id.status.code == Code.CLIENT_ID_REQUIRED


def test_every_rpc_not_implemented_answers_in_band() -> None:
    class Partial:
        def SendMessage(self) -> None: ...
    fill_unsupported(Partial, aio=False)
    for m in METHODS:
        if m.name in ("SendMessage", "Telemetry"):
            continue
        handler = getattr(Partial(), m.name)

        class Ctx:
            def peer(self) -> str:
                return "ipv4:127.0.0.1:1"
        out = handler(None, Ctx())
        answer = next(out) if m.server_streaming else out
        assert answer.status.code == Code.NOT_IMPLEMENTED and m.name in answer.status.message and "SendMessage" in answer.status.message


def _store(tmp_path: Path) -> CommitLogStore:
    return CommitLogStore(StoreConfig(store_dir=tmp_path / "store", segment_size=1 << 20, store_host=("127.0.0.5", 10911)))  # type: ignore[arg-type]


def _end(half_result, resolution: int, topic: str = "OrderTopic", msg_id: str = MSG_ID) -> service.EndTransactionRequest:  # type: ignore[no-untyped-def]
    return service.EndTransactionRequest(topic=v2.Resource(name=topic), message_id=msg_id, transaction_id=half_result.offset_msg_id, resolution=resolution)


def test_transaction_half_is_hidden_until_commit_and_resolved_once(tmp_path: Path) -> None:
    store = _store(tmp_path)
    try:
        m = sdk_message(tag="tx", keys=["tx-key"], message_type=v2.MessageType.TRANSACTION, queue_id=1)
        (half_result,) = store.append_many([half_message(m, ("127.0.0.1", 5))])
        assert half_result.topic == HALF_TOPIC and "OrderTopic" not in store.topics
        tx = Transactions(store)
        with pytest.raises(RmqError) as wrong_id:
            claim(tx, _end(half_result, v2.TransactionResolution.COMMIT, msg_id="01" + "0" * 32))
        assert wrong_id.value.code == Code.ILLEGAL_MESSAGE_ID
        half = claim(tx, _end(half_result, v2.TransactionResolution.COMMIT))
        committed, op = store.append_many(Transactions.resolution(half, commit=True), same_topic=False)
        rec = store.read(committed.physical_offset)
        assert (rec.topic, rec.queue_id, rec.sys_flag & 0xC, rec.prepared_transaction_offset) == ("OrderTopic", 1, SYSFLAG_TRANSACTION_COMMIT, half_result.physical_offset)
        assert rec.properties["UNIQ_KEY"] == MSG_ID and rec.keys == ["tx-key"] and rec.properties["TRAN_MSG"] == "true" and "REAL_TOPIC" not in rec.properties
        assert op.topic == OP_TOPIC and store.read(op.physical_offset).body == str(half_result.queue_offset).encode()
        with pytest.raises(RmqError) as again:
            claim(tx, _end(half_result, v2.TransactionResolution.ROLLBACK))
        assert again.value.code == Code.INVALID_TRANSACTION_ID and "already" in again.value.message
        (other,) = store.append_many([half_message(sdk_message(message_type=v2.MessageType.TRANSACTION), ("127.0.0.1", 5))])
    finally:
        store.close()
    store = _store(tmp_path)  # a restarted broker still knows the first half is resolved
    try:
        tx = Transactions(store)
        with pytest.raises(RmqError):
            claim(tx, _end(half_result, v2.TransactionResolution.COMMIT))
        half = claim(tx, _end(other, v2.TransactionResolution.ROLLBACK))
        (op,) = store.append_many(Transactions.resolution(half, commit=False))
        assert op.topic == OP_TOPIC
        with pytest.raises(RmqError) as elsewhere:
            bad = service.EndTransactionRequest(topic=v2.Resource(name="OrderTopic"), message_id=MSG_ID, transaction_id="7F0000010000271100000000000000AA")
            claim(tx, bad)
        assert elsewhere.value.code == Code.INVALID_TRANSACTION_ID and "not on this broker" in elsewhere.value.message
    finally:
        store.close()


class _Ctx:
    def __init__(self, md: dict[str, str] | None = None) -> None:
        self.md = md or {}

    def invocation_metadata(self) -> list[tuple[str, str]]:
        return list(self.md.items())

    def peer(self) -> str:
        return "ipv4:127.0.0.1:4000"


def test_router_telemetry_answers_settings_holds_many_streams_and_ends_them_at_stop() -> None:
    from quarry.services.query.doors.rmq5_messaging import RouterMessagingServicer

    async def scenario() -> None:
        servicer = RouterMessagingServicer(BrokerRegistry(expiry_ms=1000), Authenticator(None), telemetry.ServerPolicy(4096))
        settings = service.TelemetryCommand(settings=v2.Settings(client_type=v2.ClientType.PRODUCER, publishing=v2.Publishing()))
        hold = asyncio.Event()  # the clients keep their side open until this is set

        async def client() -> AsyncIterator[service.TelemetryCommand]:
            yield settings
            await hold.wait()

        # More streams than the thread-pool router's old cap (8): each is a task, none is refused.
        streams = [servicer.Telemetry(client(), _Ctx({"x-mq-client-id": f"c{i}"})) for i in range(40)]
        replies = [await s.__anext__() for s in streams]
        assert all(r.status.code == Code.OK and r.settings.publishing.max_body_size == 4096 for r in replies)
        # The server stops: every open stream ends although its client never closed it.
        servicer.close()
        for s in streams:
            with pytest.raises(StopAsyncIteration):
                await asyncio.wait_for(s.__anext__(), 5)
        # heartbeats and terminations are answered, and name what is missing
        assert (await servicer.Heartbeat(service.HeartbeatRequest(), _Ctx())).status.code == Code.CLIENT_ID_REQUIRED
        assert (await servicer.Heartbeat(service.HeartbeatRequest(client_type=v2.ClientType.PRODUCER), _Ctx({"x-mq-client-id": "c1"}))).status.code == Code.OK
        assert (await servicer.NotifyClientTermination(service.NotifyClientTerminationRequest(), _Ctx({"x-mq-client-id": "c1"}))).status.code == Code.OK
        assert (await servicer.SendMessage(service.SendMessageRequest(), _Ctx())).status.code == Code.ILLEGAL_ACCESS_POINT

    asyncio.run(scenario())


def test_every_handler_failure_is_answered_in_band_by_one_rule() -> None:
    from quarry.services.errors import ReadOnly
    from quarry.services.rmq5.client_calls import in_band
    from quarry.services.rmq5.status import RmqError

    assert in_band(RmqError(Code.BAD_REQUEST, "topic.name: must not be empty"), "AckMessage").code == Code.BAD_REQUEST
    # A store refusal keeps its meaning (AckMessage and ChangeInvisibleDuration once answered it INTERNAL).
    assert in_band(ReadOnly("store is read-only"), "AckMessage").code == Code.FORBIDDEN
    unexpected = in_band(ValueError("boom"), "ChangeInvisibleDuration")
    assert unexpected.code == Code.INTERNAL_SERVER_ERROR and "ChangeInvisibleDuration" in unexpected.message


def _send_servicer(store: CommitLogStore, loop: asyncio.AbstractEventLoop):  # type: ignore[no-untyped-def]
    import threading

    from quarry.services.commitlog.broker.flush_signal import FlushSignal
    from quarry.services.commitlog.broker.core import Broker
    from quarry.services.commitlog.doors.rmq5_messaging import CommitLogMessagingServicer

    flushed = FlushSignal(loop)
    store.add_flush_listener(flushed.fire)
    return CommitLogMessagingServicer(Broker(store, "broker-a", threading.Event(), flushed), Authenticator(None),
                                      telemetry.ServerPolicy(max_body_size=4 << 20))


def test_send_answers_each_message_with_its_id_queue_offset_and_for_a_half_its_transaction_id(tmp_path: Path) -> None:
    store = _store(tmp_path)

    async def main() -> service.SendMessageResponse:
        request = service.SendMessageRequest(messages=[sdk_message(queue_id=0), sdk_message(message_type=v2.MessageType.TRANSACTION)])
        return await _send_servicer(store, asyncio.get_running_loop()).SendMessage(request, _Ctx())

    try:
        answer = asyncio.run(main())
        assert answer.status.code == Code.OK and [e.status.code for e in answer.entries] == [Code.OK, Code.OK]
        plain, half = answer.entries
        assert (plain.message_id, plain.offset, plain.transaction_id) == (MSG_ID, 0, "")
        assert half.message_id == MSG_ID and store.read(int(half.transaction_id[-16:], 16)).topic == HALF_TOPIC
    finally:
        store.close()


def test_a_sync_send_not_flushed_in_time_is_answered_stored_but_not_persisted(tmp_path: Path) -> None:
    store = CommitLogStore(StoreConfig(store_dir=tmp_path / "store", segment_size=1 << 20, flush_mode="SYNC", sync_flush_timeout_ms=50))
    store.flusher.stop()  # nothing is fsynced any more: every SYNC wait times out

    async def main() -> service.SendMessageResponse:
        request = service.SendMessageRequest(messages=[sdk_message(), sdk_message()])
        return await _send_servicer(store, asyncio.get_running_loop()).SendMessage(request, _Ctx())

    try:
        answer = asyncio.run(main())
        assert answer.status.code == Code.MASTER_PERSISTENCE_TIMEOUT
        assert [e.status.code for e in answer.entries] == [Code.MASTER_PERSISTENCE_TIMEOUT] * 2
        assert [e.message_id for e in answer.entries] == [MSG_ID] * 2 and "stored" in answer.entries[0].status.message
    finally:
        store.close()


def test_headers_are_read_from_grpc_only_when_looked_at_and_then_once() -> None:
    from quarry.services.rmq5 import client_calls

    class Counting(_Ctx):
        reads = 0

        def invocation_metadata(self) -> list[tuple[str, str]]:
            Counting.reads += 1
            return [*super().invocation_metadata(), ("binary-bin", b"\x00")]  # type: ignore[list-item]

    ctx = Counting({"x-mq-client-id": "c1", "x-mq-language": "PYTHON"})
    md = client_calls.metadata(ctx)
    Authenticator(None).check(md, "SendMessage", "publish", ["T"])  # ACL off: nothing to read
    assert Counting.reads == 0
    assert md.get("x-mq-client-id") == "c1" and md.get("absent", "") == "" and dict(md) == {"x-mq-client-id": "c1", "x-mq-language": "PYTHON"}
    assert Counting.reads == 1  # binary headers left out, read once
