"""The real mqadmin of Apache RocketMQ 4.9.8 (rocketmq-tools' MQAdminStartup) against a real
Quarry cluster (issue 35): `-n` is the router's remoting port. The topic is made with mqadmin's
own updateTopic, RocketMQ 4.9.8's DefaultMQProducer sends to it, then one JVM runs the message
commands (queryMsgByKey, queryMsgById with an offsetMsgId and with a msgId,
queryMsgByUniqueKey, queryMsgByOffset, printMsg, printMsgByQueue, queryMsgTraceById,
sendMessage, consumeMessage) and the everyday ones (clusterList, topicList, topicRoute,
brokerStatus, topicStatus, producerConnection, consumerProgress, consumerConnection,
resetOffsetByTime, updateSubGroup, deleteTopic); what each prints is checked against the
messages sent, or, for a request Quarry does not serve, that mqadmin says "not supported by
Quarry" and names it. consumerProgress and consumerConnection are run again beside a live
DefaultMQPushConsumer that consumed part of another topic (in its JVM: Consumer4's mqadmin step).

(tests/e2e/mqadmin.py is another thing: mqadmin's requests rebuilt in Python.)"""
from __future__ import annotations

import asyncio
import json
import re
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from quarry.clients.admin import AdminClient
from quarry.services.remoting import codes
from tests.remoting_client import RemotingClient
from scripts.launcher import LocalCluster
from tests.e2e import java
from tests.e2e.conftest import wait_until

TOPIC, GROUP = "MqadminTopic", "PG_quarry_mqadmin"
CONSUMER_GROUP = "CG_quarry_mqadmin"
NOT_SUPPORTED = "not supported by Quarry"
BROKERS = {"broker-a": "127.0.0.85", "broker-b": "127.0.0.86"}
N = 6


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = LocalCluster(root=tmp_path_factory.mktemp("mqadmin"),
                     indexer_args=["--hash-slots", "101", "--index-num", "4000", "--flush-interval-ms", "100"])
    with c.running(BROKERS):
        yield c


def ns(c: LocalCluster) -> str:
    assert c.router is not None
    return c.router.remoting_address


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("mqadmin-jvm")


@pytest.fixture(scope="module")
def created(cluster: LocalCluster, work: Path) -> dict[str, Any]:
    """mqadmin updateTopic -c DefaultCluster: the topic on every broker of the cluster."""
    (out,) = java.mqadmin([["updateTopic", "-n", ns(cluster), "-c", "DefaultCluster", "-t", TOPIC, "-r", "4", "-w", "4"]], work_dir=work)
    assert cluster.router is not None
    with AdminClient(cluster.router.address) as admin:
        wait_until(lambda: len(admin.topic_route(TOPIC).brokers) == len(BROKERS), what=f"{TOPIC} routed on every broker")
    return out


@pytest.fixture(scope="module")
def sent(cluster: LocalCluster, created: dict[str, Any], work: Path) -> list[dict[str, Any]]:
    """N messages from RocketMQ 4.9.8's DefaultMQProducer (sync), spread over both brokers."""
    plan = {"namesrv": ns(cluster), "group": GROUP, "sends": [{"mode": "sync", "messages": [
        {"topic": TOPIC, "tags": f"Tag{i % 2}", "keys": [f"admin-{i}", "admin-shared"], "props": {"n": str(i)}, "body": f"mqadmin body {i}"}
        for i in range(N)]}]}
    lines = java.run_driver("quarry.drivers.Producer4", plan, work_dir=work)
    results = [r for r in lines if "send" in r]
    assert [r for r in results if r.get("status") != "SEND_OK"] == []
    assert {r["brokerName"] for r in results} == set(BROKERS)
    cluster.wait_indexed()
    return results


def broker_addr(c: LocalCluster, name: str) -> str:
    return c.brokers[name].commitlog.remoting_address


def msgid_decodes_to_a_port(msg_id: str) -> bool:
    """mqadmin 4.9.8's queryMsgById reads any id as an offsetMsgId (ip, port, offset): a
    msgId's bytes 4-7 (pid, class loader hash) are a port only when the pid is a multiple of
    65536, and then it would dial this machine's own address, not loopback: don't run it."""
    return int(msg_id[8:16], 16) <= 65535


