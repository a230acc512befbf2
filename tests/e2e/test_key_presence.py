"""Key presence on real processes: three brokers (127.0.0.2/3/4) and a router that watches
their indexers' filters. A key query asks only the broker that holds the key, a message an
indexer has indexed is found through the router however fast the query follows the send
(the batch's keys leave for the router in the step that writes it, and a copy behind what
the router has seen is not trusted), and a stopped router delays no indexing.
"""
from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Iterator

import grpc
import pytest

from quarry.channels import open_channel
from quarry.v1 import commitlog_pb2, commitlog_pb2_grpc, common_pb2, indexer_pb2, indexer_pb2_grpc, router_pb2, router_pb2_grpc
from tests.e2e.conftest import wait_until
from tests.e2e.stubs import ClusterStubs

TOPIC = "PresenceTopic"
HOSTS = {"broker-a": "127.0.0.2", "broker-b": "127.0.0.3", "broker-c": "127.0.0.4"}


class Env(ClusterStubs):
    def send(self, broker: str, keys: list[str], unique_key: str = "") -> common_pb2.SendResult:
        msg = common_pb2.MessageInput(topic=TOPIC, body=b"presence", keys=keys, unique_key=unique_key, queue_id=-1)
        return self.commitlog(broker).SendMessage(commitlog_pb2.SendMessageRequest(message=msg), timeout=5).result

    def by_key(self, key: str) -> router_pb2.QueryResult:
        return self.router.QueryMsgByKey(router_pb2.QueryMsgByKeyRequest(topic=TOPIC, key=key), timeout=10).result

    def indexed_to(self, broker: str) -> int:
        with grpc.insecure_channel(self.cluster.brokers[broker].indexer.address) as ch:
            status = indexer_pb2_grpc.IndexerServiceStub(ch).GetIndexStatus(indexer_pb2.GetIndexStatusRequest(), timeout=5)
        return status.index_last_update_phy_offset


def _cluster(cluster_factory, *router_args: str, indexer_args: tuple[str, ...] = ()) -> Env:  # type: ignore[no-untyped-def]
    cluster = cluster_factory(indexer_args=["--flush-interval-ms", "100", *indexer_args])
    # Time limits a loaded machine does not reach: the tests judge complete answers.
    cluster.start_router("--broker-call-timeout-ms", "5000", "--query-timeout-ms", "10000", *router_args)
    for name, host in HOSTS.items():
        cluster.add_broker(name, host)
    e = Env(cluster)
    for name in HOSTS:  # the topic on every broker: each is one a key query could ask
        e.send(name, [f"seed-{name}"])
    wait_until(lambda: len(e.router.GetTopicRoute(router_pb2.GetTopicRouteRequest(topic=TOPIC), timeout=2).brokers) == 3, what="route on 3 brokers")
    return e


@pytest.fixture
def env(cluster_factory) -> Iterator[Env]:  # type: ignore[no-untyped-def]
    e = _cluster(cluster_factory)
    yield e
    e.close()


def _ruled_out(result: router_pb2.QueryResult) -> set[str]:
    return {o.broker_name for o in result.brokers if o.ruled_out_by_key_filter}


def test_a_key_query_asks_only_the_broker_holding_the_key(env: Env) -> None:
    sent = env.send("broker-b", ["order-77"], unique_key="presence-uniq-77")
    # The router watches an indexer from the first query that names it; broker-b's indexer
    # finds the message once it has indexed it.
    result = wait_until(lambda: (r := env.by_key("order-77")) and r.messages and _ruled_out(r) == {"broker-a", "broker-c"} and r,
                        what="the message found, the other brokers ruled out")
    assert [m.offset_msg_id for m in result.messages] == [sent.offset_msg_id]  # type: ignore[union-attr]
    assert result.complete  # type: ignore[union-attr]
    outcomes = {o.broker_name: o for o in result.brokers}  # type: ignore[union-attr]
    assert outcomes["broker-b"].attempts == 1 and not outcomes["broker-b"].ruled_out_by_key_filter
    assert all(outcomes[b].answered and outcomes[b].attempts == 0 for b in ("broker-a", "broker-c"))
    # The same holds for unique keys, which are indexed under the same filter. A copy may fall
    # behind for a moment on a loaded machine (its broker is then asked, by design), so the
    # ruling out is waited for; every answer meanwhile must still be right and complete.
    seen: list[router_pb2.QueryResult] = []

    def by_unique_key() -> set[str]:
        seen.append(env.router.QueryMsgByUniqueKey(router_pb2.QueryMsgByUniqueKeyRequest(topic=TOPIC, unique_key="presence-uniq-77"), timeout=10).result)
        return _ruled_out(seen[-1])

    wait_until(lambda: by_unique_key() == {"broker-a", "broker-c"}, what="unique key: the other brokers ruled out")
    assert all([m.offset_msg_id for m in r.messages] == [sent.offset_msg_id] and r.complete for r in seen)
    # An absent key: nobody is asked, and the answer is still complete.
    seen.clear()

    def absent() -> set[str]:
        seen.append(env.by_key("no-such-order"))
        return _ruled_out(seen[-1])

    wait_until(lambda: absent() == set(HOSTS), what="absent key: every broker ruled out")
    assert all(not r.messages and r.complete for r in seen)


