"""Apache RocketMQ 4.9.8's own Java consumers against a real Quarry cluster (issue 35, item 2): the
router's remoting port as namesrvAddr, two commitlogs as brokers. Messages are sent by Quarry's
own client and by RocketMQ's DefaultMQProducer; tests/java/src/main/java/quarry/drivers/Consumer4.java
runs the consumers, one JVM per scenario group, and prints each delivery as a JSON line.

- push: DefaultMQPushConsumer clustering (every message once, a tag subscription only its
  tags, a compressed body intact), broadcasting (every consumer every message), orderly (the
  broker's queue locks; each queue in order), two consumers of one group sharing the queues
  (each message once), and a SQL92 subscription refused with RocketMQ's own error.
- retry: a failing listener's messages sent back (CONSUMER_SEND_MSG_BACK) to %RETRY%<group>,
  redelivered after RocketMQ's delay levels, and to %DLQ%<group> after maxReconsumeTimes.
- restart and lite pull: a consumer restarted (a new JVM) resumes from its committed offsets;
  DefaultLitePullConsumer with assign and seek."""
from __future__ import annotations

import time
from collections import Counter
from typing import Any, Iterator

import pytest

from quarry.clients.admin import AdminClient
from quarry.clients.producer import Producer
from scripts.launcher import LocalCluster
from tests.e2e import java
from tests.e2e.conftest import wait_until

BROKERS = {"broker-a": "127.0.0.101", "broker-b": "127.0.0.102"}
TOPIC, ORDER_TOPIC, REB_TOPIC = "JConsumeTopic", "JOrderTopic", "JRebalanceTopic"
RETRY_TOPIC_, RESTART_TOPIC = "JRetryTopic", "JRestartTopic"
SQL92_REFUSED = "The broker does not support consumer to filter message by SQL92"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = LocalCluster(root=tmp_path_factory.mktemp("java-consumer"),
                     indexer_args=["--hash-slots", "101", "--index-num", "4000", "--flush-interval-ms", "100"])
    with c.running(BROKERS):
        yield c


def ns(c: LocalCluster) -> str:
    assert c.router is not None
    return c.router.remoting_address


def quarry_send(c: LocalCluster, topic: str, names: list[str], tags: str | list[str] = "TagQ", pinned: list[str] = []) -> dict[str, Any]:
    """Messages from Quarry's own client (the topic is made on each broker a first send reaches:
    both, from two messages on), then `pinned` all to one queue; their SendResults by key, once
    the router routes the topic there."""
    assert c.router is not None
    out = {}
    with Producer(c.router.address) as p:
        for i, name in enumerate(names):
            tag = tags[i % len(tags)] if isinstance(tags, list) else tags
            out[name] = p.send(topic, f"quarry body of {name}".encode(), keys=[name], tags=tag)
        for name in pinned:  # all to one queue: the first of the route
            out[name] = p.send(topic, f"quarry body of {name}".encode(), keys=[name], tags="TagP", selector=lambda qs, _: qs[0])
    with AdminClient(c.router.address) as admin:
        held = {r.message_queue.broker_name for r in out.values()}
        wait_until(lambda: held <= {b.broker_name for b in admin.topic_route(topic).brokers}, what=f"{topic} routed on {sorted(held)}")
    return out


def lines_of(lines: list[dict[str, Any]], kind: str, name: str | None = None) -> list[dict[str, Any]]:
    return [x for x in lines if kind in x and (name is None or x[kind] == name)]


def awaited_ok(lines: list[dict[str, Any]]) -> None:
    bad = [x for x in lines_of(lines, "awaited") + lines_of(lines, "settled") + lines_of(lines, "committed")
           if not x.get("ok", x.get("settled"))]
    assert bad == [], bad


# -- push consumers ------------------------------------------------------------------------------
JAVA_MSGS = [{"topic": TOPIC, "tags": ["TagA", "TagB", "TagC"][i % 3], "keys": [f"java-{i}"], "props": {"n": str(i)}, "body": f"java body {i}"}
             for i in range(9)]
JAVA_MSGS.append({"topic": TOPIC, "tags": "TagA", "keys": ["java-zip"], "bodyBytes": 6000})  # compressed by the client (over 4 KiB)
ORDER_MSGS = [{"topic": ORDER_TOPIC, "tags": "TagO", "keys": [f"order-{o}-{s}"], "orderKey": f"order-{o}", "body": f"step {s}"}
              for s in range(5) for o in range(3)]
