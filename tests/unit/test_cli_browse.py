"""printMsg's paging and exit codes over a scripted router: 0 found, 1 none, 3 nobody
answered, 4 some broker did not answer (with the token that retries the page)."""
from __future__ import annotations

import argparse
import io
import json

from quarry.clients.cli_browse import BrowseCommands
from quarry.clients.model import BrokerOutcome, Message, QueryResult


def _msg(i: int, broker: str) -> Message:
    return Message(topic="T", body=f"b{i}".encode(), properties={}, property_pairs=[], keys=[], tags="", unique_key="", flag=0,
                   queue_id=0, queue_offset=i, commit_log_offset=i, store_size=100, sys_flag=0, born_timestamp=1, born_host="1.1.1.1:1",
                   store_timestamp=1000 - i, store_host="2.2.2.2:2", reconsume_times=0, prepared_transaction_offset=0, body_crc=0,
                   offset_msg_id=f"ID{i}", broker_name=broker)


class ScriptedAdmin:
    def __init__(self, pages: dict[str, QueryResult]) -> None:
        self.pages = pages
        self.asked: list[tuple[str, int]] = []

    def browse_topic(self, topic: str, begin: int, end: int, tags: str, oldest_first: bool, max_num: int, token: str, **kw: object) -> QueryResult:
        self.asked.append((token, max_num))
        return self.pages[token]


def _run(pages: dict[str, QueryResult], **overrides: object) -> tuple[int, dict[str, object], str, ScriptedAdmin]:
    cmd = BrowseCommands()
    args = dict(topic="T", begin=0, end=0, sub_expression="*", oldest_first=False, charset="UTF-8", print_body="true",
                max=0, page_size=2, token="", json=True)
    args.update(overrides)
    cmd.args = argparse.Namespace(**args)
    cmd.out, cmd.err = io.StringIO(), io.StringIO()
    cmd.admin = ScriptedAdmin(pages)
    code = cmd.printMsg()
    return code, json.loads(cmd.out.getvalue()), cmd.err.getvalue(), cmd.admin


OK = [BrokerOutcome("a", True, "", "", 1), BrokerOutcome("b", True, "", "", 1)]
B_DOWN = [BrokerOutcome("a", True, "", "", 1), BrokerOutcome("b", False, "UNAVAILABLE", "down", 1)]
ALL_DOWN = [BrokerOutcome("a", False, "UNAVAILABLE", "down", 1), BrokerOutcome("b", False, "UNAVAILABLE", "down", 1)]


def test_every_page_is_fetched_and_found_is_0() -> None:
    code, data, _, admin = _run({"": QueryResult([_msg(0, "a"), _msg(1, "b")], OK, True, next_token="t1"),
                                 "t1": QueryResult([_msg(2, "a")], OK, True)})
    assert code == 0 and [m["body"] for m in data["messages"]] == ["b0", "b1", "b2"] and data["complete"] and data["next_token"] == ""
    assert admin.asked == [("", 2), ("t1", 2)]


def test_nothing_in_the_window_is_1() -> None:
    code, data, _, _ = _run({"": QueryResult([], OK, True)})
    assert code == 1 and data["messages"] == []


def test_max_stops_early_and_hands_back_the_token() -> None:
    code, data, _, admin = _run({"": QueryResult([_msg(0, "a"), _msg(1, "b")], OK, True, next_token="t1"),
                                 "t1": QueryResult([_msg(2, "a")], OK, True, next_token="t2")}, max=3)
    assert code == 0 and len(data["messages"]) == 3 and data["next_token"] == "t2"
    assert admin.asked == [("", 2), ("t1", 1)]  # the last page asks only for what is missing


def test_a_broker_down_mid_browse_is_4_with_the_retry_token() -> None:
    code, data, err, _ = _run({"": QueryResult([_msg(0, "a"), _msg(1, "b")], OK, True, next_token="t1"),
                               "t1": QueryResult([_msg(2, "a")], B_DOWN, False, next_token="t2")})
    assert code == 4 and not data["complete"] and data["retry_token"] == "t1" and data["failed_brokers"] == {"b": "UNAVAILABLE: down"}
    assert "broker b did not answer" in err and "--token 't1'" in err


def test_nobody_answering_is_3() -> None:
    code, data, _, _ = _run({"": QueryResult([], ALL_DOWN, False, next_token="t0")})
    assert code == 3 and data["messages"] == []
