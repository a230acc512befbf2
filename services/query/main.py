"""The router process: the registry, the query engine and its doors (quarry.v1, RocketMQ 5,
the NameServer), built by constructor and served on one event loop; stops cleanly."""
from __future__ import annotations

import argparse
import asyncio
import gc
import logging

from quarry.v1 import router_pb2, router_pb2_grpc
from quarry.services.query.doors.nameserver import NameServer
from quarry.services.remoting.acl import ACCESS_KEY, RemotingAcl
from quarry.services.remoting.server import RemotingServer, known_key_check, limits_from
from quarry.services.security import configured_accounts
from quarry.services.query import metrics
from quarry.services import event_loop
from quarry.services.log import configure_logging, log_event
from quarry.services.metrics import StartupError
from quarry.services.settings import metrics_host
from quarry.services.query.broker_clients import PRUNE_IDLE_S, BrokerClients
from quarry.services.errors import Conflict
from quarry.services.query.queries import Queries, QuerySettings
from quarry.services.query.registry import BrokerRegistry, parse_static_brokers
from quarry.services.rmq5.auth import Authenticator
from quarry.services.rmq5.contract import SERVICE_NAME as RMQ5_SERVICE
from quarry.services.rmq5.contract import service_grpc as rmq5_grpc
from quarry.services.query.doors.rmq5_messaging import RouterMessagingServicer
from quarry.services.rmq5.telemetry import ServerPolicy
from quarry.services.serving import Registration, aio_wait_for_termination, start_aio_server
from quarry.services.settings import named
from quarry.services.query.doors.quarry_v1 import QueryRouterServicer

log = logging.getLogger("quarry.router")


def serve(args: argparse.Namespace) -> int:
    configure_logging(args.log_format, args.log_level)
    try:
        return event_loop.run(_serve(args), args.event_loop)
    except StartupError as exc:
        log_event(log, "refusing to start", logging.ERROR, reason=str(exc))
        return 2


def _count_brokers(registry: BrokerRegistry, missing: bool) -> float:
    return float(sum(1 for b in registry.known() if b.missing == missing))


async def _prune_channels(registry: BrokerRegistry, clients: BrokerClients, every_s: float = PRUNE_IDLE_S) -> None:
    """Now and then, close the channels of addresses no registered broker has any more (each
    holds a connection)."""
    while True:
        await asyncio.sleep(every_s)
        keep = {a for b in registry.known() for a in (b.commitlog_addr, b.indexer_addr) if a}
        for address in await clients.prune(keep):
            log_event(log, "broker channel closed", address=address, reason="no registered broker has this address")


async def _serve(args: argparse.Namespace) -> int:
    """Everything on one event loop (grpc.aio): the queries' broker calls are coroutines
    gathered by the fan-out, Telemetry streams are tasks, and the NameServer port is served
    by the same loop."""
    metrics.METRICS.serve(args.metrics_port, metrics_host(args))
    registry = BrokerRegistry(expiry_ms=args.heartbeat_interval_ms * args.missed_heartbeats, forget_after_ms=args.forget_missing_after_ms)
    metrics.BROKERS.labels("live").set_function(lambda: _count_brokers(registry, missing=False))
    metrics.BROKERS.labels("missing").set_function(lambda: _count_brokers(registry, missing=True))
    try:
        for broker in parse_static_brokers(args.static_brokers):
            registry.register(broker)
    except (ValueError, Conflict) as exc:
        raise StartupError(f"{named('--static-brokers')}: {exc}") from None
    clients = BrokerClients()
    queries = Queries(
        registry,
        clients,
        QuerySettings(
            query_timeout_ms=args.query_timeout_ms,
            broker_call_timeout_ms=args.broker_call_timeout_ms,
            clock_skew_ms=args.clock_skew_ms,
            fallback_window_ms=args.fallback_window_ms,
            bodies_from=args.read_bodies_from,
            key_presence=args.key_presence == "on",
        ),
    )
    servicer = QueryRouterServicer(registry, queries)
    name = router_pb2.DESCRIPTOR.services_by_name["QueryRouterService"].full_name
    # The RocketMQ 5 SDKs' access point, on the same port: see services/rmq5.
    rmq5 = RouterMessagingServicer(registry, Authenticator.from_settings(configured_accounts(), args), ServerPolicy(max_body_size=args.max_message_size))
    # The NameServer port listens before health says SERVING: a client (or a test) that waits
    # for SERVING may then use either port.
    remoting = None
    if args.remoting_bind:
        accounts = configured_accounts()
        acl = accounts is not None  # (on: a request naming no account is refused from its header, as the commitlog's)
        remoting = RemotingServer("nameserver", NameServer(registry).handlers(), args.remoting_max_frame_bytes, RemotingAcl(accounts) if accounts is not None else None,
                                  known_key_check(ACCESS_KEY, accounts) if accounts is not None else None, limits_from(args, acl))
        await remoting.start(args.remoting_bind)  # raises StartupError naming --remoting-bind
    running = await start_aio_server("router", args.bind, [
        Registration(lambda s: router_pb2_grpc.add_QueryRouterServiceServicer_to_server(servicer, s), name),
        Registration(lambda s: rmq5_grpc.add_MessagingServiceServicer_to_server(rmq5, s), RMQ5_SERVICE),
    ], metrics=metrics.METRICS)
    pruning = asyncio.get_running_loop().create_task(_prune_channels(registry, clients))
    # What start-up built (modules, protobuf descriptors) lives as long as the process: frozen,
    # a full collection under load no longer walks it (~20 ms with the loop stalled), as the
    # commitlog does.
    gc.collect()
    gc.freeze()

    def _before_grace() -> None:
        rmq5.close()  # open Telemetry streams end, so they do not hold the grace period
        if remoting is not None:
            remoting.stop_accepting()

    await aio_wait_for_termination(running, "router", on_stop=lambda: None, before_stop=_before_grace, grace_s=args.shutdown_grace_ms / 1000.0)
    pruning.cancel()
    if remoting is not None:
        await remoting.close()
    await clients.close()
    return 0
