"""The broker registry: who is alive, where they are, which topics they hold.

Plain Python (no gRPC). Brokers register and heartbeat; one that misses heartbeats for
`expiry_ms` leaves the routes but is kept as *missing* (with its last heartbeat), so queries
of its topics keep saying it did not answer, until it registers again, it is unregistered
(clean shutdown or an operator), or `forget_after_ms` more pass (0: never). Static brokers
(configured at start) never expire.

A store host (the ip:port in offsetMsgIds) belongs to one live broker: a broker announcing one
that another live broker announced is refused (`Conflict`), since an id naming it could not
be told apart; a broker gone missing frees its store hosts.
"""
from __future__ import annotations

import functools
import ipaddress
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from quarry.formats.addresses import normalize_host_port
from quarry.services.errors import Conflict


@dataclass
class Broker:
    """What the router knows of one broker."""

    name: str
    commitlog_addr: str
    indexer_addr: str
    store_host: str
    cluster_name: str = "DefaultCluster"
    topics: dict[str, int] = field(default_factory=dict)
    last_heartbeat_ms: int = 0
    static: bool = False
    rmq5_endpoint: str = ""  # where RocketMQ 5 SDKs reach it; empty: commitlog_addr
    other_store_hosts: list[str] = field(default_factory=list)  # further ip:port its records carry
    remoting_addr: str = ""  # RocketMQ 4 remoting (broker) address, given to NameServer clients
    missing: bool = False


class UnknownBrokerError(LookupError):
    """No live broker by that name."""


@dataclass
class _View:
    """The table as queries read it, rebuilt only when it can have changed: a registration,
    an unregistration, or the clock passing the next expiry or forget time (`valid_until`)."""

    brokers: list[Broker]  # live and missing, sorted by name
    valid_until: int
    by_store_host: dict[tuple[object, int], Broker] = field(default_factory=dict)
    holding: dict[str, list[Broker]] = field(default_factory=dict)


