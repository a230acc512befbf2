"""The broker's admin reads that rocketmq-dashboard needs (issue 36, part 4), asked by RocketMQ's
own tools against a real Quarry cluster: mqadmin 4.9.8's getBrokerConfig (GET_BROKER_CONFIG),
getConsumerConfig (GET_ALL_SUBSCRIPTIONGROUP_CONFIG) and statsAll (VIEW_BROKER_STATS_DATA), and
mqadmin 5.3.3's topicStatus, whose examineTopicStats asks GET_TOPIC_CONFIG first (rocketmq-tools
5.3.3 is the dashboard's admin library). The messages come from RocketMQ 4.9.8's producer in one
batch; a group pulls them and commits its offset over the remoting protocol."""
from __future__ import annotations

import asyncio
import json
import re
import subprocess
from pathlib import Path
from typing import Any, Iterator

import pytest

from quarry.services.remoting import codes
from tests.remoting_client import RemotingClient
from scripts.launcher import LocalCluster
from tests.e2e import java, rocketmq_broker

TOPIC, GROUP, PRODUCER_GROUP = "AdminReadsTopic", "CG_admin_reads", "PG_admin_reads"
BROKERS = {"broker-a": "127.0.0.171"}
N = 5


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = LocalCluster(root=tmp_path_factory.mktemp("admin-reads"))
    with c.running(BROKERS):
        yield c


def ns(c: LocalCluster) -> str:
    assert c.router is not None
    return c.router.remoting_address


def broker_addr(c: LocalCluster) -> str:
    return c.brokers["broker-a"].commitlog.remoting_address


