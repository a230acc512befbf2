"""The commitlog process: open the store, serve the RPCs, heartbeat to the router, stop cleanly."""
from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import threading

import grpc
from pathlib import Path

from quarry.v1 import commitlog_pb2, commitlog_pb2_grpc, router_pb2
from quarry.formats.addresses import format_host_port
from quarry.services.commitlog import metrics
from quarry.services.commitlog.doors.quarry_v1_convert import resolve_store_host
from quarry.services.commitlog.broker.core import Broker
from quarry.services.commitlog.broker.delayed_delivery import DelayedDelivery
from quarry.services.commitlog.broker.flush_signal import FlushSignal
from quarry.services.commitlog.health import store_health
from quarry.services.commitlog.registration import Heartbeats, announced_topics, registration_request
from quarry.services.commitlog.broker.offsets_persister import OffsetsPersister
from quarry.services.commitlog.remoting_port import start_remoting
from quarry.services.commitlog.storage.segments import StoreLayoutError
from quarry.services.commitlog.storage.store_lock import StoreLockError
from quarry.services.commitlog.doors.quarry_v1 import CommitLogServicer
from quarry.services.commitlog.storage.store import CommitLogStore, StoreConfig
from quarry.services.commitlog.broker.transaction_check import TransactionCheck, check_settings
from quarry.services import event_loop
from quarry.services.indexer.index_view import open_index_view
from quarry.services.log import configure_logging, log_event
from quarry.services.metrics import StartupError
from quarry.services.settings import metrics_host
from quarry.services.progress import Watches
from quarry.services.rmq5.auth import Authenticator
from quarry.services.commitlog.doors.rmq5_messaging import CommitLogMessagingServicer
from quarry.services.rmq5.contract import SERVICE_NAME as RMQ5_SERVICE
from quarry.services.rmq5.contract import service_grpc as rmq5_grpc
from quarry.services.rmq5.telemetry import ServerPolicy
from quarry.services.security import configured_accounts
from quarry.services.call_tracking import CallTracker
from quarry.services.frames_server import announced, start_frames
from quarry.services.serving import Registration, aio_wait_for_termination, start_aio_server

log = logging.getLogger("quarry.commitlog")

GC_YOUNG_THRESHOLD = 10_000
DELIVERY_STOP_S = 10.0  # longest a stop waits for a round of delayed delivery to end


def _store_host(args: argparse.Namespace) -> tuple[str, int]:
    """The store host offsetMsgIds carry; a name that does not resolve stops the start naming its flag."""
    given = args.store_host or args.advertise
    try:
        return resolve_store_host(given)
    except OSError as exc:
        flag = getattr(args, "store_host_flag", "--store-host [env QUARRY_STORE_HOST]")
        raise StartupError(f"{flag}: {given}: cannot resolve the host ({exc.strerror or exc})") from None


def serve(args: argparse.Namespace) -> int:
    configure_logging(args.log_format, args.log_level)
    try:
        event_loop.run(_serve(args), args.event_loop)
    except (StartupError, StoreLayoutError, StoreLockError) as exc:
        log_event(log, "refusing to start", logging.ERROR, reason=str(exc))
        return 2
    return 0


