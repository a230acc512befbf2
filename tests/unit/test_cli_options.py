"""CLI option parsing: times in one zone, seconds refused naming the flag, help on every flag,
router lists, exit codes in --help."""
from __future__ import annotations

import argparse
import io
import json
import os
import time

import pytest

from quarry.clients.cli import build_parser, main
from quarry.clients.cli_options import human_time, parse_time
from quarry.clients.routers import parse_router_addresses


@pytest.fixture
def kolkata(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TZ", "Asia/Kolkata")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def test_printed_time_parses_back_to_the_same_millisecond(kolkata: None) -> None:
    ms = 1_764_000_123_456
    assert human_time(ms) == "2025-11-24 21:32:03,456"
    assert parse_time(human_time(ms)) == ms
    assert parse_time("2025-11-24T21:32:03.456") == ms  # ISO without zone: the same local zone
    assert parse_time("2025-11-24T16:02:03.456Z") == ms
    assert parse_time("2025-11-24T17:02:03.456+01:00") == ms
    assert parse_time(str(ms)) == ms and parse_time("0") == 0


@pytest.mark.parametrize("text", ["1700000000", "yesterday", "-5", "2025-13-01"])
def test_bad_times_are_refused(text: str) -> None:
    with pytest.raises(ValueError):
        parse_time(text)


def test_a_seconds_value_is_refused_naming_the_flag_as_typed() -> None:
    err = io.StringIO()
    assert main(["queryMsgByKey", "-t", "T", "-k", "k", "--endTimestamp", "1700000000"], out=io.StringIO(), err=err) == 2
    assert "--endTimestamp '1700000000': looks like seconds; give epoch milliseconds (1700000000000)" in err.getvalue()


def test_every_option_of_every_command_has_help_and_exit_codes_are_listed() -> None:
    parser = build_parser()
    [sub] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    assert "4  incomplete" in parser.format_help()
    for name, sp in sub.choices.items():
        for action in sp._actions:
            if action.option_strings:
                assert action.help, f"{name} {action.option_strings} has no help"
        assert "exit codes" in sp.format_help()


def test_json_and_n_anywhere_on_the_line() -> None:
    parser = build_parser()
    a = parser.parse_args(["--json", "-n", "a:1", "clusterList"])
    b = parser.parse_args(["clusterList", "--json", "--namesrvAddr", "a:1;b:2"])
    c = parser.parse_args(["clusterList"])
    assert a.json and a.namesrv == "a:1" and b.json and b.namesrv == "a:1;b:2" and not c.json
    assert c.namesrv == os.environ.get("NAMESRV_ADDR", "127.0.0.1:9876")


def test_router_lists() -> None:
    assert parse_router_addresses("a:9876; b:9876;;a:9876") == ["a:9876", "b:9876"]
    assert parse_router_addresses("[::1]:9876") == ["[::1]:9876"]
    for bad in ("", "a", "a:0", "::1:9876", "a:x"):
        with pytest.raises(ValueError):
            parse_router_addresses(bad)


class _ScriptedAdmin:
    """The router's answers to queryMsgById, by id (an exception is raised as the router's error)."""

    answers: dict[str, object] = {}

    def __init__(self, router: str) -> None:
        pass

    def query_by_id(self, msg_id: str) -> object:
        answer = self.answers[msg_id]
        if isinstance(answer, Exception):
            raise answer
        return answer

    def track(self, topic: str, broker_name: str, queue_id: int, queue_offset: int) -> list[object]:
        return []

    def close(self) -> None:
        pass


IDS = ["7F00000100002A9F0000000000000000", "7F00000200002A9F0000000000000100", "7F00000300002A9F0000000000000200", "7F00000300002A9F0000000000000300"]


@pytest.fixture
def scripted_router(monkeypatch: pytest.MonkeyPatch) -> None:
    from quarry.clients import cli
    from quarry.clients.errors import NotFoundError
    from quarry.clients.model import QueryResult
    from quarry.v1 import common_pb2, router_pb2

    def found(n: int, broker: str, answered: bool = True) -> QueryResult:
        outcome = common_pb2.BrokerOutcome(broker_name=broker, answered=answered, error_code="" if answered else "UNAVAILABLE")
        messages = [common_pb2.StoredMessage(topic="T", body=b"b%d" % n, offset_msg_id=IDS[n], broker_name=broker)] if answered else []
        return QueryResult.from_proto(router_pb2.QueryResult(messages=messages, brokers=[outcome], complete=answered))

    _ScriptedAdmin.answers = {IDS[0]: found(0, "broker-a"), IDS[1]: found(1, "broker-b"), IDS[2]: NotFoundError("NOT_FOUND", "no message at 512"),
                              IDS[3]: found(3, "broker-c", answered=False)}
    monkeypatch.setattr(cli, "AdminClient", _ScriptedAdmin)


def test_several_ids_as_json_are_one_document(scripted_router: None) -> None:
    """`quarry --json queryMsgById -i a,b,c` printed one document per id, back to back (jq -s
    read it, json.loads did not): now one QueryResult, shaped as one id's answer."""
    out, err = io.StringIO(), io.StringIO()
    assert main(["--json", "queryMsgById", "-i", ",".join(IDS[:2])], out=out, err=err) == 0
    data = json.loads(out.getvalue())
    assert [m["offsetMsgId"] for m in data["messages"]] == IDS[:2] and data["tracks"] == [[], []] and data["complete"]
    assert [b["brokerName"] for b in data["brokers"]] == ["broker-a", "broker-b"]
    one = io.StringIO()
    assert main(["queryMsgById", "-i", IDS[0], "--json"], out=one, err=io.StringIO()) == 0
    assert set(json.loads(one.getvalue())) == set(data)  # the same shape for one id as for several

    out, err = io.StringIO(), io.StringIO()
    assert main(["--json", "queryMsgById", "-i", ",".join(IDS)], out=out, err=err) == 4  # the worst outcome: incomplete
    data = json.loads(out.getvalue())
    assert [m["offsetMsgId"] for m in data["messages"]] == IDS[:2] and not data["complete"]  # broker-c did not answer
    assert {b["brokerName"]: b["answered"] for b in data["brokers"]} == {"broker-a": True, "broker-b": True, "broker-c": False}
    assert f"-i {IDS[2]}: no message at 512" in err.getvalue() and "broker broker-c did not answer" in err.getvalue()


def test_json_lines_prints_one_compact_document_per_id(scripted_router: None) -> None:
    out = io.StringIO()
    assert main(["queryMsgById", "--json-lines", "-i", ",".join(IDS[:2])], out=out, err=io.StringIO()) == 0
    lines = out.getvalue().splitlines()
    assert [[m["offsetMsgId"] for m in json.loads(line)["messages"]] for line in lines] == [[IDS[0]], [IDS[1]]]
    help_text = " ".join(build_parser().format_help().split())
    assert "--json-lines" in help_text and "one JSON document" in help_text and "one compact JSON document per line" in help_text


def test_every_json_output_goes_through_one_printer() -> None:
    """No command prints JSON itself (`json.dumps` outside print_json could print documents back to back again)."""
    from pathlib import Path

    import quarry.clients.cli as cli
    import quarry.clients.cli_browse as cli_browse

    for module in (cli, cli_browse):
        assert "json.dumps" not in Path(module.__file__).read_text(), module.__name__
