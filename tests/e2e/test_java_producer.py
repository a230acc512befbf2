"""Apache RocketMQ 4.9.8's own Java producer (DefaultMQProducer) against a real Quarry cluster
(issue 35): the router's remoting port as namesrvAddr, the commitlogs as brokers. Sync, async,
oneway and batch sends with keys, tags, user properties, a delay level and a 4 MiB body, all in
one JVM (tests/java/src/main/java/quarry/drivers/Producer4.java); then Quarry's own CLI finds
every message by offsetMsgId, by key and by unique key (the msgId the producer returned), with
the body and properties the producer sent."""
from __future__ import annotations

import base64
import hashlib
import json
import subprocess
from typing import Any, Iterator

import pytest

from scripts.launcher import LocalCluster
from tests.e2e import java
from tests.e2e.conftest import run_quarry, wait_until

TOPIC, GROUP = "JavaProducerTopic", "PG_quarry_java"
BIG = 4 << 20  # DefaultMQProducer's maxMessageSize: the largest body it sends
DELAY_TOPIC = "SCHEDULE_TOPIC_XXXX"


def spec(name: str, tags: str, **extra: Any) -> dict[str, Any]:
    """A message of the plan: keys [name, "java-shared"], a user property naming it."""
    return {"topic": TOPIC, "tags": tags, "keys": [name, "java-shared"], "props": {"origin": name, "lang": "java 4.9.8"},
            "body": f"body of {name}", **extra}


PLAN_SENDS = [
    {"mode": "sync", "messages": [spec("sync-0", "TagA"), spec("sync-1", "TagB"),
                                  spec("sync-zip", "TagA", body="compressible by the client (over 4 KiB) " * 400)]},
    {"mode": "async", "messages": [spec(f"async-{i}", "TagA") for i in range(3)]},
    {"mode": "oneway", "messages": [spec(f"oneway-{i}", "TagC") for i in range(2)]},
    {"mode": "batch", "messages": [spec(f"batch-{i}", "TagD") for i in range(4)]},
    {"mode": "sync", "messages": [spec("delayed-0", "TagE", delayLevel=1)]},  # 1 s
    {"mode": "sync", "messages": [{**spec("big-0", "TagF"), "body": None, "randomBytes": BIG, "seed": 35}]},
]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = LocalCluster(root=tmp_path_factory.mktemp("java-producer"),
                     indexer_args=["--hash-slots", "101", "--index-num", "4000", "--flush-interval-ms", "100"])
    with c.running({"broker-a": "127.0.0.81", "broker-b": "127.0.0.82"}):
        yield c