@pytest.fixture(scope="module")
def consumer_group(cluster: LocalCluster) -> str:
    """A consumer group a broker has met (a consumer's heartbeat: its retry topic made and routed),
    so mqadmin's consumer commands get past the route lookup they start with."""
    async def beat() -> None:
        async with RemotingClient(broker_addr(cluster, "broker-a")) as b:
            body = {"clientID": "mqadmin-test-consumer", "producerDataSet": [], "consumerDataSet": [
                {"groupName": CONSUMER_GROUP, "consumeType": "CONSUME_PASSIVELY", "messageModel": "CLUSTERING",
                 "consumeFromWhere": "CONSUME_FROM_FIRST_OFFSET", "unitMode": False,
                 "subscriptionDataSet": [{"topic": TOPIC, "subString": "*", "expressionType": "TAG", "tagsSet": [], "codeSet": []}]}]}
            r = await b.call(codes.HEART_BEAT, {}, json.dumps(body).encode())
            assert r.code == codes.SUCCESS, r.remark
    asyncio.run(asyncio.wait_for(beat(), 30))
    assert cluster.router is not None
    with AdminClient(cluster.router.address) as admin:
        wait_until(lambda: admin.topic_route(f"%RETRY%{CONSUMER_GROUP}").brokers, what="the consumer group's retry topic routed")
    return CONSUMER_GROUP


@pytest.fixture(scope="module")
def printed(cluster: LocalCluster, sent: list[dict[str, Any]], work: Path, consumer_group: str) -> Iterator[dict[str, dict[str, Any]]]:
    """Every command in one JVM; what each printed, by a label. The body files mqadmin wrote
    (/tmp/rocketmq/msgbodys/<msgId>) are removed afterwards."""
    n = ns(cluster)
    first, other = sent[0], next(r for r in sent if r["brokerName"] != sent[0]["brokerName"])
    commands = {
        "clusterList": ["clusterList", "-n", n],
        "topicList": ["topicList", "-n", n],
        "topicRoute": ["topicRoute", "-n", n, "-t", TOPIC],
        "brokerStatus": ["brokerStatus", "-n", n, "-b", broker_addr(cluster, "broker-a")],
        "byKey": ["queryMsgByKey", "-n", n, "-t", TOPIC, "-k", "admin-0"],
        "bySharedKey": ["queryMsgByKey", "-n", n, "-t", TOPIC, "-k", "admin-shared"],
        "byOffsetMsgIds": ["queryMsgById", "-n", n, "-i", f"{first['offsetMsgId']},{other['offsetMsgId']}"],
        "byUniqueKey": ["queryMsgByUniqueKey", "-n", n, "-t", TOPIC, "-i", other["msgId"]],
        "byOffset": ["queryMsgByOffset", "-n", n, "-t", TOPIC, "-b", other["brokerName"], "-i", str(other["queueId"]), "-o", str(other["queueOffset"])],
    }
    if not msgid_decodes_to_a_port(first["msgId"]):
        commands["byMsgId"] = ["queryMsgById", "-n", n, "-i", first["msgId"]]
    # The everyday operations; the ones that add or change something last.
    commands.update({
        "topicStatus": ["topicStatus", "-n", n, "-t", TOPIC],
        "producerConnection": ["producerConnection", "-n", n, "-g", GROUP, "-t", TOPIC],
        "consumerProgress": ["consumerProgress", "-n", n, "-g", consumer_group],
        "consumerConnection": ["consumerConnection", "-n", n, "-g", consumer_group],
        "printMsg": ["printMsg", "-n", n, "-t", TOPIC, "-d", "true"],
        "printMsgByQueue": ["printMsgByQueue", "-n", n, "-t", TOPIC, "-a", other["brokerName"], "-i", str(other["queueId"]), "-p", "true", "-d", "true"],
        "queryMsgTraceById": ["queryMsgTraceById", "-n", n, "-i", first["msgId"]],
        "resetOffsetByTime": ["resetOffsetByTime", "-n", n, "-g", consumer_group, "-t", TOPIC, "-s", "now"],
        "updateSubGroup": ["updateSubGroup", "-n", n, "-c", "DefaultCluster", "-g", consumer_group],
        "sendMessage": ["sendMessage", "-n", n, "-t", TOPIC, "-p", "sent by mqadmin", "-k", "admin-sent", "-c", "TagM"],
        "consumeMessage": ["consumeMessage", "-n", n, "-t", TOPIC, "-g", "CG_quarry_mqadmin_tool"],
        "deleteTopic": ["deleteTopic", "-n", n, "-c", "DefaultCluster", "-t", TOPIC],
    })
    answers = java.mqadmin(list(commands.values()), work_dir=work)
    assert len(answers) == len(commands)
    yield dict(zip(commands, answers))
    for r in sent:
        Path("/tmp/rocketmq/msgbodys", r["msgId"]).unlink(missing_ok=True)


