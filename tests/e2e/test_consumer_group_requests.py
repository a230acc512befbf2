"""The consumer-group requests RocketMQ 4's push consumers make beyond pulling (issue 35, item 2),
on the wire against one broker with access control on: LOCK_BATCH_MQ / UNLOCK_BATCH_MQ (an
orderly consumer's queue locks), CONSUMER_SEND_MSG_BACK (a failed message to %RETRY%<group>,
parked at its delay level), CHECK_CLIENT_CONFIG (SQL92 refused as a RocketMQ broker without
enablePropertyFilter refuses it) and NOTIFY_CONSUMER_IDS_CHANGED (the broker telling a group's
consumers that one joined or left). tests/e2e/test_java_consumer.py runs RocketMQ's own Java
consumers through them; here each rule and refusal is looked at alone."""
from __future__ import annotations

import asyncio
import json
import time
from typing import Any, Iterator

import pytest

from quarry.formats import offset_msg_id
from quarry.services.remoting import codes
from tests.remoting_client import RemotingClient
from tests.e2e.acl_broker import acl_broker
from tests.e2e import mqadmin

HOST = "127.0.0.103"
ACCOUNTS = [
    {"access_key": "admin", "secret_key": "admin-secret-1", "admin": True},
    {"access_key": "qx", "secret_key": "qx-secret-4444", "topics": {"TopicX": ["query"]}},
    {"access_key": "nogroup", "secret_key": "nogroup-secret-5", "topics": {"*": ["query"]}, "default_group_perms": []},
]
SECRETS = {a["access_key"]: a["secret_key"] for a in ACCOUNTS}


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with acl_broker(tmp_path_factory.mktemp("group-requests"), HOST, ACCOUNTS) as address:
        yield address


def run(coro: Any) -> Any:
    return asyncio.run(coro)


async def _call(addr: str, who: str, code: int, fields: dict[str, Any], body: bytes = b"") -> Any:
    async with RemotingClient(addr, access_key=who, secret_key=SECRETS[who]) as b:
        return await b.call(code, fields, body)


def _send(addr: str, topic: str, properties: str) -> int:
    """A message stored by admin; its commit log offset."""
    fields = {"a": "pg", "b": topic, "c": "TBW102", "d": 4, "e": 0, "f": 0, "g": int(time.time() * 1000), "h": 0, "i": properties, "j": 0, "k": False}
    sent = run(_call(addr, "admin", codes.SEND_MESSAGE_V2, fields, b"to be retried"))
    assert sent.code == codes.SUCCESS, sent.remark
    return offset_msg_id.decode(sent.ext_fields["msgId"]).offset


def _lock_body(group: str, client: str, queues: list[tuple[str, int]]) -> bytes:
    return json.dumps({"consumerGroup": group, "clientId": client,
                       "mqSet": [{"topic": t, "brokerName": "broker-a", "queueId": q} for t, q in queues]}).encode()


def _locked(answer: Any) -> set[tuple[str, int]]:
    assert answer.code == codes.SUCCESS, answer.remark
    return {(q["topic"], q["queueId"]) for q in json.loads(answer.body)["lockOKMQSet"]}


def _heartbeat(client: str, group: str, topic: str) -> bytes:
    subs = [{"topic": topic, "subString": "*", "tagsSet": [], "codeSet": [], "subVersion": 0, "expressionType": "TAG"}]
    return json.dumps({"clientID": client, "producerDataSet": [], "consumerDataSet": [
        {"groupName": group, "consumeType": "CONSUME_PASSIVELY", "messageModel": "CLUSTERING",
         "consumeFromWhere": "CONSUME_FROM_LAST_OFFSET", "subscriptionDataSet": subs, "unitMode": False}]}).encode()


