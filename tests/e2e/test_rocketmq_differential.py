"""RocketMQ and Quarry answering the same key queries over the same messages (issue 36, part 2).

One real NameServer and broker (Apache RocketMQ 4.9.7, tests/e2e/rocketmq_broker.py) stores
what RocketMQ 4.9.8's DefaultMQProducer sends (tests/java: Producer4); one Quarry cluster
follows that broker's store read-only with Quarry's own index. Then, for every key and every
unique key (msgId) sent, three answers:

* the real mqadmin 4.9.8 (`queryMsgByKey`, `queryMsgByUniqueKey -a`) with `-n` the broker's
  NameServer;
* the broker's raw QUERY_MESSAGE answer, before mqadmin's filter (the request as mqadmin's
  MQClientAPIImpl.queryMessage sends it, records decoded by tests/e2e/mqadmin.py), to show what
  the broker itself returned;
* Quarry's router (AdminClient), every page (continuation tokens).

The keys and the collisions are generated (tests/collisions.py), not hand-picked:

* the same key strings in two topics (no collision: RocketMQ and Quarry agree);
* keys of topic A whose index name `A#key` has the same Java hash as a key of topic B
  (`B#key`), and as a unique key of a message of topic B: the broker's IndexFile keeps hashes
  only, so it returns topic B's record for topic A's query, and mqadmin drops it again (its
  filter: the key among the record's KEYS, the msgId equal to the unique key);
* a message of topic B carrying both its own key and that colliding key of topic A: the broker
  returns it for topic A's key, with the key in its KEYS; mqadmin 4.9.8 drops it only because its
  filter also compares the topic (the broker never does);
* a key with 70 messages, and topic B keys colliding with it: the broker answers at most 64
  entries (maxMsgsNumBatch) counted before any filter, so mqadmin shows 64 of 70, or fewer when
  colliding entries take some of the 64 (here 60);
* a topic C key colliding with that 70-message key, sent before it: the broker's 64 newest
  entries are all topic A's, mqadmin's filter leaves none, and mqadmin says "no message" for a
  key whose two messages are stored; Quarry finds both.

Two more cases, each with messages of its own in topic D (not among the ones above):

* a unique key whose embedded time lies after its message's store time (a producer clock 5 s
  ahead; the UNIQ_KEY generated with MessageClientIDSetter's layout, formats/unique_key.py, and
  set by the producer, as a client may): mqadmin 4.9.8's queryMsgByUniqueKey searches [0,
  Long.MAX_VALUE] and finds it, but DefaultMQAdminExt.viewMessage(topic, msgId) (the clients'
  viewMessage(topic, msgId) too) searches only from getNearlyTimeFromID(msgId) - 1 s: the
  message's store time lies before that window and RocketMQ answers "no message"; Quarry's
  window for the id (services/query/unique_key_window.py: ±14 h of time zone, ±1 h of clock
  skew, the previous month's reading while this month's is not wholly past) holds it;
* a key query with a window given to the millisecond (DefaultMQAdminExt.queryMessage(topic, key,
  64, begin, end); mqadmin's queryMsgByKey takes no window): the broker's IndexFile keeps each
  entry's time as whole seconds since the file's beginTimestamp (IndexFile.putKey) and compares
  that, not the store time (selectPhyOffset), and nobody filters by store time after it. The
  window is chosen from the messages' store times as the broker stored them: it begins at a
  message's store time whose entry reads earlier (dropped although inside) and ends 1 ms before
  a message's whose entry reads inside (returned although outside); Quarry returns exactly the
  messages stored within the window.

What RocketMQ answers is predicted from the messages sent (the IndexFile's hash-only match,
newest first, 64 at most, then mqadmin's filter) and checked against both the broker's raw
answer and mqadmin's printout; Quarry's answer is checked against the truth (every message of
that topic with that key). Where they differ the test prints a table: the key, RocketMQ's
answer, Quarry's, and why Quarry's is right.
"""
from __future__ import annotations

import asyncio
import os
import random
import re
import struct
import time
import uuid
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Iterator

import pytest