def fields(block: str) -> dict[str, str]:
    """`Name:   value` lines of mqadmin's message printout."""
    return {m[1]: m[2].strip() for m in re.finditer(r"^([A-Z][A-Za-z ]+):\s+(.*)$", block, re.M)}


def java_map(text: str) -> dict[str, str]:
    """A java.util.Map's toString ({a=1, b=2}); values here hold no ', '."""
    return dict(kv.split("=", 1) for kv in text.strip("{}").split(", ") if kv)


def check_printed_message(c: LocalCluster, block: str, r: dict[str, Any], i: int) -> dict[str, str]:
    f = fields(block)
    props = java_map(f["Properties"])
    assert (f["Topic"], f["Tags"], f["Keys"]) == (TOPIC, f"[Tag{i % 2}]", f"[admin-{i} admin-shared]"), f
    assert (int(f["Queue ID"]), int(f["Queue Offset"])) == (r["queueId"], r["queueOffset"]), f
    assert f["Store Host"] == broker_addr(c, r["brokerName"]), f
    assert (props["UNIQ_KEY"], props["n"], props["KEYS"], props["TAGS"]) == (r["msgId"], str(i), f"admin-{i} admin-shared", f"Tag{i % 2}"), props
    # mqadmin writes the body it was given to a file it names (/tmp/rocketmq/msgbodys/<msgId>).
    assert Path(f["Message Body Path"]).read_bytes() == f"mqadmin body {i}".encode()
    return f


def no_stack_trace(answer: dict[str, Any]) -> None:
    assert "Exception" not in answer["err"] and "Exception" not in answer["out"], answer["err"][-3000:] or answer["out"][-3000:]


def test_no_command_hangs(printed: dict[str, dict[str, Any]]) -> None:
    assert [label for label, a in printed.items() if a["hung"]] == []


def test_update_topic_creates_the_topic_on_every_broker_of_the_cluster(cluster: LocalCluster, created: dict[str, Any]) -> None:
    no_stack_trace(created)
    for name in BROKERS:
        assert f"create topic to {broker_addr(cluster, name)} success." in created["out"], created["out"]
    assert f"topicName={TOPIC}, readQueueNums=4, writeQueueNums=4, perm=RW-" in created["out"], created["out"]


def test_cluster_list_lists_every_broker_with_its_remoting_address(cluster: LocalCluster, printed: dict[str, dict[str, Any]]) -> None:
    rows = [line.split() for line in printed["clusterList"]["out"].splitlines() if line.startswith("DefaultCluster")]
    assert sorted((r[1], r[2], r[3]) for r in rows) == sorted((name, "0", broker_addr(cluster, name)) for name in BROKERS), printed["clusterList"]["out"]


def test_cluster_list_prints_each_brokers_version_rates_and_disk_without_a_stack_trace(cluster: LocalCluster, printed: dict[str, dict[str, Any]]) -> None:
    """GET_BROKER_RUNTIME_INFO answered: the version, InTPS/OutTPS (Quarry keeps no send or
    pull thread pools: their queue figures print as null), the hours since the oldest message
    and the disk's used share."""
    no_stack_trace(printed["clusterList"])
    rows = [line.split() for line in printed["clusterList"]["out"].splitlines() if line.startswith("DefaultCluster")]
    assert len(rows) == len(BROKERS), printed["clusterList"]["out"]
    for row in rows:
        assert row[4] == "V4_9_8" and re.fullmatch(r"\d+\.\d\d\(null,nullms\)", row[5]) and re.fullmatch(r"\d+\.\d\d\(null,nullms\)", row[6]), row
        hours, space = float(row[-2]), float(row[-1])
        assert 0 <= hours < 1 and 0 < space <= 1, row


