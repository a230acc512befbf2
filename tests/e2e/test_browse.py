"""printMsg / printMsgByQueue / searchOffset / queryMsgTraceById / DecodeMessageId through the
CLI on two brokers: windows of 0, 1 and thousands of messages, tag filters, delayed messages
parked for their topic, trace records in RocketMQ's format, a window part of which retention
deleted (a cluster of its own), and a broker killed mid-browse.
The killing test runs last in this module (it stops broker-b)."""
from __future__ import annotations

import base64
import json
import os
import subprocess
import time
from datetime import datetime
from typing import Any, Callable, Iterator

import pytest

from quarry.channels import open_channel
from quarry.clients.producer import unique_key_generator
from scripts.launcher import LocalCluster
from quarry.v1 import commitlog_pb2, commitlog_pb2_grpc, common_pb2, router_pb2, router_pb2_grpc
from tests.e2e.conftest import run_quarry, wait_until

MANY = 6000
C, F = "\x01", "\x02"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = LocalCluster(root=tmp_path_factory.mktemp("browse"), commitlog_args=["--segment-size", str(8 << 20)],
                     indexer_args=["--hash-slots", "1001", "--index-num", "40000", "--flush-interval-ms", "100"])
    with c.running({"broker-a": "127.0.0.21", "broker-b": "127.0.0.22"}):
        yield c


def quarry(cluster: LocalCluster, *args: str) -> subprocess.CompletedProcess[str]:
    assert cluster.router is not None
    return run_quarry(cluster.router.address, *args, timeout_s=120)


def send(cluster: LocalCluster, broker: str, msgs: list[common_pb2.MessageInput]) -> list[common_pb2.SendResult]:
    with open_channel(cluster.brokers[broker].commitlog.address) as ch:
        stub = commitlog_pb2_grpc.CommitLogServiceStub(ch)
        out: list[common_pb2.SendResult] = []
        for i in range(0, len(msgs), 1000):
            out += stub.SendBatch(commitlog_pb2.SendBatchRequest(messages=msgs[i:i + 1000]), timeout=30).results
    # A browse asks the brokers the router knows to hold the topic; a new topic reaches it with
    # the broker's next heartbeat (sent at once, but not before the CLI may ask).
    assert cluster.router is not None
    with open_channel(cluster.router.address) as ch:
        router = router_pb2_grpc.QueryRouterServiceStub(ch)
        for topic in {m.topic for m in msgs}:
            wait_until(lambda: broker in {x.broker_name for x in router.GetTopicRoute(router_pb2.GetTopicRouteRequest(topic=topic), timeout=5).brokers},
                       what=f"{topic} routed to {broker}")
    return list(out)


def _body(m: dict[str, Any]) -> str:
    """--json prints the protobuf JSON mapping: bytes in base64."""
    return base64.b64decode(m["body"]).decode()


def _json(p: subprocess.CompletedProcess[str]) -> Any:
    assert "Traceback" not in p.stderr, p.stderr
    return json.loads(p.stdout)


@pytest.fixture(scope="module")
def many(cluster: LocalCluster) -> dict[str, Any]:
    """MANY messages of ManyT over both brokers: tag TagA for i % 3 == 0, TagB for 1, none for 2."""
    begin = int(time.time() * 1000) - 1
    tags = ["TagA", "TagB", ""]
    for broker, parity in (("broker-a", 0), ("broker-b", 1)):
        send(cluster, broker, [common_pb2.MessageInput(topic="ManyT", body=f"many-{i}".encode(), tags=tags[i % 3], queue_id=-1)
                               for i in range(MANY) if i % 2 == parity])
    end = int(time.time() * 1000) + 1
    return {"begin": begin, "end": end}


def test_a_window_of_thousands_is_complete_and_ordered_both_ways(cluster: LocalCluster, many: dict[str, Any]) -> None:
    b, e = str(many["begin"]), str(many["end"])
    newest = quarry(cluster, "--json", "printMsg", "-t", "ManyT", "-b", b, "-e", e, "--page-size", "500")
    assert newest.returncode == 0, newest.stderr
    data = _json(newest)
    bodies = [_body(m) for m in data["messages"]]
    assert sorted(bodies) == sorted(f"many-{i}" for i in range(MANY)) and data["complete"] and data["nextToken"] == ""
    times = [int(m["storeTimestamp"]) for m in data["messages"]]
    assert times == sorted(times, reverse=True)
    oldest = _json(quarry(cluster, "--json", "printMsg", "-t", "ManyT", "-b", b, "-e", e, "--oldest-first", "-d", "false"))
    assert [int(m["storeTimestamp"]) for m in oldest["messages"]] == sorted(times) and "body" not in oldest["messages"][0]
    assert {m["brokerName"] for m in oldest["messages"]} == {"broker-a", "broker-b"}