from quarry.clients.admin import AdminClient
from quarry.clients.errors import NotFoundError
from quarry.formats import unique_key
from quarry.formats.java_hash import java_string_hash
from quarry.formats.offset_msg_id import decode as decode_offset_msg_id
from quarry.formats.properties import encode_properties
from quarry.formats.record import decode_record
from quarry.services.remoting import codes
from tests.remoting_client import RemotingClient
from scripts.launcher import LocalCluster, free_port
from tests.collisions import colliding_key
from tests.e2e import java
from tests.e2e import mqadmin as mqadmin_py
from tests.e2e.conftest import wait_until
from tests.e2e.rocketmq_broker import RocketMQ
from tests.e2e.test_rocketmq_broker_follow import _broker_ports

HOST, QUARRY_HOST = "127.0.0.131", "127.0.0.132"
BROKER = "broker-a"
TA, TB, TC, TD = "DiffTopicA", "DiffTopicB", "DiffTopicC", "DiffTopicD"
MANY = 70  # messages with one key: more than mqadmin's (and the broker's) 64
CAP = 64  # QueryMsgByKeySubCommand's maxNum, and the broker's maxMsgsNumBatch
UNIQUE_CAP = 32  # queryMessageByUniqKey's maxNum
PLAIN = 6
AHEAD_MS = 5000  # the producer's clock, ahead of the broker's, for the unique key's embedded time
ADMIN_QUERY = Path(__file__).resolve().parent / "AdminQuery4.java"


@dataclass
class Sent:
    topic: str
    keys: list[str]
    msg_id: str  # UNIQ_KEY
    offset_msg_id: str
    offset: int  # in the CommitLog
    queue_id: int
    queue_offset: int


@dataclass
class World:
    rmq: RocketMQ
    quarry: LocalCluster
    root: Path
    sent: list[Sent]
    roles: dict[str, tuple[str, str]]  # (topic, key) -> why it was generated


def _send(rmq: RocketMQ, messages: list[dict[str, Any]], work: Path, group: str, pause_ms: int = 0) -> list[Sent]:
    from quarry.formats.offset_msg_id import decode

    plan = {"namesrv": rmq.namesrv_addr, "group": group, "timeoutMs": 5000,
            "sends": [{"mode": "sync", "messages": messages, "pauseMs": pause_ms}]}
    lines = [x for x in java.run_driver("quarry.drivers.Producer4", plan, work_dir=work) if "send" in x]
    assert len(lines) == len(messages) and all(x.get("status") == "SEND_OK" for x in lines), [x for x in lines if x.get("status") != "SEND_OK"][:3]
    return [Sent(x["topic"], x["keys"].split(" "), x["msgId"], x["offsetMsgId"], decode(x["offsetMsgId"]).offset, int(x["queueId"]),
                 int(x["queueOffset"])) for x in lines]