def test_broker_status_prints_the_broker_runtime_table(cluster: LocalCluster, sent: list[dict[str, Any]], printed: dict[str, dict[str, Any]]) -> None:
    no_stack_trace(printed["brokerStatus"])
    table = dict(re.findall(r"^(\w+)\s*:\s*(.*)$", printed["brokerStatus"]["out"], re.M))
    assert (table["brokerVersionDesc"], table["brokerVersion"]) == ("V4_9_8", "409"), table
    on_a = sum(1 for r in sent if r["brokerName"] == "broker-a")
    # Every message appended since start (the mqadmin topic's, and the halves, retries... of none here).
    assert int(table["msgPutTotalTodayNow"]) == on_a and table["msgPutTotalTodayMorning"] == "0", table
    assert int(table["msgGetTotalTodayNow"]) >= 0 and int(table["commitLogMaxOffset"]) > int(table["commitLogMinOffset"]) == 0, table
    for key in ("putTps", "getTransferedTps"):
        assert len([float(x) for x in table[key].split(" ")]) == 3, table[key]
    assert 0 < float(table["commitLogDiskRatio"]) <= 1 and table["commitLogDirCapacity"].startswith("Total : "), table
    assert int(table["earliestMessageTimeStamp"]) > 0 and "sendThreadPoolQueueSize" not in table, table


def test_topic_list_and_topic_route(cluster: LocalCluster, printed: dict[str, dict[str, Any]]) -> None:
    no_stack_trace(printed["topicList"])
    assert TOPIC in printed["topicList"]["out"].split(), printed["topicList"]["out"]
    no_stack_trace(printed["topicRoute"])
    # fastjson's pretty print of TopicRouteData (broker ids as bare numbers: {0:"host:port"})
    route = json.loads(re.sub(r"([{,]\s*)(\d+):", r'\1"\2":', printed["topicRoute"]["out"]))
    assert sorted((b["brokerName"], b["cluster"], b["brokerAddrs"]) for b in route["brokerDatas"]) == \
        sorted((name, "DefaultCluster", {"0": broker_addr(cluster, name)}) for name in BROKERS)
    assert sorted((q["brokerName"], q["readQueueNums"], q["writeQueueNums"], q["perm"]) for q in route["queueDatas"]) == \
        sorted((name, 4, 4, 6) for name in BROKERS)


def key_rows(out: str) -> list[tuple[str, int, int]]:
    """queryMsgByKey's table: #Message ID (the msgId: UNIQ_KEY), #QID, #Offset."""
    return sorted((row[0], int(row[1]), int(row[2])) for row in (line.split() for line in out.splitlines()[1:]) if len(row) == 3)


def test_query_msg_by_key(sent: list[dict[str, Any]], printed: dict[str, dict[str, Any]]) -> None:
    for label in ("byKey", "bySharedKey"):
        no_stack_trace(printed[label])
        assert printed[label]["out"].splitlines()[0].split() == ["#Message", "ID", "#QID", "#Offset"], printed[label]["out"]
    assert key_rows(printed["byKey"]["out"]) == [(sent[0]["msgId"], sent[0]["queueId"], sent[0]["queueOffset"])]
    assert key_rows(printed["bySharedKey"]["out"]) == sorted((r["msgId"], r["queueId"], r["queueOffset"]) for r in sent)


def test_query_msg_by_id_with_offset_msg_ids(cluster: LocalCluster, sent: list[dict[str, Any]], printed: dict[str, dict[str, Any]]) -> None:
    """Each offsetMsgId goes straight to the broker it names (VIEW_MESSAGE_BY_ID); the
    message printed with its properties and body, then its track (no consumer yet)."""
    a = printed["byOffsetMsgIds"]
    no_stack_trace(a)
    blocks = a["out"].split("OffsetID:")[1:]
    first, other = sent[0], next(r for r in sent if r["brokerName"] != sent[0]["brokerName"])
    assert [b.split()[0] for b in blocks] == [first["offsetMsgId"], other["offsetMsgId"]]
    for block, r in zip(blocks, (first, other)):
        check_printed_message(cluster, block, r, sent.index(r))
        assert "WARN: No Consumer" in block