def test_what_an_indexer_has_indexed_is_always_found_through_the_router(env: Env) -> None:
    wait_until(lambda: len(_ruled_out(env.by_key("warm-up"))) == 3, what="every filter watched")
    for i in range(60):
        broker = list(HOSTS)[i % 3]
        sent = env.send(broker, [f"fresh-{i}"])
        # Query as fast as possible while the indexer catches up. A complete answer without the
        # record comes from the broker not having indexed it yet, or from its being ruled out on
        # a copy that says it was older than the record (the copy trails its indexer by the watch
        # stream's delivery time), never on a copy that had it; found once both have it.
        give_up = time.monotonic() + 20
        while True:
            indexed = env.indexed_to(broker) >= sent.physical_offset
            result = env.by_key(f"fresh-{i}")
            # (an answer short of a broker that did not answer in time says so: not complete)
            (outcome,) = [o for o in result.brokers if o.broker_name == broker]
            if result.complete and outcome.ruled_out_by_key_filter:
                assert outcome.key_filter_position < sent.physical_offset, (i, outcome)
            elif indexed and result.complete:  # asked, and its indexer had the record before the query
                assert [m.offset_msg_id for m in result.messages] == [sent.offset_msg_id], (i, outcome)
                break
            assert len(result.messages) <= 1
            assert time.monotonic() < give_up, f"fresh-{i}: not indexed, or no complete answer with it, within 20 s"


def test_with_key_presence_off_every_broker_is_asked(cluster_factory) -> None:  # type: ignore[no-untyped-def]
    e = _cluster(cluster_factory, "--key-presence", "off")
    try:
        sent = e.send("broker-a", ["order-9"])
        result = wait_until(lambda: (r := e.by_key("order-9")) and r.messages and r, what="message indexed")
        assert [m.offset_msg_id for m in result.messages] == [sent.offset_msg_id]  # type: ignore[union-attr]
        assert not _ruled_out(result) and all(o.attempts == 1 for o in result.brokers)  # type: ignore[union-attr]
    finally:
        e.close()


def test_an_indexer_restart_is_watched_again(env: Env) -> None:
    env.send("broker-c", ["before-restart"])
    wait_until(lambda: _ruled_out(env.by_key("before-restart")) == {"broker-a", "broker-b"}, what="filters watched")
    indexer = env.cluster.brokers["broker-c"].indexer
    indexer.stop()
    indexer.start()
    sent = env.send("broker-c", ["after-restart"])
    # While broker-c's indexer is away its copy is dropped and it is asked (and reported).
    result = wait_until(lambda: (r := env.by_key("after-restart")) and r.messages and _ruled_out(r) == {"broker-a", "broker-b"} and r,
                        what="the restarted indexer's filter watched again")
    assert [m.offset_msg_id for m in result.messages] == [sent.offset_msg_id]  # type: ignore[union-attr]
    # Its filter was rebuilt from the IndexFiles on disk: the older key is still held there.
    wait_until(lambda: _ruled_out(env.by_key("before-restart")) == {"broker-a", "broker-b"}, what="the older key in the rebuilt filter")


