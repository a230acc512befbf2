"""Rules of the browse-related formats: tag expressions, delayed messages, trace records, id decoding."""
from __future__ import annotations

import json
from datetime import timezone
from pathlib import Path

import pytest

from quarry.formats import message_id, message_trace, scheduled, tag_expression
from quarry.formats.java_hash import java_string_hash

GOLDEN = Path(__file__).resolve().parents[1] / "golden"

# -- tag expressions ------------------------------------------------------------------------


@pytest.mark.parametrize("expr", ["", None, "*", "  *  "])
def test_empty_and_star_match_everything(expr: str | None) -> None:
    f = tag_expression.parse(expr)
    assert f.all and f.matches_code(12345) and f.matches_tag(None) and f.matches_tag("x")


def test_or_expression_splits_trims_and_drops_empties() -> None:
    f = tag_expression.parse(" TagA ||TagB|| ||")
    assert f.tags == {"TagA", "TagB"}
    assert f.codes == {java_string_hash("TagA"), java_string_hash("TagB")}
    assert f.matches_tag("TagA") and f.matches_tag("TagB")
    assert not f.matches_tag("TagC") and not f.matches_tag(None) and not f.matches_tag("")


def test_hash_match_alone_is_not_enough() -> None:
    # "Aa" and "BB" share a Java hashCode: the unit passes, the real tag decides.
    f = tag_expression.parse("Aa")
    assert java_string_hash("Aa") == java_string_hash("BB")
    assert f.matches_code(java_string_hash("BB"))
    assert not f.matches_tag("BB")
    assert not f.matches_code(0)  # a message without tags has tagsCode 0


@pytest.mark.parametrize("expr,why", [("||", "names no tag"), ("TagA || *", "cannot be combined"), ("x" * 5000, "at most")])
def test_bad_expressions_name_the_field_and_rule(expr: str, why: str) -> None:
    with pytest.raises(tag_expression.TagExpressionError, match=f"tag_expression: .*{why}"):
        tag_expression.parse(expr)


# -- delayed messages ------------------------------------------------------------------------


def test_level_delay_parked_under_schedule_topic() -> None:
    props = {"DELAY": "3", "REAL_TOPIC": "Orders", "REAL_QID": "2"}
    s = scheduled.schedule_of(scheduled.SCHEDULE_TOPIC, props, 1_000_000)
    assert s == scheduled.Schedule("Orders", 1_000_000 + 10_000, True)
    assert scheduled.belongs_to(scheduled.SCHEDULE_TOPIC, props, "Orders")
    assert not scheduled.belongs_to(scheduled.SCHEDULE_TOPIC, props, "Other")


def test_levels_above_the_table_use_the_last_level() -> None:
    assert scheduled.deliver_time({"DELAY": "99"}, 0) == 7_200_000
    assert scheduled.deliver_time({"DELAY": "0"}, 0) is None
    assert scheduled.deliver_time({"DELAY": "x"}, 0) is None


def test_timer_properties() -> None:
    assert scheduled.deliver_time({"TIMER_DELIVER_MS": "5000"}, 1) == 5000
    assert scheduled.deliver_time({"TIMER_OUT_MS": "4000", "TIMER_DELIVER_MS": "5000"}, 1) == 4000  # the parked (rounded) time wins
    assert scheduled.deliver_time({"TIMER_DELAY_SEC": "7"}, 1000) == 8000
    assert scheduled.deliver_time({"TIMER_DELAY_MS": "70"}, 1000) == 1070
    s = scheduled.schedule_of(scheduled.TIMER_TOPIC, {"TIMER_OUT_MS": "4000", "REAL_TOPIC": "T"}, 1)
    assert s == scheduled.Schedule("T", 4000, True)


def test_ordinary_and_unparked_records() -> None:
    assert scheduled.schedule_of("T", {"KEYS": "a"}, 5) is None
    assert scheduled.schedule_of("T", {"DELAY": "1"}, 5) == scheduled.Schedule("T", 1005, False)
    assert scheduled.schedule_of(scheduled.SCHEDULE_TOPIC, {"DELAY": "1"}, 5) is None  # no REAL_TOPIC: not a user message


# -- trace records ---------------------------------------------------------------------------
# Built field by field in TraceDataEncoder's order (\x01 between fields, \x02 after each context).

C, F = "\x01", "\x02"
MSG = "7F0000010BB818B4AAC2172AE1C70000"
PUB = C.join(["Pub", "1700000000123", "DefaultRegion", "PG", "Orders", MSG, "TagA", "k1 k2", "10.0.0.1:10911", "42", "7", "0",
              "0A0000010000000000000000000A2C3D", "true"]) + F
SUB_BEFORE = C.join(["SubBefore", "1700000001000", "DefaultRegion", "CG", "req-1", MSG, "0", "k1 k2"]) + F
SUB_AFTER = C.join(["SubAfter", "req-1", MSG, "15", "false", "k1 k2", "0", "1700000001015", "CG"]) + F
SUB_AFTER_CLOUD = C.join(["SubAfter", "req-2", MSG, "3", "true", "k1 k2", "1", ""]) + F  # CLOUD: no time/group
END_TX = C.join(["EndTransaction", "1700000000200", "R", "PG", "Orders", MSG, "TagA", "k1", "10.0.0.1:10911", "1", "tx-9",
                 "COMMIT_MESSAGE", "false"]) + F