class BrokerRegistry:
    """Thread-safe broker table with heartbeat expiry."""

    def __init__(self, expiry_ms: int, clock_ms: Callable[[], int] | None = None, forget_after_ms: int = 0) -> None:
        self.expiry_ms = expiry_ms
        self.forget_after_ms = forget_after_ms
        self._clock = clock_ms or (lambda: int(time.time() * 1000))
        self._lock = threading.Lock()
        self._brokers: dict[str, Broker] = {}
        self._view: _View | None = None

    def register(self, broker: Broker) -> None:
        """Add or refresh a broker; a re-registration replaces addresses and topics.

        An empty indexer address keeps the one already known, so a commitlog heartbeat
        does not erase what its indexer announced. Conflict when another live broker
        announced one of its store hosts (nothing changes then).
        """
        with self._lock:
            self._check_store_hosts(broker)
            old = self._brokers.get(broker.name)
            if old is not None and not broker.indexer_addr:
                broker.indexer_addr = old.indexer_addr
            broker.last_heartbeat_ms = self._clock()
            broker.missing = False
            self._brokers[broker.name] = broker
            self._view = None

    def _check_store_hosts(self, broker: Broker) -> None:
        """(Under the lock.) Refuse store hosts a live broker of another name announced."""
        view = self._current()
        for store_host in (broker.store_host, *broker.other_store_hosts):
            key = _store_host_key(store_host)
            holder = view.by_store_host.get(key) if key is not None else None
            if holder is not None and holder.name != broker.name and not holder.missing:
                raise Conflict(f"store host {store_host}: already announced by live broker {holder.name!r}, so broker {broker.name!r} "
                               "may not announce it too (an offsetMsgId naming it would reach either); give each broker its own "
                               "store host (--store-host, or its remoting address)")

    def unregister(self, name: str) -> None:
        with self._lock:
            if self._brokers.pop(name, None) is None:
                raise UnknownBrokerError(f"unknown broker {name!r}")
            self._view = None

    def _current(self) -> _View:
        """The view for now (under the lock): `missing` set on brokers past expiry, forgotten
        ones dropped. Every query reads the registry, so it is not rebuilt per query."""
        now = self._clock()
        view = self._view
        if view is not None and now < view.valid_until:
            return view
        valid_until = 2**63 - 1
        for name, b in list(self._brokers.items()):
            if b.static:
                continue
            silent = now - b.last_heartbeat_ms
            b.missing = silent > self.expiry_ms
            if self.forget_after_ms and silent > self.expiry_ms + self.forget_after_ms:
                del self._brokers[name]
                continue
            # The next instant this broker's state changes: it goes missing, or is forgotten.
            if not b.missing:
                valid_until = min(valid_until, b.last_heartbeat_ms + self.expiry_ms + 1)
            elif self.forget_after_ms:
                valid_until = min(valid_until, b.last_heartbeat_ms + self.expiry_ms + self.forget_after_ms + 1)
        view = _View(sorted(self._brokers.values(), key=lambda b: b.name), valid_until)
        # Live brokers first: a store host freed by a missing broker maps to the live one that took it.
        for broker in sorted(view.brokers, key=lambda b: b.missing):
            for store_host in (broker.store_host, *broker.other_store_hosts):
                key = _store_host_key(store_host)
                if key is not None:
                    view.by_store_host.setdefault(key, broker)
        self._view = view
        return view

    def known(self) -> list[Broker]:
        """Live and missing brokers sorted by name (`missing` set on those past expiry)."""
        with self._lock:
            return list(self._current().brokers)

    def live(self) -> list[Broker]:
        """Brokers that heartbeat (or are static), sorted by name."""
        return [b for b in self.known() if not b.missing]

    def get(self, name: str) -> Broker:
        """A live or missing broker by name (callers check `missing`)."""
        for broker in self.known():
            if broker.name == name:
                return broker
        raise UnknownBrokerError(f"unknown broker {name!r}")

    def holding(self, topic: str) -> list[Broker]:
        """Live and missing brokers holding `topic`; a static broker that never announced
        topics is asked for all. Callers report missing ones as not answering."""
        with self._lock:
            view = self._current()
            found = view.holding.get(topic)
            if found is None:
                found = [b for b in view.brokers if topic in b.topics or (b.static and not b.topics)]
                if found:  # only topics some broker holds: any name a client sends must not grow it
                    view.holding[topic] = found
            return list(found)

    def by_store_host(self, ip: str, port: int) -> Broker | None:
        """The live or missing broker whose advertised store host is ip:port (addresses compared as IPs)."""
        with self._lock:
            return self._current().by_store_host.get((_ip(ip) or ip, port))

    def topics(self) -> list[str]:
        return sorted({t for b in self.known() for t in b.topics})


def _store_host_key(store_host: str) -> tuple[object, int] | None:
    """ip:port as compared (addresses as IPs, IPv4-mapped as IPv4); None when not ip:port."""
    host, _, port = store_host.rpartition(":")
    if not port.isdigit():
        return None
    return (_ip(host.strip("[]")) or host.strip("[]"), int(port))


@functools.lru_cache(maxsize=4096)  # a query by id parses its broker's host each time: a few hosts
def _ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        addr = ipaddress.ip_address(text)
    except ValueError:
        return None
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        return addr.ipv4_mapped
    return addr


def parse_static_brokers(text: str) -> list[Broker]:
    """Parse `name=commitlog_addr,indexer_addr,store_host;…` (store host defaults to the commitlog address)."""
    brokers = []
    for item in filter(None, (part.strip() for part in text.split(";"))):
        name, sep, rest = item.partition("=")
        addrs = [a.strip() for a in rest.split(",")]
        if not sep or not name or not addrs[0]:
            raise ValueError(f"static broker {item!r}: expected name=commitlog_addr[,indexer_addr[,store_host]]")
        indexer = addrs[1] if len(addrs) > 1 else ""
        store_host = normalize_host_port(addrs[2] if len(addrs) > 2 and addrs[2] else addrs[0])
        brokers.append(Broker(name=name.strip(), commitlog_addr=addrs[0], indexer_addr=indexer, store_host=store_host, static=True))
    return brokers