def _msg(topic: str, keys: list[str], n: int) -> dict[str, Any]:
    return {"topic": topic, "tags": "TagD", "keys": keys, "body": f"differential {topic} {n}"}


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    root = tmp_path_factory.mktemp("rocketmq-differential")
    rmq = RocketMQ(root / "rocketmq", HOST, broker_name=BROKER, namesrv_port=free_port(HOST), broker_port=_broker_ports(HOST))
    quarry = LocalCluster(root=root / "quarry")
    try:
        rmq.start()
        quarry.start_router(host=QUARRY_HOST)
        quarry.add_broker(BROKER, QUARRY_HOST,
                          commitlog_args=["--store-dir", str(rmq.store), "--follow", "true", "--follow-interval-ms", "100",
                                          "--store-host", rmq.broker_addr, "--cq-units-per-file", "300", "--broker-name", BROKER],
                          indexer_args=["--flush-interval-ms", "100", "--hash-slots", "10007", "--index-num", "200000"])
        roles: dict[str, tuple[str, str]] = {}
        msgs: list[dict[str, Any]] = []
        # The same key strings in both topics: `A#k0` and `B#k0` hash apart; nobody errs.
        for n in range(PLAIN):
            msgs.append(_msg(TA, [f"k{n}", f"pair{n % 3}"], n))
        for n in range(PLAIN // 2):
            msgs.append(_msg(TB, [f"k{n}"], n))
        # Topic A keys colliding with topic B's keys (generated: same Java hash of the index name).
        for n in range(2):
            k = colliding_key(TA, f"{TB}#k{n}")
            roles[k] = ("cross-topic key collision", f"{TA}#{k} hashes as {TB}#k{n}")
            msgs.append(_msg(TA, [k], 100 + n))
        # A topic B message carrying its own key and the topic A key its own collides with.
        kx = colliding_key(TA, f"{TB}#x0")
        roles[kx] = ("cross-topic collision, other topic's KEYS hold the key", f"{TA}#{kx} hashes as {TB}#x0")
        msgs.append(_msg(TA, [kx], 200))
        msgs.append(_msg(TB, ["x0", kx], 201))
        # A topic C key colliding with the >64 key below, sent before it: its entries are older
        # than the 64 the broker answers.
        hidden = colliding_key(TC, f"{TA}#many")
        roles[hidden] = ("older than a colliding >64 key", f"{TC}#{hidden} hashes as {TA}#many, sent first")
        for n in range(2):
            msgs.append(_msg(TC, [hidden], 250 + n))
        # More than 64 messages with one key, then topic B keys colliding with it (newest entries).
        roles["many"] = ("more than 64 messages", f"{MANY} messages")
        for n in range(MANY):
            msgs.append(_msg(TA, ["many"], 300 + n))
        kc = colliding_key(TB, f"{TA}#many")
        roles[kc] = ("collides with a >64 key", f"{TB}#{kc} hashes as {TA}#many")
        for n in range(4):
            msgs.append(_msg(TB, [kc], 400 + n))
        sent = _send(rmq, msgs, root / "drivers", "PG_diff_1")
        # Unique keys collide too: topic A keys whose `A#key` hashes as topic B's `B#<msgId>`.
        second = []
        for s in [s for s in sent if s.topic == TB][:2]:
            k = colliding_key(TA, f"{TB}#{s.msg_id}")
            roles[k] = ("collides with a unique key", f"{TA}#{k} hashes as {TB}#{s.msg_id}")
            roles[s.msg_id] = ("unique key collided by a key", f"{TB}#{s.msg_id} hashes as {TA}#{k}")
            second.append(_msg(TA, [k], 500 + len(second)))
        sent += _send(rmq, second, root / "drivers", "PG_diff_2")
        last = sent[-1]
        wait_until(lambda: _broker_raw(rmq.broker_addr, last.topic, last.msg_id, True), timeout_s=30,
                   what="the broker's index holds the last message")
        assert quarry.router is not None
        with AdminClient(quarry.router.address) as admin:
            wait_until(lambda: _quarry_unique(admin, last.topic, last.msg_id) == {last.offset_msg_id}, timeout_s=30,
                       what="Quarry finds the last message")
        yield World(rmq, quarry, root, sent, roles)
    finally:
        quarry.stop()
        rmq.stop()


# -- what each side answers -----------------------------------------------------------------------
def _broker_raw(addr: str, topic: str, key: str, unique: bool, begin: int = 0, end: int = mqadmin_py.LONG_MAX) -> list[Any]:
    """The broker's own QUERY_MESSAGE answer as mqadmin requests it (MQClientAPIImpl.queryMessage:
    maxNum 64, or 32 for a unique key, over [0, Long.MAX_VALUE] unless given), its records before
    any filter. (The one broker's address directly: RocketMQ's NameServer routes in fastjson's
    {0:"addr"}.)"""
    async def ask() -> list[Any]:
        async with RemotingClient(addr) as broker:
            req = broker.request(codes.QUERY_MESSAGE, {"topic": topic, "key": key, "maxNum": UNIQUE_CAP if unique else CAP,
                                                       "beginTimestamp": begin, "endTimestamp": end})
            req.ext_fields[codes.UNIQUE_KEY_QUERY_FLAG] = "true" if unique else "false"
            resp = await broker.invoke(req)
        return mqadmin_py.decodes(resp.body) if resp.code == codes.SUCCESS else []
    return asyncio.run(asyncio.wait_for(ask(), 30))


def _quarry_keys(admin: AdminClient, topic: str, key: str) -> list[Any]:
    """Every page of Quarry's key answer."""
    try:
        r = admin.query_by_key(topic, key, max_num=CAP)
    except NotFoundError:
        return []
    pages = 1
    while r.next_token:
        r = r.extended(admin.query_by_key(topic, key, max_num=CAP, continuation_token=r.next_token))
        pages += 1
        assert pages < 20
    return list(r.messages)


def _quarry_unique(admin: AdminClient, topic: str, msg_id: str) -> set[str]:
    try:
        return {m.offset_msg_id for m in admin.query_by_unique_key(topic, msg_id, return_all=True).messages}
    except NotFoundError:
        return set()


def _index_hash(name: str) -> int:
    """IndexService.indexKeyHashMethod: abs(String.hashCode()), 0 for Integer.MIN_VALUE."""
    h = java_string_hash(name)
    h = h - (1 << 32) if h >= 1 << 31 else h
    return 0 if h == -(1 << 31) else abs(h)


def _predicted(world: World, topic: str, key: str, unique: bool) -> tuple[list[Sent], list[Sent]]:
    """RocketMQ's answer from the messages sent: the broker's (the IndexFile's entries whose hash
    is that of `topic#key`, newest first, at most 64 (32 for a unique key), whatever their topic
    or key), then mqadmin 4.9.8's filter (MQAdminImpl.queryMessage: the key among KEYS and the
    topic equal; for a unique key the msgId equal, the topic unchecked)."""
    want = _index_hash(f"{topic}#{key}")
    entries = []
    for s in world.sent:
        for name in [*(f"{s.topic}#{k}" for k in s.keys), f"{s.topic}#{s.msg_id}"]:
            if _index_hash(name) == want:
                entries.append(s)
    entries.sort(key=lambda s: -s.offset)
    broker = entries[:UNIQUE_CAP if unique else CAP]
    shown = [s for s in broker if (s.msg_id == key if unique else key in s.keys and s.topic == topic)]
    return broker, shown


def _truth(world: World, topic: str, key: str, unique: bool) -> list[Sent]:
    return [s for s in world.sent if s.topic == topic and (s.msg_id == key if unique else key in s.keys)]


@pytest.fixture(scope="module")
def answers(world: World) -> dict[tuple[str, str, bool], dict[str, Any]]:
    """For every (topic, key) and (topic, msgId) sent: mqadmin's printout, the broker's raw
    answer and Quarry's."""
    queries: list[tuple[str, str, bool]] = []
    for s in world.sent:
        queries += [(s.topic, k, False) for k in s.keys if (s.topic, k, False) not in queries]
        queries.append((s.topic, s.msg_id, True))
    ns = world.rmq.namesrv_addr
    commands = [["queryMsgByUniqueKey", "-n", ns, "-t", t, "-i", k, "-a"] if u else ["queryMsgByKey", "-n", ns, "-t", t, "-k", k]
                for t, k, u in queries]
    printed = java.mqadmin(commands, work_dir=world.root / "mqadmin", timeout_s=240)
    print(f"mqadmin: {len(printed)} commands, {sum(p['ms'] for p in printed) / 1000:.1f} s")
    for s in world.sent:
        Path("/tmp/rocketmq/msgbodys", s.msg_id).unlink(missing_ok=True)
    from quarry.formats.offset_msg_id import decode

    out: dict[tuple[str, str, bool], dict[str, Any]] = {}
    assert world.quarry.router is not None
    with AdminClient(world.quarry.router.address) as admin:
        for q, p in zip(queries, printed):
            topic, key, unique = q
            raw = _broker_raw(world.rmq.broker_addr, topic, key, unique)
            quarry = ({decode(x).offset for x in _quarry_unique(admin, topic, key)} if unique else
                      {m.unique_key for m in _quarry_keys(admin, topic, key)})
            out[q] = {"printed": p, "raw": raw, "quarry": quarry}
    return out


def _mqadmin_ids(p: dict[str, Any], unique: bool) -> list[Any]:
    """queryMsgByKey's rows (#Message ID: the UNIQ_KEY); queryMsgByUniqueKey's CommitLog Offset lines."""
    assert not p["hung"], p["args"]
    if "CODE: 208  DESC: query message by key finished, but no message." in p["err"]:
        return []  # mqadmin's filter left nothing (MQAdminImpl.queryMessage throws NO_MESSAGE)
    assert "Exception" not in p["out"] + p["err"], (p["args"], p["err"][-2000:])
    if unique:
        return [int(x) for x in re.findall(r"^CommitLog Offset:\s+(\d+)", p["out"], re.M)]
    return [row[0] for row in (line.split() for line in p["out"].splitlines()[1:]) if len(row) == 3]


def test_every_key_and_unique_key_rocketmq_and_quarry(world: World, answers: dict[tuple[str, str, bool], dict[str, Any]]) -> None:
    """RocketMQ's answers are what its index and mqadmin's filter predict; Quarry's are the
    truth; they are the same set wherever RocketMQ's is right, and the table says why where not."""
    rows: dict[tuple[str, str, bool], dict[str, Any]] = {}
    agree = 0
    for (topic, key, unique), a in answers.items():
        broker_pred, shown_pred = _predicted(world, topic, key, unique)
        truth = _truth(world, topic, key, unique)
        # The broker returned exactly the records its IndexFile's hash match predicts (any topic).
        assert sorted(r.unique_key for r in a["raw"]) == sorted(s.msg_id for s in broker_pred), (topic, key, unique)
        # mqadmin printed exactly those its filter keeps.
        printed = _mqadmin_ids(a["printed"], unique)
        assert sorted(printed) == sorted(s.offset if unique else s.msg_id for s in shown_pred), (topic, key, unique, a["printed"]["out"][-2000:])
        # Quarry: every message of that topic with that key, nothing else.
        truth_ids = {s.offset if unique else s.msg_id for s in truth}
        assert a["quarry"] == truth_ids, (topic, key, unique)
        foreign = [r for r in a["raw"] if r.topic != topic]
        if set(printed) == truth_ids and len(a["raw"]) == len(truth):
            agree += 1  # the broker, mqadmin and Quarry: the same messages
            continue
        if len(printed) < len(truth_ids):
            why = (f"the broker answers {len(a['raw'])} entries at most, newest first, {len(foreign)} of them another topic's "
                   f"(hash collision), counted before mqadmin's filter: the oldest {len(truth_ids) - len(printed)} never shown"
                   + ("; mqadmin says 'no message'" if not printed else "") + "; "
                   "Quarry pages every match of this topic and key")
        else:
            holds = [r for r in foreign if not unique and key in r.keys]
            why = (f"the broker returned {len(foreign)} record(s) of {sorted({r.topic for r in foreign})} (same hash)"
                   + (", whose KEYS hold this very key" if holds else "")
                   + ": mqadmin's own filter drops them; Quarry's index never returns them")
        rows[(topic, key, unique)] = {"raw": len(a["raw"]), "foreign": foreign, "mqadmin": len(printed), "quarry": len(a["quarry"]),
                                      "truth": len(truth), "why": why}
    print(f"\n{len(answers)} queries ({sum(1 for q in answers if not q[2])} keys, {sum(1 for q in answers if q[2])} unique keys) over "
          f"{len(world.sent)} messages: {agree} answered alike by RocketMQ's broker, mqadmin and Quarry; where not:")
    print(f"{'topic':<11} {'key':<33} {'kind':<4} {'generated as':<44} {'broker':<13} {'mqadmin':<7} {'Quarry':<6} why Quarry's is right")
    for (topic, key, unique), r in rows.items():
        made = world.roles.get(key, ("", ""))[1]
        print(f"{topic:<11} {key:<33} {'uniq' if unique else 'key':<4} {made[:44]:<44} {r['raw']:>3} ({len(r['foreign']):>2} other) "
              f"{r['mqadmin']:>7} {r['quarry']:>6} {r['why']}")
    # Every generated collision showed on RocketMQ's side, and only those (or their targets).
    assert {k for (_, k, _) in rows} == set(world.roles) | {f"k{n}" for n in range(2)} | {"x0"}, sorted(rows)
    # The >64 key: mqadmin shows 60 of 70 (64 entries, 4 of them topic B's colliding key), Quarry all 70.
    many = rows[(TA, "many", False)]
    assert (many["raw"], len(many["foreign"]), many["mqadmin"], many["quarry"], many["truth"]) == (CAP, 4, CAP - 4, MANY, MANY), many
    # Cross-topic key collisions: the broker returns topic B's record for topic A's key; mqadmin
    # filters it; Quarry never returns it. For x0's twin, topic B's record even carries the key.
    kx = colliding_key(TA, f"{TB}#x0")
    for k in [kx, *(colliding_key(TA, f"{TB}#k{n}") for n in range(2))]:
        r = rows[(TA, k, False)]
        assert [f.topic for f in r["foreign"]] == [TB] and r["mqadmin"] == r["quarry"] == r["truth"] == 1, (k, r)
    assert kx in rows[(TA, kx, False)]["foreign"][0].keys
    # A key sent before a colliding >64 key: the broker's 64 entries are all the other topic's,
    # mqadmin's filter leaves nothing ("no message"), while both messages are there; Quarry finds them.
    r = rows[(TC, colliding_key(TC, f"{TA}#many"), False)]
    assert (r["raw"], len(r["foreign"]), r["mqadmin"], r["quarry"], r["truth"]) == (CAP, CAP, 0, 2, 2), r
    # Unique keys of topic B collided by generated keys of topic A: the broker returns the A record too.
    for s in [s for s in world.sent if s.topic == TB][:2]:
        r = rows[(TB, s.msg_id, True)]
        assert [f.topic for f in r["foreign"]] == [TA] and r["mqadmin"] == r["quarry"] == 1, (s.msg_id, r)


def test_quarry_pages_past_64_where_mqadmin_stops(world: World, answers: dict[tuple[str, str, bool], dict[str, Any]]) -> None:
    """mqadmin's queryMsgByKey shows the broker's newest 64 entries less the colliding ones;
    Quarry's router pages every one of the 70 (continuation tokens), and says how many
    colliding entries it dropped."""
    many = answers[(TA, "many", False)]
    shown = _mqadmin_ids(many["printed"], False)
    all_many = {s.msg_id for s in _truth(world, TA, "many", False)}
    assert len(all_many) == MANY and set(shown) < all_many and len(shown) == CAP - 4
    assert many["quarry"] == all_many
    # The ones mqadmin never shows are the oldest: the broker walks its IndexFile newest first.
    missing = all_many - set(shown)
    oldest = {s.msg_id for s in sorted(_truth(world, TA, "many", False), key=lambda s: s.offset)[:len(missing)]}
    assert missing == oldest
    assert world.quarry.router is not None
    with AdminClient(world.quarry.router.address) as admin:
        first = admin.query_by_key(TA, "many", max_num=CAP)
        assert len(first.messages) <= CAP and first.next_token, "a first page, and a token for the rest"
        kc = colliding_key(TB, f"{TA}#many")
        assert {m.topic for m in _quarry_keys(admin, TB, kc)} == {TB}


# -- the unique key's window and the millisecond window --------------------------------------------
def _admin_query(world: World, *args: str) -> dict[str, Any]:
    """AdminQuery4.java (DefaultMQAdminExt of RocketMQ 4.9.8), its one JSON line."""
    run = java.run_java(str(ADMIN_QUERY), args[0], world.rmq.namesrv_addr, *args[1:], timeout_s=120, work_dir=world.root / "admin-query")
    assert run.returncode == 0, (run.stdout[-3000:], run.stderr[-3000:])
    [line] = java.json_lines(run.stdout)
    return line


def _send_raw(addr: str, topic: str, properties: str, body: bytes) -> str:
    """SEND_MESSAGE_V2 as a 4.x client sends it, the properties (UNIQ_KEY included) the producer's
    own; the broker's offsetMsgId."""
    fields = {"a": "PG_diff_raw", "b": topic, "c": "TBW102", "d": 4, "e": 0, "f": 0, "g": int(time.time() * 1000),
              "h": 0, "i": properties, "j": 0, "k": False}

    async def send() -> Any:
        async with RemotingClient(addr) as broker:
            return await broker.call(codes.SEND_MESSAGE_V2, fields, body)
    resp = asyncio.run(asyncio.wait_for(send(), 30))
    assert resp.code == codes.SUCCESS, (resp.code, resp.remark)
    return str(resp.ext_fields["msgId"])


def test_unique_key_whose_time_is_after_its_store_time(world: World) -> None:
    """A unique key embedding a time 5 s after its message's store time: DefaultMQAdminExt's
    viewMessage(topic, msgId) searches from that time less 1 s and says "no message"; the broker
    holds it (found over [0, Long.MAX_VALUE], as mqadmin's queryMsgByUniqueKey asks); Quarry finds
    it within its window for the id."""
    tz = datetime.now().astimezone().tzinfo
    assert tz is not None
    gen = unique_key.UniqueKeyGenerator(f"127.0.{random.randrange(1, 255)}.{random.randrange(1, 255)}", os.getpid(),
                                        random.getrandbits(32), tz, clock=lambda: int(time.time() * 1000) + AHEAD_MS)
    gen.set_counter(random.getrandbits(16))
    uid = gen.next_id()
    embedded = gen.start_time + unique_key.time_span_ms(uid)  # the producer's clock, read as MessageClientIDSetter would
    offset_msg_id = _send_raw(world.rmq.broker_addr, TD, encode_properties([("TAGS", "TagD"), ("UNIQ_KEY", uid), ("WAIT", "true")]),
                              b"differential unique key ahead")
    offset = decode_offset_msg_id(offset_msg_id).offset
    [record] = wait_until(lambda: _broker_raw(world.rmq.broker_addr, TD, uid, True), timeout_s=30, what="the broker indexes the unique key")
    stored = record.store_timestamp
    assert record.physical_offset == offset and embedded - 1000 > stored, (embedded, stored)
    # DefaultMQAdminExt reads the id's time as this month's once it is past (before, as last month's).
    wait_until(lambda: int(time.time() * 1000) > embedded, timeout_s=AHEAD_MS / 1000 + 30, what="the id's embedded time is past")
    rocketmq = _admin_query(world, "uniq", TD, uid)
    assert rocketmq["begin"] == embedded - 1000, (rocketmq, embedded, str(tz))  # the JVM reads the id as we do
    assert rocketmq["viewMessage"] is None and rocketmq["error"].startswith("208 "), rocketmq  # NO_MESSAGE
    assert rocketmq["whole"] == [{"offset": offset, "storeTimestamp": stored}], rocketmq  # mqadmin's [0, MAX]: there
    # The broker's own answer over the two windows: the window is the cause.
    assert _broker_raw(world.rmq.broker_addr, TD, uid, True, begin=rocketmq["begin"]) == []
    assert world.quarry.router is not None
    with AdminClient(world.quarry.router.address) as admin:
        got = wait_until(lambda: _quarry_unique(admin, TD, uid), timeout_s=30, what="Quarry indexes the unique key")
        answer = admin.query_by_unique_key(TD, uid, return_all=True)
    assert got == {offset_msg_id} and [m.store_timestamp for m in answer.messages] == [stored]
    # Found in the id's own window, not the whole-index fallback.
    assert len(answer.notes) == 1 and answer.notes[0].startswith("4.x unique key: searched store times"), answer.notes
    print(f"\nunique key {uid}: embedded time {embedded} ({embedded - stored} ms after the store time {stored})")
    print(f"{'who':<44} answer")
    print(f"{'DefaultMQAdminExt.viewMessage(topic, msgId)':<44} none (searched from {rocketmq['begin']}: {rocketmq['error']})")
    print(f"{'mqadmin queryMsgByUniqueKey [0, MAX]':<44} offset {offset}")
    print(f"{'Quarry router':<44} {offset_msg_id} ({answer.notes[0]})")
    print("why Quarry's is right: the id's time is the producer's clock (its zone, its skew), not the store's; "
          "a window starting 1 s before it misses a message stored earlier, Quarry's allows for both")


def _index_times(world: World, name: str, offsets: set[int]) -> dict[int, int]:
    """For each CommitLog offset, the time the broker's IndexFile entry of `name` holds, as
    IndexFile.selectPhyOffset reads it: beginTimestamp + timeDiff * 1000, where the file's
    beginTimestamp is its entry 1's record's store time (IndexFile.putKey sets it at the first
    put; the header on disk is only written at a flush). Read from the broker's files."""
    slots = int(world.rmq.broker_conf()["maxHashSlotNum"])  # type: ignore[call-overload]
    want, entries_at = _index_hash(name), 40 + 4 * slots
    out: dict[int, int] = {}
    for path in sorted((world.rmq.store / "index").iterdir()):
        data = path.read_bytes()
        found: dict[int, int] = {}
        number = 1
        while entries_at + (number + 1) * 20 <= len(data):
            h, phy, diff, prev = struct.unpack_from(">iqii", data, entries_at + number * 20)
            if (h, phy, diff, prev) == (0, 0, 0, 0):
                break
            if h == want and phy in offsets:
                found[phy] = diff
            number += 1
        if found:
            first_phy = struct.unpack_from(">q", data, entries_at + 20 + 4)[0]
            begin = _view(world.rmq.broker_addr, first_phy).store_timestamp
            out.update({phy: begin + diff * 1000 for phy, diff in found.items()})
    return out


def _view(addr: str, offset: int) -> Any:
    async def ask() -> Any:
        async with RemotingClient(addr) as broker:
            return await broker.call(codes.VIEW_MESSAGE_BY_ID, {"offset": offset})
    resp = asyncio.run(asyncio.wait_for(ask(), 30))
    assert resp.code == codes.SUCCESS, (resp.code, resp.remark)
    return decode_record(resp.body, 0)


def test_millisecond_window_rocketmq_rounds_to_the_second(world: World) -> None:
    """A key's messages stored over a few seconds; a window [a message's store time, another's
    store time - 1 ms]: DefaultMQAdminExt.queryMessage drops the first (its entry's time reads up
    to 999 ms earlier) and returns the second (its entry reads inside); Quarry returns exactly
    the messages stored within the window."""
    key = f"ms-{uuid.uuid4().hex[:16]}"
    n = 40
    sent = _send(world.rmq, [_msg(TD, [key], 600 + i) for i in range(n)], world.root / "drivers", "PG_diff_ms", pause_ms=60)
    records = wait_until(lambda: (lambda r: r if len(r) == n else None)(_broker_raw(world.rmq.broker_addr, TD, key, False)),
                         timeout_s=30, what="the broker indexes every message of the key")
    stored = {r.physical_offset: r.store_timestamp for r in records}  # the store's own times
    assert set(stored) == {s.offset for s in sent}
    read = _index_times(world, f"{TD}#{key}", set(stored))
    assert set(read) == set(stored) and all(0 <= stored[o] - read[o] < 1000 for o in stored), (stored, read)
    order = sorted(stored)
    # First message (not the oldest) whose entry reads earlier than its store time: the window's begin.
    i = next(k for k in range(1, n) if read[order[k]] < stored[order[k]])
    begin = stored[order[i]]
    # First later message whose entry reads at or after begin but earlier than its store time:
    # the window ends 1 ms before its store time.
    j = next((k for k in range(i + 1, n) if begin <= read[order[k]] < stored[order[k]] and stored[order[k]] - 1 >= begin), None)
    assert j is not None, "the messages were stored within one second of the index's clock"
    end = stored[order[j]] - 1
    truth = {o for o in order if begin <= stored[o] <= end}
    predicted = {o for o in order if begin <= read[o] <= end}  # selectPhyOffset's test, newest first, none of them past 64
    assert order[i] in truth - predicted and order[j] in predicted - truth
    # The broker, and RocketMQ's admin API (its filter: the key in KEYS, the topic; no time).
    raw = _broker_raw(world.rmq.broker_addr, TD, key, False, begin=begin, end=end)
    assert {r.physical_offset for r in raw} == predicted
    rocketmq = _admin_query(world, "key", TD, key, str(begin), str(end))
    assert {m["offset"] for m in rocketmq["queryMessage"]} == predicted, rocketmq
    assert world.quarry.router is not None
    with AdminClient(world.quarry.router.address) as admin:
        wait_until(lambda: len(_quarry_keys(admin, TD, key)) == n, timeout_s=30, what="Quarry indexes every message of the key")
        quarry = admin.query_by_key(TD, key, max_num=CAP, begin=begin, end=end)
    assert not quarry.next_token
    got = {m.commit_log_offset for m in quarry.messages}
    assert got == truth and all(begin <= m.store_timestamp <= end for m in quarry.messages)
    print(f"\nkey {key}, window [{begin}, {end}] (ms): {len(truth)} messages stored within it")
    print(f"{'offset':>10} {'stored':>14} {'entry reads':>14} {'inside':>6} {'RocketMQ':>8} {'Quarry':>6}")
    shown = [k for k, o in enumerate(order) if o in truth | predicted]
    for o in order[max(0, shown[0] - 1):shown[-1] + 2]:
        print(f"{o:>10} {stored[o]:>14} {read[o]:>14} {'yes' if o in truth else 'no':>6} "
              f"{'yes' if o in predicted else 'no':>8} {'yes' if o in got else 'no':>6}")
    print(f"RocketMQ: {len(predicted - truth)} returned though stored after the end, {len(truth - predicted)} dropped though "
          "stored within; why Quarry's is right: the IndexFile keeps whole seconds since its beginTimestamp and the broker "
          "compares those; Quarry widens its index search by 999 ms and checks each record's own store time")
