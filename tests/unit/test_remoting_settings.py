"""Remoting settings of the commitlog and the router: defaults, 'off', and the store host they imply."""
from __future__ import annotations

import pytest

from quarry.services.commitlog.config import parse_args as commitlog_args
from quarry.services.query.config import parse_args as router_args


def test_defaults_do_not_clash_with_the_grpc_ports() -> None:
    c, r = commitlog_args([]), router_args([])
    assert (c.bind, c.remoting_bind) == ("127.0.0.1:10911", "127.0.0.1:10931")
    assert (r.bind, r.remoting_bind) == ("127.0.0.1:9876", "127.0.0.1:9877")
    assert c.store_host == "127.0.0.1:10931"  # offsetMsgIds name the broker's remoting address, as mqadmin expects


def test_the_remoting_port_defaults_to_the_bind_host() -> None:
    """A broker on 10.0.0.5 listens and announces 10.0.0.5:10931, not 127.0.0.1:10931: remote
    4.x clients reach it, and two brokers on two hosts issue ids with two store hosts."""
    c = commitlog_args(["--bind", "10.0.0.5:10911"])
    assert (c.remoting_bind, c.remoting_advertise, c.store_host) == ("10.0.0.5:10931", "10.0.0.5:10931", "10.0.0.5:10931")
    assert router_args(["--bind", "10.0.0.5:9876"]).remoting_bind == "10.0.0.5:9877"
    six = commitlog_args(["--bind", "[::1]:10911"])
    assert (six.remoting_bind, six.store_host) == ("[::1]:10931", "[::1]:10931")


def test_behind_an_advertised_address_the_remoting_port_is_announced_on_that_host() -> None:
    c = commitlog_args(["--bind", "0.0.0.0:10911", "--advertise", "broker-a.example:10911"])
    assert (c.remoting_bind, c.remoting_advertise, c.store_host) == ("0.0.0.0:10931", "broker-a.example:10931", "broker-a.example:10931")
    moved = commitlog_args(["--bind", "10.0.0.5:10911", "--advertise", "203.0.113.5:10911", "--remoting-bind", "10.0.0.5:20931"])
    assert moved.remoting_advertise == "203.0.113.5:20931"  # the port given, on the host others dial
    elsewhere = commitlog_args(["--bind", "10.0.0.5:10911", "--remoting-bind", "10.0.0.9:10931"])
    assert elsewhere.remoting_advertise == "10.0.0.9:10931"  # a host of its own: announced as given


def test_a_wildcard_bind_announces_this_machines_address() -> None:
    """Listening on every address, a broker must still announce one others can dial (as
    RocketMQ's brokerIP1 comes from the machine), for gRPC as for remoting."""
    import socket

    machine = socket.gethostbyname(socket.gethostname())
    c = commitlog_args(["--bind", "0.0.0.0:10911"])
    assert (c.advertise, c.remoting_bind, c.remoting_advertise) == (f"{machine}:10911", "0.0.0.0:10931", f"{machine}:10931")
    assert router_args(["--bind", "0.0.0.0:9876"]).remoting_bind == "0.0.0.0:9877"


@pytest.mark.parametrize(("parse", "argv", "message"), [
    (commitlog_args, ["--bind", "127.0.0.1:10931"], "--remoting-bind [env QUARRY_COMMITLOG_REMOTING_BIND]: 127.0.0.1:10931 is the gRPC --bind address"),
    (router_args, ["--bind", "127.0.0.1:9877"], "--remoting-bind [env QUARRY_ROUTER_REMOTING_BIND]: 127.0.0.1:9877 is the gRPC --bind address"),
    (router_args, ["--remoting-bind", "nowhere"], "--remoting-bind [env QUARRY_ROUTER_REMOTING_BIND]: expected host:port, got 'nowhere'"),
])
def test_a_remoting_address_that_cannot_work_is_refused_at_start(parse, argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SystemExit) as exit_:
        parse(argv)
    assert exit_.value.code == 2 and message in capsys.readouterr().err


def test_off_disables_and_the_store_host_follows() -> None:
    c = commitlog_args(["--remoting-bind", "off", "--advertise", "10.0.0.5:10911"])
    assert c.remoting_bind == "" and c.store_host == "10.0.0.5:10911"
    assert router_args(["--remoting-bind", "OFF"]).remoting_bind == ""
    explicit = commitlog_args(["--remoting-advertise", "10.0.0.5:10931", "--store-host", "10.0.0.9:10911"])
    assert (explicit.remoting_advertise, explicit.store_host) == ("10.0.0.5:10931", "10.0.0.9:10911")


def test_environment_works_like_the_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QUARRY_COMMITLOG_REMOTING_BIND", "0.0.0.0:20931")
    monkeypatch.setenv("QUARRY_COMMITLOG_REMOTING_ADVERTISE", "broker-a.example:20931")
    c = commitlog_args([])
    assert (c.remoting_bind, c.remoting_advertise, c.store_host) == ("0.0.0.0:20931", "broker-a.example:20931", "broker-a.example:20931")


def test_a_port_0_remoting_address_is_refused_at_start(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        commitlog_args(["--remoting-bind", "127.0.0.1:0"])
    assert exit_.value.code == 2 and "--remoting-bind" in capsys.readouterr().err
