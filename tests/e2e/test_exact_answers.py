"""Exact answers and honest failures through the router (issue 15, items 1-3, 5, 6), on real
processes: windows to the millisecond, full pages under hash collisions, unique keys of any
age, a dead broker reported with its own error after one attempt, a silent broker kept
reported missing until removed.
"""
from __future__ import annotations

import json
import shutil
import subprocess
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterator

import grpc
import pytest

from quarry.formats import segment_walk
from quarry.formats.record import SYSFLAG_TRANSACTION_MASK, SYSFLAG_TRANSACTION_ROLLBACK
from quarry.formats.topic import is_valid_topic
from quarry.formats.unique_key import V5_EPOCH_UTC_MS, UniqueKeyGenerator
from scripts.launcher import LocalCluster
from quarry.v1 import commitlog_pb2, common_pb2, router_pb2, router_pb2_grpc
from tests.conftest import golden_root
from tests.e2e.conftest import Launch, run_quarry, wait_until
from tests.e2e.stubs import ClusterStubs

TOPIC = "ExactTopic"
HOSTS = {"broker-a": "127.0.0.21", "broker-b": "127.0.0.22"}


class Env(ClusterStubs):
    def __init__(self, cluster: LocalCluster) -> None:
        super().__init__(cluster)
        self.ids = UniqueKeyGenerator(ip="10.1.2.4", pid=77, class_loader_hash=0x5678, tz=timezone.utc)

    def send(self, broker: str, body: bytes, keys: list[str] = (), unique_key: str = "") -> common_pb2.SendResult:  # type: ignore[assignment]
        msg = common_pb2.MessageInput(topic=TOPIC, body=body, keys=list(keys), unique_key=unique_key or self.ids.next_id(), queue_id=-1)
        return self.commitlog(broker).SendMessage(commitlog_pb2.SendMessageRequest(message=msg), timeout=5).result

    def send_batch(self, broker: str, keys: list[str]) -> list[common_pb2.SendResult]:
        msgs = [common_pb2.MessageInput(topic=TOPIC, body=f"{k}-{i}".encode(), keys=[k], queue_id=0) for i, k in enumerate(keys)]
        return list(self.commitlog(broker).SendBatch(commitlog_pb2.SendBatchRequest(messages=msgs), timeout=10).results)

    def stored(self, offset_msg_id: str) -> common_pb2.StoredMessage:
        return self.router.QueryMsgById(router_pb2.QueryMsgByIdRequest(offset_msg_id=offset_msg_id), timeout=5).result.messages[0]

    def by_key(self, key: str, **kw: object) -> router_pb2.QueryResult:
        return self.router.QueryMsgByKey(router_pb2.QueryMsgByKeyRequest(topic=TOPIC, key=key, **kw), timeout=10).result

    def by_uniq(self, uid: str, **kw: object) -> router_pb2.QueryResult:
        return self.router.QueryMsgByUniqueKey(router_pb2.QueryMsgByUniqueKeyRequest(topic=TOPIC, unique_key=uid, **kw), timeout=10).result

    def quarry(self, *args: str) -> subprocess.CompletedProcess[str]:
        assert self.cluster.router is not None
        return run_quarry(self.cluster.router.address, *args)


def _env(cluster_factory, bodies: str, missed_heartbeats: int) -> Env:  # type: ignore[no-untyped-def]
    # Tiny hash tables and files: keys share slots and the index spans several files.
    cluster = cluster_factory(commitlog_args=["--segment-size", str(1 << 20)], indexer_args=["--hash-slots", "7", "--index-num", "120", "--flush-interval-ms", "50"])
    cluster.heartbeat_ms = 100
    # bodies: who reads the records of a key query: the router's --read-bodies-from, and with
    # "indexer-files" the indexers read them from their commitlog's files (--commitlog-store-dir).
    cluster.indexer_reads_store = bodies == "indexer-files"
    cluster.start_router("--query-timeout-ms", "3000", "--broker-call-timeout-ms", "2000", "--read-bodies-from", bodies.split("-")[0],
                         "--missed-heartbeats", str(missed_heartbeats))
    for name, host in HOSTS.items():
        cluster.add_broker(name, host)
    return Env(cluster)