def test_query_msg_by_id_with_a_msg_id_is_refused_by_mqadmin_itself(sent: list[dict[str, Any]], printed: dict[str, dict[str, Any]]) -> None:
    """mqadmin 4.9.8's queryMsgById takes every id for an offsetMsgId; a producer's msgId does
    not decode to a broker address, so it gives up before sending anything, as it does against
    a RocketMQ broker (queryMsgByUniqueKey is the command for msgIds)."""
    if "byMsgId" not in printed:
        pytest.fail(f"the msgId {sent[0]['msgId']} would decode to a real port; rerun")  # once in 65536 runs
    a = printed["byMsgId"]
    assert "CODE: 208  DESC: query message by id finished, but no message." in a["err"], a["err"][-2000:]
    assert "OffsetID:" not in a["out"]


def test_query_msg_by_unique_key(cluster: LocalCluster, sent: list[dict[str, Any]], printed: dict[str, dict[str, Any]]) -> None:
    a = printed["byUniqueKey"]
    no_stack_trace(a)
    other = next(r for r in sent if r["brokerName"] != sent[0]["brokerName"])
    check_printed_message(cluster, a["out"], other, sent.index(other))
    assert a["out"].count("Topic:") == 1 and "WARN: No Consumer" in a["out"]


def test_query_msg_by_offset(cluster: LocalCluster, sent: list[dict[str, Any]], printed: dict[str, dict[str, Any]]) -> None:
    """queryMsgByOffset pulls the message at the queue offset from the broker (PULL_MESSAGE)."""
    a = printed["byOffset"]
    no_stack_trace(a)
    other = next(r for r in sent if r["brokerName"] != sent[0]["brokerName"])
    f = check_printed_message(cluster, a["out"], other, sent.index(other))
    assert f["OffsetID"] == other["offsetMsgId"]
    props = java_map(f["Properties"])
    assert int(props["MIN_OFFSET"]) == 0 and int(props["MAX_OFFSET"]) > other["queueOffset"], props


def test_topic_consumed_by_names_the_groups_holding_offsets(cluster: LocalCluster) -> None:
    """QUERY_TOPIC_CONSUME_BY_WHO (mqadmin's message track): the groups with offsets for the
    topic, as RocketMQ's broker answers it (another topic, so the printouts above stay as they are)."""
    async def main() -> tuple[Any, Any]:
        async with RemotingClient(broker_addr(cluster, "broker-a")) as b:
            r = await b.call(codes.UPDATE_CONSUMER_OFFSET, {"consumerGroup": "GID_tracked", "topic": "TrackedTopic", "queueId": 0, "commitOffset": 0})
            assert r.code == codes.SUCCESS, r.remark
            tracked = await b.call(codes.QUERY_TOPIC_CONSUME_BY_WHO, {"topic": "TrackedTopic"})
            untracked = await b.call(codes.QUERY_TOPIC_CONSUME_BY_WHO, {"topic": "NobodysTopic"})
            return tracked, untracked
    tracked, untracked = asyncio.run(asyncio.wait_for(main(), 30))
    assert tracked.code == codes.SUCCESS and json.loads(tracked.body) == {"groupList": ["GID_tracked"]}
    assert untracked.code == codes.SUCCESS and json.loads(untracked.body) == {"groupList": []}


def not_supported(answer: dict[str, Any], code: int, name: str) -> None:
    """mqadmin's own failure for a broker's REQUEST_CODE_NOT_SUPPORTED: the request named, no
    other exception (a malformed answer would show as one)."""
    text = answer["out"] + answer["err"]
    assert f"CODE: 3  DESC: request type {code} ({name}) {NOT_SUPPORTED}" in text, text[-3000:]
    causes = set(re.findall(r"(?:Caused by: |^)([\w.]+(?:Exception|Error))", answer["err"], re.M))
    assert causes <= {"org.apache.rocketmq.tools.command.SubCommandException", "org.apache.rocketmq.client.exception.MQBrokerException",
                      "org.apache.rocketmq.client.exception.MQClientException"}, causes


