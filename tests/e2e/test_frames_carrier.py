"""The frames carrier between real processes: a router querying broker-a over its frames carrier and
broker-b (--frames-port 0) over gRPC gives the same answers and errors for the same messages; a
broker killed with a call in flight fails that query UNAVAILABLE, never hangs it."""
from __future__ import annotations

import threading
import time
from typing import Iterator

import grpc
import pytest

from quarry.formats import offset_msg_id
from quarry.v1 import commitlog_pb2, common_pb2, router_pb2
from tests.e2e.conftest import wait_until
from tests.e2e.stubs import ClusterStubs

TOPIC = "FramesTopic"
HOSTS = {"broker-a": "127.0.0.2", "broker-b": "127.0.0.3"}  # broker-a: frames; broker-b: gRPC only


@pytest.fixture
def env(cluster_factory) -> Iterator[ClusterStubs]:  # type: ignore[no-untyped-def]
    cluster = cluster_factory(indexer_args=["--flush-interval-ms", "100"])
    cluster.start_router("--query-timeout-ms", "10000", "--broker-call-timeout-ms", "5000")
    cluster.add_broker("broker-a", HOSTS["broker-a"])
    cluster.add_broker("broker-b", HOSTS["broker-b"], commitlog_args=["--frames-port", "0"], indexer_args=["--frames-port", "0"])
    e = ClusterStubs(cluster)
    yield e
    e.close()


def _send(env: ClusterStubs, broker: str, body: bytes, key: str) -> common_pb2.SendResult:
    msg = common_pb2.MessageInput(topic=TOPIC, body=body, keys=[key], queue_id=0, tags="TagA")
    return env.commitlog(broker).SendMessage(commitlog_pb2.SendMessageRequest(message=msg), timeout=5).result


def _by_id(env: ClusterStubs, msg_id: str) -> tuple[str, object]:
    try:
        [m] = env.router.QueryMsgById(router_pb2.QueryMsgByIdRequest(offset_msg_id=msg_id), timeout=10).result.messages
        return "OK", (m.topic, m.body, list(m.keys), m.tags, m.queue_id, m.queue_offset, m.commit_log_offset, m.broker_name)
    except grpc.RpcError as exc:
        return exc.code().name, exc.details()  # type: ignore[attr-defined]


def _log(env: ClusterStubs, broker: str, kind: str) -> str:
    return getattr(env.cluster.brokers[broker], kind).log_path.read_text(errors="replace")


def test_answers_and_errors_over_frames_equal_the_grpc_paths(env: ClusterStubs) -> None:
    sent = {b: [_send(env, b, f"body {i}".encode(), f"key-{i % 3}") for i in range(6)] for b in HOSTS}
    answers = {b: [_by_id(env, r.offset_msg_id) for r in sent[b]] for b in HOSTS}
    for b in HOSTS:
        decoded = offset_msg_id.decode(sent[b][0].offset_msg_id)
        answers[b].append(_by_id(env, offset_msg_id.create(decoded.ip, decoded.port, 1 << 40)))  # past the end: the broker's error
    assert all(a[0] == "OK" for b in HOSTS for a in answers[b][:-1])
    assert [a[1][:-1] for a in answers["broker-a"][:-1]] == [a[1][:-1] for a in answers["broker-b"][:-1]]  # type: ignore[index]
    assert answers["broker-a"][-1][0] == answers["broker-b"][-1][0] != "OK"
    assert str(answers["broker-a"][-1][1]).replace("broker-a", "broker-b") == answers["broker-b"][-1][1]
    env.cluster.wait_indexed()
    for key in ("key-0", "key-1", "key-2"):
        result = env.router.QueryMsgByKey(router_pb2.QueryMsgByKeyRequest(topic=TOPIC, key=key), timeout=10).result
        by_broker = {b: sorted(m.body for m in result.messages if m.broker_name == b) for b in HOSTS}
        assert by_broker["broker-a"] == by_broker["broker-b"] and len(by_broker["broker-a"]) == 2, key
        assert result.complete
    # broker-a's calls came over the carrier (both processes), broker-b's could not
    assert "frames connection opened" in _log(env, "broker-a", "commitlog") and "frames connection opened" in _log(env, "broker-a", "indexer")
    assert "frames carrier off" in _log(env, "broker-b", "commitlog") and "frames connection opened" not in _log(env, "broker-b", "commitlog")


def test_a_broker_killed_with_calls_in_flight_fails_them_unavailable(env: ClusterStubs) -> None:
    ids = [_send(env, "broker-a", f"body {i}".encode(), "k").offset_msg_id for i in range(20)]
    wait_until(lambda: "frames connection opened" in (_by_id(env, ids[0]) and _log(env, "broker-a", "commitlog")), what="the carrier in use")
    outcomes: list[tuple[str, float]] = []
    stop = threading.Event()

    def query() -> None:
        while not stop.is_set():
            t0 = time.monotonic()
            code, _ = _by_id(env, ids[len(outcomes) % len(ids)])
            outcomes.append((code, time.monotonic() - t0))

    threads = [threading.Thread(target=query) for _ in range(4)]
    for t in threads:
        t.start()
    wait_until(lambda: len(outcomes) >= 40, what="queries answered")
    env.cluster.brokers["broker-a"].commitlog.kill()
    n = len(outcomes)
    wait_until(lambda: sum(1 for code, _ in outcomes[n:] if code != "OK") >= 8, what="queries failing after the kill")
    stop.set()
    for t in threads:
        t.join(15)
    after = outcomes[n:]
    assert {code for code, _ in after} <= {"OK", "UNAVAILABLE"}, after
    assert max(s for _, s in after) < 8, after  # none waited for the router's query timeout