@pytest.fixture
def env(request: pytest.FixtureRequest, cluster_factory) -> Iterator[Env]:  # type: ignore[no-untyped-def]
    # A broker goes missing after 30 s of silence: a loaded machine never makes a live one
    # missing mid-test, and a killed one is still asked (and its error reported) meanwhile.
    e = _env(cluster_factory, getattr(request, "param", "indexer"), missed_heartbeats=300)
    yield e
    e.close()


@pytest.fixture
def quiet_env(cluster_factory) -> Iterator[Env]:  # type: ignore[no-untyped-def]
    """Brokers missing after 2 s of silence (20 heartbeats of 100 ms)."""
    e = _env(cluster_factory, "indexer", missed_heartbeats=20)
    yield e
    e.close()


BODIES = pytest.mark.parametrize("env", ["indexer", "indexer-files", "commitlog"], indirect=True)


@BODIES
def test_time_window_is_exact_to_the_millisecond(env: Env) -> None:
    # Records whose store times differ by less than a second (retry until they differ at all).
    sent: list[common_pb2.StoredMessage] = []
    for i in range(200):
        m = env.stored(env.send("broker-a", f"w{i}".encode(), keys=["win"]).offset_msg_id)
        if not sent or m.store_timestamp > sent[-1].store_timestamp:
            sent.append(m)
        if len(sent) == 3:
            break
    assert len(sent) == 3
    env.cluster.wait_indexed()
    first, mid, last = (m.store_timestamp for m in sent)
    exact = env.by_key("win", begin_timestamp=first, end_timestamp=last)
    assert {m.commit_log_offset for m in sent} <= {m.commit_log_offset for m in exact.messages}
    assert all(first <= m.store_timestamp <= last for m in exact.messages)
    only_mid = env.by_key("win", begin_timestamp=mid, end_timestamp=mid)
    assert only_mid.messages and all(m.store_timestamp == mid for m in only_mid.messages)
    after_last = env.by_key("win", begin_timestamp=last + 1, end_timestamp=last + 999)
    assert all(last + 1 <= m.store_timestamp <= last + 999 for m in after_last.messages)
    assert sent[-1].commit_log_offset not in {m.commit_log_offset for m in after_last.messages}
    # The same rule for unique keys: a window that ends 1 ms before the store time misses it.
    uid = sent[1].unique_key
    with pytest.raises(grpc.RpcError) as err:
        env.by_uniq(uid, begin_timestamp=mid - 999, end_timestamp=mid - 1)
    assert err.value.code() == grpc.StatusCode.NOT_FOUND


@BODIES
def test_pages_are_full_under_hash_collisions_and_max_num_above_64(env: Env) -> None:
    # "AaAa" and "BBBB" have equal Java hashes, so every entry of one is a collision of the other.
    env.send_batch("broker-a", ["AaAa", "BBBB"] * 100)
    env.cluster.wait_indexed()
    first = env.by_key("AaAa", max_num=64)
    assert len(first.messages) == 64 and first.collisions_filtered >= 60 and first.next_continuation_token
    second = env.by_key("AaAa", max_num=64, continuation_token=first.next_continuation_token)
    assert len(second.messages) == 36 and not second.next_continuation_token
    bodies = {m.body for m in first.messages} | {m.body for m in second.messages}
    assert len(bodies) == 100 and all(b.startswith(b"AaAa-") for b in bodies)
    whole = env.by_key("BBBB", max_num=150)
    assert len(whole.messages) == 100 and all("BBBB" in m.keys for m in whole.messages)
    # The CLI reads on past the router's page: -m 150 prints all 100 rows, --maxNum works too.
    table = env.quarry("queryMsgByKey", "--topic", TOPIC, "--msgKey", "AaAa", "--maxNum", "150")
    assert table.returncode == 0, table.stderr
    assert len(table.stdout.splitlines()) == 1 + 100