def test_tag_filter_and_plain_output(cluster: LocalCluster, many: dict[str, Any]) -> None:
    b, e = str(many["begin"]), str(many["end"])
    a = _json(quarry(cluster, "--json", "printMsg", "-t", "ManyT", "-b", b, "-e", e, "-s", "TagA"))
    assert sorted(_body(m) for m in a["messages"]) == sorted(f"many-{i}" for i in range(0, MANY, 3))
    ab = _json(quarry(cluster, "--json", "printMsg", "-t", "ManyT", "-b", b, "-e", e, "-s", "TagA || TagB"))
    assert len(ab["messages"]) == len([i for i in range(MANY) if i % 3 != 2])
    plain = quarry(cluster, "printMsg", "-t", "ManyT", "-b", b, "-e", e, "-s", "TagB", "--max", "5")
    lines = plain.stdout.splitlines()
    assert plain.returncode == 0 and len(lines) == 6 and all(line.startswith("MSGID: ") and " BODY: many-" in line for line in lines[:5])
    assert lines[5].startswith("more: --token ")
    rest = _json(quarry(cluster, "--json", "printMsg", "-t", "ManyT", "-b", b, "-e", e, "-s", "TagB", "--token", lines[5].split()[-1]))
    assert len(rest["messages"]) == len(range(1, MANY, 3)) - 5


def test_windows_of_zero_and_one_message_and_bad_input(cluster: LocalCluster, many: dict[str, Any]) -> None:
    (r,) = send(cluster, "broker-a", [common_pb2.MessageInput(topic="OneT", body=b"only one", queue_id=-1)])
    everything = _json(quarry(cluster, "--json", "printMsg", "-t", "OneT"))
    (msg,) = everything["messages"]
    ts = int(msg["storeTimestamp"])
    exact = _json(quarry(cluster, "--json", "printMsg", "-t", "OneT", "-b", str(ts), "-e", str(ts)))
    assert [m["offsetMsgId"] for m in exact["messages"]] == [r.offset_msg_id]
    as_mqadmin = datetime.fromtimestamp(ts / 1000).strftime("%Y-%m-%d#%H:%M:%S:") + f"{ts % 1000:03d}"  # mqadmin's format, local zone
    same = _json(quarry(cluster, "--json", "printMsg", "-t", "OneT", "-b", as_mqadmin, "-e", as_mqadmin))
    assert [m["offsetMsgId"] for m in same["messages"]] == [r.offset_msg_id]
    empty = quarry(cluster, "--json", "printMsg", "-t", "ManyT", "-b", "1970-01-01T00:00:01Z", "-e", "1970-01-01T00:00:02Z")
    assert empty.returncode == 1 and _json(empty)["messages"] == []
    after = quarry(cluster, "printMsg", "-t", "OneT", "-b", str(ts + 1), "-e", str(ts + 10_000))
    assert after.returncode == 1 and after.stdout == ""
    for args, field in ((["-s", "||"], "tag_expression"), (["--token", "bogus"], "continuation_token"), (["-b", "1970-01-01T00:00:09Z", "-e", "1970-01-01T00:00:05Z"], "end_timestamp"), (["-b", "1700000000"], "seconds"),
                        (["--page-size", "5000"], "max_num"), (["-c", "NOPE-CHARSET"], "charset")):
        bad = quarry(cluster, "printMsg", "-t", "OneT", *args)
        assert bad.returncode == 2 and field in bad.stderr and "Traceback" not in bad.stderr, (args, bad.stderr)
    assert quarry(cluster, "printMsg", "-t", "NoSuchTopic").returncode == 1
    assert quarry(cluster, "printMsgByQueue", "-t", "OneT", "-a", "broker-z", "-i", "0").returncode == 1