def test_topic_status_prints_each_queues_offsets(cluster: LocalCluster, sent: list[dict[str, Any]], printed: dict[str, dict[str, Any]]) -> None:
    a = printed["topicStatus"]
    no_stack_trace(a)
    rows = [line.split() for line in a["out"].splitlines()[1:] if line.strip()]
    # #Broker Name  #QID  #Min Offset  #Max Offset  #Last Updated
    got = {(r[0], int(r[1])): (int(r[2]), int(r[3])) for r in rows}
    want: dict[tuple[str, int], tuple[int, int]] = {(b, q): (0, 0) for b in BROKERS for q in range(4)}
    for r in sent:
        lo, hi = want[(r["brokerName"], r["queueId"])]
        want[(r["brokerName"], r["queueId"])] = (lo, max(hi, r["queueOffset"] + 1))
    assert got == want, a["out"]


def test_producer_connection_answers_as_rocketmq_when_no_producer_is_online(printed: dict[str, dict[str, Any]]) -> None:
    """GET_PRODUCER_CONNECTION_LIST is served; the driver's producer has gone, so the broker
    answers what RocketMQ's does for a group with no live producer."""
    a = printed["producerConnection"]
    assert f"the producer group[{GROUP}] not exist" in a["err"] and NOT_SUPPORTED not in a["err"], a["err"][-2000:]


def test_consumer_progress_and_connection_answer_as_rocketmq_for_a_group_without_offsets_or_live_consumers(
        printed: dict[str, dict[str, Any]]) -> None:
    """The group's only consumer (the fixture's heartbeat) has gone and it committed nothing: the
    broker's answers are RocketMQ's (an empty offset table; CONSUMER_NOT_ONLINE), and mqadmin says
    what it says against a RocketMQ broker."""
    progress, connection = printed["consumerProgress"], printed["consumerConnection"]
    assert "CODE: 206  DESC: Not found the consumer group consume stats, because return offset table is empty" in progress["err"], progress["err"][-2000:]
    assert f"CODE: 206  DESC: the consumer group[{CONSUMER_GROUP}] not online" in connection["err"], connection["err"][-2000:]
    assert NOT_SUPPORTED not in progress["err"] + connection["err"]


PROGRESS_TOPIC, PROGRESS_GROUP = "MqadminProgressTopic", "CG_quarry_progress"


def progress_rows(out: str) -> dict[tuple[str, str, int], tuple[int, int, int, str]]:
    """consumerProgress' table: (topic, broker, queue) -> (broker offset, consumer offset, diff, last time)."""
    rows = {}
    for line in out.splitlines():
        m = re.match(r"^(\S+)\s+(\S+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(-?\d+)\s+(N/A|\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)\s*$", line)
        if m:
            rows[(m[1], m[2], int(m[3]))] = (int(m[4]), int(m[5]), int(m[6]), m[7])
    return rows


