"""quarry-console in a real browser (issue 37): Debian's Chromium driven headless by Playwright's
own driver (tests/console/drive.mjs, playwright-core pinned in tests/console/package-lock.json,
the system browser: no browser download), against a real cluster started here (a router, two
brokers, 10,000 messages and one sent with the RocketMQ 5 SDK) and a quarry-console process.

Search by each id kind and by key; browse three pages of a topic with a tag filter, every
message once; the histogram's counts equal the browse, and a drag zooms the window; the
message page; a pasted link reproduces the view; dead letters resent after the page's
confirmation and found under their topic by their new ids; the cluster page's store status,
queue offsets and a group's lag; the message page's trace timeline, copies and segment; a
killed broker shows the banner naming it (last: it stops a broker). Screenshots of each page
go to build/console-screenshots/ (ignored).
"""
from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from quarry.clients.admin import AdminClient
from quarry.clients.producer import Producer
from scripts.console_process import ConsoleProcess
from scripts.launcher import LocalCluster
from tests.e2e.conftest import wait_until

ROOT = Path(__file__).resolve().parents[2]
DRIVER = ROOT / "tests" / "console" / "drive.mjs"
PLAYWRIGHT = ROOT / "tests" / "console" / "node_modules" / "playwright-core" / "package.json"
CHROMIUM = os.environ.get("QUARRY_CHROMIUM", "/usr/bin/chromium")
SHOTS = ROOT / "build" / "console-screenshots"
TOPIC = "ConsoleOrders"
MESSAGES, BATCH = 10_000, 100
PAGE = 1000  # TagA is a quarter of the topic: 2,500 messages, three pages


def _tools() -> None:
    """The browser tests need node, Playwright's driver and Debian's Chromium: fail naming the one missing."""
    if shutil.which("node") is None:
        pytest.fail("node (Node.js) not found: the console's browser tests drive Chromium with Playwright from node")
    if not PLAYWRIGHT.exists():
        pytest.fail(f"playwright-core not installed at {PLAYWRIGHT.parent}: run `make console-browser` (npm ci in tests/console)")
    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail(f"{CHROMIUM} not found: run `make console-browser` (scripts/ensure_chromium.sh installs Debian's chromium)")


def drive(console: ConsoleProcess, *steps: dict[str, Any], timeout_s: float = 240, chromium_args: list[str] | None = None) -> list[dict[str, Any]]:
    scenario = {"base": console.url, "shots": str(SHOTS), "steps": list(steps), "chromiumArgs": chromium_args or []}
    done = subprocess.run(["node", str(DRIVER), json.dumps(scenario)], capture_output=True, text=True, timeout=timeout_s, cwd=DRIVER.parent)
    assert done.returncode == 0, f"drive.mjs failed ({done.returncode}):\n{done.stderr[-4000:]}\nconsole log:\n{console.log_tail(40)}"
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["errors"] == [], f"errors in the page: {out['errors']}"
    return list(out["results"])


