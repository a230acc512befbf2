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
