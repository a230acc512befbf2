"""The broker's admin reads on the remoting door, in process: GET_TOPIC_CONFIG,
GET_ALL_SUBSCRIPTIONGROUP_CONFIG, GET_BROKER_CONFIG and VIEW_BROKER_STATS_DATA (the bodies
RocketMQ's tools decode), and the counters and windows behind the stats (broker_stats.py)."""
from __future__ import annotations

import asyncio
import inspect
import json
import threading
from pathlib import Path
from typing import Any, Awaitable, Callable

import pytest

from quarry.services.commitlog.broker.broker_settings import BrokerSettings, rocketmq_settings
from quarry.services.commitlog.broker.broker_stats import GROUP_GET_NUMS, TOPIC_PUT_NUMS, TOPIC_PUT_SIZE, BrokerStats, Snapshot
from quarry.services.commitlog.config import parse_args
from quarry.services.commitlog.broker.core import Broker
from quarry.services.commitlog.broker.flush_signal import FlushSignal
from quarry.services.commitlog.storage.message_input import NewMessage
from quarry.services.commitlog.doors.remoting import RemotingBroker
from quarry.services.commitlog.doors.quarry_v1 import CommitLogServicer
from quarry.services.commitlog.storage.store import CommitLogStore, StoreConfig
from quarry.services.remoting import codes
from quarry.services.remoting.command import RemotingCommand
from quarry.services.remoting.server import Connection, RemotingError

MIN, HOUR = 60_000, 3_600_000


def test_stats_windows_follow_rocketmqs_sampling() -> None:
    now = [1_000_000]
    stats = BrokerStats(clock_ms=lambda: now[0])
    assert stats.view(TOPIC_PUT_NUMS, "T") is None  # never counted: "not exist"
    stats.add(TOPIC_PUT_NUMS, "T", 4)  # one send of a batch of 4
    minute, hour, day = stats.view(TOPIC_PUT_NUMS, "T")  # type: ignore[misc]
    # Sampled at once, after a zero one period earlier: 4 in 10 s, 10 min, 1 h.
    assert minute == Snapshot(4, 0.4, 4.0) and hour.sum == 4 and day.sum == 4
    assert hour.tps == pytest.approx(4 / 600) and day.tps == pytest.approx(4 / 3600)
    stats.add(TOPIC_PUT_NUMS, "T", 2)
    assert stats.view(TOPIC_PUT_NUMS, "T")[0].sum == 4  # type: ignore[index]  # not sampled yet
    now[0] += 10_000
    stats.tick()
    assert stats.view(TOPIC_PUT_NUMS, "T")[0] == Snapshot(6, 6 * 1000 / 20_000, 3.0)  # type: ignore[index]  # 6 in 2 calls
    for _ in range(6):  # the minute keeps 7 samples: a minute idle and nothing is left in it
        now[0] += 10_000
        stats.tick()
    minute, hour, _ = stats.view(TOPIC_PUT_NUMS, "T")  # type: ignore[misc]
    assert minute == Snapshot(0, 0.0, 0.0)
    assert hour.sum == 4  # its next sample is 10 min after the first
    now[0] += 600_000 - 70_000
    stats.tick()
    assert stats.view(TOPIC_PUT_NUMS, "T")[1] == Snapshot(6, 6 * 1000 / 1_200_000, 3.0)  # type: ignore[index]


def test_put_counts_come_from_every_send_and_group_gets_from_pulls(tmp_path: Path) -> None:
    async def scenario(broker: RemotingBroker, servicer: CommitLogServicer, conn: Connection) -> None:
        await servicer.sending.append_flushed([NewMessage("StatsT", b"a", queue_id=0), NewMessage("StatsT", b"bb", queue_id=0)])
        await servicer.sending.append_flushed([NewMessage("StatsT", b"c", queue_id=0)])
        resp = await call(broker, conn, codes.VIEW_BROKER_STATS_DATA, statsName=TOPIC_PUT_NUMS, statsKey="StatsT")
        data = json.loads(resp.body)
        assert set(data) == {"statsMinute", "statsHour", "statsDay"}
        assert data["statsMinute"]["sum"] == 3 and data["statsMinute"]["avgpt"] == 1.5  # 3 messages, 2 sends
        assert json.loads((await call(broker, conn, codes.VIEW_BROKER_STATS_DATA, statsName=TOPIC_PUT_SIZE, statsKey="StatsT")).body)["statsDay"]["sum"] > 3
        with pytest.raises(RemotingError, match=r"The stats <GROUP_GET_NUMS> <StatsT@G1> not exist") as err:
            await call(broker, conn, codes.VIEW_BROKER_STATS_DATA, statsName=GROUP_GET_NUMS, statsKey="StatsT@G1")
        assert err.value.code == codes.SYSTEM_ERROR
        pulled = await call(broker, conn, codes.PULL_MESSAGE, consumerGroup="G1", topic="StatsT", queueId=0, queueOffset=0, maxMsgNums=2, sysFlag=0)
        assert pulled.code == codes.SUCCESS
        data = json.loads((await call(broker, conn, codes.VIEW_BROKER_STATS_DATA, statsName=GROUP_GET_NUMS, statsKey="StatsT@G1")).body)
        assert (data["statsMinute"]["sum"], data["statsMinute"]["avgpt"]) == (2, 2.0)

    run(tmp_path, scenario)


