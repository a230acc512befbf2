"""The shared life cycle of a Quarry gRPC server: health, reflection, signals, graceful stop.

Every service's `serve()` builds its servicers and hands them here; this module holds no
service logic. Every service (commitlog, indexer, router) serves on grpc.aio: handlers run on
the event loop, which avoids handing every request between threads (it took the commitlog's
batched sends from ~48k to ~65k msg/s on a 2-core box, and the router's fan-out no longer
parks a worker thread per broker call).

Health comes from state: a service may pass `health_check` (returns why it cannot serve, or
"" when it can), re-evaluated every HEALTH_INTERVAL_S and on change logged as one
`health changed` event. Stopping waits for the calls in flight (`call_tracking`), not for
idle client connections: an idle service exits at once on SIGTERM.
"""
from __future__ import annotations

import asyncio
import logging
import signal
from dataclasses import dataclass, field
from typing import Callable, Iterable

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection, reflection_pb2_grpc

from quarry.services.call_tracking import AioTrackingInterceptor, CallTracker, TrackedServer
from quarry.services.log import log_event
from quarry.services.metrics import ServiceMetrics
from quarry.services.settings import cannot_listen
from quarry.services.security import aio_acl_interceptors, server_credentials

log = logging.getLogger("quarry.serving")

HEALTH_INTERVAL_S = 0.25
HealthCheck = Callable[[], str]  # "" when the service can serve, else the reason it cannot


@dataclass
class Registration:
    """One servicer: how to add it and the full service name it serves."""

    add: Callable[[grpc.aio.Server], None]
    service_name: str


def _evaluate(check: HealthCheck) -> str:
    try:
        return check()
    except Exception as exc:  # a failing check is itself a reason not to serve
        return f"health check failed: {exc!r}"


def _log_health(name: str, reason: str) -> None:
    if reason:
        log_event(log, "health changed", logging.WARNING, service=name, status="NOT_SERVING", reason=reason)
    else:
        log_event(log, "health changed", service=name, status="SERVING")


# Quarry's own channels ping every quarry.channels.KEEPALIVE_TIME_MS while a call is in flight
# (to find a peer gone without a word); gRPC's default would answer pings more often than every
# 5 minutes with GOAWAY "too_many_pings".
MIN_PING_INTERVAL_MS = 5_000


def _options(max_message_bytes: int) -> list[tuple[str, int]]:
    return [
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.so_reuseport", 0),
        ("grpc.http2.min_ping_interval_without_data_ms", MIN_PING_INTERVAL_MS),
    ]


def _register_and_bind(name: str, bind: str, server: grpc.aio.Server, registrations: Iterable[Registration],
                       health_servicer: object) -> tuple[int, list[str], bool]:
    """Add the servicers, health and reflection; bind with TLS when configured. Returns
    (port, service names, TLS on)."""
    regs = list(registrations)
    for reg in regs:
        reg.add(server)  # type: ignore[arg-type]
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    names = [r.service_name for r in regs]
    # The asyncio servicer, named: `server` may be the TrackedServer in front of the grpc.aio
    # server, which enable_server_reflection would take for a thread-pool one.
    reflection_pb2_grpc.add_ServerReflectionServicer_to_server(
        reflection.aio.ReflectionServicer(names + [health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME]), server)
    creds = server_credentials()
    try:
        port = server.add_secure_port(bind, creds) if creds is not None else server.add_insecure_port(bind)
    except RuntimeError:  # newer grpc raises where older returned 0
        port = 0
    if port == 0:
        raise cannot_listen("--bind", bind, "address in use, or not an address of this host")
    return port, names, creds is not None


