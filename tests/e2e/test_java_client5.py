"""Apache RocketMQ's own gRPC client, rocketmq-client-java 5.0.8, against a real Quarry cluster
(issue 35, items 4 and 6): the router's gRPC address as the access point, the commitlogs as the
brokers (RocketMQ 5's local mode). One JVM (tests/java/src/main/java/quarry/drivers/Client5.java)
runs the whole plan: a Producer sends normal (sync and async), FIFO (a message group), delayed (a
delivery timestamp) and transactional messages (commit, rollback, and one left to the server's
check, which its TransactionChecker commits); a SimpleConsumer receives, acks and changes an
invisible duration; PushConsumers consume (one failure redelivered). Quarry's own CLI then finds
every message by id (the 5.x message id is the unique key), by key and by unique key. With ACL on,
the client's session credentials are admitted for their permissions and refused beyond them."""
from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path
from typing import Any, Iterator

import pytest

from scripts.launcher import LocalCluster
from tests.e2e import java
from tests.e2e.conftest import run_quarry, wait_until

NORMAL, FIFO, DELAY, TX = "J5Normal", "J5Fifo", "J5Delay", "J5Tx"
DELAY_MS = 3000
# A half not ended is checked after 1 s, looked for every 0.5 s (RocketMQ: 6 s and 60 s).
CHECK_ARGS = ["--transaction-timeout-ms", "1000", "--transaction-check-interval-ms", "500"]


def spec(name: str, tag: str = "", **extra: Any) -> dict[str, Any]:
    """A message of the plan: keys [name, "j5-shared"], a user property naming the plan's case."""
    m: dict[str, Any] = {"name": name, "keys": [name, "j5-shared"], "props": {"lang": "java 5.0.8"}, "body": f"body of {name}", **extra}
    if tag:
        m["tag"] = tag
    return m


NORMALS = [spec(f"n{i}", "TagA" if i % 2 else "TagB") for i in range(4)]
ASYNCS = [spec(f"a{i}", "TagA") for i in range(4)]
FIFOS = [spec(f"f{i}", "step", group="order-77") for i in range(4)]
PLAN_STEPS: list[dict[str, Any]] = [
    {"op": "send", "topic": NORMAL, "messages": NORMALS},
    {"op": "send", "topic": NORMAL, "async": True, "messages": ASYNCS},
    {"op": "send", "topic": FIFO, "messages": FIFOS},
    {"op": "send", "topic": DELAY, "messages": [spec("d0", "later", deliverInMs=DELAY_MS)]},
    {"op": "transaction", "topic": TX, "resolution": "commit", "message": spec("t-commit", "tx")},
    {"op": "transaction", "topic": TX, "resolution": "rollback", "message": spec("t-rollback", "tx")},
    {"op": "transaction", "topic": TX, "resolution": "none", "message": spec("t-orphan", "tx")},
    # n1 is first hidden for 1 s instead of acked (ChangeInvisibleDuration), then received again.
    {"op": "simple", "group": "J5Simple", "topic": NORMAL, "want": 8, "invisibleMs": 20000, "deadlineMs": 30000,
     "changeInvisible": {"names": ["n1"], "toMs": 1000}},
    # f0 fails once: redelivered after the group's first retry delay (1 s).
    {"op": "push", "group": "J5Push", "topic": FIFO, "want": 4, "deadlineMs": 30000, "failOnce": ["f0"], "settleMs": 500},
    {"op": "simple", "group": "J5Later", "topic": DELAY, "want": 1, "deadlineMs": 20000},
    # The committed message and the orphan the checker commits; never the rolled back one.
    {"op": "push", "group": "J5TxPush", "topic": TX, "want": 2, "deadlineMs": 30000, "settleMs": 500},
    {"op": "awaitChecks", "deadlineMs": 10000},
]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = LocalCluster(root=tmp_path_factory.mktemp("java-client5"), commitlog_args=CHECK_ARGS,
                     indexer_args=["--hash-slots", "101", "--index-num", "4000", "--flush-interval-ms", "100"])
    with c.running({"broker-a": "127.0.0.102", "broker-b": "127.0.0.103"}, router_host="127.0.0.101"):
        yield c