@pytest.fixture(scope="module")
def sent(cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """Every message of PLAN_SENDS sent by one DefaultMQProducer, by its first key; the
    delayed one delivered and everything indexed before the tests look."""
    assert cluster.router is not None
    plan = {"namesrv": cluster.router.remoting_address, "group": GROUP, "timeoutMs": 20000, "sends": PLAN_SENDS}
    lines = java.run_driver("quarry.drivers.Producer4", plan, work_dir=tmp_path_factory.mktemp("java-producer-jvm"))
    assert lines and lines[-1] == {"done": True}, lines[-3:]
    results = lines[:-1]
    assert [r for r in results if "error" in r] == [], "sends refused"
    by_key = {r["keys"].split()[0]: r for r in results}
    assert len(by_key) == sum(len(s["messages"]) for s in PLAN_SENDS), sorted(by_key)
    wait_until(lambda: delivered(found_by_key(cluster, "delayed-0")), timeout_s=30, what="the delayed message delivered to its topic")
    cluster.wait_indexed()
    return by_key


def quarry(c: LocalCluster, *args: str) -> subprocess.CompletedProcess[str]:
    assert c.router is not None
    return run_quarry(c.router.address, "--json", *args)


def messages(run: subprocess.CompletedProcess[str]) -> list[dict[str, Any]]:
    assert run.returncode in (0, 1), f"quarry exited {run.returncode}: {run.stderr[-2000:]}"
    return json.loads(run.stdout).get("messages", []) if run.stdout.strip() else []


def found_by_key(c: LocalCluster, key: str) -> list[dict[str, Any]]:
    return messages(quarry(c, "queryMsgByKey", "-t", TOPIC, "-k", key))


def delivered(found: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Quarry answers a delayed message's key and unique key with the parked record too, marked
    `scheduled` (with its `realTopic`): the copies delivered to the topic are the others."""
    return [m for m in found if not m.get("scheduled")]


def parked_only(found: list[dict[str, Any]], r: dict[str, Any]) -> None:
    """What delivered() left out is the record the producer's offsetMsgId names."""
    assert [(m["topic"], m.get("realTopic"), m["offsetMsgId"]) for m in found if m.get("scheduled")] in ([], [(DELAY_TOPIC, TOPIC, r["offsetMsgId"])])


def expected_spec(name: str) -> dict[str, Any]:
    return next(m for s in PLAN_SENDS for m in s["messages"] if m["keys"][0] == name)


def check_message(msg: dict[str, Any], name: str, sent_line: dict[str, Any]) -> None:
    """Body (sha256 and length, as the producer computed them), tags, keys, the user properties
    and the UNIQ_KEY, as stored."""
    want = expected_spec(name)
    body = base64.b64decode(msg.get("body", ""))
    assert (len(body), hashlib.sha256(body).hexdigest()) == (sent_line["bodyLength"], sent_line["bodySha256"]), name
    topic = (DELAY_TOPIC, TOPIC) if msg.get("scheduled") else (TOPIC, "")
    assert (msg["topic"], msg.get("realTopic", "")) == topic and msg["tags"] == want["tags"] and msg["keys"] == want["keys"], (name, msg["topic"], msg["tags"], msg["keys"])
    props = {p["name"]: p.get("value", "") for p in msg.get("properties", [])}
    for k, v in want["props"].items():
        assert props.get(k) == v, (name, k, props)
    assert msg.get("uniqueKey") == sent_line["uniqKey"] == props.get("UNIQ_KEY"), (name, msg.get("uniqueKey"), sent_line["uniqKey"])


def test_every_send_mode_is_acknowledged_as_a_rocketmq_broker_would(cluster: LocalCluster, sent: dict[str, dict[str, Any]]) -> None:
    for name, r in sent.items():
        if r["mode"] == "oneway":
            assert r["status"] is None and r["offsetMsgId"] is None and r["msgId"], name
            continue
        assert r["status"] == "SEND_OK", (name, r)
        assert r["msgId"] == r["uniqKey"], name  # the client's msgId is the UNIQ_KEY it set
        assert len(r["offsetMsgId"]) == 32 and r["brokerName"] in ("broker-a", "broker-b"), (name, r)
    batch = sorted((r for r in sent.values() if r["mode"] == "batch"), key=lambda r: r["index"])
    # One SendResult for the batch: one id and one offsetMsgId per message, one queue, consecutive offsets.
    assert {(r["resultMsgIds"], r["resultOffsetMsgIds"]) for r in batch} == {(4, 4)}
    assert len({(r["brokerName"], r["queueId"]) for r in batch}) == 1
    assert len({r["offsetMsgId"] for r in batch}) == 4
    assert {r["brokerName"] for r in sent.values() if r["mode"] != "oneway"} == {"broker-a", "broker-b"}
    assert sent["big-0"]["bodyLength"] == BIG


def test_every_acknowledged_message_found_by_offset_msg_id(cluster: LocalCluster, sent: dict[str, dict[str, Any]]) -> None:
    acked = {name: r for name, r in sent.items() if r["offsetMsgId"] and name != "delayed-0"}
    run = quarry(cluster, "queryMsgById", "-i", ",".join(r["offsetMsgId"] for r in acked.values()))
    assert run.returncode == 0, run.stderr[-2000:]
    found = {m["offsetMsgId"]: m for m in json.loads(run.stdout)["messages"]}
    assert sorted(found) == sorted(r["offsetMsgId"] for r in acked.values())
    for name, r in acked.items():
        check_message(found[r["offsetMsgId"]], name, r)


def test_a_delayed_message_is_parked_under_its_offset_msg_id_then_delivered(cluster: LocalCluster, sent: dict[str, dict[str, Any]]) -> None:
    """As on a 4.x broker: the offsetMsgId the producer got names the parked record
    (SCHEDULE_TOPIC_XXXX, REAL_TOPIC and DELAY properties); the delivered copy is found by key
    and unique key under the real topic."""
    r = sent["delayed-0"]
    (parked,) = messages(quarry(cluster, "queryMsgById", "-i", r["offsetMsgId"]))
    props = {p["name"]: p.get("value", "") for p in parked.get("properties", [])}
    assert parked["topic"] == DELAY_TOPIC and props.get("REAL_TOPIC") == TOPIC and props.get("DELAY") == "1", (parked["topic"], props)
    assert parked.get("scheduled") is True and parked.get("realTopic") == TOPIC
    by_key = found_by_key(cluster, "delayed-0")
    (copy,) = delivered(by_key)
    parked_only(by_key, r)
    assert copy["offsetMsgId"] != r["offsetMsgId"] and copy["topic"] == TOPIC
    check_message(copy, "delayed-0", r)
    # By unique key: the earliest stored copy (the parked record), every copy with -a.
    (earliest,) = messages(quarry(cluster, "queryMsgByUniqueKey", "-t", TOPIC, "-i", r["msgId"]))
    assert earliest["offsetMsgId"] == r["offsetMsgId"]
    every = messages(quarry(cluster, "queryMsgByUniqueKey", "-t", TOPIC, "-i", r["msgId"], "-a"))
    assert [m["offsetMsgId"] for m in delivered(every)] == [copy["offsetMsgId"]]
    parked_only(every, r)


def test_every_message_found_by_each_key(cluster: LocalCluster, sent: dict[str, dict[str, Any]]) -> None:
    """Oneway sends have no result: their key finds them. The shared key finds all of them."""
    for name, r in sent.items():
        found = found_by_key(cluster, name)
        (msg,) = delivered(found)
        parked_only(found, r)
        check_message(msg, name, r)
        if r["offsetMsgId"] and name != "delayed-0":
            assert msg["offsetMsgId"] == r["offsetMsgId"], name
    shared = delivered(found_by_key(cluster, "java-shared"))
    assert sorted(m["uniqueKey"] for m in shared) == sorted(r["uniqKey"] for r in sent.values())


def test_every_message_found_by_unique_key(cluster: LocalCluster, sent: dict[str, dict[str, Any]]) -> None:
    """The msgId a Java producer returns (for oneway: the UNIQ_KEY it set) is a unique key."""
    for name, r in sent.items():
        (msg,) = messages(quarry(cluster, "queryMsgByUniqueKey", "-t", TOPIC, "-i", r["msgId"]))
        check_message(msg, name, r)  # a delayed message's earliest copy: the parked record
        if r["offsetMsgId"]:
            assert msg["offsetMsgId"] == r["offsetMsgId"], name
