"""printMsg's paging and exit codes over a scripted router: 0 found, 1 none, 3 nobody
answered, 4 some broker did not answer (with the token that retries the page) or messages of
the window are gone (retention deleted them: the router's note is printed)."""
from __future__ import annotations

import argparse
import base64
import io
import json

from quarry.clients.cli_browse import BrowseCommands
from quarry.clients.model import QueryResult as Result
from quarry.v1 import common_pb2, router_pb2


def _msg(i: int, broker: str) -> common_pb2.StoredMessage:
    return common_pb2.StoredMessage(topic="T", body=f"b{i}".encode(), queue_offset=i, commit_log_offset=i, store_size=100, born_timestamp=1,
                                    store_timestamp=1000 - i, offset_msg_id=f"ID{i}", broker_name=broker)


def QueryResult(messages: list[common_pb2.StoredMessage], brokers: list[common_pb2.BrokerOutcome], complete: bool, next_token: str = "",
                notes: list[str] | None = None) -> Result:
    """A router page as the admin client returns it (typed, with the proto it came from)."""
    return Result.from_proto(router_pb2.QueryResult(messages=messages, brokers=brokers, complete=complete, next_continuation_token=next_token,
                                                    notes=notes or []))


def BrokerOutcome(name: str, answered: bool, code: str, message: str, latency_ms: int) -> common_pb2.BrokerOutcome:
    return common_pb2.BrokerOutcome(broker_name=name, answered=answered, error_code=code, error_message=message, latency_ms=latency_ms)


def _body(m: dict[str, object]) -> str:
    return base64.b64decode(str(m["body"])).decode()  # --json: the protobuf JSON mapping


class ScriptedAdmin:
    def __init__(self, pages: dict[str, QueryResult]) -> None:
        self.pages = pages
        self.asked: list[tuple[str, int]] = []

    def browse_topic(self, topic: str, begin: int, end: int, tags: str, oldest_first: bool, max_num: int, token: str, **kw: object) -> Result:
        self.asked.append((token, max_num))
        return self.pages[token]


def _run(pages: dict[str, Result], **overrides: object) -> tuple[int, dict[str, object], str, ScriptedAdmin]:
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
    assert code == 0 and [_body(m) for m in data["messages"]] == ["b0", "b1", "b2"] and data["complete"] and data["nextToken"] == ""
    assert admin.asked == [("", 2), ("t1", 2)]


def test_nothing_in_the_window_is_1() -> None:
    code, data, _, _ = _run({"": QueryResult([], OK, True)})
    assert code == 1 and data["messages"] == []


def test_max_stops_early_and_hands_back_the_token() -> None:
    code, data, _, admin = _run({"": QueryResult([_msg(0, "a"), _msg(1, "b")], OK, True, next_token="t1"),
                                 "t1": QueryResult([_msg(2, "a")], OK, True, next_token="t2")}, max=3)
    assert code == 0 and len(data["messages"]) == 3 and data["nextToken"] == "t2"
    assert admin.asked == [("", 2), ("t1", 1)]  # the last page asks only for what is missing


def test_a_broker_down_mid_browse_is_4_with_the_retry_token() -> None:
    code, data, err, _ = _run({"": QueryResult([_msg(0, "a"), _msg(1, "b")], OK, True, next_token="t1"),
                               "t1": QueryResult([_msg(2, "a")], B_DOWN, False, next_token="t2")})
    assert code == 4 and not data["complete"] and data["retryToken"] == "t1" and data["failedBrokers"] == {"b": "UNAVAILABLE: down"}
    assert "broker b did not answer" in err and "--token 't1'" in err


def test_nobody_answering_is_3() -> None:
    code, data, _, _ = _run({"": QueryResult([], ALL_DOWN, False, next_token="t0")})
    assert code == 3 and data["messages"] == []


GONE = "broker a: messages of this window may be gone: retention deleted the CommitLog segments holding physical offsets [0, 8192) (stored at or before 2023-11-14T22:13:20.000Z); queue offsets gone: T/0 [0, 40)"


def test_messages_gone_to_retention_are_4_with_the_note_and_every_page_fetched() -> None:
    code, data, err, admin = _run({"": QueryResult([_msg(0, "a"), _msg(1, "b")], OK, False, next_token="t1", notes=[GONE]),
                                   "t1": QueryResult([_msg(2, "b")], OK, False, notes=[GONE])})
    assert code == 4 and [_body(m) for m in data["messages"]] == ["b0", "b1", "b2"] and admin.asked == [("", 2), ("t1", 2)]
    assert not data["complete"] and data["failedBrokers"] == {} and data["retryToken"] == "" and data["notes"] == [GONE]
    assert err.count("WARNING: broker a: messages of this window may be gone") == 1 and "[0, 8192)" in err


def test_nothing_left_of_a_window_gone_to_retention_is_4_not_1() -> None:
    code, data, err, _ = _run({"": QueryResult([], OK, False, notes=[GONE])})
    assert code == 4 and data["messages"] == [] and "messages of this window may be gone" in err


def test_a_note_on_a_complete_page_is_shown_and_changes_nothing() -> None:
    code, data, err, _ = _run({"": QueryResult([_msg(0, "a")], OK, True, notes=["brokers that joined after the first page are not in this browse: c"])})
    assert code == 0 and data["complete"] and err.startswith("note: brokers that joined")