def _v5_uid(made_ms: int, counter: int = 1) -> str:
    """A 5.x client id (34 hex: 01, 8 bytes of host and pid, seconds since 2021, counter)."""
    return f"01AABBCCDDEEFF1234{(made_ms - V5_EPOCH_UTC_MS) // 1000:08X}{counter:08X}"


def test_unique_key_of_any_age_is_found_and_not_found_says_what_was_searched(env: Env) -> None:
    now = int(datetime.now(timezone.utc).timestamp() * 1000)
    uid = _v5_uid(now - 3 * 86_400_000)  # made 3 days ago, stored now: outside the id's own window (±15 h)
    sent = env.send("broker-b", b"old id", unique_key=uid)
    env.cluster.wait_indexed()
    found = env.by_uniq(uid)
    assert [m.offset_msg_id for m in found.messages] == [sent.offset_msg_id]
    assert any("whole retained index" in n for n in found.notes)
    # An explicit window is searched alone; NOT_FOUND names it.
    with pytest.raises(grpc.RpcError) as err:
        env.by_uniq(uid, begin_timestamp=now - 10 * 86_400_000, end_timestamp=now - 86_400_000)
    assert err.value.code() == grpc.StatusCode.NOT_FOUND and "searched store times" in err.value.details()
    # Through the CLI: -b/-e set the window; ISO with Z is accepted.
    cli = env.quarry("queryMsgByUniqueKey", "-t", TOPIC, "-i", uid, "-b", "2000-01-01T00:00:00Z")
    assert cli.returncode == 0 and sent.offset_msg_id in cli.stdout, cli.stderr
    missing = env.quarry("queryMsgByUniqueKey", "-t", TOPIC, "-i", _v5_uid(now - 86_400_000, 2))
    assert missing.returncode == 1 and "searched store times" in missing.stderr and " then " in missing.stderr


def test_every_unique_key_of_a_2023_store_is_found_through_the_router(tmp_path: Path, launch: Launch) -> None:
    scenario = golden_root() / "messages" / "basic_ipv4"
    store = tmp_path / "store"
    shutil.copytree(scenario / "commitlog", store / "commitlog")
    # Every record the broker's IndexService indexes (all but transaction rollbacks) of a
    # topic the router accepts by name.
    records = [r for r in segment_walk.walk_segments(store / "commitlog")
               if r.properties.get("UNIQ_KEY") and r.sys_flag & SYSFLAG_TRANSACTION_MASK != SYSFLAG_TRANSACTION_ROLLBACK and is_valid_topic(r.topic)]
    assert len(records) >= 20
    assert all(r.store_timestamp < 1_735_689_600_000 for r in records)  # stored before 2025
    cl = launch("commitlog", "--store-dir", str(store), "--segment-size", "4096", "--read-only", "true", host="127.0.0.23")
    ix = launch("indexer", "--index-dir", str(tmp_path / "index"), "--commitlog", cl.address, "--broker-name", "old", host="127.0.0.23")
    router = launch("router", "--static-brokers", f"old={cl.address},{ix.address},127.0.0.1:10911")
    with grpc.insecure_channel(router.address) as ch, grpc.insecure_channel(ix.address) as ich:
        from quarry.v1 import indexer_pb2, indexer_pb2_grpc

        end = records[-1].physical_offset
        wait_until(lambda: indexer_pb2_grpc.IndexerServiceStub(ich).GetIndexStatus(indexer_pb2.GetIndexStatusRequest(), timeout=5).index_last_update_phy_offset >= end, what="old store indexed")
        stub = router_pb2_grpc.QueryRouterServiceStub(ch)
        found = 0
        for r in records:
            result = stub.QueryMsgByUniqueKey(router_pb2.QueryMsgByUniqueKeyRequest(topic=r.topic, unique_key=r.properties["UNIQ_KEY"]), timeout=10).result
            assert [m.commit_log_offset for m in result.messages] == [r.physical_offset], r.properties["UNIQ_KEY"]
            found += 1
    assert found == len(records)


