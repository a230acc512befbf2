"""The broker role's small parts: consumer offsets on disk, RocketMQ property mapping, client table."""
from __future__ import annotations

import json
import zlib
from pathlib import Path

import pytest

from quarry.services.commitlog.broker.client_table import EXPIRY_MS, ClientTable
from quarry.services.commitlog.storage.consumer_offsets import ConsumerOffsets
from quarry.services.commitlog.storage.errors import InvalidArgument
from quarry.services.commitlog.broker.message_mapping import from_client_message, inflate, split_properties
from quarry.services.commitlog.broker.pull_rates import PullRates


def test_consumer_offsets_persist_in_rocketmq_layout_and_reload(tmp_path: Path) -> None:
    offsets = ConsumerOffsets(tmp_path)
    assert offsets.persist() is False  # nothing changed: nothing written
    offsets.commit("g1", "TopicA", 0, 12)
    offsets.commit("g1", "TopicA", 3, 7)
    offsets.commit("g2", "Topic@B", 1, 5)  # '@' in a topic: the group is after the last '@'
    assert offsets.persist() is True
    data = json.loads((tmp_path / "consumerOffset.json").read_text())
    assert data == {"offsetTable": {"Topic@B@g2": {"1": 5}, "TopicA@g1": {"0": 12, "3": 7}}}
    assert not list(tmp_path.glob("*.tmp"))
    again = ConsumerOffsets(tmp_path)
    assert (again.get("g1", "TopicA", 3), again.get("g2", "Topic@B", 1), again.get("g1", "TopicA", 1)) == (7, 5, None)
    with pytest.raises(ValueError, match="commitOffset"):
        again.commit("g1", "TopicA", 0, -1)


def test_properties_split_into_the_fields_the_store_encodes() -> None:
    keys, tags, uk, rest = split_properties("WAIT\x01true\x02KEYS\x01a  b \x02TAGS\x01T\x02UNIQ_KEY\x01U1\x02color\x01red")
    assert (keys, tags, uk, rest) == (["a", "b"], "T", "U1", [("WAIT", "true"), ("color", "red")])
    msg = from_client_message("T", b"x", "KEYS\x01k", flag=3, queue_id=2, born_host=("10.0.0.1", 5))
    assert (msg.keys, msg.flag, msg.queue_id, msg.born_host) == (["k"], 3, 2, ("10.0.0.1", 5))


def test_compressed_bodies_are_inflated_within_the_size_limit() -> None:
    body = b"abc" * 1000
    assert from_client_message("T", zlib.compress(body), "", sys_flag=1).body == body
    with pytest.raises(InvalidArgument, match="inflates beyond"):
        inflate(zlib.compress(b"\0" * 10_000), 1000)
    with pytest.raises(InvalidArgument, match="does not inflate"):
        inflate(b"not zlib", 1000)


def test_client_table_groups_expiry_and_closed_connections() -> None:
    now = [0]
    table = ClientTable(clock_ms=lambda: now[0])
    conn_a, conn_b = object(), object()
    hb = {"clientID": "a@1", "consumerDataSet": [{"groupName": "G", "subscriptionDataSet": [{"topic": "T", "subString": "x || y"}]}]}
    assert table.heartbeat(hb, conn_a) == ["G"]
    table.heartbeat({"clientID": "b@1", "consumerDataSet": [{"groupName": "G"}], "producerDataSet": [{"groupName": "P"}]}, conn_b)
    assert table.consumers("G") == ["a@1", "b@1"] and table.subscriptions[("G", "T")] == ("x || y", "TAG")
    table.connection_closed(conn_b)
    assert table.consumers("G") == ["a@1"]
    now[0] = EXPIRY_MS + 1
    assert table.consumers("G") == []
    with pytest.raises(ValueError, match="clientID"):
        table.heartbeat({}, conn_a)


def test_a_client_is_known_per_connection_so_its_id_cannot_be_taken_over() -> None:
    """Review finding (issue 33, 4): a heartbeat or unregister naming another connection's
    clientID touches only its own connection's entry."""
    table = ClientTable(clock_ms=lambda: 0)
    victim, attacker = object(), object()
    table.heartbeat({"clientID": "10.0.0.7@123", "consumerDataSet": [{"groupName": "GA"}], "producerDataSet": [{"groupName": "PA"}]}, victim)
    table.heartbeat({"clientID": "10.0.0.7@123", "producerDataSet": [{"groupName": "X"}]}, attacker)  # same id, producer data only
    assert table.consumers("GA") == ["10.0.0.7@123"] and [p[1] for p in table.producers("PA")] == [victim]
    table.unregister("10.0.0.7@123", attacker, ["PA", "GA"])
    assert table.consumers("GA") == ["10.0.0.7@123"] and [p[1] for p in table.producers("PA")] == [victim]
    table.unregister("10.0.0.7@123", victim, ["GA"])
    assert table.consumers("GA") == [] and [p[1] for p in table.producers("PA")] == [victim]


def test_client_table_says_who_joined_and_where_a_groups_consumers_are() -> None:
    """What the broker needs to tell a group's consumers that one joined or left (NOTIFY_CONSUMER_IDS_CHANGED)."""
    now = [0]
    table = ClientTable(clock_ms=lambda: now[0])
    conn_a, conn_b = object(), object()
    assert table.consumer_groups_of("a@1", conn_a) == set()
    table.heartbeat({"clientID": "a@1", "consumerDataSet": [{"groupName": "G"}, {"groupName": "H"}]}, conn_a)
    assert table.consumer_groups_of("a@1", conn_a) == {"G", "H"}
    assert table.consumer_groups_of("a@1", conn_b) == set()  # the same id on another connection: a newcomer
    table.heartbeat({"clientID": "b@1", "consumerDataSet": [{"groupName": "G"}]}, conn_b)
    assert table.consumer_connections("G") == [conn_a, conn_b] and table.consumer_connections("H") == [conn_a]
    assert table.connection_closed(conn_a) == ["G", "H"] and table.connection_closed(conn_a) == []
    now[0] = EXPIRY_MS + 1
    assert table.consumer_connections("G") == []


