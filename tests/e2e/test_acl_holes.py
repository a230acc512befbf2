"""Issue 33, holes 1, 2 and 4, through the RocketMQ 4 remoting door they were found on: a broker
(commitlog + indexer) with QUARRY_ACL_FILE and the issue's four accounts (admin; pub, publish on
TopicA; reader, query on every topic; qx, query on TopicX)."""
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
from tests.collisions import colliding_key
from tests.e2e import mqadmin
from tests.e2e.conftest import wait_until

HOST = "127.0.0.93"
ACCOUNTS = [
    {"access_key": "admin", "secret_key": "admin-secret-1", "admin": True},
    {"access_key": "pub", "secret_key": "pub-secret-22", "topics": {"TopicA": ["publish"]}},
    {"access_key": "reader", "secret_key": "reader-secret-333", "topics": {"*": ["query"]}},
    {"access_key": "qx", "secret_key": "qx-secret-4444", "topics": {"TopicX": ["query"]}},
]
SECRETS = {a["access_key"]: a["secret_key"] for a in ACCOUNTS}


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with acl_broker(tmp_path_factory.mktemp("acl-holes"), HOST, ACCOUNTS) as address:
        yield address


def run(coro: Any) -> Any:
    return asyncio.run(coro)


async def _call(addr: str, who: str, code: int, fields: dict[str, Any], body: bytes = b"") -> Any:
    async with RemotingClient(addr, access_key=who, secret_key=SECRETS[who]) as b:
        return await b.call(code, fields, body)


def _send(addr: str, who: str, topic: str, body: bytes, properties: str, sys_flag: int = 0) -> Any:
    fields = {"a": "pg", "b": topic, "c": "TBW102", "d": 4, "e": 0, "f": sys_flag, "g": int(time.time() * 1000), "h": 0,
              "i": properties, "j": 0, "k": False}
    return run(_call(addr, who, codes.SEND_MESSAGE_V2, fields, body))


def _query(addr: str, who: str, topic: str, key: str) -> Any:
    fields = {"topic": topic, "key": key, "maxNum": 64, "beginTimestamp": 0, "endTimestamp": 2**62}
    return run(_call(addr, who, codes.QUERY_MESSAGE, fields))


def _pull(addr: str, topic: str) -> list[Any]:
    fields = {"consumerGroup": "cg", "topic": topic, "queueId": 0, "queueOffset": 0, "maxMsgNums": 32, "sysFlag": 0,
              "commitOffset": 0, "suspendTimeoutMillis": 0, "subscription": "*", "subVersion": 0}
    got = run(_call(addr, "admin", codes.PULL_MESSAGE, fields))
    return mqadmin.decodes(got.body) if got.code == codes.SUCCESS else []


def test_a_transaction_is_ended_only_with_publish_on_its_topic_and_only_once(broker: str) -> None:
    half = _send(broker, "admin", "TopicSecret", b"secret order", "TRAN_MSG\x01true\x02PGROUP\x01pg\x02KEYS\x01tx-1", sys_flag=0x4)
    assert half.code == codes.SUCCESS, half.remark
    end = {"producerGroup": "pg", "tranStateTableOffset": half.ext_fields["queueOffset"],
           "commitLogOffset": offset_msg_id.decode(half.ext_fields["msgId"]).offset, "commitOrRollback": 8, "fromTransactionCheck": False,
           "msgId": half.ext_fields["msgId"]}
    for who in ("qx", "pub", "reader"):
        refused = run(_call(broker, who, codes.END_TRANSACTION, end))
        assert refused.code == codes.NO_PERMISSION and "publish" in refused.remark and "TopicSecret" in refused.remark, refused.remark
    assert _pull(broker, "TopicSecret") == []
    assert run(_call(broker, "admin", codes.END_TRANSACTION, end)).code == codes.SUCCESS
    for _ in range(3):  # the same frame again: refused, nothing stored
        again = run(_call(broker, "admin", codes.END_TRANSACTION, end))
        assert again.code == codes.SYSTEM_ERROR and "already committed or rolled back" in again.remark
    rollback = run(_call(broker, "admin", codes.END_TRANSACTION, {**end, "commitOrRollback": 12}))
    assert rollback.code == codes.SYSTEM_ERROR
    assert [m.body for m in _pull(broker, "TopicSecret")] == [b"secret order"]  # consumed once


