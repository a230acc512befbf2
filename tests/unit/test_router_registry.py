"""Broker registry: registration, expiry, re-registration, static brokers."""
from __future__ import annotations

import pytest

from quarry.services.errors import Conflict
from quarry.services.query.registry import Broker, BrokerRegistry, UnknownBrokerError, parse_static_brokers


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000

    def __call__(self) -> int:
        return self.now


def _broker(name: str, addr: str = "127.0.0.2:10911", topics: dict[str, int] | None = None) -> Broker:
    return Broker(name=name, commitlog_addr=addr, indexer_addr="127.0.0.2:10921", store_host=addr, topics=topics or {"T": 4})


def test_broker_that_misses_heartbeats_leaves_the_routes_but_stays_reported_missing() -> None:
    clock = Clock()
    reg = BrokerRegistry(expiry_ms=9000, clock_ms=clock)
    reg.register(_broker("a"))
    clock.now += 9000
    assert [(b.name, b.missing) for b in reg.holding("T")] == [("a", False)]
    clock.now += 1
    assert reg.live() == []
    assert [(b.name, b.missing, b.last_heartbeat_ms) for b in reg.holding("T")] == [("a", True, 1_000_000)]
    clock.now += 10**9  # no forget time configured: kept until unregistered
    assert [b.name for b in reg.known()] == ["a"] and reg.topics() == ["T"]
    reg.register(_broker("a"))
    assert [(b.name, b.missing) for b in reg.live()] == [("a", False)]
    reg.unregister("a")
    assert reg.known() == []


def test_missing_broker_is_forgotten_after_the_configured_time() -> None:
    clock = Clock()
    reg = BrokerRegistry(expiry_ms=9000, clock_ms=clock, forget_after_ms=60_000)
    reg.register(_broker("a"))
    clock.now += 9000 + 60_000
    assert [b.missing for b in reg.known()] == [True]
    clock.now += 1
    assert reg.known() == [] and reg.holding("T") == []


def test_ipv6_store_host_is_kept_in_brackets() -> None:
    [b] = parse_static_brokers("a=[::1]:10911,[::1]:10921,::1:10911")
    assert b.store_host == "[::1]:10911"


def test_reregistration_updates_addresses_and_keeps_indexer_when_not_given() -> None:
    reg = BrokerRegistry(expiry_ms=9000, clock_ms=Clock())
    reg.register(_broker("a"))
    moved = Broker(name="a", commitlog_addr="127.0.0.9:1", indexer_addr="", store_host="127.0.0.9:1", topics={"T": 8})
    reg.register(moved)
    got = reg.get("a")
    assert got.commitlog_addr == "127.0.0.9:1" and got.indexer_addr == "127.0.0.2:10921" and got.topics == {"T": 8}
    assert reg.by_store_host("127.0.0.9", 1) is got
    assert reg.by_store_host("127.0.0.2", 10911) is None


def test_unknown_broker_is_reported() -> None:
    reg = BrokerRegistry(expiry_ms=10, clock_ms=Clock())
    with pytest.raises(UnknownBrokerError):
        reg.get("nope")
    with pytest.raises(UnknownBrokerError):
        reg.unregister("nope")


def test_static_brokers_never_expire_and_are_asked_for_every_topic() -> None:
    clock = Clock()
    reg = BrokerRegistry(expiry_ms=10, clock_ms=clock)
    for b in parse_static_brokers("a=127.0.0.2:1,127.0.0.2:2;b=127.0.0.3:1,127.0.0.3:2,10.0.0.3:9"):
        reg.register(b)
    clock.now += 10_000
    assert [b.name for b in reg.holding("Any")] == ["a", "b"]
    assert reg.get("b").store_host == "10.0.0.3:9"
    assert reg.get("a").store_host == "127.0.0.2:1"


def test_static_broker_spec_errors_name_the_format() -> None:
    with pytest.raises(ValueError, match="name=commitlog_addr"):
        parse_static_brokers("justaname")