def test_queue_locks_are_one_clients_until_it_unlocks_them(broker: str) -> None:
    x0, x1 = ("TopicX", 0), ("TopicX", 1)
    assert _locked(run(_call(broker, "qx", codes.LOCK_BATCH_MQ, {}, _lock_body("GX", "c1", [x0, x1])))) == {x0, x1}
    assert _locked(run(_call(broker, "qx", codes.LOCK_BATCH_MQ, {}, _lock_body("GX", "c2", [x1])))) == set()  # c1's: left out
    assert _locked(run(_call(broker, "qx", codes.LOCK_BATCH_MQ, {}, _lock_body("GY", "c2", [x1])))) == {x1}  # another group
    assert run(_call(broker, "qx", codes.UNLOCK_BATCH_MQ, {}, _lock_body("GX", "c2", [x0]))).code == codes.SUCCESS  # not c2's: kept
    assert _locked(run(_call(broker, "qx", codes.LOCK_BATCH_MQ, {}, _lock_body("GX", "c2", [x0])))) == set()
    assert run(_call(broker, "qx", codes.UNLOCK_BATCH_MQ, {}, _lock_body("GX", "c1", [x0]))).code == codes.SUCCESS
    assert _locked(run(_call(broker, "qx", codes.LOCK_BATCH_MQ, {}, _lock_body("GX", "c2", [x0])))) == {x0}
    bad = run(_call(broker, "qx", codes.LOCK_BATCH_MQ, {}, b"{not json"))
    assert bad.code == codes.SYSTEM_ERROR and "LockBatchRequestBody" in bad.remark


def test_queue_locks_need_query_on_the_topics_and_the_group(broker: str) -> None:
    for code in (codes.LOCK_BATCH_MQ, codes.UNLOCK_BATCH_MQ):
        refused = run(_call(broker, "qx", code, {}, _lock_body("GX", "c1", [("TopicX", 0), ("TopicA", 0)])))
        assert refused.code == codes.NO_PERMISSION and "TopicA" in refused.remark, refused.remark
        refused = run(_call(broker, "nogroup", code, {}, _lock_body("GX", "c1", [("TopicX", 0)])))
        assert refused.code == codes.NO_PERMISSION and "consumer group GX" in refused.remark, refused.remark


def test_a_message_sent_back_is_parked_for_the_groups_retry_topic(broker: str) -> None:
    offset = _send(broker, "TopicX", "KEYS\x01back-1\x02TAGS\x01TagB\x02UNIQ_KEY\x01U-BACK-1\x02color\x01red")
    back = run(_call(broker, "qx", codes.CONSUMER_SEND_MSG_BACK, {"offset": offset, "group": "GX", "delayLevel": 0, "originTopic": "TopicX",
                                                                  "maxReconsumeTimes": 16, "unitMode": False}))
    assert back.code == codes.SUCCESS, back.remark
    fields = {"consumerGroup": "admin-reader", "topic": "SCHEDULE_TOPIC_XXXX", "queueId": 2, "queueOffset": 0, "maxMsgNums": 32, "sysFlag": 0,
              "commitOffset": 0, "suspendTimeoutMillis": 0, "subscription": "*", "subVersion": 0}
    pulled = run(_call(broker, "admin", codes.PULL_MESSAGE, fields))  # level 3 (3 + reconsume times 0) parks in queue 2
    assert pulled.code == codes.SUCCESS, pulled.remark
    (parked,) = [r for r in mqadmin.decodes(pulled.body) if r.unique_key == "U-BACK-1"]
    props = parked.properties
    assert (props["REAL_TOPIC"], props["DELAY"], props["RETRY_TOPIC"], props["color"], parked.tags, parked.keys) == (
        "%RETRY%GX", "3", "TopicX", "red", "TagB", ["back-1"])
    assert parked.reconsume_times == 1 and props["ORIGIN_MESSAGE_ID"] == offset_msg_id.create(HOST, int(broker.rsplit(":", 1)[1]), offset)


def test_sending_back_needs_query_on_the_messages_topic_and_the_group(broker: str) -> None:
    offset = _send(broker, "TopicA", "KEYS\x01back-2")
    refused = run(_call(broker, "qx", codes.CONSUMER_SEND_MSG_BACK, {"offset": offset, "group": "GX", "delayLevel": 0}))
    assert refused.code == codes.NO_PERMISSION and "TopicA" in refused.remark, refused.remark
    refused = run(_call(broker, "nogroup", codes.CONSUMER_SEND_MSG_BACK, {"offset": offset, "group": "GX", "delayLevel": 0}))
    assert refused.code == codes.NO_PERMISSION and "consumer group GX" in refused.remark, refused.remark
    missing = run(_call(broker, "admin", codes.CONSUMER_SEND_MSG_BACK, {"offset": 1 << 40, "group": "GX", "delayLevel": 0}))
    assert missing.code == codes.SYSTEM_ERROR and missing.remark.startswith("look message by offset failed"), missing.remark