@BODIES
def test_a_dead_commitlog_costs_one_attempt_and_its_error_is_passed_through(env: Env) -> None:
    for b in HOSTS:
        env.send(b, b"d", keys=["dead"])
    env.cluster.wait_indexed()
    env.cluster.brokers["broker-b"].commitlog.kill()  # its indexer still answers, with an error
    if env.cluster.indexer_reads_store:
        # Its records are still on disk: the indexer reads them there without the commitlog...
        whole = env.by_key("dead", timeout_ms=3000)
        assert whole.complete and sorted(m.broker_name for m in whole.messages) == ["broker-a", "broker-b"]
        segments = env.cluster.brokers["broker-b"].store_dir / "commitlog"
        segments.rename(segments.with_name("commitlog.gone"))  # ...until they are not: the commitlog is asked
    result = env.by_key("dead", timeout_ms=3000)
    [failed] = [o for o in result.brokers if not o.answered]
    assert failed.broker_name == "broker-b" and failed.error_code == "UNAVAILABLE"
    assert "commitlog of broker-b did not answer" in failed.error_message and failed.attempts == 1
    assert [m.broker_name for m in result.messages] == ["broker-a"] and not result.complete
    env.cluster.brokers["broker-b"].indexer.kill()  # now nothing listens: connection refused
    result = env.by_key("dead", timeout_ms=3000)
    [failed] = [o for o in result.brokers if not o.answered]
    assert failed.error_code == "UNAVAILABLE" and failed.attempts == 1 and "connect" in failed.error_message.lower()
    cli = env.quarry("queryMsgByKey", "-t", TOPIC, "-k", "dead")
    assert cli.returncode == 4 and "broker-b" in cli.stderr


def test_a_broker_that_stopped_heartbeating_stays_missing_until_removed(quiet_env: Env) -> None:
    env = quiet_env
    sent = env.send("broker-b", b"m", keys=["quiet"])
    env.send("broker-a", b"m", keys=["quiet"])
    env.cluster.wait_indexed()
    b = env.cluster.brokers["broker-b"]
    b.commitlog.kill()  # SIGKILL: no clean unregister
    b.indexer.kill()

    def missing() -> router_pb2.BrokerInfo | None:
        brokers = env.router.ListBrokers(router_pb2.ListBrokersRequest(), timeout=5).brokers
        return next((x for x in brokers if x.broker_name == "broker-b" and x.missing), None)

    info = wait_until(missing, what="broker-b reported missing")
    assert info.last_heartbeat_ms > 0  # type: ignore[union-attr]
    result = env.by_key("quiet")
    assert not result.complete
    [failed] = [o for o in result.brokers if not o.answered]
    assert failed.broker_name == "broker-b" and "missing" in failed.error_message and "heartbeat" in failed.error_message
    with pytest.raises(grpc.RpcError) as err:
        env.router.QueryMsgById(router_pb2.QueryMsgByIdRequest(offset_msg_id=sent.offset_msg_id), timeout=5)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE and "missing" in err.value.details()
    route = env.router.GetTopicRoute(router_pb2.GetTopicRouteRequest(topic=TOPIC), timeout=5)
    assert [x.broker_name for x in route.brokers] == ["broker-a"]  # producers are not sent there

    listed = env.quarry("clusterList")
    assert listed.returncode == 4 and "MISSING" in listed.stdout and "broker-b" in listed.stdout
    as_json = json.loads(env.quarry("clusterList", "--json").stdout)
    assert [x["brokerName"] for x in as_json["brokers"] if x["missing"]] == ["broker-b"]

    removed = env.quarry("unregisterBroker", "-b", "broker-b")
    assert removed.returncode == 0, removed.stderr
    after = env.by_key("quiet")
    assert after.complete and [o.broker_name for o in after.brokers] == ["broker-a"]