def test_a_watched_indexer_stops_without_waiting_out_its_grace(cluster_factory) -> None:  # type: ignore[no-untyped-def]
    e = _cluster(cluster_factory, indexer_args=("--shutdown-grace-ms", "120000"))
    try:
        wait_until(lambda: len(_ruled_out(e.by_key("warm-up"))) == 3, what="every filter watched")
        # The watch streams never end by themselves: left open they would hold the whole grace.
        assert e.cluster.brokers["broker-c"].indexer.stop(timeout_s=20) == 0  # not killed
        # The stopped broker is asked (and reported), not ruled out, once the router has seen its
        # watch end (a copy still current a moment longer may rule it out: it holds what it held).
        # Without heartbeats it would stop being trusted anyway: that a copy is dropped the moment
        # its watch ends is tested in process (test_presence_watch: a bad update ends the watch).
        wait_until(lambda: "broker-c" not in _ruled_out(e.by_key("warm-up")), what="broker-c asked again")
    finally:
        e.close()


def test_under_access_control_the_router_watches_with_a_signed_stream(cluster_factory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    # Every service checks the accounts and signs its own calls with the cluster's account; a
    # reader may only query. The router's watch of each indexer is a signed server-streaming
    # call: unsigned, it would be refused under ACL.
    (tmp_path / "acl.json").write_text(json.dumps({"accounts": [
        {"access_key": "cluster", "secret_key": "cluster-secret-1", "admin": True},
        {"access_key": "reader", "secret_key": "reader-secret-2", "topics": {"*": ["query"]}},
    ]}))
    monkeypatch.setenv("QUARRY_ACL_FILE", str(tmp_path / "acl.json"))
    monkeypatch.setenv("QUARRY_ACCESS_KEY", "cluster")
    monkeypatch.setenv("QUARRY_SECRET_KEY", "cluster-secret-1")
    cluster = cluster_factory(indexer_args=["--flush-interval-ms", "100"])
    cluster.start_router()
    for name, host in HOSTS.items():
        cluster.add_broker(name, host)
    for name in HOSTS:
        with open_channel(cluster.brokers[name].commitlog.address) as ch:
            msg = common_pb2.MessageInput(topic=TOPIC, body=b"acl", keys=[f"acl-{name}"], queue_id=-1)
            commitlog_pb2_grpc.CommitLogServiceStub(ch).SendMessage(commitlog_pb2.SendMessageRequest(message=msg), timeout=5)
    monkeypatch.setenv("QUARRY_ACCESS_KEY", "reader")  # the querying user: query only
    monkeypatch.setenv("QUARRY_SECRET_KEY", "reader-secret-2")
    with open_channel(cluster.router.address) as ch:
        router = router_pb2_grpc.QueryRouterServiceStub(ch)

        def by_key(key: str) -> router_pb2.QueryResult:
            return router.QueryMsgByKey(router_pb2.QueryMsgByKeyRequest(topic=TOPIC, key=key), timeout=10).result

        result = wait_until(lambda: (r := by_key("acl-broker-b")) and r.messages and _ruled_out(r) == {"broker-a", "broker-c"} and r,
                            what="the message found, the other brokers ruled out by their watched filters")
        assert result.complete  # type: ignore[union-attr]
    assert "key presence not watched" not in (cluster.root / "logs" / "router.log").read_text()


def test_a_stopped_router_delays_no_indexing(env: Env) -> None:
    wait_until(lambda: len(_ruled_out(env.by_key("warm-up"))) == 3, what="every filter watched")
    router = env.cluster.router
    assert router is not None and router.proc is not None
    os.kill(router.proc.pid, signal.SIGSTOP)  # its watches stay open, none of them read
    try:
        sent = [env.send("broker-a", [f"while-stopped-{i}"]) for i in range(20)]
        wait_until(lambda: env.indexed_to("broker-a") >= sent[-1].physical_offset, what="indexed while the router is stopped")
    finally:
        os.kill(router.proc.pid, signal.SIGCONT)
    indexer_log = env.cluster.brokers["broker-a"].indexer.log_path.read_text()
    assert "watcher dropped" not in indexer_log  # nothing waited on it, so nothing gave up on it
    result = wait_until(lambda: (r := env.by_key("while-stopped-19")) and r.messages and _ruled_out(r) == {"broker-b", "broker-c"} and r,
                        what="found, the same watches caught up")
    assert [m.offset_msg_id for m in result.messages] == [sent[-1].offset_msg_id]  # type: ignore[union-attr]