def test_a_sql92_subscription_is_refused_by_the_client_check(broker: str) -> None:
    def check(who: str, kind: str, topic: str = "TopicX") -> Any:
        body = {"clientId": "c1", "group": "GX", "subscriptionData": {"topic": topic, "subString": "a > 1", "expressionType": kind}}
        return run(_call(broker, who, codes.CHECK_CLIENT_CONFIG, {}, json.dumps(body).encode()))

    assert check("qx", "TAG").code == codes.SUCCESS
    refused = check("qx", "SQL92")
    assert (refused.code, refused.remark) == (codes.SYSTEM_ERROR, "The broker does not support consumer to filter message by SQL92")
    assert check("qx", "SQL92", "TopicA").code == codes.NO_PERMISSION


def test_a_groups_consumers_are_told_when_one_joins_or_leaves(broker: str) -> None:
    async def main() -> None:
        async with RemotingClient(broker, access_key="qx", secret_key=SECRETS["qx"]) as first:
            assert (await first.call(codes.HEART_BEAT, {}, _heartbeat("first@1", "GN", "TopicX"))).code == codes.SUCCESS
            told = await asyncio.wait_for(first.server_requests.get(), 5)  # itself joining: told too, as RocketMQ tells every channel
            assert (told.code, told.ext_fields, told.is_oneway) == (codes.NOTIFY_CONSUMER_IDS_CHANGED, {"consumerGroup": "GN"}, True)
            assert (await first.call(codes.HEART_BEAT, {}, _heartbeat("first@1", "GN", "TopicX"))).code == codes.SUCCESS  # no change: nothing
            async with RemotingClient(broker, access_key="qx", secret_key=SECRETS["qx"]) as second:
                assert (await second.call(codes.HEART_BEAT, {}, _heartbeat("second@1", "GN", "TopicX"))).code == codes.SUCCESS
                told = await asyncio.wait_for(first.server_requests.get(), 5)
                assert told.code == codes.NOTIFY_CONSUMER_IDS_CHANGED
            told = await asyncio.wait_for(first.server_requests.get(), 5)  # second's connection closed: it left
            assert told.code == codes.NOTIFY_CONSUMER_IDS_CHANGED and first.server_requests.empty()

    run(main())


def test_a_clients_own_retry_send_past_its_last_attempt_goes_to_the_dlq(broker: str) -> None:
    """A 4.x client sends the message to %RETRY%<group> itself when CONSUMER_SEND_MSG_BACK fails
    (and an orderly consumer does so at its last attempt): with reconsumeTimes (j) at the
    maxReconsumeTimes (l) of the header, a RocketMQ broker stores it in %DLQ%<group>, undelayed."""
    def send(reconsume: int, key: str) -> Any:
        fields = {"a": "pg", "b": "%RETRY%GD", "c": "TBW102", "d": 4, "e": 0, "f": 0, "g": int(time.time() * 1000), "h": 0,
                  "i": f"KEYS\x01{key}\x02DELAY\x01{3 + reconsume}\x02RETRY_TOPIC\x01TopicX", "j": reconsume, "k": False, "l": 2}
        return run(_call(broker, "admin", codes.SEND_MESSAGE_V2, fields, b"retried by the client"))

    assert send(1, "still-retried").code == codes.SUCCESS
    assert send(2, "dead").code == codes.SUCCESS
    fields = {"consumerGroup": "admin-reader", "topic": "%DLQ%GD", "queueId": 0, "queueOffset": 0, "maxMsgNums": 32, "sysFlag": 0,
              "commitOffset": 0, "suspendTimeoutMillis": 0, "subscription": "*", "subVersion": 0}
    pulled = run(_call(broker, "admin", codes.PULL_MESSAGE, fields))
    assert pulled.code == codes.SUCCESS, pulled.remark
    (dead,) = mqadmin.decodes(pulled.body)
    assert (dead.keys, dead.reconsume_times, dead.properties["DELAY"], dead.properties["RETRY_TOPIC"]) == (["dead"], 2, "0", "TopicX")
