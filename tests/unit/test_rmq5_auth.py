"""RocketMQ 5's authorization header against the clock (issue 33, hole 3): the signed
x-mq-date-time is parsed strictly and must lie within the window of the server's clock, in the
zone the SDKs write it in; the SDKs' own signer still passes."""
from __future__ import annotations

import logging
import time
from datetime import datetime, timedelta, timezone

import pytest

from quarry.services.rmq5.auth import ANY_ZONE, DATE_TIME, UTC_ONLY, Authenticator, authorization_header
from quarry.services.rmq5.contract import Code
from quarry.services.rmq5.status import RmqError
from quarry.services.security import Account

NOW = 1_700_000_000.0  # the server's clock in these tests: 2023-11-14T22:13:20Z
PUB = Account("pub", "pub-secret", topics={"TopicA": {"publish"}})


def _auth(zones: tuple[int, ...] = ANY_ZONE, window_s: float = 15 * 60) -> Authenticator:
    return Authenticator({"pub": PUB}, window_s, zones, clock=lambda: NOW)


def _md(date_time: str, secret: str = "pub-secret") -> dict[str, str]:
    return {"authorization": authorization_header("pub", secret, date_time), DATE_TIME: date_time}


def _at(offset_s: float, zone_h: float = 0.0) -> str:
    """The x-mq-date-time of a client `offset_s` off the server's clock, writing the local time
    of UTC+zone_h marked Z (as the Java and Python SDKs do)."""
    local = datetime.fromtimestamp(NOW + offset_s, timezone.utc) + timedelta(hours=zone_h)
    return local.strftime("%Y%m%dT%H%M%SZ")


def _refusal(auth: Authenticator, md: dict[str, str]) -> str:
    with pytest.raises(RmqError) as err:
        auth.check(md, "SendMessage", "publish", ["TopicA"])
    assert err.value.code == Code.UNAUTHORIZED
    return err.value.message


def test_a_header_signed_long_ago_is_refused_naming_the_date_time_and_the_window() -> None:
    """The issue's probe: a header dated 2001, correctly signed by pub, opened every send."""
    why = _refusal(_auth(), _md("20010101T000000Z"))
    assert why.startswith(f"{DATE_TIME}: 20010101T000000Z is outside the 15-minute window") and "20231114T221320Z" in why
    _auth().check(_md(_at(0)), "SendMessage", "publish", ["TopicA"])  # the same account, now: accepted


@pytest.mark.parametrize(("offset_s", "accepted"), [(-14 * 60, True), (14 * 60, True), (-16 * 60, False), (16 * 60, False)])
def test_the_window_is_measured_from_the_servers_clock(offset_s: float, accepted: bool) -> None:
    auth = _auth(UTC_ONLY)
    if accepted:
        auth.check(_md(_at(offset_s)), "SendMessage", "publish", ["TopicA"])
    else:
        assert "outside the 15-minute window around this server's clock" in _refusal(auth, _md(_at(offset_s)))


@pytest.mark.parametrize("zone_h", [-12, -3.5, 0, 5.75, 8, 14])
def test_sdks_writing_local_time_marked_z_are_accepted_from_any_zone(zone_h: float) -> None:
    _auth().check(_md(_at(-60, zone_h)), "SendMessage", "publish", ["TopicA"])
    if zone_h:
        assert "in any time zone" not in _refusal(_auth(UTC_ONLY), _md(_at(-60, zone_h)))  # utc: local time is off


@pytest.mark.parametrize(("offset_s", "zone_h"), [(-16 * 60, -12), (16 * 60, 14), (-86400, 0), (3 * 86400, 0)])
def test_any_zone_still_refuses_what_no_zone_explains(offset_s: float, zone_h: float) -> None:
    """Quarter-hour zones 15 minutes apart leave no gap: any zone accepts -12:15..+14:15 around
    the clock, and refuses beyond (a header captured lives up to 26 hours, not forever)."""
    assert "in any time zone" in _refusal(_auth(), _md(_at(offset_s, zone_h)))


@pytest.mark.parametrize("value", ["2001010T000000Z", "20240230T000000Z", "20240101T240000Z", "20240101T000000z", "20240101T000000",
                                   "2024-01-01T00:00:00Z", " 20240101T000000Z", "２0240101T000000Z", "1700000000"])
def test_a_malformed_date_time_is_refused_naming_the_header_even_when_signed(value: str) -> None:
    why = _refusal(_auth(), _md(value))
    assert why.startswith(f"{DATE_TIME}: ") and "yyyyMMdd'T'HHmmss'Z'" in why


def test_a_bad_signature_is_still_named_first() -> None:
    assert "bad signature" in _refusal(_auth(), _md("20010101T000000Z", secret="wrong"))


def test_the_python_sdks_own_signer_is_accepted_with_the_real_clock() -> None:
    from rocketmq.v5.util.signature import Signature  # writes datetime.now(): local time marked Z

    class Config:
        class credentials:
            ak, sk = "pub", "pub-secret"
        namespace = ""

    md = dict(Signature.metadata(Config, "client-1"))
    for zones in (ANY_ZONE, UTC_ONLY if time.localtime().tm_gmtoff == 0 else ANY_ZONE):
        Authenticator({"pub": PUB}, 15 * 60, zones).check(md, "SendMessage", "publish", ["TopicA"])


def test_settings_give_the_window_and_zones_and_warn_when_acl_runs_without_tls(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    from quarry.services.commitlog.config import parse_args as commitlog_args
    from quarry.services.query.config import parse_args as router_args

    for var in ("QUARRY_TLS_CERT", "QUARRY_TLS_KEY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("QUARRY_RMQ5_SIGNATURE_WINDOW_MINUTES", "5")
    for args in (commitlog_args(["--rmq5-date-time-zone", "UTC"]), router_args(["--rmq5-date-time-zone", "utc"])):
        with caplog.at_level(logging.WARNING, "quarry.rmq5.auth"):
            caplog.clear()
            auth = Authenticator.from_settings({"pub": PUB}, args)
            assert (auth.window_s, auth.zones) == (300, UTC_ONLY)
            assert [r.getMessage() for r in caplog.records] == ["access control without TLS"]
            caplog.clear()
            assert Authenticator.from_settings(None, args).accounts is None  # ACL off: nothing to say
            assert not caplog.records
    assert Authenticator.from_settings(None, commitlog_args([])).zones == ANY_ZONE


def test_a_consumer_rpc_needs_the_group_permission_too() -> None:
    reader = Account("pub", "pub-secret", topics={"TopicA": {"query"}}, groups={"Billing": {"sub"}, "Audit": set()},
                     default_group_perms=frozenset())
    auth = Authenticator({"pub": reader}, 15 * 60, ANY_ZONE, clock=lambda: NOW)
    md = _md(_at(0))
    auth.check(md, "ReceiveMessage", "query", ["TopicA"], group="Billing")  # topic and group allowed
    for group in ("Audit", "Other"):  # named without sub, and not named with no default
        with pytest.raises(RmqError) as err:
            auth.check(md, "ReceiveMessage", "query", ["TopicA"], group=group)
        assert err.value.code == Code.FORBIDDEN and f"lacks sub permission on group {group}" in err.value.message
    with pytest.raises(RmqError) as err:  # the topic is still checked first
        auth.check(md, "ReceiveMessage", "query", ["TopicB"], group="Billing")
    assert "TopicB" in err.value.message