class World:
    cluster: LocalCluster
    console: ConsoleProcess
    sent: list[Any]  # SendResults, in order
    tags: list[str]
    v5_id: str
    browse_pages: list[dict[str, Any]]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    _tools()
    SHOTS.mkdir(parents=True, exist_ok=True)
    root = tmp_path_factory.mktemp("console")
    w = World()
    w.cluster = LocalCluster(root=root / "cluster")
    w.cluster.start_router()
    try:
        w.cluster.add_broker("broker-a", "127.0.0.71")
        w.cluster.add_broker("broker-b", "127.0.0.72")
        assert w.cluster.router is not None
        router = w.cluster.router.address
        w.sent, w.tags = [], []
        with Producer(router) as producer:
            for b in range(MESSAGES // BATCH):
                tag = ("TagA", "TagB", "TagC", "TagB")[b % 4]
                n0 = b * BATCH
                bodies = [json.dumps({"order": n, "customer": f"c-{n % 97}", "note": "paid"}).encode() for n in range(n0, n0 + BATCH)]
                w.sent += producer.send_batch(TOPIC, bodies, keys=[[f"order-{n}", f"customer-{n % 97}"] for n in range(n0, n0 + BATCH)], tags=tag)
                w.tags += [tag] * BATCH
        w.v5_id = _send_with_rocketmq5_sdk(router)
        w.cluster.wait_indexed()
        with AdminClient(router) as admin:  # the 5.x message is found by the router before the page asks for it
            wait_until(lambda: admin.query_by_unique_key(TOPIC, w.v5_id).messages, what="the RocketMQ 5 message indexed")
        w.console = ConsoleProcess(router, root / "logs" / "console.log").start()
        try:
            yield w
        finally:
            w.console.stop()
    finally:
        w.cluster.stop()


def _send_with_rocketmq5_sdk(router: str) -> str:
    from rocketmq import ClientConfiguration, Credentials, Message, Producer as Rmq5Producer

    producer = Rmq5Producer(ClientConfiguration(router, Credentials(), request_timeout=5), (TOPIC,))
    producer.startup()
    try:
        m = Message()
        m.topic, m.body, m.tag, m.keys = TOPIC, b'{"order": "rmq5-1", "note": "sent with the RocketMQ 5 SDK"}', "TagV5", "order-rmq5-1"
        return str(producer.send(m).message_id)
    finally:
        producer.shutdown()


def _q(url: str) -> dict[str, str]:
    return {k: v[0] for k, v in parse_qs(urlsplit(url).query).items()}


def test_the_search_box_takes_each_id_kind_and_a_key_and_says_which(world: World) -> None:
    one = world.sent[1234]
    steps = [
        {"do": "search", "q": one.offset_msg_id, "shot": "search-offsetmsgid"},
        {"do": "search", "q": one.msg_id},  # a 4.x unique key, no topic: every topic searched
        {"do": "search", "q": world.v5_id, "topic": TOPIC, "shot": "search"},
        {"do": "search", "q": "order-4321", "topic": TOPIC},
        {"do": "search", "q": "order-4321"},  # a key without a topic: 400 naming the field
    ]
    by_id, by_uid, by_v5, by_key, no_topic = drive(world.console, *steps)
    assert by_id["kind"] == "offsetMsgId" and [r["offsetMsgId"] for r in by_id["rows"]] == [one.offset_msg_id]
    assert by_uid["kind"] == "uniqueKey" and [r["uniqueKey"] for r in by_uid["rows"]] == [one.msg_id]
    assert by_v5["kind"] == "uniqueKeyV5" and [r["uniqueKey"] for r in by_v5["rows"]] == [world.v5_id]
    assert by_v5["rows"][0]["keys"] == "order-rmq5-1"
    assert by_key["kind"] == "key" and [r["offsetMsgId"] for r in by_key["rows"]] == [world.sent[4321].offset_msg_id]
    assert _q(by_key["url"]) == {"q": "order-4321", "topic": TOPIC}  # the URL holds the query
    assert [b["kind"] for b in no_topic["banners"]] == ["error"] and "(topic)" in no_topic["banners"][0]["text"]
    # times to the millisecond, the zone shown
    assert "UTC" in by_id["zone"] and len(by_id["rows"][0]["time"]) == len("2026-01-01 00:00:00.000")


def test_three_pages_of_a_tag_filtered_browse_hold_every_message_once_and_the_histogram_counts_them(world: World) -> None:
    (browse,) = drive(world.console, {"do": "browse", "path": f"/browse?topic={TOPIC}&tags=TagA&order=oldest&pageSize={PAGE}", "pages": 5,
                                      "zoom": True, "shot": "browse"})
    pages = browse["pages"]
    world.browse_pages = pages
    assert [len(p["rows"]) for p in pages] == [1000, 1000, 500]
    rows = [r for p in pages for r in p["rows"]]
    ids = [r["offsetMsgId"] for r in rows]
    expected = {s.offset_msg_id for s, tag in zip(world.sent, world.tags) if tag == "TagA"}
    assert len(ids) == len(set(ids)) == 2500 and set(ids) == expected
    assert {r["tags"] for r in rows} == {"TagA"}
    assert [r["storeMs"] for r in rows] == sorted(r["storeMs"] for r in rows)  # oldest first
    assert all(p["banners"] == [] or all(b["kind"] == "note" for b in p["banners"]) for p in pages)
    first = _q(pages[0]["url"])  # the window the console fixed is in the URL, the same on every page
    assert all(_q(p["url"])["begin"] == first["begin"] and _q(p["url"])["end"] == first["end"] for p in pages)
    # the histogram: exact, and each interval holds the browse's messages of that interval
    h = browse["histogram"]
    assert h["done"] == "true" and h["total"] == 2500 and "not sampled" in h["status"]
    assert sum(b["count"] for b in h["bars"]) == 2500
    assert [b["count"] for b in h["bars"]] == [sum(1 for r in rows if b["from"] <= r["storeMs"] <= b["to"]) for b in h["bars"]]
    # drag to zoom: the window becomes the dragged part, its count the browse's messages there
    zoom = browse["zoom"]
    z = _q(zoom["url"])
    lo, hi = int(z["begin"]), int(z["end"])
    assert int(first["begin"]) < lo < hi < int(first["end"])
    inside = [r for r in rows if lo <= r["storeMs"] <= hi]
    assert zoom["total"] == len(inside) and {r["offsetMsgId"] for r in zoom["rows"]} <= {r["offsetMsgId"] for r in inside}


def test_a_pasted_link_reproduces_the_view(world: World) -> None:
    page2 = world.browse_pages[1]
    one = world.sent[77]
    pasted, searched = drive(world.console, {"do": "paste", "url": page2["url"], "table": "browse-table", "path": "browse"},
                             {"do": "paste", "url": f"{world.console.url}/search?q={one.msg_id}&topic={TOPIC}", "table": "search-table"})
    assert pasted["url"] == page2["url"] and [r["offsetMsgId"] for r in pasted["rows"]] == [r["offsetMsgId"] for r in page2["rows"]]
    assert [r["offsetMsgId"] for r in searched["rows"]] == [one.offset_msg_id]


def test_the_message_page_shows_every_field_the_body_three_ways_and_where_it_is_stored(world: World) -> None:
    one = world.sent[2000]  # TagA (batch 20)
    with AdminClient(world.console.router) as admin:
        m = admin.query_by_id(one.offset_msg_id).messages[0]
    path = f"/message?topic={TOPIC}&broker={m.broker_name}&queue={m.queue_id}&offset={m.queue_offset}"
    (page,) = drive(world.console, {"do": "message", "path": path, "shot": "message"})
    f = page["fields"]
    assert f["offsetMsgId"] == one.offset_msg_id and f["uniqueKey"] == one.msg_id and f["tags"] == "TagA"
    assert f["keys"] == "order-2000 customer-60" and f["queueOffset"] == str(m.queue_offset) and f["brokerName"] == m.broker_name
    assert f["storeTimestamp"].endswith(f"({m.store_timestamp})")
    assert page["properties"]["UNIQ_KEY"] == one.msg_id and page["properties"]["TAGS"] == "TagA"
    assert json.loads(page["body"]["text"]) == {"order": 2000, "customer": "c-60", "note": "paid"}
    assert '\n  "order": 2000' in page["body"]["json"]  # pretty
    assert page["body"]["hex"].startswith("00000000  7b 22 6f 72")
    assert base64.b64decode(page["downloaded"]) == m.body
    assert f"broker {m.broker_name}" in page["stored"] and f"queue {m.queue_id} at queue offset {m.queue_offset}" in page["stored"]


def test_the_cluster_page_lists_the_brokers(world: World) -> None:
    (page,) = drive(world.console, {"do": "view", "path": "/cluster", "wait": "#brokers"})
    assert page["banners"] == []


# ---- dead letters, cluster status, trace and copies (issue 37, part A) ----------------------------

DLQ_TOPIC, DLQ_GROUP, LAG_GROUP = "ConsoleDlq", "GConsoleDead", "GConsoleLag"
C, F = "\x01", "\x02"  # RocketMQ's trace text separators


def _remoting(addr: str, code: int, fields: dict[str, Any]) -> Any:
    import asyncio

    from tests.remoting_client import RemotingClient

    async def call() -> Any:
        async with RemotingClient(addr) as c:
            return await c.call(code, fields)

    return asyncio.run(call())


@pytest.fixture(scope="module")
def history(world: World) -> dict[str, Any]:
    """Two messages dead-lettered by the broker itself (a 4.x consumer's send-back past its
    retries), a group with committed offsets behind the log, a message with a trace, and a
    unique key sent twice."""
    from quarry.formats import offset_msg_id
    from quarry.services.remoting import codes

    router = world.console.router
    out: dict[str, Any] = {}
    t0 = int(time.time() * 1000)  # the trace's times (only their order is checked): recent, as a real trace's
    with Producer(router) as producer:
        dead = [producer.send(DLQ_TOPIC, f'{{"payment": {i}}}'.encode(), keys=[f"pay-{i}"], tags="Failing", properties={"color": "red"}) for i in range(2)]
        uid = dead[0].msg_id
        twice = [producer.send(TOPIC, b'{"order": "twice"}', keys=["order-twice"], tags="TagT", unique_key="0A0000990000000000000000000000AA") for _ in range(2)]
        stored_at = offset_msg_id.decode(dead[0].offset_msg_id)  # the Pub context's store host, as a producer traces it
        trace_body = (C.join(["Pub", str(t0), "DefaultRegion", "PG-pay", DLQ_TOPIC, uid, "Failing",
                              "pay-0", f"{stored_at.ip}:{stored_at.port}", "14", "6", "0", dead[0].offset_msg_id, "true"]) + F
                      + C.join(["SubBefore", str(t0 + 877), "DefaultRegion", DLQ_GROUP, "r1", uid, "0", "pay-0"]) + F
                      + C.join(["SubAfter", "r1", uid, "15", "false", "pay-0", "0", str(t0 + 892), DLQ_GROUP]) + F)
        producer.send("RMQ_SYS_TRACE_TOPIC", trace_body.encode(), keys=[uid, "pay-0"])
    with AdminClient(router) as admin:
        brokers = {b.broker_name: b for b in admin.brokers()}
    for r in dead:  # CONSUMER_SEND_MSG_BACK with delay level -1: straight to %DLQ%<group>, as send_back.py stores it
        remoting = brokers[r.message_queue.broker_name].remoting_addr
        sent_back = _remoting(remoting, codes.CONSUMER_SEND_MSG_BACK, {"group": DLQ_GROUP, "offset": offset_msg_id.decode(r.offset_msg_id).offset,
                                                                      "delayLevel": -1, "originMsgId": r.msg_id, "originTopic": DLQ_TOPIC, "maxReconsumeTimes": 16})
        assert sent_back.code == codes.SUCCESS, sent_back.remark
    # a group that committed offset 10 on queue 0 of broker-a: its lag is what follows
    a = world.cluster.brokers["broker-a"].commitlog.remoting_address
    done = _remoting(a, codes.UPDATE_CONSUMER_OFFSET, {"consumerGroup": LAG_GROUP, "topic": TOPIC, "queueId": 0, "commitOffset": 10})
    assert done.code == codes.SUCCESS, done.remark
    world.cluster.wait_indexed()
    with AdminClient(router) as admin:
        wait_until(lambda: len(admin.browse_topic(f"%DLQ%{DLQ_GROUP}", oldest_first=True, max_num=10).messages) == 2, what="both dead letters browsable")
        wait_until(lambda: admin.query_by_key("RMQ_SYS_TRACE_TOPIC", uid).messages, what="the trace indexed")
        wait_until(lambda: len(admin.query_by_unique_key(TOPIC, twice[0].msg_id, return_all=True).messages) == 2, what="both copies indexed")
        out["lag_max"] = admin.search_offset(TOPIC, "broker-a", 0, 0).max_queue_offset
        out["twice_stored"] = [admin.query_by_id(t.offset_msg_id).messages[0] for t in twice]
        out["dead_stored"] = admin.query_by_id(dead[0].offset_msg_id).messages[0]
        out["dead_letters"] = admin.browse_topic(f"%DLQ%{DLQ_GROUP}", oldest_first=True, max_num=10).messages
    out.update(dead=dead, twice=twice, uid=uid)
    return out


def test_dead_letters_are_resent_after_confirmation_and_found_under_their_topic(world: World, history: dict[str, Any]) -> None:
    # the console has no account of its own: a resend is sent as the operator who logged in
    # (routers without ACL accept any account's signed call)
    _, page = drive(world.console, {"do": "login", "accessKey": "operator", "secretKey": "any"},
                    {"do": "dlq", "path": f"/browse?topic=%25DLQ%25{DLQ_GROUP}&order=oldest", "shot": "dead-letters"})
    assert sorted(r["keys"] for r in page["rows"]) == ["pay-0", "pay-1"]
    assert [p["toTopic"] for p in page["plan"]] == [DLQ_TOPIC, DLQ_TOPIC] and all(p["refused"] == "" for p in page["plan"])
    assert page["resentBeforeConfirm"] == 0  # the plan is shown first; nothing sent until confirmed
    assert page["done"]["resent"] == "2" and len(page["results"]) == 2
    new = {r["newMsgId"]: r for r in page["results"]}
    dead_ids = {r["offsetMsgId"] for r in page["rows"]}
    assert {r["offsetMsgId"] for r in page["results"]} == dead_ids and all(r["toTopic"] == DLQ_TOPIC for r in page["results"])
    assert not set(new) & {d.msg_id for d in history["dead"]}  # each resend has its own new id
    with AdminClient(world.console.router) as admin:
        for msg_id, r in new.items():  # found under the original topic, by its new id, with body and keys kept
            found = wait_until(lambda: admin.query_by_unique_key(DLQ_TOPIC, msg_id).messages, what=f"resend {msg_id} found under {DLQ_TOPIC}")
            m = found[0]
            assert m.topic == DLQ_TOPIC and m.offset_msg_id == r["newOffsetMsgId"] and m.properties["RESENT_FROM"] in dead_ids
            assert m.keys[0] in ("pay-0", "pay-1") and m.properties["color"] == "red" and "RETRY_TOPIC" not in m.properties
        # the plan sent nothing and the confirmation sent each once: the topic holds the two
        # messages first sent and the two resends, no more; the dead letters stay where they were
        held = admin.browse_topic(DLQ_TOPIC, oldest_first=True, max_num=100).messages
        assert sorted(m.offset_msg_id for m in held) == sorted([d.offset_msg_id for d in history["dead"]] + [r["newOffsetMsgId"] for r in new.values()])
        assert sorted(m.offset_msg_id for m in admin.browse_topic(f"%DLQ%{DLQ_GROUP}", oldest_first=True, max_num=100).messages) == sorted(dead_ids)
    (found_page,) = drive(world.console, {"do": "search", "q": next(iter(new)), "topic": DLQ_TOPIC})
    assert [r["uniqueKey"] for r in found_page["rows"]] == [next(iter(new))]


def test_the_cluster_page_shows_store_status_queue_offsets_and_consumer_lag(world: World, history: dict[str, Any]) -> None:
    def written() -> dict[str, int]:
        with AdminClient(world.console.router) as admin:
            return {b.broker_name: sum(g.written_bytes for g in admin.broker_status(b.commitlog_addr).segments) for b in admin.brokers()}

    before = written()
    (page,) = drive(world.console, {"do": "cluster", "shot": "cluster"})
    after = written()
    assert page["banners"] == []
    stores = {s["broker"]: s for s in page["stores"]}
    assert set(stores) == {"broker-a", "broker-b"} and all(s["damaged"] == "0" and s["expiredTo"] == "" for s in stores.values())
    assert all(0 < before[b] <= int(s["writtenBytes"]) <= after[b] for b, s in stores.items()), (before, stores, after)
    assert all(int(s["indexLagBytes"]) >= 0 for s in stores.values())
    lag = [g for g in page["groups"] if g["group"] == LAG_GROUP]
    assert lag == [{"group": LAG_GROUP, "topic": TOPIC, "source": "offset", "lag": str(history["lag_max"] - 10)}]
    assert {(d["topic"], d["messages"]) for d in page["deadLetters"]} == {(f"%DLQ%{DLQ_GROUP}", "2")}
    q = {(r["topic"], r["broker"], r["queue"]): r for r in page["queues"]}
    assert q[(TOPIC, "broker-a", "0")]["max"] == str(history["lag_max"]) and q[(TOPIC, "broker-a", "0")]["min"] == "0"


def test_the_message_page_shows_the_trace_timeline_its_copies_and_its_segment(world: World, history: dict[str, Any]) -> None:
    m = history["dead_stored"]
    path = f"/message?topic={DLQ_TOPIC}&broker={m.broker_name}&queue={m.queue_id}&offset={m.queue_offset}"
    (page,) = drive(world.console, {"do": "history", "path": path, "shot": "message-trace"})
    assert [(t["type"], t["group"], t["success"]) for t in page["timeline"]] == [
        ("Pub", "PG-pay", "true"), ("SubBefore", DLQ_GROUP, "true"), ("SubAfter", DLQ_GROUP, "false")]
    # its copies: the message and its dead letter keep its unique key, each linked, this one marked
    (dead_letter,) = [d for d in history["dead_letters"] if d.unique_key == history["uid"]]
    assert sorted((r["offsetMsgId"], r["this"]) for r in page["copies"]) == sorted([(m.offset_msg_id, "true"), (dead_letter.offset_msg_id, "")])
    assert {r["uniqueKey"] for r in page["copies"]} == {history["uid"]} and {r["topic"] for r in page["copies"]} == {DLQ_TOPIC, f"%DLQ%{DLQ_GROUP}"}
    assert all(r["href"].startswith("/message?") for r in page["copies"])
    assert page["copiesParts"] == ["copies-count", "copies-table"]  # the count and the table, nothing else (no stray "null")
    assert "Segment file 00000000000000000000, at byte " + str(m.commit_log_offset) in page["stored"]
    twice = history["twice_stored"][0]
    path = f"/message?topic={TOPIC}&broker={twice.broker_name}&queue={twice.queue_id}&offset={twice.queue_offset}"
    (sent_twice,) = drive(world.console, {"do": "history", "path": path})
    assert sorted(r["offsetMsgId"] for r in sent_twice["copies"]) == sorted(t.offset_msg_id for t in history["twice"])
    assert sent_twice["timeline"] == [] and "No trace of" in sent_twice["traceText"]


def test_a_killed_broker_shows_the_banner_naming_it(world: World) -> None:
    """Last: it stops broker-b for good."""
    broker = world.cluster.brokers["broker-b"]
    broker.commitlog.kill()
    broker.indexer.kill()
    first = _q(world.browse_pages[0]["url"])
    path = f"/browse?topic={TOPIC}&tags=TagA&order=oldest&pageSize={PAGE}&begin={first['begin']}&end={first['end']}"
    (page,) = drive(world.console, {"do": "view", "path": path, "wait": "#browse-summary", "table": "browse-table", "shot": "browse-incomplete"})
    incomplete = [b for b in page["banners"] if b["kind"] == "incomplete"]
    assert len(incomplete) == 1 and incomplete[0]["brokers"] == "broker-b", page["banners"]
    assert "broker-b did not answer" in incomplete[0]["text"] and "Retry this page" in incomplete[0]["text"]
    assert {r["broker"] for r in page["rows"]} <= {"broker-a"}