def test_print_msg_by_queue_and_search_offset(cluster: LocalCluster, many: dict[str, Any]) -> None:
    with open_channel(cluster.brokers["broker-a"].commitlog.address) as ch:
        status = commitlog_pb2_grpc.CommitLogServiceStub(ch).GetStoreStatus(commitlog_pb2.GetStoreStatusRequest(), timeout=10)
    count = next(t for t in status.topics if t.topic == "ManyT").max_queue_offsets[1]
    q = _json(quarry(cluster, "--json", "printMsgByQueue", "-t", "ManyT", "-a", "broker-a", "-i", "1", "--oldest-first"))
    assert [int(m["queueOffset"]) for m in q["messages"]] == list(range(count))
    assert {(m["brokerName"], m["queueId"]) for m in q["messages"]} == {("broker-a", 1)}
    mid = q["messages"][count // 2]
    found = _json(quarry(cluster, "--json", "searchOffset", "-t", "ManyT", "-a", "broker-a", "-i", "1", "-s", mid["storeTimestamp"]))
    first_at = next(int(m["queueOffset"]) for m in q["messages"] if int(m["storeTimestamp"]) >= int(mid["storeTimestamp"]))
    assert (found["brokerName"], int(found["queueOffset"]), int(found["minQueueOffset"]), int(found["maxQueueOffset"])) == ("broker-a", first_at, 0, count)
    last = _json(quarry(cluster, "--json", "searchOffset", "-t", "ManyT", "-a", "broker-a", "-i", "1", "-s", mid["storeTimestamp"], "--upper"))
    assert int(last["queueOffset"]) == max(int(m["queueOffset"]) for m in q["messages"] if int(m["storeTimestamp"]) <= int(mid["storeTimestamp"]))
    assert _json(quarry(cluster, "--json", "searchOffset", "-t", "ManyT", "-a", "broker-a", "-i", "1", "-s", "0"))["queueOffset"] == "0"
    assert quarry(cluster, "searchOffset", "-t", "ManyT", "-a", "broker-a", "-i", "99", "-s", "0").returncode == 1


def test_delayed_message_is_found_before_delivery_under_its_real_topic(cluster: LocalCluster) -> None:
    uid = unique_key_generator().next_id()
    for broker in ("broker-a", "broker-b"):
        send(cluster, broker, [common_pb2.MessageInput(topic="DelayT", body=f"now-{broker}".encode(), queue_id=0)])
    # What a RocketMQ broker stores for a message sent to DelayT with delay level 16 (30 min, due
    # long after the test): parked under SCHEDULE_TOPIC_XXXX queue 15, its topic and queue kept
    # in REAL_TOPIC / REAL_QID.
    (parked,) = send(cluster, "broker-a", [common_pb2.MessageInput(
        topic="SCHEDULE_TOPIC_XXXX", body=b"later", queue_id=15, keys=["order-77"], tags="Pay", unique_key=uid,
        properties=[common_pb2.Property(name="DELAY", value="16"), common_pb2.Property(name="REAL_TOPIC", value="DelayT"),
                    common_pb2.Property(name="REAL_QID", value="0")])])
    data = _json(quarry(cluster, "--json", "printMsg", "-t", "DelayT"))
    by_body = {_body(m): m for m in data["messages"]}
    assert set(by_body) == {"now-broker-a", "now-broker-b", "later"}
    later = by_body["later"]
    assert later["scheduled"] and later["realTopic"] == "DelayT" and int(later["deliverTimestamp"]) == int(later["storeTimestamp"]) + 1_800_000
    assert not by_body["now-broker-a"]["scheduled"]
    assert [_body(m) for m in _json(quarry(cluster, "--json", "printMsg", "-t", "DelayT", "-s", "Pay"))["messages"]] == ["later"]
    plain = quarry(cluster, "printMsg", "-t", "DelayT", "-s", "Pay")
    assert "scheduled=true" in plain.stdout and "realTopic=DelayT" in plain.stdout
    by_key = wait_until(lambda: (p := quarry(cluster, "--json", "queryMsgByKey", "-t", "DelayT", "-k", "order-77")) and _json(p)["messages"] and p, what="parked message indexed")
    (m,) = _json(by_key)["messages"]
    assert m["offsetMsgId"] == parked.offset_msg_id and m["scheduled"]
    by_uid = _json(quarry(cluster, "--json", "queryMsgByUniqueKey", "-t", "DelayT", "-i", uid))
    assert [x["offsetMsgId"] for x in by_uid["messages"]] == [parked.offset_msg_id]
    assert quarry(cluster, "queryMsgByKey", "-t", "Elsewhere", "-k", "order-77").stdout.count("order") == 0
    # What the RocketMQ 5 front door stores for a delivery time: the real topic, TIMER_DELIVER_MS.
    due = int(time.time() * 1000) + 3_600_000
    send(cluster, "broker-b", [common_pb2.MessageInput(topic="DelayT", body=b"timer", queue_id=1,
                                                       properties=[common_pb2.Property(name="TIMER_DELIVER_MS", value=str(due))])])
    timer = {_body(m): m for m in _json(quarry(cluster, "--json", "printMsg", "-t", "DelayT"))["messages"]}["timer"]
    assert timer["scheduled"] and int(timer["deliverTimestamp"]) == due and timer["realTopic"] == "DelayT"


def _trace_msg(body: str, keys: list[str], host: str) -> common_pb2.MessageInput:
    return common_pb2.MessageInput(topic="RMQ_SYS_TRACE_TOPIC", body=body.encode(), keys=keys, queue_id=-1,
                                   born_host=common_pb2.HostAddress(ip=host, port=50123))


def test_message_trace_is_decoded_into_the_send_and_consume_timeline(cluster: LocalCluster) -> None:
    mid, other = "0A0000090BB818B4AAC2172AE1C70001", "0A0000090BB818B4AAC2172AE1C70002"
    pub = C.join(["Pub", "1700000000123", "DefaultRegion", "PG-orders", "Orders", mid, "TagA", "k1", "10.0.0.1:10911", "42", "7", "0",
                  "0A00000100002A9F0000000000000100", "true"]) + F
    pub_other = C.join(["Pub", "1700000000124", "DefaultRegion", "PG-orders", "Orders", other, "TagA", "k2", "10.0.0.1:10911", "1", "1", "0", "X", "true"]) + F
    sub = lambda group, req, ok, ts: (C.join(["SubBefore", str(ts), "DefaultRegion", group, req, mid, "0", "k1"]) + F
                                       + C.join(["SubAfter", req, mid, "15", ok, "k1", "0", str(ts + 15), group]) + F)
    send(cluster, "broker-b", [_trace_msg(pub + pub_other, [mid, "k1", other, "k2"], "10.9.8.7")])
    send(cluster, "broker-a", [_trace_msg(sub("CG-billing", "r1", "true", 1700000001000), [mid, "k1"], "10.9.8.8"),
                               _trace_msg(sub("CG-audit", "r2", "false", 1700000002000), [mid, "k1"], "10.9.8.9")])
    got = wait_until(lambda: (p := quarry(cluster, "--json", "queryMsgTraceById", "-i", mid)) and len(_json(p)["contexts"]) == 5 and p, what="trace indexed")
    data = _json(got)
    kinds = [(c["traceType"], c["group"], c["clientHost"], c["success"]) for c in data["contexts"]]
    assert kinds == [("Pub", "PG-orders", "10.9.8.7", True), ("SubBefore", "CG-billing", "10.9.8.8", True), ("SubAfter", "CG-billing", "10.9.8.8", True),
                     ("SubBefore", "CG-audit", "10.9.8.9", True), ("SubAfter", "CG-audit", "10.9.8.9", False)]
    assert data["contexts"][0]["offsetMsgId"] == "0A00000100002A9F0000000000000100" and data["complete"]
    table = quarry(cluster, "queryMsgTraceById", "-i", mid)
    assert table.returncode == 0
    lines = [line.split() for line in table.stdout.splitlines() if line.strip()]
    assert lines[0][:3] == ["#Type", "#ProducerGroup", "#ClientHost"] and lines[1][:3] == ["Pub", "PG-orders", "10.9.8.7"] and lines[1][-2:] == ["7ms", "success"]
    subs = [line for line in lines if line[0] == "Sub"]
    assert [(s[1], s[-1]) for s in subs] == [("CG-billing", "success"), ("CG-audit", "failed")]
    assert quarry(cluster, "queryMsgTraceById", "-i", "0A0000090BB818B4AAC2172AE1C7FFFF").returncode == 1
    assert quarry(cluster, "queryMsgTraceById", "-i", mid, "-t", "MyTraceTopic").returncode == 1


def test_decode_message_id_offline(cluster: LocalCluster) -> None:
    (r,) = send(cluster, "broker-b", [common_pb2.MessageInput(topic="OneT", body=b"id", queue_id=-1, unique_key=unique_key_generator().next_id())])
    out = _json(quarry(cluster, "--json", "DecodeMessageId", "-i", r.offset_msg_id))
    assert out["offsetMsgId"]["storeHost"].startswith("127.0.0.22:") and out["offsetMsgId"]["commitLogOffset"] == r.physical_offset
    uk = _json(quarry(cluster, "--json", "DecodeMessageId", "-i", r.unique_key))["uniqueKeyV4"]
    assert uk["pid"] == os.getpid() & 0xFFFF and abs(uk["nearlyTimeMs"] - time.time() * 1000) < 3_600_000
    assert quarry(cluster, "DecodeMessageId", "-i", "xyz").returncode == 2


def test_a_window_reaching_into_segments_retention_deleted_is_4_naming_the_range(cluster_factory: Callable[..., LocalCluster]) -> None:
    # Small segments kept 0 hours: the retention pass a commitlog makes as it starts deletes every
    # segment but the active one.
    own = cluster_factory(commitlog_args=["--segment-size", str(64 << 10), "--file-reserved-hours", "0"])
    router = own.start_router().address
    broker = own.add_broker("broker-a", "127.0.0.23").commitlog
    begin = int(time.time() * 1000) - 1
    for n in range(10):
        send(own, "broker-a", [common_pb2.MessageInput(topic="OldT", body=f"old-{n}-{i}".encode() + b"x" * 1024, queue_id=-1) for i in range(20)])
    assert broker.stop() == 0
    broker.start()
    # (A pass may already have run before the restart: wait for the end state, not for a change.)
    settled = wait_until(lambda: (st := _store_status(broker.address)) and len(st.segments) == 1 and st, what="retention at start-up deleted the old segments")
    floor = settled.min_offset  # type: ignore[attr-defined]
    assert floor > 0
    # New messages after the oldest readable record: in two sends, so the second is strictly newer.
    send(own, "broker-a", [common_pb2.MessageInput(topic="OldT", body=b"new-0", queue_id=-1)])
    stored_by = int(time.time() * 1000)  # same host clock: the first new message's store time is not later
    wait_until(lambda: int(time.time() * 1000) > stored_by, what="the clock passing the first new message")
    send(own, "broker-a", [common_pb2.MessageInput(topic="OldT", body=b"new-1", queue_id=-1)])
    end = int(time.time() * 1000) + 1
    with open_channel(broker.address) as ch:
        oldest = commitlog_pb2_grpc.CommitLogServiceStub(ch).GetMessages(commitlog_pb2.GetMessagesRequest(physical_offsets=[floor]), timeout=10).messages[0]

    whole = run_quarry(router, "--json", "printMsg", "-t", "OldT", "-b", str(begin), "-e", str(end), timeout_s=120)
    assert whole.returncode == 4, whole.stderr
    data = _json(whole)
    bodies = {_body(m)[:6] for m in data["messages"]}
    assert {"new-0", "new-1"} <= bodies and not data["complete"] and data["failedBrokers"] == {} and data["retryToken"] == ""
    assert all(int(m["commitLogOffset"]) >= floor for m in data["messages"])  # what is left, and only that
    warning = next(line for line in whole.stderr.splitlines() if line.startswith("WARNING: broker broker-a: messages of this window may be gone"))
    assert f"physical offsets [0, {floor})" in warning and "OldT/0 [0, " in warning, warning
    by_queue = run_quarry(router, "printMsgByQueue", "-t", "OldT", "-a", "broker-a", "-i", "1", "-b", str(begin), "-e", str(end))
    assert by_queue.returncode == 4 and "OldT/1 [0, " in by_queue.stderr and "OldT/0" not in by_queue.stderr, by_queue.stderr
    # A window newer than the oldest readable record misses nothing: no note, exit 0.
    newer = run_quarry(router, "--json", "printMsg", "-t", "OldT", "-b", str(oldest.store_timestamp + 1), "-e", str(end))
    assert newer.returncode == 0 and "WARNING" not in newer.stderr, newer.stderr
    assert _json(newer)["complete"] and "new-1" in {_body(m) for m in _json(newer)["messages"]}


def _store_status(address: str) -> commitlog_pb2.GetStoreStatusResponse:
    with open_channel(address) as ch:
        return commitlog_pb2_grpc.CommitLogServiceStub(ch).GetStoreStatus(commitlog_pb2.GetStoreStatusRequest(), timeout=10)


def test_broker_killed_mid_browse_is_reported_and_the_page_can_be_retried(cluster: LocalCluster, many: dict[str, Any]) -> None:
    b, e = str(many["begin"]), str(many["end"])
    first = _json(quarry(cluster, "--json", "printMsg", "-t", "ManyT", "-b", b, "-e", e, "--max", "1000"))
    assert len(first["messages"]) == 1000 and first["nextToken"]
    cluster.brokers["broker-b"].commitlog.kill()
    second = quarry(cluster, "--json", "printMsg", "-t", "ManyT", "-b", b, "-e", e, "--max", "1000", "--token", first["nextToken"])
    assert second.returncode == 4, second.stderr
    data = _json(second)
    assert not data["complete"] and "broker-b" in data["failedBrokers"] and data["retryToken"] == first["nextToken"]
    assert data["messages"] and {m["brokerName"] for m in data["messages"]} == {"broker-a"}
    assert "broker-b" in second.stderr and "--token" in second.stderr
    seen = {m["body"] for m in first["messages"]}
    assert not seen & {m["body"] for m in data["messages"]}  # the page continues, it does not repeat