def test_consumer_progress_and_connection_beside_a_live_java_consumer(cluster: LocalCluster, work: Path) -> None:
    """A DefaultMQPushConsumer consumes a topic of both brokers but one message, whose listener is
    still running (held): its queue's committed offset stays at that message. consumerProgress
    prints every queue's broker and consumer offsets, the diff (that message and the three after
    it in its queue), the store time of the last message consumed and the group's rate;
    consumerConnection the live consumer (its client id, JAVA, V4_9_8), its subscriptions, consume
    type, model and where it starts. The listener released and the offsets committed, the diff is 0."""
    async def create() -> None:
        for name in BROKERS:
            async with RemotingClient(broker_addr(cluster, name)) as b:
                r = await b.call(codes.UPDATE_AND_CREATE_TOPIC, {"topic": PROGRESS_TOPIC, "readQueueNums": 4, "writeQueueNums": 4, "perm": 6})
                assert r.code == codes.SUCCESS, r.remark
    asyncio.run(asyncio.wait_for(create(), 30))
    assert cluster.router is not None
    with AdminClient(cluster.router.address) as admin:
        wait_until(lambda: len(admin.topic_route(PROGRESS_TOPIC).brokers) == len(BROKERS), what=f"{PROGRESS_TOPIC} routed on every broker")
    n = ns(cluster)
    free = [f"prog-{i}" for i in range(8)]
    pinned = ["prog-held", "prog-after-0", "prog-after-1", "prog-after-2"]  # one queue, in this order
    msgs = [{"topic": PROGRESS_TOPIC, "tags": "TagP", "keys": [k], "body": f"body of {k}"} for k in free]
    msgs += [{"topic": PROGRESS_TOPIC, "tags": "TagP", "keys": [k], "body": f"body of {k}", "orderKey": "held"} for k in pinned]
    admin_cmds = [["consumerProgress", "-n", n, "-g", PROGRESS_GROUP], ["consumerConnection", "-n", n, "-g", PROGRESS_GROUP]]
    steps = [
        {"op": "send", "group": "PG_quarry_progress", "messages": msgs},
        {"op": "push", "name": "c1", "group": PROGRESS_GROUP, "subscriptions": {PROGRESS_TOPIC: "*"}, "hold": ["prog-held"]},
        {"op": "await", "consumers": ["c1"], "keys": free + pinned[1:]},
        {"op": "awaitDeliveries", "consumer": "c1", "key": "prog-held", "count": 1},
        {"op": "awaitRoute", "topic": f"%RETRY%{PROGRESS_GROUP}", "brokers": len(BROKERS)},
        {"op": "commitSync", "consumer": "c1", "topic": PROGRESS_TOPIC},
        {"op": "mqadmin", "commands": admin_cmds},
        {"op": "release"},
        {"op": "await", "consumers": ["c1"], "keys": ["prog-held"]},
        {"op": "committed", "consumer": "c1", "topic": PROGRESS_TOPIC},
        {"op": "commitSync", "consumer": "c1", "topic": PROGRESS_TOPIC},
        {"op": "mqadmin", "commands": admin_cmds[:1]},
    ]
    lines = java.run_driver("quarry.drivers.Consumer4", {"namesrv": n, "steps": steps}, work_dir=work / "progress", timeout_s=180)
    bad = [x for x in lines if ("awaited" in x or "routed" in x or "committed" in x) and not x["ok"]]
    assert bad == [], bad
    sent = {x["sent"]: x for x in lines if "sent" in x}
    consumed = {x["key"]: x for x in lines if x.get("consumed") == "c1" and x["result"] == "OK"}
    (started,) = [x for x in lines if "started" in x]
    progress, connection, progress_after = [x for x in lines if "mqadmin" in x]
    for a in (progress, connection, progress_after):
        no_stack_trace(a)
        assert not a["hung"], a

    held = sent["prog-held"]
    held_q = (held["brokerName"], held["queueId"])
    assert all((sent[k]["brokerName"], sent[k]["queueId"]) == held_q for k in pinned)
    ends: dict[tuple[str, int], int] = {(b, q): 0 for b in BROKERS for q in range(4)}
    by_offset = {}
    for x in sent.values():
        q = (x["brokerName"], x["queueId"])
        ends[q] = max(ends[q], x["queueOffset"] + 1)
        by_offset[(*q, x["queueOffset"])] = x["sent"]

    def last_time(b: str, q: int, consumer_offset: int) -> str:
        if consumer_offset == 0:
            return "N/A"
        ts = consumed[by_offset[(b, q, consumer_offset - 1)]]["storeTimestamp"]
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts / 1000))

    rows = progress_rows(progress["out"])
    mine = {k: v for k, v in rows.items() if k[0] == PROGRESS_TOPIC}
    want = {}
    for (b, q), end in ends.items():
        at = held["queueOffset"] if (b, q) == held_q else end
        want[(PROGRESS_TOPIC, b, q)] = (end, at, end - at, last_time(b, q, at))
    assert mine == want, progress["out"]
    assert all(k[0] == f"%RETRY%{PROGRESS_GROUP}" and v[2] == 0 for k, v in rows.items() if k[0] != PROGRESS_TOPIC), progress["out"]
    assert want[(PROGRESS_TOPIC, *held_q)][2] == len(pinned)
    assert re.search(r"^Diff Total: 4$", progress["out"], re.M), progress["out"]
    # Every message was pulled within the minute: 12 of them, 12 / 60 per second.
    assert re.search(r"^Consume TPS: 0\.20$", progress["out"], re.M), progress["out"]

    out = connection["out"]
    head, _, subs_part = out.partition("Below is subscription:")
    clients = [line.split() for line in head.splitlines()[1:] if line.strip()]  # #ClientId #ClientAddr #Language #Version
    assert len(clients) == 1 and clients[0][0] == started["clientId"] and clients[0][2:] == ["JAVA", "V4_9_8"], out
    assert re.fullmatch(r"127\.0\.0\.\d+:\d+", clients[0][1]), out  # the consumer's end of its connection
    subs = sorted(tuple(line.split()) for line in subs_part.splitlines()[2:] if line.strip() and ":" not in line)  # #Topic #SubExpression
    assert subs == sorted([(PROGRESS_TOPIC, "*"), (f"%RETRY%{PROGRESS_GROUP}", "*")]), out
    assert "ConsumeType: CONSUME_PASSIVELY" in out and "MessageModel: CLUSTERING" in out and "ConsumeFromWhere: CONSUME_FROM_FIRST_OFFSET" in out, out

    after = {k: v for k, v in progress_rows(progress_after["out"]).items() if k[0] == PROGRESS_TOPIC}
    assert {k: v[:3] for k, v in after.items()} == {(PROGRESS_TOPIC, b, q): (end, end, 0) for (b, q), end in ends.items()}, progress_after["out"]
    assert re.search(r"^Diff Total: 0$", progress_after["out"], re.M), progress_after["out"]