def test_client_table_describes_a_group_as_its_newest_heartbeat_does() -> None:
    """What GET_CONSUMER_CONNECTION_LIST answers (RocketMQ's ConsumerGroupInfo): the live clients, and
    the newest heartbeat's consume type, model, where from and subscriptions (topics it dropped gone)."""
    now = [0]
    table = ClientTable(clock_ms=lambda: now[0])
    conn_a, conn_b = object(), object()

    def beat(cid: str, conn: object, topics: list[str], model: str) -> None:
        subs = [{"topic": t, "subString": "*", "tagsSet": [], "codeSet": [], "subVersion": 7, "expressionType": "TAG", "extra": 1} for t in topics]
        table.heartbeat({"clientID": cid, "consumerDataSet": [{"groupName": "G", "consumeType": "CONSUME_PASSIVELY", "messageModel": model,
                                                               "consumeFromWhere": "CONSUME_FROM_FIRST_OFFSET", "subscriptionDataSet": subs}]}, conn)
    assert table.consumer_group("G") is None
    beat("a@1", conn_a, ["T", "U"], "CLUSTERING")
    now[0] = 10
    beat("b@1", conn_b, ["T"], "BROADCASTING")
    view = table.consumer_group("G")
    assert view is not None and view.clients == [("a@1", conn_a), ("b@1", conn_b)]
    assert (view.consume_type, view.message_model, view.consume_from_where) == ("CONSUME_PASSIVELY", "BROADCASTING", "CONSUME_FROM_FIRST_OFFSET")
    assert view.subscriptions == {"T": {"topic": "T", "subString": "*", "tagsSet": [], "codeSet": [], "subVersion": 7, "expressionType": "TAG"}}
    table.connection_closed(conn_b)
    view = table.consumer_group("G")
    assert view is not None and sorted(view.subscriptions) == ["T", "U"] and view.message_model == "CLUSTERING"
    now[0] = EXPIRY_MS + 1
    assert table.consumer_group("G") is None


def test_pull_rates_count_the_trailing_minute_per_group_and_topic() -> None:
    now = [1000.0]
    rates = PullRates(clock_s=lambda: now[0])
    rates.add("G", "T", 30)
    now[0] += 0.5
    rates.add("G", "T", 30)
    rates.add("H", "T", 6)
    assert rates.per_second("G", "T") == 1.0 and rates.per_second("H", "T") == 0.1 and rates.per_second("G", "U") == 0.0
    now[0] += 59
    rates.add("G", "T", 60)
    assert rates.per_second("G", "T") == 2.0  # the first minute's messages still counted
    now[0] += 1
    assert rates.per_second("G", "T") == 1.0  # they are a minute old now
    now[0] += 120
    rates.add("G", "U", 1)  # a minute on: the idle pairs forgotten
    assert set(rates._buckets) == {("G", "U")}


def test_an_unreadable_offset_table_stops_the_start_naming_the_file(tmp_path: Path) -> None:
    (tmp_path / "consumerOffset.json").write_text('{"offsetTable": {"T@g": {"0": "x"}}}')
    with pytest.raises(ValueError, match="consumerOffset.json: not a consumer offset table"):
        ConsumerOffsets(tmp_path)


def test_a_rocketmq_brokers_own_offset_file_is_read(tmp_path: Path) -> None:
    """fastjson writes the queue ids bare: not strict JSON, as a 4.x broker leaves the file."""
    (tmp_path / "consumerOffset.json").write_text('{\n\t"offsetTable":{\n\t\t"RMQ_SYS_TRANS_OP_HALF_TOPIC@CID_RMQ_SYS_TRANS":{0:7\n\t\t},'
                                                  '\n\t\t"TopicTest@g":{0:250,1:249\n\t\t}\n\t}\n}')
    offsets = ConsumerOffsets(tmp_path, read_only=True)
    assert (offsets.get("g", "TopicTest", 1), offsets.get("CID_RMQ_SYS_TRANS", "RMQ_SYS_TRANS_OP_HALF_TOPIC", 0)) == (249, 7)


def test_docs_show_the_remoting_response_code_table() -> None:
    import re

    from quarry.services.remoting import codes
    from quarry.services.remoting.status import RESPONSE_CODES, remoting_error
    from quarry.services.errors import DiskFull, Expired, NotFound, ReadOnly, Unavailable

    doc = (Path(__file__).resolve().parents[2] / "docs" / "errors.md").read_text()
    table = doc.split("<!-- remoting-table:begin -->")[1].split("<!-- remoting-table:end -->")[0]
    rows = {m.group(1): (m.group(2), int(m.group(3))) for m in re.finditer(r"\| `(\w+)` \| `(\w+)` \((\d+)\) \|", table)}
    assert rows == {t.__name__: (name, code) for t, (code, name) in RESPONSE_CODES.items()}
    assert all(getattr(codes, name) == code for name, code in rows.values())
    for exc in (NotFound("x"), Expired("x"), ReadOnly("x"), DiskFull("x"), Unavailable("x"), InvalidArgument("topic", "bad")):
        assert remoting_error(exc).code == RESPONSE_CODES[type(exc)][0]