REB_MSGS = [{"topic": REB_TOPIC, "tags": "TagR", "keys": [f"reb-{i}"], "body": f"rebalanced {i}"} for i in range(24)]


@pytest.fixture(scope="module")
def push_run(cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    quarry_sent = quarry_send(cluster, TOPIC, [f"quarry-{i}" for i in range(4)], ["TagA", "TagC"])
    quarry_send(cluster, ORDER_TOPIC, [f"order-pre-{i}" for i in range(2)])
    quarry_send(cluster, REB_TOPIC, [f"reb-pre-{i}" for i in range(4)])
    all_keys = sorted([*quarry_sent, *(m["keys"][0] for m in JAVA_MSGS)])
    tag_keys = sorted([k for k, r in quarry_sent.items() if int(k.split("-")[1]) % 2 == 0]
                      + [m["keys"][0] for m in JAVA_MSGS if m["tags"] in ("TagA", "TagB")])
    order_keys = sorted([f"order-pre-{i}" for i in range(2)] + [m["keys"][0] for m in ORDER_MSGS])
    reb_pre = [f"reb-pre-{i}" for i in range(4)]
    plan = {"namesrv": ns(cluster), "steps": [
        {"op": "send", "group": "PG_jc", "messages": JAVA_MSGS},
        {"op": "send", "group": "PG_jc_order", "messages": ORDER_MSGS},
        {"op": "push", "name": "all", "group": "G_all", "subscriptions": {TOPIC: "*"}},
        {"op": "push", "name": "tags", "group": "G_tags", "subscriptions": {TOPIC: "TagA || TagB"}},
        {"op": "push", "name": "bc1", "group": "G_bc", "model": "BROADCASTING", "subscriptions": {TOPIC: "*"}},
        {"op": "push", "name": "bc2", "group": "G_bc", "model": "BROADCASTING", "subscriptions": {TOPIC: "*"}},
        {"op": "push", "name": "ord", "group": "G_ord", "orderly": True, "subscriptions": {ORDER_TOPIC: "*"}},
        {"op": "push", "name": "sql", "group": "G_sql", "sql": {TOPIC: "n > 3"}},
        {"op": "push", "name": "r1", "group": "G_reb", "subscriptions": {REB_TOPIC: "*"}},
        {"op": "push", "name": "r2", "group": "G_reb", "subscriptions": {REB_TOPIC: "*"}},
        {"op": "settle", "consumers": ["r1", "r2"], "topic": REB_TOPIC},
        {"op": "awaitAny", "consumers": ["r1", "r2"], "keys": reb_pre},
        {"op": "send", "group": "PG_jc_reb", "messages": REB_MSGS},
        {"op": "awaitAny", "consumers": ["r1", "r2"], "keys": [m["keys"][0] for m in REB_MSGS]},
        {"op": "settle", "consumers": ["r1", "r2"], "topic": REB_TOPIC},
        {"op": "await", "consumers": ["all", "bc1", "bc2"], "keys": all_keys},
        {"op": "await", "consumers": ["tags"], "keys": tag_keys},
        {"op": "await", "consumers": ["ord"], "keys": order_keys},
        {"op": "committed", "consumer": "all", "topic": TOPIC},
        {"op": "shutdown", "consumers": ["all", "tags", "bc1", "bc2", "ord", "r1", "r2"]},
    ]}
    t0 = time.monotonic()
    lines = java.run_driver("quarry.drivers.Consumer4", plan, work_dir=tmp_path_factory.mktemp("java-consumer-push"), timeout_s=150)
    assert lines and lines[-1] == {"done": True}, lines[-5:]
    return {"lines": lines, "all_keys": all_keys, "tag_keys": tag_keys, "order_keys": order_keys, "reb_pre": reb_pre,
            "quarry_sent": quarry_sent, "seconds": time.monotonic() - t0}


def consumed(lines: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return lines_of(lines, "consumed", name)


def test_every_message_is_consumed_once_by_a_clustering_consumer(push_run: dict[str, Any]) -> None:
    lines = push_run["lines"]
    awaited_ok(lines)
    sent = {x["sent"]: x for x in lines_of(lines, "sent")}
    assert [x for x in sent.values() if x["status"] != "SEND_OK"] == []
    got = consumed(lines, "all")
    assert Counter(x["key"] for x in got) == Counter(push_run["all_keys"])  # each once: none twice
    assert {x["result"] for x in got} == {"OK"} and {x["brokerName"] for x in got} == set(BROKERS)
    by_key = {x["key"]: x for x in got}
    for key, s in sent.items():
        if s["topic"] == TOPIC:
            assert (by_key[key]["msgId"], by_key[key]["bodySha256"]) == (s["msgId"], s["bodySha256"]), key  # the compressed one too
            assert (by_key[key]["brokerName"], by_key[key]["queueId"], by_key[key]["queueOffset"]) == (s["brokerName"], s["queueId"], s["queueOffset"])
    for key, r in push_run["quarry_sent"].items():
        assert by_key[key]["msgId"] == r.msg_id and by_key[key]["tags"] in ("TagA", "TagC")
    assert by_key["java-4"]["props"]["n"] == "4" and by_key["java-4"]["tags"] == "TagB"


def test_a_tag_subscription_delivers_only_its_tags(push_run: dict[str, Any]) -> None:
    got = consumed(push_run["lines"], "tags")
    assert Counter(x["key"] for x in got) == Counter(push_run["tag_keys"])
    assert {x["tags"] for x in got} == {"TagA", "TagB"}


def test_broadcasting_consumers_each_get_every_message_once(push_run: dict[str, Any]) -> None:
    for name in ("bc1", "bc2"):
        assert Counter(x["key"] for x in consumed(push_run["lines"], name)) == Counter(push_run["all_keys"]), name


def test_an_orderly_consumer_locks_its_queues_and_consumes_each_in_order(push_run: dict[str, Any]) -> None:
    """MessageListenerOrderly consumes only from queues the broker locked for it (LOCK_BATCH_MQ):
    every message once, each queue in offset order, each order key's steps in sequence."""
    got = consumed(push_run["lines"], "ord")
    assert Counter(x["key"] for x in got) == Counter(push_run["order_keys"])
    by_queue: dict[tuple[str, int], list[int]] = {}
    for x in got:
        by_queue.setdefault((x["brokerName"], x["queueId"]), []).append(x["queueOffset"])
    assert all(offsets == sorted(offsets) for offsets in by_queue.values()), by_queue
    sent_queue = {x["sent"]: (x["brokerName"], x["queueId"]) for x in lines_of(push_run["lines"], "sent") if x["topic"] == ORDER_TOPIC}
    for o in range(3):
        steps = [x["key"] for x in got if x["key"].startswith(f"order-{o}-")]
        assert steps == [f"order-{o}-{s}" for s in range(5)], steps
        assert len({sent_queue[k] for k in steps}) == 1  # one order key, one queue


def test_two_consumers_of_one_group_share_the_queues_and_none_is_consumed_twice(push_run: dict[str, Any]) -> None:
    lines = push_run["lines"]
    settled = lines_of(lines, "settled")
    assert settled and all(s["settled"] for s in settled), settled
    held = settled[0]["held"]
    assert held["r1"] and held["r2"] and not set(held["r1"]) & set(held["r2"])  # both hold queues, none both
    got = consumed(lines, "r1") + consumed(lines, "r2")
    reb = [x for x in got if not x["key"].startswith("reb-pre-")]
    assert Counter(x["key"] for x in reb) == Counter(m["keys"][0] for m in REB_MSGS)  # each once, while both are healthy
    assert {x["consumed"] for x in reb} == {"r1", "r2"}
    for x in reb:
        assert f"{x['brokerName']}/{x['queueId']}" in held[x["consumed"]], x
    assert set(push_run["reb_pre"]) <= {x["key"] for x in got}


def test_a_sql92_subscription_is_refused_with_rocketmqs_error(push_run: dict[str, Any]) -> None:
    """A RocketMQ broker without enablePropertyFilter answers the consumer's CHECK_CLIENT_CONFIG
    with SYSTEM_ERROR and this remark, and DefaultMQPushConsumer.start() throws it."""
    (refused,) = lines_of(push_run["lines"], "startError", "sql")
    assert refused["code"] == 1 and refused["remark"] == SQL92_REFUSED, refused
    assert lines_of(push_run["lines"], "started", "sql") == [] and consumed(push_run["lines"], "sql") == []


# -- a failing listener: retried with delay levels, then dead-lettered ------------------------------
@pytest.fixture(scope="module")
def retry_run(cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    quarry_send(cluster, RETRY_TOPIC_, ["fine-0"])
    msgs = [{"topic": RETRY_TOPIC_, "tags": "TagF", "keys": [k], "body": f"body of {k}", "props": {"kind": k}} for k in ("retry-once", "poison")]
    plan = {"namesrv": ns(cluster), "steps": [
        {"op": "send", "group": "PG_jc_retry", "messages": msgs},
        # retry-once fails once, retried at the broker's level (3 + reconsume times: 10 s); poison
        # always fails, asking level 1 (1 s): after maxReconsumeTimes (2) retries it is dead.
        {"op": "push", "name": "f", "group": "G_retry", "subscriptions": {RETRY_TOPIC_: "*"}, "maxReconsumeTimes": 2,
         "fail": {"retry-once": {"times": 1}, "poison": {"times": 99, "delayLevel": 1}}},
        {"op": "await", "consumers": ["f"], "keys": ["fine-0", "retry-once"], "timeoutMs": 40000},
        {"op": "awaitDeliveries", "consumer": "f", "key": "poison", "count": 3},
        {"op": "shutdown", "consumers": ["f"]},
    ]}
    t0 = time.monotonic()
    # A new group's retry topic is made by its first heartbeat, after the consumer looked its
    # routes up: found by the next route poll (1 s in the driver) and pulled from the next
    # rebalance, every 20 s by default; every second here, as -D lets a client ask.
    lines = java.run_driver("quarry.drivers.Consumer4", plan, work_dir=tmp_path_factory.mktemp("java-consumer-retry"), timeout_s=120,
                            jvm_args=["-Drocketmq.client.rebalance.waitInterval=1000"])
    assert lines and lines[-1] == {"done": True}, lines[-5:]
    return {"lines": lines, "seconds": time.monotonic() - t0}


def test_a_failed_message_is_redelivered_after_its_delay_level(retry_run: dict[str, Any]) -> None:
    lines = retry_run["lines"]
    awaited_ok(lines)
    sent = {x["sent"]: x for x in lines_of(lines, "sent")}
    got = [x for x in consumed(lines, "f") if x["key"] == "retry-once"]
    assert [(x["result"], x["reconsumeTimes"]) for x in got] == [("FAIL", 0), ("OK", 1)], got
    first, again = got
    assert again["topic"] == RETRY_TOPIC_ and again["msgId"] == first["msgId"] == sent["retry-once"]["msgId"]  # the client's msgId kept
    props = again["props"]
    assert (props["RETRY_TOPIC"], props["ORIGIN_MESSAGE_ID"], props["DELAY"], props["kind"]) == (
        RETRY_TOPIC_, sent["retry-once"]["offsetMsgId"], "3", "retry-once"), props
    assert props["REAL_TOPIC"] == "%RETRY%G_retry"  # it came through the group's retry topic
    assert again["storeTimestamp"] >= first["at"] + 10_000 - 50, (again["storeTimestamp"] - first["at"])  # level 3: 10 s
    assert [x["key"] for x in consumed(lines, "f") if x["key"] == "fine-0"] == ["fine-0"]


def test_a_message_failing_past_max_reconsume_times_goes_to_the_dlq(cluster: LocalCluster, retry_run: dict[str, Any]) -> None:
    lines = retry_run["lines"]
    sent = {x["sent"]: x for x in lines_of(lines, "sent")}
    got = [x for x in consumed(lines, "f") if x["key"] == "poison"]
    assert [(x["result"], x["reconsumeTimes"]) for x in got] == [("FAIL", 0), ("FAIL", 1), ("FAIL", 2)], got
    assert [x["props"].get("DELAY") for x in got[1:]] == ["1", "1"]  # the level the listener asked
    for before, after in zip(got, got[1:]):
        assert after["storeTimestamp"] >= before["at"] + 1000 - 50
    assert cluster.router is not None
    with AdminClient(cluster.router.address) as admin:
        found = wait_until(lambda: admin.query_by_key("%DLQ%G_retry", "poison").messages, timeout_s=30, what="poison in %DLQ%G_retry")
    (dead,) = found  # type: ignore[misc]
    assert (dead.topic, dead.unique_key, dead.reconsume_times, dead.body) == ("%DLQ%G_retry", sent["poison"]["msgId"], 3, b"body of poison")
    assert (dead.properties["RETRY_TOPIC"], dead.properties["ORIGIN_MESSAGE_ID"], dead.properties["DELAY"]) == (
        RETRY_TOPIC_, sent["poison"]["offsetMsgId"], "0")
    assert not dead.scheduled


# -- a restarted consumer resumes; lite pull with assign and seek ------------------------------------
@pytest.fixture(scope="module")
def restart_run(cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    first = quarry_send(cluster, RESTART_TOPIC, [f"first-{i}" for i in range(8)])
    t0 = time.monotonic()
    before = java.run_driver("quarry.drivers.Consumer4", {"namesrv": ns(cluster), "steps": [
        {"op": "push", "name": "a", "group": "G_restart", "subscriptions": {RESTART_TOPIC: "*"}},
        {"op": "await", "consumers": ["a"], "keys": sorted(first)},
        {"op": "committed", "consumer": "a", "topic": RESTART_TOPIC},
        {"op": "shutdown", "consumers": ["a"]},
    ]}, work_dir=tmp_path_factory.mktemp("java-consumer-restart-1"))
    second = quarry_send(cluster, RESTART_TOPIC, [f"second-{i}" for i in range(8)], pinned=[f"pinned-{i}" for i in range(6)])
    # The lite pull: one queue read from a chosen offset (the others at their end), then from 0.
    every = {**first, **second}
    q = every["pinned-0"].message_queue
    in_queue = sorted((r.queue_offset, k) for k, r in every.items() if (r.message_queue.broker_name, r.message_queue.queue_id) == (q.broker_name, q.queue_id))
    start = every["pinned-3"].queue_offset
    rounds = [{"seeks": [{"brokerName": q.broker_name, "queueId": q.queue_id, "offset": start}], "expect": sum(1 for o, _ in in_queue if o >= start)},
              {"seeks": [{"brokerName": q.broker_name, "queueId": q.queue_id, "offset": 0}], "expect": len(in_queue)}]
    after = java.run_driver("quarry.drivers.Consumer4", {"namesrv": ns(cluster), "steps": [
        {"op": "push", "name": "b", "group": "G_restart", "subscriptions": {RESTART_TOPIC: "*"}},
        {"op": "await", "consumers": ["b"], "keys": sorted(second)},
        {"op": "committed", "consumer": "b", "topic": RESTART_TOPIC},
        {"op": "shutdown", "consumers": ["b"]},
        {"op": "pull", "group": "G_lite", "topic": RESTART_TOPIC, "rounds": rounds},
    ]}, work_dir=tmp_path_factory.mktemp("java-consumer-restart-2"))
    assert before[-1] == after[-1] == {"done": True}
    return {"before": before, "after": after, "first": first, "second": second, "in_queue": in_queue, "start": start,
            "queue": (q.broker_name, q.queue_id), "seconds": time.monotonic() - t0}


def test_a_restarted_consumer_resumes_from_its_committed_offsets(restart_run: dict[str, Any]) -> None:
    before, after = restart_run["before"], restart_run["after"]
    awaited_ok(before)
    awaited_ok(after)
    assert Counter(x["key"] for x in consumed(before, "a")) == Counter(list(restart_run["first"]))
    assert Counter(x["key"] for x in consumed(after, "b")) == Counter(list(restart_run["second"]))  # nothing of the first again


def test_a_lite_pull_consumer_reads_an_assigned_queue_from_where_it_seeks(restart_run: dict[str, Any]) -> None:
    after = restart_run["after"]
    (assigned,) = lines_of(after, "assigned")
    assert assigned["assigned"] == 8  # 4 queues on each broker, all assigned
    assert lines_of(after, "seekError") == []
    polled = lines_of(after, "polled")
    assert [x for x in polled if x.get("extra")] == []
    broker, queue = restart_run["queue"]
    for r, lo in ((0, restart_run["start"]), (1, 0)):
        got = [(x["queueOffset"], x["polled"]) for x in polled if x["round"] == r]
        assert {(x["brokerName"], x["queueId"]) for x in polled if x["round"] == r} == {(broker, queue)}
        assert got == [(o, k) for o, k in restart_run["in_queue"] if o >= lo], (r, got)