def test_reset_offset_by_time_update_sub_group_and_delete_topic_are_not_supported(printed: dict[str, dict[str, Any]]) -> None:
    not_supported(printed["resetOffsetByTime"], 222, "INVOKE_BROKER_TO_RESET_OFFSET")
    not_supported(printed["updateSubGroup"], 200, "UPDATE_AND_CREATE_SUBSCRIPTIONGROUP")
    not_supported(printed["deleteTopic"], 215, "DELETE_TOPIC_IN_BROKER")


def test_print_msg_and_print_msg_by_queue_print_the_messages_sent(sent: list[dict[str, Any]], printed: dict[str, dict[str, Any]]) -> None:
    for label in ("printMsg", "printMsgByQueue"):
        no_stack_trace(printed[label])
    ids = re.findall(r"^MSGID: (\w+) .* BODY: (.*)$", printed["printMsg"]["out"], re.M)
    assert sorted(ids) == sorted((r["msgId"], f"mqadmin body {i}") for i, r in enumerate(sent)), printed["printMsg"]["out"][-3000:]
    other = next(r for r in sent if r["brokerName"] != sent[0]["brokerName"])
    in_queue = [r["msgId"] for r in sent if (r["brokerName"], r["queueId"]) == (other["brokerName"], other["queueId"])]
    assert re.findall(r"^MSGID: (\w+) ", printed["printMsgByQueue"]["out"], re.M) == in_queue, printed["printMsgByQueue"]["out"][-3000:]


def test_query_msg_trace_by_id_says_there_is_no_trace_topic_as_rocketmq_does(printed: dict[str, dict[str, Any]]) -> None:
    """No client here traces, so there is no RMQ_SYS_TRACE_TOPIC: mqadmin says so, as against a
    RocketMQ broker without it."""
    assert "The topic[RMQ_SYS_TRACE_TOPIC] not matched route info" in printed["queryMsgTraceById"]["err"], printed["queryMsgTraceById"]["err"][-2000:]


def test_send_message_then_consume_message_gets_every_message(sent: list[dict[str, Any]], printed: dict[str, dict[str, Any]]) -> None:
    no_stack_trace(printed["sendMessage"])
    (row,) = [line.split() for line in printed["sendMessage"]["out"].splitlines()[1:] if line.strip()]
    assert row[0] in BROKERS and row[2] == "SEND_OK", row
    no_stack_trace(printed["consumeMessage"])
    consumed = re.findall(r"^MSGID: (\w+) .* BODY: (.*)$", printed["consumeMessage"]["out"], re.M)
    assert sorted(consumed) == sorted([(r["msgId"], f"mqadmin body {i}") for i, r in enumerate(sent)] + [(row[3], "sent by mqadmin")]), \
        printed["consumeMessage"]["out"][-3000:]
