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


PARSERS = {"commitlog": commitlog_args, "indexer": indexer_args, "router": router_args}
BAD_VALUES = [
    ("--flush-mode", "QUARRY_FLUSH_MODE", "sometimes", "must be one of ASYNC, SYNC, got 'sometimes'"),
    ("--segment-size", "QUARRY_SEGMENT_SIZE", "abc", "must be an integer, got 'abc'"),
    ("--segment-size", "QUARRY_SEGMENT_SIZE", "10", "must be >= 4096, got 10"),
    ("--read-only", "QUARRY_READ_ONLY", "maybe", "expected true or false, got 'maybe'"),
    ("--file-reserved-hours", "QUARRY_FILE_RESERVED_HOURS", "soon", "must be a number, got 'soon'"),
    ("--log-format", "QUARRY_LOG_FORMAT", "xml", "must be one of kv, json, got 'xml'"),
    ("--log-level", "QUARRY_LOG_LEVEL", "loud", "must be one of DEBUG, INFO, WARNING, ERROR, CRITICAL, got 'loud'"),
]


@pytest.mark.parametrize(("flag", "env", "raw", "rule"), BAD_VALUES)
def test_environment_and_flag_are_checked_by_one_rule(flag: str, env: str, raw: str, rule: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """The same bad value is refused with the same rule whether it came as a flag or a variable
    (QUARRY_FLUSH_MODE=sometimes once started a commitlog in mode SOMETIMES)."""
    with pytest.raises(SystemExit) as by_flag:
        commitlog_args([flag, raw])
    flag_err = capsys.readouterr().err
    monkeypatch.setenv(env, raw)
    with pytest.raises(SystemExit) as by_env:
        commitlog_args([])
    env_err = capsys.readouterr().err
    assert by_flag.value.code == by_env.value.code == 2
    assert f"{flag} [env {env}]: {rule}" in flag_err
    assert f"{flag} [env {env}]: {rule} (from environment variable {env})" in env_err


def test_environment_values_are_converted_like_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QUARRY_FLUSH_MODE", "sync")
    monkeypatch.setenv("QUARRY_READ_ONLY", "yes")
    args = commitlog_args([])
    assert (args.flush_mode, args.read_only) == ("SYNC", True)
    assert commitlog_args(["--flush-mode", "async"]).flush_mode == "ASYNC"  # the flag still wins


@pytest.mark.parametrize("service", sorted(PARSERS))
def test_every_setting_of_every_service_refuses_a_bad_environment_value(service: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Generic over the parsers' own declarations: a typed or restricted setting given nonsense in
    its variable stops the service naming the flag and the variable."""
    from quarry.services.commitlog.config import build_parser as cl
    from quarry.services.indexer.config import build_parser as ix
    from quarry.services.query.config import build_parser as rt

    parser = {"commitlog": cl, "indexer": ix, "router": rt}[service]()
    checked = 0
    for setting in parser.settings.values():
        if setting.convert is str and setting.choices is None:
            continue  # free text (addresses, names, paths)
        monkeypatch.setenv(setting.env, "\u2603nonsense")
        with pytest.raises(SystemExit):
            PARSERS[service]([])
        assert f"{setting.flag} [env {setting.env}]:" in capsys.readouterr().err
        monkeypatch.delenv(setting.env)
        checked += 1
    assert checked >= 5


@pytest.mark.parametrize("flag", ["--router", "--advertise", "--heartbeat-interval-ms"])
def test_the_indexer_has_no_flag_that_does_nothing(flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    # The commitlog registers its indexer (--indexer-addr); these were parsed and ignored.
    with pytest.raises(SystemExit) as stop:
        indexer_args([flag, "1"])
    assert stop.value.code == 2
    assert f"unrecognized arguments: {flag}" in capsys.readouterr().err


def test_a_port_that_cannot_be_bound_names_the_flag_its_variable_and_the_address() -> None:
    """Every port a service listens on (gRPC, remoting) that cannot be bound stops the
    start with one StartupError in the words of a bad setting, not a traceback."""
    import asyncio
    import socket

    from quarry.services.remoting.server import RemotingServer
    from quarry.services.serving import start_aio_server
    from quarry.services.settings import StartupError

    commitlog_args([])  # this process's settings: their variables are named
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]

        async def refusals() -> list[str]:
            found = []
            for start in (lambda: RemotingServer("commitlog", {}).start(f"127.0.0.1:{port}"),
                          lambda: start_aio_server("commitlog", f"127.0.0.1:{port}", [])):
                with pytest.raises(StartupError) as refused:
                    await start()
                found.append(str(refused.value))
            return found

        remoting, grpc_bind = asyncio.run(refusals())
    assert remoting == f"--remoting-bind [env QUARRY_COMMITLOG_REMOTING_BIND]: cannot listen on 127.0.0.1:{port}: Address already in use"
    assert grpc_bind.startswith(f"--bind [env QUARRY_COMMITLOG_BIND]: cannot listen on 127.0.0.1:{port}: ")