def test_topic_config_and_the_groups_known(tmp_path: Path) -> None:
    async def scenario(broker: RemotingBroker, servicer: CommitLogServicer, conn: Connection) -> None:
        config = json.loads((await call(broker, conn, codes.GET_TOPIC_CONFIG, topic="StatsT", lo="true")).body)
        assert config == {"attributes": {}, "order": False, "perm": 6, "readQueueNums": 2, "topicFilterType": "SINGLE_TAG",
                          "topicName": "StatsT", "topicSysFlag": 0, "writeQueueNums": 2}
        system = json.loads((await call(broker, conn, codes.GET_SYSTEM_TOPIC_LIST_FROM_BROKER)).body)["topicList"]
        assert {"TBW102", "SCHEDULE_TOPIC_XXXX", "RMQ_SYS_TRANS_HALF_TOPIC"} <= set(system) and "StatsT" not in system
        with pytest.raises(RemotingError, match="No topic in this broker. topic: Nope") as err:
            await call(broker, conn, codes.GET_TOPIC_CONFIG, topic="Nope")
        assert err.value.code == codes.TOPIC_NOT_EXIST
        every = json.loads((await call(broker, conn, codes.GET_ALL_TOPIC_CONFIG)).body)
        assert every["topicConfigTable"]["StatsT"] == config and set(every["dataVersion"]) == {"counter", "timestamp"}
        assert set(every["topicConfigTable"]) == set(broker.store.topics)
        empty = json.loads((await call(broker, conn, codes.GET_ALL_SUBSCRIPTIONGROUP_CONFIG)).body)
        assert empty["subscriptionGroupTable"] == {} and set(empty["dataVersion"]) == {"counter", "timestamp"}
        broker.offsets.commit("G_offsets", "StatsT", 0, 1)
        broker.clients.heartbeat({"clientID": "c1", "consumerDataSet": [{"groupName": "G_live", "subscriptionDataSet": [{"topic": "StatsT"}]}]}, conn)
        table = json.loads((await call(broker, conn, codes.GET_ALL_SUBSCRIPTIONGROUP_CONFIG)).body)["subscriptionGroupTable"]
        assert sorted(table) == ["G_live", "G_offsets"]
        assert table["G_live"] == {"brokerId": 0, "consumeBroadcastEnable": True, "consumeEnable": True, "consumeFromMinEnable": True,
                                   "groupName": "G_live", "notifyConsumerIdsChangedEnable": True, "retryMaxTimes": 16,
                                   "retryQueueNums": 1, "whichBrokerWhenConsumeSlowly": 1}

    run(tmp_path, scenario)


def test_broker_config_is_the_processes_settings_under_rocketmqs_names(tmp_path: Path) -> None:
    args = parse_args(["--bind", "127.0.0.7:10911", "--store-dir", str(tmp_path / "s"), "--broker-name", "broker-x", "--cluster-name", "C1",
                       "--flush-mode", "SYNC", "--file-reserved-hours", "1.5", "--cq-units-per-file", "1000"])
    values = rocketmq_settings(args, acl_enabled=False)
    assert (values["brokerName"], values["brokerClusterName"], values["listenPort"], values["brokerIP1"]) == ("broker-x", "C1", "10931", "127.0.0.7")
    assert (values["flushDiskType"], values["fileReservedTime"], values["mappedFileSizeConsumeQueue"]) == ("SYNC_FLUSH", "1.5", "20000")
    assert values["storePathCommitLog"] == str(tmp_path / "s" / "commitlog") and values["aclEnable"] == "false"

    async def scenario(broker: RemotingBroker, servicer: CommitLogServicer, conn: Connection) -> None:
        broker.settings = BrokerSettings({**values, "odd key": "a\\b\n c"}, since_ms=1234)
        resp = await call(broker, conn, codes.GET_BROKER_CONFIG)
        assert json.loads(resp.ext_fields["version"]) == {"counter": 0, "timestamp": 1234}
        lines = resp.body.decode().splitlines()
        assert "brokerName=broker-x" in lines and "flushDiskType=SYNC_FLUSH" in lines
        assert "odd\\ key=a\\\\b\\n c" in lines  # escaped as java.util.Properties.load reads it back

    run(tmp_path, scenario)


async def call(broker: RemotingBroker, conn: Connection, code: int, **fields: Any) -> RemotingCommand:
    req = RemotingCommand(code, 1, 0, None, {k: str(v) for k, v in fields.items()})
    resp = broker.handlers()[code](req, conn)
    if inspect.isawaitable(resp):
        resp = await resp
    assert resp is not None
    return resp


def run(tmp_path: Path, scenario: Callable[[RemotingBroker, CommitLogServicer, Connection], Awaitable[None]]) -> None:
    store = CommitLogStore(StoreConfig(store_dir=tmp_path / "store", segment_size=1 << 20, store_host=("127.0.0.5", 10931)))  # type: ignore[arg-type]
    store.create_topic("StatsT", 2)

    async def main() -> None:
        flushed = FlushSignal(asyncio.get_running_loop())
        store.add_flush_listener(flushed.fire)
        servicer = CommitLogServicer(Broker(store, "broker-a", threading.Event(), flushed))
        broker = RemotingBroker(servicer.broker)
        await scenario(broker, servicer, Connection(("127.0.0.1", 1), None))  # type: ignore[arg-type]

    try:
        asyncio.run(main())
    finally:
        store.close()
