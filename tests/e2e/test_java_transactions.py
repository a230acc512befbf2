"""Apache RocketMQ 4.9.8's TransactionMQProducer against a real Quarry cluster (issue 35): local
transactions answered COMMIT, ROLLBACK and UNKNOW, the UNKNOW ones answered later through
Quarry's broker-side check (CHECK_TRANSACTION_STATE to the producer, services/commitlog/
transaction_check.py), one of them only at its second check, and one never (discarded to
TRANS_CHECK_MAX_TIME_TOPIC after the last check). One JVM
(tests/java/src/main/java/quarry/drivers/TxProducer4.java); then Quarry's CLI finds each
committed message by id, key and unique key, a consumer's pulls get it once, and nothing rolled
back or discarded is found under the topic or pulled."""
from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path
from typing import Any, Iterator

import pytest

from quarry.formats import offset_msg_id
from quarry.services.remoting import codes
from tests.remoting_client import RemotingClient
from scripts.launcher import LocalCluster
from tests.e2e import java, mqadmin
from tests.e2e.conftest import wait_until
from tests.e2e.test_java_producer import messages, quarry  # (the CLI as the producer test reads it)

TOPIC, GROUP = "JavaTxTopic", "PG_quarry_java_tx"
BROKERS = {"broker-a": "127.0.0.87", "broker-b": "127.0.0.88"}
MAX_CHECKS = 2
CHECK_ARGS = ["--transaction-timeout-ms", "1000", "--transaction-check-interval-ms", "300", "--transaction-check-max", str(MAX_CHECKS)]
PLAN = [
    {"name": "commit-0", "local": "COMMIT_MESSAGE", "checks": []},
    {"name": "rollback-0", "local": "ROLLBACK_MESSAGE", "checks": []},
    {"name": "unknown-commit", "local": "UNKNOW", "checks": ["COMMIT_MESSAGE"]},
    {"name": "unknown-twice-commit", "local": "UNKNOW", "checks": ["UNKNOW", "COMMIT_MESSAGE"]},
    {"name": "unknown-rollback", "local": "UNKNOW", "checks": ["ROLLBACK_MESSAGE"]},
    {"name": "unknown-forever", "local": "UNKNOW", "checks": ["UNKNOW"] * MAX_CHECKS},
]
COMMITTED = ["commit-0", "unknown-commit", "unknown-twice-commit"]
NOT_COMMITTED = ["rollback-0", "unknown-rollback", "unknown-forever"]
DISCARD_TOPIC = "TRANS_CHECK_MAX_TIME_TOPIC"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = LocalCluster(root=tmp_path_factory.mktemp("java-tx"), commitlog_args=CHECK_ARGS,
                     indexer_args=["--hash-slots", "101", "--index-num", "4000", "--flush-interval-ms", "100"])
    with c.running(BROKERS):
        yield c