@dataclass
class RunningAioServer:
    """A started asyncio gRPC server with its health servicer and bound port."""

    server: grpc.aio.Server
    health: health.aio.HealthServicer
    port: int
    address: str
    service_names: list[str] = field(default_factory=list)
    tracker: CallTracker | None = None
    health_check: HealthCheck | None = None
    _monitor: "asyncio.Task[None] | None" = None

    async def set_serving(self, serving: bool) -> None:
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        await self.health.set("", status)
        for name in self.service_names:
            await self.health.set(name, status)

    def monitor_health(self, name: str) -> None:
        """Keep the health status equal to what `health_check` says (a task on the loop; the
        check must not block)."""
        check = self.health_check
        if check is None:
            return

        async def run() -> None:
            # None: the first round always publishes, so a state that changed between the
            # start-up evaluation and this loop is never missed.
            reason: str | None = None
            while True:
                now = _evaluate(check)
                if now != reason:
                    await self.set_serving(not now)
                    _log_health(name, now)
                    reason = now
                await asyncio.sleep(HEALTH_INTERVAL_S)

        self._monitor = asyncio.get_running_loop().create_task(run())


async def start_aio_server(
    name: str, bind: str, registrations: Iterable[Registration], max_message_bytes: int = 128 * 1024 * 1024,
    metrics: ServiceMetrics | None = None, health_check: HealthCheck | None = None, tracker: CallTracker | None = None,
) -> RunningAioServer:
    """Create, register (+health, +reflection), bind and start a server for asyncio servicers
    (coroutine handlers); return it serving (SERVING, or what `health_check` says). Call inside
    the event loop. `tracker`: the server's call tracker when the caller built it first (the
    commitlog's send path asks it whether a call has company)."""
    tracker = tracker or CallTracker(metrics or ServiceMetrics(name))
    acl = aio_acl_interceptors()
    # Calls are tracked by their handlers, wrapped as they are registered; only a server that
    # needs interceptors anyway (ACL) tracks with one, first, so refused calls count too.
    server = grpc.aio.server(options=_options(max_message_bytes), interceptors=[AioTrackingInterceptor(tracker), *acl] if acl else None)
    health_servicer = health.aio.HealthServicer()
    port, names, tls = _register_and_bind(name, bind, server if acl else TrackedServer(server, tracker), registrations, health_servicer)
    await server.start()
    host = bind.rsplit(":", 1)[0]
    running = RunningAioServer(server=server, health=health_servicer, port=port, address=f"{host}:{port}",
                               service_names=names, tracker=tracker, health_check=health_check)
    await running.set_serving(health_check is None or not _evaluate(health_check))
    log_event(log, "server started", service=name, address=running.address, tls=tls)
    running.monitor_health(name)
    return running


async def stop_server(running: RunningAioServer, grace_s: float) -> None:
    """Take no new call, let those in flight finish within the grace period, then stop."""
    if grace_s <= 0:
        await running.server.stop(None)  # one stop: two at once with no grace can crash grpc's core
    else:
        stopping = asyncio.ensure_future(running.server.stop(grace_s))  # no new calls from here
        # grpc would also wait the whole grace for clients that merely hold idle connections:
        # once no call is in flight, end those at once.
        if running.tracker is None or await asyncio.to_thread(running.tracker.wait_idle, grace_s):
            await running.server.stop(None)
        await stopping


async def aio_wait_for_termination(
    running: RunningAioServer, name: str, on_stop: Callable[[], None], grace_s: float = 5.0, before_stop: Callable[[], None] | None = None
) -> None:
    """Wait for SIGTERM/SIGINT, then stop accepting, let in-flight calls finish, run on_stop
    (off the loop: it may block). before_stop runs first, to end long-lived streams that
    would otherwise hold the grace period."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def _handler(signum: int) -> None:
        log_event(log, "signal received", service=name, signal=signal.Signals(signum).name)
        stop.set()

    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, _handler, signum)
    await stop.wait()
    if running._monitor is not None:
        running._monitor.cancel()
    await running.set_serving(False)
    if before_stop is not None:
        before_stop()
    await stop_server(running, grace_s)
    try:
        await asyncio.to_thread(on_stop)
    finally:
        log_event(log, "server stopped", service=name, address=running.address)