def test_a_key_query_never_returns_another_topics_records(broker: str) -> None:
    # A key of TopicX whose index name hashes as TopicSecret's key, and a delayed message parked
    # for TopicSecret (indexed under SCHEDULE_TOPIC_XXXX, which every key query also reads).
    colliding = colliding_key("TopicX", "TopicSecret#secretkey")
    assert _send(broker, "admin", "TopicSecret", b"the secret", "KEYS\x01secretkey").code == codes.SUCCESS
    assert _send(broker, "admin", "TopicSecret", b"parked secret", "KEYS\x01parkedkey\x02DELAY\x0118").code == codes.SUCCESS
    wait_until(lambda: len(mqadmin.decodes(_query(broker, "reader", "TopicSecret", "secretkey").body)) == 1, what="indexed")
    wait_until(lambda: mqadmin.decodes(_query(broker, "reader", "TopicSecret", "parkedkey").body), what="the parked one indexed")
    for key in (colliding, "parkedkey"):
        answer = _query(broker, "qx", "TopicX", key)
        assert answer.code in (codes.SUCCESS, codes.QUERY_NOT_FOUND) and mqadmin.decodes(answer.body) == [], key
    assert _query(broker, "qx", "TopicSecret", "secretkey").code == codes.NO_PERMISSION


def _heartbeat(client: str, group: str, topics: list[str]) -> bytes:
    subs = [{"topic": t, "subString": "*", "tagsSet": [], "codeSet": [], "subVersion": 0, "expressionType": "TAG"} for t in topics]
    return json.dumps({"clientID": client, "producerDataSet": [], "consumerDataSet": [
        {"groupName": group, "consumeType": "CONSUME_PASSIVELY", "messageModel": "CLUSTERING",
         "consumeFromWhere": "CONSUME_FROM_LAST_OFFSET", "subscriptionDataSet": subs, "unitMode": False}]}).encode()


def test_only_an_account_that_may_consume_joins_or_leaves_a_group(broker: str) -> None:
    async def main() -> None:
        # The real consumer stays connected (a client leaves with its connection).
        async with RemotingClient(broker, access_key="reader", secret_key=SECRETS["reader"]) as real:
            assert (await real.call(codes.HEART_BEAT, {}, _heartbeat("real@1", "GA", ["TopicA", "%RETRY%GA"]))).code == codes.SUCCESS
            for who, topics in (("pub", ["TopicA"]), ("pub", []), ("qx", ["TopicA"])):
                fake = await _call(broker, who, codes.HEART_BEAT, {}, _heartbeat(f"fake-{who}@1", "GA", topics))
                assert fake.code == codes.NO_PERMISSION and "query" in fake.remark, fake.remark
            leave = await _call(broker, "pub", codes.UNREGISTER_CLIENT, {"clientID": "real@1", "consumerGroup": "GA"})
            assert leave.code == codes.NO_PERMISSION and "TopicA" in leave.remark
            listed = await _call(broker, "admin", codes.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "GA"})
            assert json.loads(listed.body)["consumerIdList"] == ["real@1"]  # nobody else was handed queues, nobody was removed
            async with RemotingClient(broker, access_key="qx", secret_key=SECRETS["qx"]) as qx:
                assert (await qx.call(codes.HEART_BEAT, {}, _heartbeat("qx-consumer@1", "GX", ["TopicX"]))).code == codes.SUCCESS

    run(main())


def test_a_groups_progress_and_connections_are_shown_only_with_query_on_its_topics(broker: str) -> None:
    """GET_CONSUME_STATS (mqadmin consumerProgress) and GET_CONSUMER_CONNECTION_LIST
    (consumerConnection) show a group's topics, offsets and clients: query on those topics and
    the group's permission, as consuming takes."""
    assert _send(broker, "pub", "TopicA", b"counted", "KEYS\x01stats-1").code == codes.SUCCESS

    async def main() -> None:
        async with RemotingClient(broker, access_key="reader", secret_key=SECRETS["reader"]) as real:
            assert (await real.call(codes.HEART_BEAT, {}, _heartbeat("stats@1", "GS", ["TopicA"]))).code == codes.SUCCESS
            commit = {"consumerGroup": "GS", "topic": "TopicA", "queueId": 0, "commitOffset": 1}
            assert (await real.call(codes.UPDATE_CONSUMER_OFFSET, commit)).code == codes.SUCCESS
            for who, fields in (("qx", {"consumerGroup": "GS"}), ("pub", {"consumerGroup": "GS", "topic": "TopicA"})):
                refused = await _call(broker, who, codes.GET_CONSUME_STATS, fields)
                assert refused.code == codes.NO_PERMISSION and f"{who} lacks query permission on TopicA" in refused.remark, refused.remark
            refused = await _call(broker, "qx", codes.GET_CONSUMER_CONNECTION_LIST, {"consumerGroup": "GS"})
            assert refused.code == codes.NO_PERMISSION and "TopicA" in refused.remark, refused.remark
            stats = await _call(broker, "reader", codes.GET_CONSUME_STATS, {"consumerGroup": "GS"})
            assert stats.code == codes.SUCCESS and '"topic":"TopicA"}:{"brokerOffset":' in stats.body.decode(), stats.body
            listed = await _call(broker, "reader", codes.GET_CONSUMER_CONNECTION_LIST, {"consumerGroup": "GS"})
            assert listed.code == codes.SUCCESS and [c["clientId"] for c in json.loads(listed.body)["connectionSet"]] == ["stats@1"]

    run(main())