@pytest.fixture(scope="module")
def run(cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The driver's sends and the checks it received; the discard done and everything indexed."""
    assert cluster.router is not None
    plan = {"namesrv": cluster.router.remoting_address, "group": GROUP, "topic": TOPIC, "timeoutMs": 20000, "checkDeadlineMs": 60000,
            "messages": PLAN}
    lines = java.run_driver("quarry.drivers.TxProducer4", plan, work_dir=tmp_path_factory.mktemp("java-tx-jvm"))
    assert lines and lines[-1].get("done") is True, lines[-3:]
    assert lines[-1]["missing"] == [], f"checks never received for {lines[-1]['missing']}"
    sends = {r["name"]: r for r in lines if "send" in r}
    checks = [r for r in lines if "check" in r]
    wait_until(lambda: found_by_key(cluster, "unknown-forever", DISCARD_TOPIC), timeout_s=30, what="the unanswered half discarded")
    cluster.wait_indexed()
    return {"sends": sends, "checks": checks}




def found_by_key(c: LocalCluster, key: str, topic: str = TOPIC) -> list[dict[str, Any]]:
    return messages(quarry(c, "queryMsgByKey", "-t", topic, "-k", key))


def test_every_transaction_is_sent_as_a_half_and_its_local_state_reported(run: dict[str, Any]) -> None:
    sends = run["sends"]
    assert sorted(sends) == sorted(p["name"] for p in PLAN)
    for p in PLAN:
        r = sends[p["name"]]
        assert (r.get("status"), r.get("localState")) == ("SEND_OK", p["local"]), r
        assert r["brokerName"] in BROKERS and r["offsetMsgId"] is None  # 4.9.8's TransactionSendResult copies no offsetMsgId


def test_only_unknown_transactions_are_checked_as_often_as_planned_with_the_half_as_sent(cluster: LocalCluster, run: dict[str, Any]) -> None:
    """CHECK_TRANSACTION_STATE names the half (commitLogOffset; transactionId: the msgId the
    send returned) and carries the message under its real topic and queue; the MessageExt the
    client decodes has the half's offsetMsgId as its msgId."""
    sends = run["sends"]
    by_name = Counter(c["name"] for c in run["checks"])
    assert by_name == Counter({p["name"]: len(p["checks"]) for p in PLAN if p["checks"]}), run["checks"]
    for c in run["checks"]:
        s = sends[c["name"]]
        assert (c["transactionId"], c["topic"], c["queueId"]) == (s["msgId"], TOPIC, s["queueId"]), c
        assert c["body"] == f"tx body of {c['name']}" and c["keys"] == f"{c['name']} tx-shared", c
        half_id = offset_msg_id.decode(c["msgId"])
        assert half_id.offset == c["commitLogOffset"] and f"{half_id.ip}:{half_id.port}" == cluster.brokers[s["brokerName"]].commitlog.remoting_address, c
        (half,) = messages(quarry(cluster, "queryMsgById", "-i", c["msgId"]))
        assert (half["topic"], half["uniqueKey"]) == ("RMQ_SYS_TRANS_HALF_TOPIC", s["msgId"]), half
    assert [c["answer"] for c in run["checks"] if c["name"] == "unknown-twice-commit"] == ["UNKNOW", "COMMIT_MESSAGE"]


def test_committed_messages_are_found_by_key_unique_key_and_id(cluster: LocalCluster, run: dict[str, Any]) -> None:
    for name in COMMITTED:
        s = run["sends"][name]
        (m,) = found_by_key(cluster, name)
        assert (m["topic"], m["uniqueKey"], m["keys"], m["tags"]) == (TOPIC, s["msgId"], [name, "tx-shared"], "TagTx"), m
        (by_uniq,) = messages(quarry(cluster, "queryMsgByUniqueKey", "-t", TOPIC, "-i", s["msgId"]))
        assert by_uniq["offsetMsgId"] == m["offsetMsgId"]  # the committed record, not the half
        (by_id,) = messages(quarry(cluster, "queryMsgById", "-i", m["offsetMsgId"]))
        props = {p["name"]: p.get("value", "") for p in by_id.get("properties", [])}
        assert by_id["uniqueKey"] == s["msgId"] and props.get("TRAN_MSG") == "true" and props.get("name") == name, by_id


def test_rolled_back_and_discarded_messages_are_not_found_under_the_topic(cluster: LocalCluster, run: dict[str, Any]) -> None:
    for name in NOT_COMMITTED:
        assert found_by_key(cluster, name) == [], name
        assert messages(quarry(cluster, "queryMsgByUniqueKey", "-t", TOPIC, "-i", run["sends"][name]["msgId"])) == [], name
    shared = found_by_key(cluster, "tx-shared")
    assert sorted(m["uniqueKey"] for m in shared) == sorted(run["sends"][n]["msgId"] for n in COMMITTED)


def test_the_half_checked_too_often_is_discarded_to_trans_check_max_time_topic(cluster: LocalCluster, run: dict[str, Any]) -> None:
    s = run["sends"]["unknown-forever"]
    (copy,) = found_by_key(cluster, "unknown-forever", DISCARD_TOPIC)
    props = {p["name"]: p.get("value", "") for p in copy.get("properties", [])}
    assert (copy["uniqueKey"], props.get("REAL_TOPIC"), props.get("PGROUP")) == (s["msgId"], TOPIC, GROUP), copy
    log = cluster.brokers[s["brokerName"]].commitlog.log_path.read_text()
    assert "discarded to TRANS_CHECK_MAX_TIME_TOPIC" in log and s["msgId"] in log


def test_a_consumer_pulls_each_committed_message_once_and_nothing_else(cluster: LocalCluster, run: dict[str, Any]) -> None:
    async def pull_all() -> list[Any]:
        got = []
        for b in cluster.brokers.values():
            async with RemotingClient(b.commitlog.remoting_address) as client:
                for queue in range(16):
                    offset = 0
                    while True:
                        r = await client.call(codes.PULL_MESSAGE, {"consumerGroup": "CG_java_tx", "topic": TOPIC, "queueId": queue, "queueOffset": offset,
                                                                   "maxMsgNums": 32, "sysFlag": 0, "commitOffset": 0, "suspendTimeoutMillis": 0,
                                                                   "subscription": "*", "subVersion": 0})
                        if r.code != codes.SUCCESS:
                            break
                        got += mqadmin.decodes(r.body)
                        offset = int(r.ext_fields["nextBeginOffset"])
                    if r.code in (codes.SYSTEM_ERROR, codes.TOPIC_NOT_EXIST):
                        break  # past the topic's queues on this broker
        return got

    pulled = asyncio.run(asyncio.wait_for(pull_all(), 60))
    uniq = Counter(rec.unique_key for rec in pulled)
    assert uniq == Counter({run["sends"][n]["msgId"]: 1 for n in COMMITTED}), uniq
    assert all(rec.sys_flag & 0xC == 0x8 for rec in pulled)  # commit records only


def test_the_check_settings_are_rocketmqs_defaults(tmp_path: Path) -> None:
    from quarry.services.commitlog.config import parse_args

    args = parse_args(["--store-dir", str(tmp_path)])
    assert (args.transaction_timeout_ms, args.transaction_check_interval_ms, args.transaction_check_max) == (6000, 60000, 15)