@pytest.fixture(scope="module")
def consumed(cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """N messages in one batch from DefaultMQProducer, then GROUP pulls them all and commits."""
    plan = {"namesrv": ns(cluster), "group": PRODUCER_GROUP, "sends": [{"mode": "batch", "messages": [
        {"topic": TOPIC, "tags": "T", "keys": [f"admin-read-{i}"], "body": f"body {i}"} for i in range(N)]}]}
    lines = java.run_driver("quarry.drivers.Producer4", plan, work_dir=tmp_path_factory.mktemp("admin-reads-producer"))
    sent = [line for line in lines if "send" in line]
    assert sent and all(line.get("status") == "SEND_OK" for line in sent), sent
    queue_id = int(sent[0]["queueId"])

    async def pull() -> int:
        async with RemotingClient(broker_addr(cluster)) as broker:
            resp = await broker.call(codes.PULL_MESSAGE, {"consumerGroup": GROUP, "topic": TOPIC, "queueId": queue_id, "queueOffset": 0,
                                                          "maxMsgNums": 32, "sysFlag": 0, "commitOffset": 0, "suspendTimeoutMillis": 0,
                                                          "subscription": "*", "subVersion": 0})
            assert resp.code == codes.SUCCESS, (resp.code, resp.remark)
            next_offset = int(resp.ext_fields["nextBeginOffset"])
            done = await broker.call(codes.UPDATE_CONSUMER_OFFSET, {"consumerGroup": GROUP, "topic": TOPIC, "queueId": queue_id,
                                                                    "commitOffset": next_offset})
            assert done.code == codes.SUCCESS
            return next_offset

    assert asyncio.run(pull()) == N
    return {"queueId": queue_id}


def mqadmin5(args: list[str], work: Path) -> subprocess.CompletedProcess[str]:
    """mqadmin of rocketmq-tools 5.3.3 (MQAdminStartup), one command in its own JVM."""
    home = java.rocketmq_home(work / "rocketmq-home")
    cmd = [java.java_binary(), *java.JVM_FLAGS, f"-Drocketmq.home.dir={home}", f"-Duser.home={work}", f"-Drocketmq.client.logRoot={work / 'logs'}",
           "-cp", rocketmq_broker.classpath("5.3.3"), "org.apache.rocketmq.tools.command.MQAdminStartup", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=work, env={"PATH": "/usr/bin:/bin", "ROCKETMQ_HOME": str(home)})


def test_topic_status_of_rocketmq_tools_5_asks_the_topic_config_and_prints_every_queue(cluster: LocalCluster, consumed: dict[str, Any],
                                                                                       tmp_path: Path) -> None:
    run = mqadmin5(["topicStatus", "-n", ns(cluster), "-t", TOPIC], tmp_path)
    assert run.returncode == 0 and "CODE:" not in run.stdout + run.stderr, run.stdout[-2000:] + run.stderr[-3000:]
    rows = [line.split() for line in run.stdout.splitlines() if line.startswith("broker-a")]
    assert len(rows) == 4, run.stdout  # the auto-created topic's 4 queues
    by_queue = {int(r[1]): (int(r[2]), int(r[3])) for r in rows}  # queue: (min offset, max offset)
    assert by_queue[consumed["queueId"]] == (0, N)


def test_get_broker_config_prints_the_brokers_own_settings_under_rocketmqs_names(cluster: LocalCluster, consumed: dict[str, Any],
                                                                                 tmp_path: Path) -> None:
    (out,) = java.mqadmin([["getBrokerConfig", "-n", ns(cluster), "-b", broker_addr(cluster)]], work_dir=tmp_path)
    assert "CODE:" not in out["out"] + out["err"], out
    printed = dict(re.findall(r"^(\w+)\s*=\s*(.*?)\s*$", out["out"], re.M))
    store_dir = Path(printed["storePathRootDir"])
    assert (printed["brokerName"], printed["brokerClusterName"], printed["brokerId"]) == ("broker-a", "DefaultCluster", "0")
    assert printed["listenPort"] == broker_addr(cluster).rsplit(":", 1)[1] and printed["brokerIP1"] == BROKERS["broker-a"]
    assert printed["flushDiskType"] in ("ASYNC_FLUSH", "SYNC_FLUSH") and printed["storePathCommitLog"] == str(store_dir / "commitlog")
    assert (store_dir / "commitlog").is_dir()  # the broker's real store


def test_get_consumer_config_finds_the_group_with_rocketmqs_default_settings(cluster: LocalCluster, consumed: dict[str, Any],
                                                                             tmp_path: Path) -> None:
    (out,) = java.mqadmin([["getConsumerConfig", "-n", ns(cluster), "-g", GROUP]], work_dir=tmp_path)
    assert "CODE:" not in out["out"] + out["err"], out
    printed = dict(re.findall(r"^\s*(\w+)\s*=\s*(\S+)\s*$", out["out"], re.M))
    assert printed.get("groupName") == GROUP, out["out"]
    assert (printed["retryQueueNums"], printed["retryMaxTimes"], printed["consumeEnable"]) == ("1", "16", "true")


def test_stats_all_prints_the_topics_puts_and_the_groups_gets_from_the_brokers_counters(cluster: LocalCluster, consumed: dict[str, Any],
                                                                                       tmp_path: Path) -> None:
    def row() -> list[str] | None:
        (out,) = java.mqadmin([["statsAll", "-n", ns(cluster), "-t", TOPIC]], work_dir=tmp_path)
        found = [line.split() for line in out["out"].splitlines() if line.startswith(TOPIC)]
        return found[0] if found else None

    # Topic, group, accumulation, in TPS, out TPS, in 24 h, out 24 h.
    printed = row()  # (one batch and one pull: each window's first sample holds all N)
    assert printed is not None
    assert printed[1] == GROUP and printed[2] == "0", printed  # consumed and committed: nothing accumulated
    assert (int(printed[5]), int(printed[6])) == (N, N), printed
    assert float(printed[3]) > 0 and float(printed[4]) > 0, printed  # the last minute's rates


def test_stats_of_a_key_never_counted_are_refused_as_rocketmq_refuses_them(cluster: LocalCluster, consumed: dict[str, Any]) -> None:
    async def ask() -> tuple[int, str | None, Any]:
        async with RemotingClient(broker_addr(cluster)) as broker:
            missing = await broker.call(codes.VIEW_BROKER_STATS_DATA, {"statsName": "TOPIC_PUT_NUMS", "statsKey": "NeverSentTopic"})
            found = await broker.call(codes.VIEW_BROKER_STATS_DATA, {"statsName": "GROUP_GET_NUMS", "statsKey": f"{TOPIC}@{GROUP}"})
            stats = await broker.call(codes.GET_TOPIC_STATS_INFO, {"topic": TOPIC})
        return missing.code, missing.remark, (json.loads(found.body), stats.body.decode())

    code, remark, (found, stats) = asyncio.run(ask())
    assert (code, remark) == (codes.SYSTEM_ERROR, "The stats <TOPIC_PUT_NUMS> <NeverSentTopic> not exist")
    assert found["statsDay"]["sum"] == N and found["statsMinute"]["avgpt"] == N  # one pull handed all N
    # RocketMQ 5's topicPutTps (the last minute's): topicStatus leaves it out, examineTopicStatsConcurrent sums it.
    (tps,) = re.findall(r'"topicPutTps":([0-9.eE+-]+)', stats)
    assert float(tps) > 0
