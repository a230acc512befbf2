"""Heartbeat to the query router: register, then refresh every interval.

The broker keeps taking writes while the router is away; when the router comes back the
next heartbeat registers it again (the router treats every heartbeat as a registration).
"""
from __future__ import annotations

import logging
import threading
from typing import Callable, Iterable

import grpc

from quarry.channels import open_channel

from quarry.formats.topic import AUTO_CREATE_TOPIC_KEY, is_valid_topic
from quarry.v1 import router_pb2, router_pb2_grpc
from quarry.services.log import log_event

log = logging.getLogger("quarry.heartbeat")

# Answers that mean the router heard the broker and said no (not that it is away).
REFUSALS = frozenset({grpc.StatusCode.ALREADY_EXISTS, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION,
                      grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED})


def announced_topics(topics: dict[str, int], auto_create: bool, default_queues: int) -> dict[str, int]:
    """The topics a broker registers: its own, plus TBW102 with its default queue count when
    it creates topics on first send (RocketMQ's marker: producers send new topics along
    TBW102's route, so only to brokers that will create them)."""
    if not auto_create:
        return dict(topics)
    return {AUTO_CREATE_TOPIC_KEY: default_queues, **topics}


class Heartbeat:
    """A daemon thread sending RegisterBroker(build()) to one router every interval_ms."""

    def __init__(self, router_addr: str, build: Callable[[], router_pb2.RegisterBrokerRequest], interval_ms: int) -> None:
        self.router_addr = router_addr
        self.build = build
        self.interval_s = interval_ms / 1000.0
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._channel = open_channel(router_addr)
        self._stub = router_pb2_grpc.QueryRouterServiceStub(self._channel)
        self._thread = threading.Thread(target=self._run, name="heartbeat", daemon=True)
        self.registered = threading.Event()

    def start(self) -> "Heartbeat":
        self._thread.start()
        return self

    def beat_now(self) -> None:
        """Send the next heartbeat at once (e.g. a new topic was created)."""
        self._wake.set()

    def _run(self) -> None:
        state: str | None = None  # "registered", "unreachable" or why the router refuses: logged when it changes
        while not self._stop.is_set():
            try:
                self._stub.RegisterBroker(self.build(), timeout=max(1.0, self.interval_s))
                if state != "registered":
                    log_event(log, "registered with router", router=self.router_addr)
                state = "registered"
                self.registered.set()
            except grpc.RpcError as exc:
                code = exc.code()  # type: ignore[attr-defined]
                self.registered.clear()
                if code in REFUSALS:
                    # The router answered no (a store host another live broker announced, a refused
                    # signature): logged as an error, not as an absence. Retried each beat, since
                    # the other broker may go away.
                    reason = f"{code.name}: {exc.details()}"  # type: ignore[attr-defined]
                    if state != reason:
                        log_event(log, "router refused the registration; will keep retrying", logging.ERROR, router=self.router_addr, reason=reason)
                    state = reason
                else:
                    if state != "unreachable":
                        log_event(log, "router unreachable; will keep retrying", logging.WARNING, router=self.router_addr, code=code.name)
                    state = "unreachable"
            self._wake.wait(self.interval_s)
            self._wake.clear()

    def stop(self, unregister: bool = True) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=5)
        if unregister:
            try:
                self._stub.UnregisterBroker(router_pb2.UnregisterBrokerRequest(broker_name=self.build().broker_name), timeout=1.0)
            except grpc.RpcError:
                pass  # the router expires us anyway
        self._channel.close()


def _host_text(host: tuple[str, int]) -> str:
    ip, port = host
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


def registration_request(broker_name: str, advertise: str, indexer_addr: str, cluster_name: str, heartbeat_interval_ms: int,
                         store_host: tuple[str, int], topics: dict[str, int], rmq5_endpoint: str = "",
                         other_store_hosts: Iterable[tuple[str, int]] = (), remoting_addr: str = "") -> router_pb2.RegisterBrokerRequest:
    """What a broker tells the router about itself (sent by every heartbeat). Topics whose
    names the router would refuse (a RocketMQ log may hold them) are left out: their
    messages are still found by offsetMsgId."""
    primary = _host_text(store_host)
    return router_pb2.RegisterBrokerRequest(
        broker_name=broker_name, commitlog_addr=advertise, indexer_addr=indexer_addr,
        store_host=primary, cluster_name=cluster_name,
        heartbeat_interval_ms=heartbeat_interval_ms, rmq5_endpoint=rmq5_endpoint,
        topics=[router_pb2.TopicQueues(topic=t, queue_count=n) for t, n in sorted(topics.items()) if is_valid_topic(t)],
        other_store_hosts=sorted({_host_text(h) for h in other_store_hosts} - {primary}),
        remoting_addr=remoting_addr,
    )


class Heartbeats:
    """One Heartbeat per router, as a RocketMQ broker registers with every NameServer of its
    list: routers share nothing, so each learns the broker on its own and any of them can
    serve clients; one router being down delays nothing sent to the others."""

    def __init__(self, router_addrs: list[str], build: Callable[[], router_pb2.RegisterBrokerRequest], interval_ms: int) -> None:
        self.beats = [Heartbeat(addr, build, interval_ms) for addr in router_addrs]

    def start(self) -> "Heartbeats":
        for beat in self.beats:
            beat.start()
        return self

    def beat_now(self) -> None:
        for beat in self.beats:
            beat.beat_now()

    def stop(self, unregister: bool = True) -> None:
        for beat in self.beats:
            beat._stop.set()  # all at once: stopping them one by one would add their waits
            beat._wake.set()
        for beat in self.beats:
            beat.stop(unregister)
