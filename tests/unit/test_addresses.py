"""host:port and name-server lists (`a:9876;b:9876`), and the commitlog's --router setting."""
from __future__ import annotations

import pytest

from quarry.formats.addresses import parse_host_port, parse_router_addresses
from quarry.services.commitlog.config import parse_args


def test_router_lists_split_on_semicolons_drop_blanks_and_repeats() -> None:
    assert parse_router_addresses("a:9876;b:9876") == ["a:9876", "b:9876"]
    assert parse_router_addresses(" a:9876 ; ;a:9876;[::1]:9877;") == ["a:9876", "[::1]:9877"]


@pytest.mark.parametrize(("text", "needle"), [
    ("", "empty"), (" ; ", "empty"), ("a", "expected host:port"), ("a:0", "port must be 1..65535"),
    ("a:x", "port must be 1..65535"), ("::1:9876", "in brackets"), (":9876", "expected host:port"),
])
def test_bad_router_lists_are_refused_naming_the_rule(text: str, needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        parse_router_addresses(text, "--router")


def test_host_port_is_returned_stripped() -> None:
    assert parse_host_port(" 127.0.0.1:10911 ") == "127.0.0.1:10911"


def test_commitlog_router_setting_takes_a_list_from_the_flag_or_the_environment(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    assert parse_args(["--router", "r1:9876;r2:9876"]).router == ["r1:9876", "r2:9876"]
    assert parse_args([]).router == []
    monkeypatch.setenv("QUARRY_ROUTER_ADDR", "r1:9876;r2:9877")
    assert parse_args([]).router == ["r1:9876", "r2:9877"]
    monkeypatch.setenv("QUARRY_ROUTER_ADDR", "r1:9876;r2")
    with pytest.raises(SystemExit) as exc:
        parse_args([])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--router [env QUARRY_ROUTER_ADDR]: router address 'r2': expected host:port" in err