def test_a_broker_is_found_by_any_store_host_its_records_carry() -> None:
    reg = BrokerRegistry(expiry_ms=9000, clock_ms=Clock())
    reg.register(Broker(name="dead", commitlog_addr="127.0.0.61:20911", indexer_addr="", store_host="10.0.0.7:10911",
                        other_store_hosts=["[2001:db8::ff]:10911", "192.168.0.1:10911"]))
    assert reg.by_store_host("10.0.0.7", 10911).name == "dead"  # type: ignore[union-attr]
    assert reg.by_store_host("2001:db8:0:0:0:0:0:ff", 10911).name == "dead"  # type: ignore[union-attr]
    assert reg.by_store_host("192.168.0.1", 10911).name == "dead"  # type: ignore[union-attr]
    assert reg.by_store_host("127.0.0.61", 20911) is None  # the address dialled is not a store host


def _claiming(name: str, store_host: str, others: list[str] | None = None) -> Broker:
    return Broker(name=name, commitlog_addr=f"{store_host.rpartition(':')[0]}:20911", indexer_addr="", store_host=store_host,
                  other_store_hosts=others or [])


def test_a_store_host_another_live_broker_announced_is_refused_naming_both_brokers() -> None:
    reg = BrokerRegistry(expiry_ms=9000, clock_ms=Clock())
    reg.register(_claiming("broker-a", "10.0.0.5:10931"))
    with pytest.raises(Conflict) as refused:
        reg.register(_claiming("broker-b", "10.0.0.5:10931"))
    message = str(refused.value)
    assert "10.0.0.5:10931" in message and "'broker-a'" in message and "'broker-b'" in message
    assert [b.name for b in reg.known()] == ["broker-a"]  # nothing changed
    assert reg.by_store_host("10.0.0.5", 10931).name == "broker-a"  # type: ignore[union-attr]
    reg.register(_claiming("broker-a", "10.0.0.5:10931"))  # its own heartbeat is no conflict


@pytest.mark.parametrize(("first", "second"), [
    (("10.0.0.5:10931", []), ("10.0.0.6:10931", ["10.0.0.5:10931"])),  # the second's records carry the first's host
    (("10.0.0.6:10931", ["10.0.0.5:10931"]), ("10.0.0.5:10931", [])),  # the first announced it as a further host
    (("[::ffff:10.0.0.5]:10931", []), ("10.0.0.5:10931", [])),  # the same address, written another way
])
def test_further_store_hosts_and_spellings_of_one_address_conflict_too(first: tuple[str, list[str]], second: tuple[str, list[str]]) -> None:
    reg = BrokerRegistry(expiry_ms=9000, clock_ms=Clock())
    reg.register(_claiming("broker-a", first[0], first[1]))
    with pytest.raises(Conflict):
        reg.register(_claiming("broker-b", second[0], second[1]))


def test_a_broker_gone_missing_frees_its_store_host() -> None:
    clock = Clock()
    reg = BrokerRegistry(expiry_ms=9000, clock_ms=clock)
    reg.register(_claiming("broker-a", "10.0.0.5:10931"))
    clock.now += 9001  # broker-a missed its heartbeats: still reported, no longer holding the host
    reg.register(_claiming("broker-b", "10.0.0.5:10931"))
    assert reg.by_store_host("10.0.0.5", 10931).name == "broker-b"  # type: ignore[union-attr]  # the live one, not the missing one sorted first
    assert [(b.name, b.missing) for b in reg.known()] == [("broker-a", True), ("broker-b", False)]
    with pytest.raises(Conflict, match="'broker-b'"):  # back again, it finds its host taken
        reg.register(_claiming("broker-a", "10.0.0.5:10931"))


def test_static_brokers_hold_their_store_hosts_too() -> None:
    reg = BrokerRegistry(expiry_ms=10, clock_ms=Clock())
    for b in parse_static_brokers("a=127.0.0.2:1,127.0.0.2:2,10.0.0.3:9"):
        reg.register(b)
    with pytest.raises(Conflict):
        reg.register(_claiming("b", "10.0.0.3:9"))
