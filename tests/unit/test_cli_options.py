"""CLI option parsing: times in one zone, seconds refused naming the flag, help on every flag,
router lists, exit codes in --help."""
from __future__ import annotations

import argparse
import io
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