@pytest.fixture(scope="module")
def events(cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    assert cluster.router is not None
    plan = {"endpoints": cluster.router.address, "requestTimeoutMs": 5000, "topics": [NORMAL, FIFO, DELAY, TX], "steps": PLAN_STEPS}
    lines = java.run_driver("quarry.drivers.Client5", plan, flavor="rmq5", timeout_s=180, work_dir=tmp_path_factory.mktemp("java-client5-jvm"))
    assert lines and lines[-1] == {"done": True}, lines[-3:]
    assert [e for e in lines if e.get("op") == "stepError"] == []
    cluster.wait_indexed()
    return lines


def sent(events: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in events if e.get("op") == "sent"}


def of(events: list[dict[str, Any]], op: str, topic: str) -> list[dict[str, Any]]:
    return [e for e in events if e.get("op") == op and e.get("topic") == topic]


def quarry(c: LocalCluster, *args: str) -> list[dict[str, Any]]:
    assert c.router is not None
    run = run_quarry(c.router.address, "--json", *args)
    assert run.returncode in (0, 1), f"quarry exited {run.returncode}: {run.stderr[-2000:]}"
    return json.loads(run.stdout).get("messages", []) if run.stdout.strip() else []


def props(m: dict[str, Any]) -> dict[str, str]:
    return {p["name"]: p.get("value", "") for p in m.get("properties", [])}


def check_stored(m: dict[str, Any], topic: str, want: dict[str, Any], message_id: str) -> None:
    """As the producer sent it: topic, body, tag, keys, user properties; UNIQ_KEY the 5.x id."""
    assert m["topic"] == topic and base64.b64decode(m.get("body", "")) == want["body"].encode(), (want["name"], m["topic"])
    assert m.get("tags", "") == want.get("tag", "") and m["keys"] == want["keys"], (want["name"], m.get("tags"), m["keys"])
    p = props(m)
    assert p.get("name") == want["name"] and p.get("lang") == "java 5.0.8", p
    assert m.get("uniqueKey") == message_id == p.get("UNIQ_KEY"), (want["name"], m.get("uniqueKey"), message_id)


def found_three_ways(c: LocalCluster, topic: str, want: dict[str, Any], message_id: str) -> dict[str, Any]:
    """By id (the CLI's queryMsgById -t takes the SDK's id as a unique key), by key, by unique key:
    the same stored record each time."""
    (by_id,) = quarry(c, "queryMsgById", "-t", topic, "-i", message_id)
    check_stored(by_id, topic, want, message_id)
    (by_key,) = quarry(c, "queryMsgByKey", "-t", topic, "-k", want["name"])
    (by_unique,) = quarry(c, "queryMsgByUniqueKey", "-t", topic, "-i", message_id)
    assert by_key["offsetMsgId"] == by_unique["offsetMsgId"] == by_id["offsetMsgId"], want["name"]
    return by_id


def test_producer_sends_every_kind_and_the_cli_finds_each(cluster: LocalCluster, events: list[dict[str, Any]]) -> None:
    s = sent(events)
    assert [n for n, e in s.items() if "error" in e] == [], [e for e in s.values() if "error" in e]
    assert len({e["messageId"] for e in s.values()}) == len(s) == 4 + 4 + 4 + 1 + 3
    for topic, specs in ((NORMAL, NORMALS + ASYNCS), (FIFO, FIFOS)):
        for want in specs:
            found_three_ways(cluster, topic, want, s[want["name"]]["messageId"])
    shared = quarry(cluster, "queryMsgByKey", "-t", NORMAL, "-k", "j5-shared")
    assert sorted(m["uniqueKey"] for m in shared) == sorted(s[w["name"]]["messageId"] for w in NORMALS + ASYNCS)


def test_fifo_messages_of_one_group_share_a_queue_in_send_order(cluster: LocalCluster, events: list[dict[str, Any]]) -> None:
    s = sent(events)
    stored = [quarry(cluster, "queryMsgById", "-t", FIFO, "-i", s[w["name"]]["messageId"])[0] for w in FIFOS]  # (each found three ways above)
    assert len({(m["brokerName"], m["queueId"]) for m in stored}) == 1, [(m["brokerName"], m["queueId"]) for m in stored]
    offsets = [int(m["queueOffset"]) for m in stored]
    assert offsets == sorted(offsets) and len(set(offsets)) == 4
    assert all(props(m).get("__SHARDINGKEY") == "order-77" for m in stored)


def test_delayed_message_found_at_once_and_received_only_when_due(cluster: LocalCluster, events: list[dict[str, Any]]) -> None:
    d = sent(events)["d0"]
    m = found_three_ways(cluster, DELAY, spec("d0", "later"), d["messageId"])
    due_ms = int(props(m)["TIMER_DELIVER_MS"])
    assert 0 < due_ms - int(m["bornTimestamp"]) <= DELAY_MS + 1000, (due_ms, m["bornTimestamp"])
    (got,) = of(events, "received", DELAY)
    assert got["messageId"] == d["messageId"] and got["deliveryTimestamp"] == due_ms
    assert got["receivedAtMs"] >= due_ms, f"received {due_ms - got['receivedAtMs']} ms before its delivery time"


def test_transaction_commit_is_found_and_rollback_is_not(cluster: LocalCluster, events: list[dict[str, Any]]) -> None:
    s = sent(events)
    committed = found_three_ways(cluster, TX, spec("t-commit", "tx"), s["t-commit"]["messageId"])
    assert int(committed["sysFlag"]) & 0xC == 0x8  # TRANSACTION_COMMIT_TYPE
    assert quarry(cluster, "queryMsgByKey", "-t", TX, "-k", "t-rollback") == []
    assert quarry(cluster, "queryMsgByUniqueKey", "-t", TX, "-i", s["t-rollback"]["messageId"]) == []


def test_transaction_checker_answers_the_servers_check_of_an_orphaned_half(cluster: LocalCluster, events: list[dict[str, Any]]) -> None:
    """A half never ended is checked by the broker (RecoverOrphanedTransactionCommand over the
    producer's Telemetry stream); the TransactionChecker commits it: found, then consumed."""
    orphan = sent(events)["t-orphan"]
    assert [e["messageId"] for e in events if e.get("op") == "checked"] == [orphan["messageId"]]
    found_three_ways(cluster, TX, spec("t-orphan", "tx"), orphan["messageId"])
    consumed = sorted(e["name"] for e in of(events, "consumed", TX))
    assert consumed == ["t-commit", "t-orphan"]


def test_simple_consumer_receives_acks_and_changes_invisible_duration(events: list[dict[str, Any]]) -> None:
    s = sent(events)
    got = of(events, "received", NORMAL)
    acked = [e for e in got if e.get("acked")]
    assert sorted(e["name"] for e in acked) == sorted(w["name"] for w in NORMALS + ASYNCS)  # each once
    for e in acked:
        want = next(w for w in NORMALS + ASYNCS if w["name"] == e["name"])
        assert e["messageId"] == s[e["name"]]["messageId"] and e["body"] == want["body"] and e["tag"] == want["tag"]
        assert sorted(e["keys"]) == sorted(want["keys"]) and e["props"] == {"lang": "java 5.0.8", "name": e["name"]}
    hidden = [e for e in got if e["name"] == "n1"]
    assert [(e["attempt"], "invisibleChangedToMs" in e, bool(e.get("acked"))) for e in hidden] == [(1, True, False), (2, False, True)]
    assert 900 <= hidden[1]["receivedAtMs"] - hidden[0]["receivedAtMs"] < 15000  # after 1 s, not the 20 s first asked
    assert all(e["attempt"] == 1 for e in acked if e["name"] != "n1")


def test_push_consumer_consumes_every_message_once_and_redelivers_a_failure(events: list[dict[str, Any]]) -> None:
    got = of(events, "consumed", FIFO)
    ok = [e for e in got if e["result"] == "SUCCESS"]
    assert sorted(e["name"] for e in ok) == ["f0", "f1", "f2", "f3"], [(e["name"], e["result"]) for e in got]
    failed = [e for e in got if e["result"] == "FAILURE"]
    assert [(e["name"], e["attempt"]) for e in failed] == [("f0", 1)]
    (again,) = [e for e in ok if e["name"] == "f0"]
    assert again["attempt"] == 2 and again["receivedAtMs"] - failed[0]["receivedAtMs"] >= 900  # the group's first retry delay, 1 s
    assert all(e["group"] == "order-77" and e["props"] == {"lang": "java 5.0.8", "name": e["name"]} for e in got)
    assert all(e["bodySha256"] == hashlib.sha256(e["body"].encode()).hexdigest() for e in got)


# --- ACL (issue 35, item 6) ---

ACL_STEPS: list[dict[str, Any]] = [
    {"op": "send", "topic": "J5Acl", "messages": [spec("acl-ok")]},
    {"op": "send", "topic": "J5Payroll", "messages": [spec("acl-forbidden")]},
    {"op": "simple", "group": "J5AclGroup", "topic": "J5Acl", "want": 1, "deadlineMs": 15000},
    # no query permission on J5Secret: the consumer is refused
    {"op": "simple", "group": "J5AclGroup", "topic": "J5Secret", "want": 1, "deadlineMs": 5000},
    {"op": "send", "topic": "J5Acl", "accessKey": "alice", "secretKey": "wrong-secret", "messages": [spec("acl-forged")]},
]


def test_session_credentials_admitted_for_their_permissions_and_refused_beyond(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.e2e.rmq5_sdk import acl_cluster

    accounts = [{"access_key": "alice", "secret_key": "alice-secret",
                 "topics": {"J5Acl": ["publish", "query"], "J5Payroll": ["query"], "J5Secret": ["publish"]}}]
    with acl_cluster(tmp_path, monkeypatch, accounts, "127.0.0.104", "127.0.0.105") as c:
        assert c.router is not None
        plan = {"endpoints": c.router.address, "accessKey": "alice", "secretKey": "alice-secret", "topics": ["J5Acl"], "steps": ACL_STEPS}
        lines = java.run_driver("quarry.drivers.Client5", plan, flavor="rmq5", timeout_s=120, work_dir=tmp_path / "jvm")
        s = sent(lines)
        assert "error" not in s["acl-ok"], s["acl-ok"]
        forbidden = s["acl-forbidden"]
        assert forbidden.get("errorClass") == "ForbiddenException" and "alice" in forbidden["error"] and "J5Payroll" in forbidden["error"], forbidden
        # a wrong secret: the producer does not even start (its first QueryRoute is refused)
        forged = [e for e in lines if e.get("op") == "stepError" and e["step"] == 4]
        assert "acl-forged" not in s and forged, [e for e in lines if e.get("op") == "stepError"]
        assert forged[0]["errorClass"] == "UnauthorizedException" and "bad signature" in forged[0]["error"] and "alice" in forged[0]["error"], forged
        (received,) = of(lines, "received", "J5Acl")
        assert received["messageId"] == s["acl-ok"]["messageId"] and received.get("acked")
        refused = [e for e in lines if e.get("op") == "stepError" and e["step"] == 3]
        assert refused and refused[0]["errorClass"] == "ForbiddenException" and "J5Secret" in refused[0]["error"], refused or lines
        wait_until(lambda: quarry(c, "queryMsgByUniqueKey", "-t", "J5Acl", "-i", s["acl-ok"]["messageId"]), what="the admitted message indexed")
        assert quarry(c, "queryMsgByKey", "-t", "J5Acl", "-k", "acl-forged") == []