async def _serve(args: argparse.Namespace) -> None:
    # First, so a taken port stops the process before the store is opened (and recovered).
    metrics.METRICS.serve(args.metrics_port, metrics_host(args))
    store = CommitLogStore(
        StoreConfig(
            store_dir=Path(args.store_dir), store_host=_store_host(args), segment_size=args.segment_size,
            cq_units_per_file=args.cq_units_per_file, flush_mode=args.flush_mode, flush_interval_ms=args.flush_interval_ms,
            sync_flush_timeout_ms=args.sync_flush_timeout_ms, auto_create_topics=args.auto_create_topics,
            default_queues=args.default_queues, max_message_size=args.max_message_size,
            file_reserved_hours=args.file_reserved_hours, read_only=args.read_only,
            dispatch_cache_records=args.tail_cache_records, verify_segments=args.recovery_verify_segments,
            follow=args.follow, follow_interval_ms=args.follow_interval_ms,
        )
    )
    stopping = threading.Event()
    flushed = FlushSignal(asyncio.get_running_loop())
    store.add_flush_listener(flushed.fire)
    # Every loop that moves a position forward, watched: a stall is a problem, health, a metric.
    watches = Watches().register(metrics.METRICS.registry)
    watches.add(store.retention_progress)
    if store.follower is not None:
        watches.add(store.follower.progress)
    tracker = CallTracker(metrics.METRICS)
    broker = Broker(store, args.broker_name, stopping, flushed, watches=watches, consumer_max_attempts=args.max_delivery_attempts,
                    has_company=lambda: tracker.unary_in_flight > 1)
    servicer = CommitLogServicer(broker)
    delivery = None
    if not store.read_only:  # (a read-only or followed store's delayed messages are its writer's to deliver)
        try:
            delivery = DelayedDelivery(broker.sending, flushed)
            watches.add(delivery.progress)
        except (OSError, ValueError, TypeError, AttributeError) as exc:
            store.close()
            raise StartupError(f"{store.dir / 'config' / 'delayOffset.json'}: not a delay offset table ({exc}); fix or move it away") from None
    name = commitlog_pb2.DESCRIPTOR.services_by_name["CommitLogService"].full_name
    # RocketMQ 5 SDKs send here too (local mode), on the same port: see services/rmq5.
    rmq5 = CommitLogMessagingServicer(broker, Authenticator.from_settings(configured_accounts(), args), ServerPolicy(max_body_size=args.max_message_size,
                                      consumer_max_attempts=args.max_delivery_attempts), routers=list(args.router))
    broker.online_sources.append(rmq5.sessions.online_groups)
    watches.add(rmq5.consumption.dead_lettering)
    # The remoting port listens before health says SERVING: a client (or a test) that waits for
    # SERVING may then use either port.
    # QUERY_MESSAGE answered from the indexer's IndexFiles mapped read-only here (same host), else by the indexer.
    key_index = open_index_view(args.index_dir, args.index_hash_slots, args.index_num, args.index_max_num) if args.remoting_bind else None
    if key_index is not None:
        log_event(log, "key queries read the indexer's files here", index_dir=args.index_dir, refresh_interval_ms=key_index.interval_ms)
    remoting = await start_remoting(args, broker, key_index)
    max_message_bytes = max(args.max_message_size * 2 + (1 << 20), 64 * 1024 * 1024 + (1 << 20))
    # The router's unary calls may also come as frames (services/frames_server.py).
    def add_door(s: grpc.aio.Server) -> None:
        commitlog_pb2_grpc.add_CommitLogServiceServicer_to_server(servicer, s)
    frames = await start_frames("commitlog", args.frames_port, args.bind, [add_door], tracker, max_message_bytes)
    # Bodies above the limit are refused by gRPC before the payload is buffered.
    running = await start_aio_server(
        "commitlog", args.bind,
        [Registration(announced(add_door, frames), name),
         Registration(lambda s: rmq5_grpc.add_MessagingServiceServicer_to_server(rmq5, s), RMQ5_SERVICE)],
        max_message_bytes=max_message_bytes,
        metrics=metrics.METRICS, health_check=lambda: store_health(store) or "; ".join(watches.stalls()), tracker=tracker,
    )
    offsets_persister = OffsetsPersister(store.consumer_offsets, args.offsets_persist_interval_ms / 1000.0).start()
    watches.add(offsets_persister.progress)
    # What others are told to dial, once, before registering: an address only reachable here shows at start.
    log_event(log, "broker announces", broker=args.broker_name, grpc=args.advertise, remoting=remoting.address if remoting is not None else "off",
              store_host=format_host_port(*store.config.store_host), rmq5=args.rmq5_advertise or args.advertise,
              routers=";".join(args.router) or "none")
    heartbeat = None
    if args.router:
        def _registration() -> router_pb2.RegisterBrokerRequest:
            return registration_request(args.broker_name, args.advertise, args.indexer_addr, args.cluster_name,
                                        args.heartbeat_interval_ms, store.config.store_host,
                                        announced_topics(store.topics, args.auto_create_topics and not store.read_only, args.default_queues),
                                        rmq5_endpoint=args.rmq5_advertise, other_store_hosts=store.state.store_hosts_seen,
                                        remoting_addr=remoting.address if remoting is not None else "")

        heartbeat = Heartbeats(args.router, _registration, args.heartbeat_interval_ms).start()
        broker.sending.topic_listeners.append(heartbeat.beat_now)
    delivery_stop = asyncio.Event()
    delivering = asyncio.ensure_future(delivery.run(delivery_stop)) if delivery is not None else None
    checking = None
    if not store.read_only:  # halves not ended are checked with their producers (a read-only store's are its writer's)
        check = TransactionCheck(store, broker.transactions, broker.sending, check_settings(args))
        if remoting is not None:
            check.askers.append(remoting.broker.ask_producer)
        check.askers.append(rmq5.ask_producer)  # RocketMQ 5 producers: over their Telemetry streams
        checking = asyncio.ensure_future(check.run(delivery_stop))
    log_event(log, "store ready", dir=args.store_dir, end=store.write_offset, recovered=store.recovered, flush_mode=args.flush_mode)
    # What start-up built (modules, recovered state) lives as long as the process: frozen, the
    # collector's full passes under a send load no longer walk it.
    gc.collect()
    gc.freeze()
    # A batch keeps its 500-10,000 rows alive until answered and the Tail cache the newest
    # 32,768: at the default 700 the young generation was collected every batch or two, each
    # time walking the rows just added (docs/decisions/gc-freeze-and-threshold.md).
    gc.set_threshold(GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])

    loop = asyncio.get_running_loop()

    async def _delivery_ended() -> bool:
        if delivering is not None:
            await asyncio.wait([delivering], timeout=DELIVERY_STOP_S)
        return delivering is None or delivering.done()

    def _stop() -> None:
        stopping.set()
        offsets_persister.stop()  # the store's close writes the last commits
        if heartbeat is not None:
            # No unregister: until it expires, the router keeps reporting this broker as not
            # answering instead of silently leaving its messages out of answers.
            heartbeat.stop(unregister=False)
        if frames is not None:  # calls still running after the grace end before the store closes
            asyncio.run_coroutine_threadsafe(frames.close(), loop).result()
        ended = True
        if delivering is not None:  # its round ends (told in _before_grace) before the store closes
            try:
                ended = asyncio.run_coroutine_threadsafe(_delivery_ended(), loop).result(DELIVERY_STOP_S + 1)
            except Exception:
                ended = False
            if not ended:  # the store closes anyway; the cursors stay as last written: delivered again, never lost
                log_event(log, "delayed delivery did not end before the stop; its last round is delivered again at the next start", logging.WARNING)
        store.close()
        if delivery is not None and ended:
            delivery.save_at_close()  # every copy delivered is on disk now: the cursors too

    def _before_grace() -> None:
        delivery_stop.set()  # no delayed message is delivered to a closing store
        stopping.set()  # lets Tail streams end so the grace period is not spent on them
        rmq5.close()  # and the SDKs' Telemetry streams
        if frames is not None:
            frames.stop_accepting()
        flushed.fire()
        if remoting is not None:
            remoting.server.stop_accepting()  # no remoting send may reach a closing store
            remoting.broker.appended.fire_in_loop()  # long-polling pulls see `stopping` and answer now

    await aio_wait_for_termination(running, "commitlog", on_stop=_stop, before_stop=_before_grace, grace_s=args.shutdown_grace_ms / 1000.0)
    if delivering is not None:
        delivering.cancel()  # (ended in _stop unless its round outlasted DELIVERY_STOP_S)
    if checking is not None:
        checking.cancel()
    if remoting is not None:
        await remoting.close()
    if key_index is not None:
        key_index.stop()