def test_decode_every_context_type() -> None:
    got = message_trace.decode(PUB + SUB_BEFORE + SUB_AFTER + SUB_AFTER_CLOUD + END_TX)
    assert got.problems == []
    pub, before, after, cloud, end = got.contexts
    assert (pub.trace_type, pub.timestamp, pub.group, pub.topic, pub.msg_id, pub.tags, pub.keys) == ("Pub", 1700000000123, "PG", "Orders", MSG, "TagA", "k1 k2")
    assert (pub.store_host, pub.body_length, pub.cost_time_ms, pub.msg_type, pub.success) == ("10.0.0.1:10911", 42, 7, "Normal_Msg", True)
    assert pub.offset_msg_id == "0A0000010000000000000000000A2C3D"
    assert (before.request_id, before.retry_times, before.group) == ("req-1", 0, "CG")
    assert (after.cost_time_ms, after.success, after.timestamp, after.group, after.context_code) == (15, False, 1700000001015, "CG", 0)
    assert (cloud.timestamp, cloud.group, cloud.context_code) == (0, "", 1)
    assert (end.transaction_id, end.transaction_state, end.msg_type) == ("tx-9", "COMMIT_MESSAGE", "Trans_Msg_Half")


def test_old_pub_without_offset_msg_id_and_new_with_client_host() -> None:
    old = C.join(["Pub", "1", "R", "PG", "T", MSG, "", "", "h:1", "1", "2", "3", "false"]) + F
    new = C.join(["Pub", "1", "R", "PG", "T", MSG, "t", "k", "h:1", "1", "2", "4", "OFF", "true", "10.1.1.1"]) + F
    a, b = message_trace.decode(old + new).contexts
    assert (a.offset_msg_id, a.success, a.msg_type) == ("", False, "Delay_Msg")
    assert (b.offset_msg_id, b.success, b.client_host, b.msg_type) == ("OFF", True, "10.1.1.1", "Order_Msg")


def test_bad_context_reported_others_kept() -> None:
    bad = C.join(["Pub", "not-a-time", "R", "PG", "T", MSG, "", "", "h", "1", "2", "0", "true"]) + F
    short = C.join(["SubBefore", "1", "R"]) + F
    got = message_trace.decode(bad + short + PUB + "Unknown" + C + "x" + F)
    assert [c.trace_type for c in got.contexts] == ["Pub"]
    assert len(got.problems) == 2 and "timestamp" in got.problems[0] and "SubBefore" in got.problems[1]


def test_contexts_for_keeps_only_the_id_and_fills_the_client_host() -> None:
    other = PUB.replace(MSG, "OTHER")
    got = message_trace.contexts_for(other + SUB_AFTER, MSG, "192.168.0.9")
    assert [(c.trace_type, c.client_host) for c in got.contexts] == [("SubAfter", "192.168.0.9")]


# -- message ids -----------------------------------------------------------------------------


def test_offset_msg_id_reading_matches_golden() -> None:
    for case in json.loads((GOLDEN / "msgid.json").read_text())["create"]:
        if not case["decoded"]["ok"]:
            continue
        got = message_id.describe(case["msg_id"], 0, timezone.utc)["offset_msg_id"]
        assert (got["ip"], got["port"], got["commit_log_offset"]) == (case["decoded"]["ip"], case["decoded"]["port"], case["decoded"]["offset"])


def test_v4_unique_key_reading_matches_golden_producers() -> None:
    for p in json.loads((GOLDEN / "uniqid.json").read_text())["producers"]:
        for call in p["calls"][:3]:
            got = message_id.describe(call["id"], call["now_ms"] + 1, timezone.utc)["unique_key_v4"]
            assert got["ip"] == call["getIPStrFromID"] and got["pid"] == call["getPidFromID"]
            assert got["class_loader_hash"] == p["class_loader_hash"]
            assert got["counter"] == call["counter_before"] & 0xFFFF


def test_v5_unique_key_fields() -> None:
    uid = "01" + "0a1b2c3d4e5f" + "04d2" + f"{86400:08X}" + f"{7:08X}"
    got = message_id.describe(uid.upper(), 0, timezone.utc)
    assert "offset_msg_id" not in got
    v5 = got["unique_key_v5"]
    assert (v5["mac"], v5["pid"], v5["seconds_since_2021"], v5["sequence"]) == ("0a:1b:2c:3d:4e:5f", 1234, 86400, 7)
    assert v5["time_ms_if_utc"] == 1609459200000 + 86_400_000


@pytest.mark.parametrize("bad", ["", "XYZ", "0" * 33, "02" + "0" * 32])
def test_bad_ids_are_refused_with_the_rule(bad: str) -> None:
    with pytest.raises(message_id.MessageIdError):
        message_id.describe(bad, 0, timezone.utc)


def test_print_msg_takes_mqadmins_time_format_in_the_local_zone() -> None:
    from datetime import datetime

    from quarry.clients.cli_options import parse_time

    want = int(datetime(2026, 11, 23, 10, 0, 5).astimezone().timestamp()) * 1000 + 42
    assert parse_time("2026-11-23#10:00:05:042") == want
    assert parse_time("1700000000000") == 1700000000000  # the CLI's one time parser reads the rest
    with pytest.raises(ValueError, match="month"):
        parse_time("2026-13-23#10:00:05:042")