"""Service settings: flag, else environment, else default; out-of-range values stop the
service at start with the flag, its variable and the rule."""
from __future__ import annotations

import pytest

from quarry.services.commitlog.config import parse_args as commitlog_args
from quarry.services.indexer.config import parse_args as indexer_args
from quarry.services.query.config import parse_args as router_args


def test_flag_beats_environment_beats_default(monkeypatch: pytest.MonkeyPatch) -> None:
    assert commitlog_args([]).default_queues == 4
    monkeypatch.setenv("QUARRY_DEFAULT_QUEUES", "8")
    assert commitlog_args([]).default_queues == 8
    assert commitlog_args(["--default-queues", "2"]).default_queues == 2


@pytest.mark.parametrize(("parse", "argv", "named"), [
    (commitlog_args, ["--segment-size", "0"], "--segment-size [env QUARRY_SEGMENT_SIZE]: must be >= 4096, got 0"),
    (commitlog_args, ["--default-queues", "0"], "--default-queues [env QUARRY_DEFAULT_QUEUES]: must be >= 1"),
    (commitlog_args, ["--max-message-size", "-5"], "--max-message-size"),
    (commitlog_args, ["--flush-interval-ms", "0"], "--flush-interval-ms"),
    (commitlog_args, ["--tail-cache-records", "-1"], "--tail-cache-records"),
    (indexer_args, ["--index-num", "1"], "--index-num [env QUARRY_INDEX_NUM]: must be >= 2"),
    (indexer_args, ["--hash-slots", "0"], "--hash-slots"),
    (router_args, ["--missed-heartbeats", "0"], "--missed-heartbeats"),
    (router_args, ["--query-timeout-ms", "-1"], "--query-timeout-ms"),
])
def test_out_of_range_settings_are_refused_naming_the_flag_and_rule(parse, argv: list[str], named: str, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SystemExit) as stop:
        parse(argv)
    assert stop.value.code == 2
    assert named in capsys.readouterr().err


def test_out_of_range_environment_is_refused_too(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("QUARRY_SEGMENT_SIZE", "10")
    with pytest.raises(SystemExit):
        commitlog_args([])
    assert "QUARRY_SEGMENT_SIZE]: must be >= 4096, got 10" in capsys.readouterr().err
