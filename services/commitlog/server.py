"""The commitlog gRPC servicer: translates protobuf to the store and store errors to status codes."""
from __future__ import annotations

import argparse
import asyncio
import ipaddress
import logging
import socket
import threading
import time
from pathlib import Path
from typing import AsyncIterator

import grpc

from quarry.formats import scheduled, tag_expression
from quarry.formats.record import Record
from quarry.formats.topic import TopicError, validate_topic
from quarry.v1 import commitlog_pb2, commitlog_pb2_grpc, common_pb2, router_pb2
from quarry.services import metrics
from quarry.services.commitlog.browse import LOWER, UPPER, BrowseRequest, browse, search_offset_by_time
from quarry.services.commitlog.errors import DiskFull, Expired, InvalidArgument, NotFound, ReadOnly, StoreError
from quarry.services.commitlog.flush_signal import FlushSignal
from quarry.services.commitlog.flushing import await_flushed
from quarry.services.commitlog.message_input import NewMessage
from quarry.services.commitlog.registration import Heartbeat
from quarry.services.commitlog.store import AppendResult, CommitLogStore, StoreConfig
from quarry.services.log import configure_logging, log_event
from quarry.services.serving import Registration, aio_wait_for_termination, start_aio_server

log = logging.getLogger("quarry.commitlog")

MAX_GET_OFFSETS = 1024
MAX_PULL = 1024
DEFAULT_TAIL_BATCH = 512
TAIL_IDLE_S = 1.0  # an empty element this often keeps the indexer's view of max_offset fresh

_STATUS = {
    InvalidArgument: grpc.StatusCode.INVALID_ARGUMENT,
    NotFound: grpc.StatusCode.NOT_FOUND,
    Expired: grpc.StatusCode.OUT_OF_RANGE,
    ReadOnly: grpc.StatusCode.FAILED_PRECONDITION,
    DiskFull: grpc.StatusCode.RESOURCE_EXHAUSTED,
}


async def _abort(context: grpc.aio.ServicerContext, exc: StoreError, prefix: str = "") -> None:
    code = next((c for t, c in _STATUS.items() if isinstance(exc, t)), grpc.StatusCode.INTERNAL)
    await context.abort(code, prefix + str(exc))


def parse_host(text: str) -> tuple[str, int]:
    """'ip:port' or '[v6]:port' → (ip, port)."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"expected ip:port, got {text!r}")
    return host.strip("[]"), int(port)


def resolve_store_host(advertise: str) -> tuple[str, int]:
    """The IP and port offsetMsgIds carry: a host name is resolved, a wildcard replaced by
    this host's address (an id must hold an IP the router can match)."""
    host, port = parse_host(advertise)
    if host in ("0.0.0.0", "::", ""):
        host = socket.gethostbyname(socket.gethostname())
    try:
        ipaddress.ip_address(host)
    except ValueError:
        host = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][4][0]
    return host, port


def _peer_host(context: grpc.ServicerContext) -> tuple[str, int]:
    peer = context.peer() or ""
    try:
        _, _, rest = peer.partition(":")
        host, port = parse_host(rest.replace("%25", "%"))
        return host.split("%")[0], port
    except ValueError:
        return "127.0.0.1", 0


def to_new_message(m: common_pb2.MessageInput, peer: tuple[str, int]) -> NewMessage:
    """The store's message; an empty born host means the caller's address (`peer`)."""
    # Positional and with each field read once: a batch converts thousands of these.
    bh = m.born_host
    return NewMessage(
        m.topic, m.body, m.keys[:], m.tags, m.unique_key,
        [(p.name, p.value) for p in m.properties] if m.properties else [],
        m.flag, m.queue_id, m.born_timestamp, (bh.ip, bh.port) if bh.ip else peer, m.sys_flag,
        m.reconsume_times, m.prepared_transaction_offset,
    )


def to_stored(rec: Record, broker_name: str = "") -> common_pb2.StoredMessage:
    """A decoded record as the wire's StoredMessage (every MessageExt field)."""
    props = rec.properties
    schedule = scheduled.schedule_of(rec.topic, props, rec.store_timestamp)
    return common_pb2.StoredMessage(
        topic=rec.topic, flag=rec.flag, body=rec.body,
        properties=[common_pb2.Property(name=n, value=v) for n, v in rec.properties_pairs],
        keys=rec.keys, tags=props.get("TAGS", ""), unique_key=props.get("UNIQ_KEY", ""),
        queue_id=rec.queue_id, queue_offset=rec.queue_offset, commit_log_offset=rec.physical_offset,
        store_size=rec.store_size, sys_flag=rec.sys_flag, born_timestamp=rec.born_timestamp,
        born_host=common_pb2.HostAddress(ip=rec.born_host[0], port=rec.born_host[1]),
        store_timestamp=rec.store_timestamp,
        store_host=common_pb2.HostAddress(ip=rec.store_host[0], port=rec.store_host[1]),
        reconsume_times=rec.reconsume_times, prepared_transaction_offset=rec.prepared_transaction_offset,
        body_crc=rec.body_crc, offset_msg_id=rec.offset_msg_id, broker_name=broker_name,
        scheduled=schedule is not None, deliver_timestamp=schedule.deliver_timestamp if schedule else 0,
        real_topic=schedule.real_topic if schedule else "",
    )


def _result_fields(r: AppendResult, broker: str) -> dict[str, object]:
    return dict(
        status=common_pb2.SEND_STATUS_SEND_OK if r.flushed else common_pb2.SEND_STATUS_FLUSH_DISK_TIMEOUT,
        unique_key=r.unique_key, offset_msg_id=r.offset_msg_id, queue_id=r.queue_id,
        queue_offset=r.queue_offset, physical_offset=r.physical_offset, topic=r.topic, broker_name=broker,
    )


def _result(r: AppendResult, broker: str) -> common_pb2.SendResult:
    return common_pb2.SendResult(**_result_fields(r, broker))  # type: ignore[arg-type]


class CommitLogServicer(commitlog_pb2_grpc.CommitLogServiceServicer):
    """Every commitlog RPC over one store, on the event loop. Store calls made here are short
    (CPU, page-cache reads and writes); the only long waits, for fsync and for new records,
    are awaited on the FlushSignal."""

    def __init__(self, store: CommitLogStore, broker_name: str, stopping: threading.Event, flushed: FlushSignal) -> None:
        self.store = store
        self.broker_name = broker_name
        self.stopping = stopping
        self.flushed = flushed
        self.on_topic_created = lambda: None

    async def _append(self, msgs: list[NewMessage], context: grpc.aio.ServicerContext, rpc: str = "SendMessage", abort_prefix: str = "", wait_flush: bool = True) -> list[AppendResult]:
        """Store, count, announce new topics and (SYNC, unless told otherwise) await the fsync."""
        topics_before = len(self.store.topics)
        t0 = time.perf_counter()
        try:
            results = self.store.append_many(msgs, wait_flush=False)
        except StoreError as exc:
            metrics.SEND_ERRORS.labels(type(exc).__name__).inc()
            await _abort(context, exc, abort_prefix)
            raise
        if len(self.store.topics) != topics_before:
            self.on_topic_created()
        if wait_flush:
            await self._await_flushed(results)
        metrics.SEND_LATENCY.labels(rpc).observe(time.perf_counter() - t0)
        metrics.SENT_MESSAGES.labels(results[0].topic).inc(len(results))
        metrics.SENT_BYTES.inc(sum(r.size for r in results))
        metrics.STORE_MAX_OFFSET.set(self.store.write_offset)
        return results

    async def _await_flushed(self, results: list[AppendResult]) -> None:
        """SYNC mode: return once the results are fsynced, or mark them not flushed at the timeout."""
        if self.store.config.flush_mode != "SYNC" or not results:
            return
        end = results[-1].physical_offset + results[-1].size
        if not await await_flushed(self.store.flusher, self.flushed, end, self.store.config.sync_flush_timeout_ms / 1000.0):
            for r in results:
                r.flushed = False

    async def SendMessage(self, request: commitlog_pb2.SendMessageRequest, context: grpc.aio.ServicerContext) -> commitlog_pb2.SendMessageResponse:
        (r,) = await self._append([to_new_message(request.message, _peer_host(context))], context)
        return commitlog_pb2.SendMessageResponse(result=_result(r, self.broker_name))

    async def SendBatch(self, request: commitlog_pb2.SendBatchRequest, context: grpc.aio.ServicerContext) -> commitlog_pb2.SendBatchResponse:
        peer = _peer_host(context)
        msgs = [to_new_message(m, peer) for m in request.messages]
        results = await self._append(msgs, context, rpc="SendBatch")
        response = commitlog_pb2.SendBatchResponse()
        add = response.results.add  # filling in place: no SendResult copied per message
        for r in results:
            add(**_result_fields(r, self.broker_name))
        return response

    async def SendStream(self, request_iterator: AsyncIterator[commitlog_pb2.SendStreamRequest], context: grpc.aio.ServicerContext) -> commitlog_pb2.SendStreamResponse:
        stored: list[AppendResult] = []
        peer = _peer_host(context)
        i = 0
        async for req in request_iterator:
            prefix = f"stream message {i} rejected ({len(stored)} stored before it): "
            stored += await self._append([to_new_message(req.message, peer)], context, "SendStream", prefix, wait_flush=False)
            i += 1
        # Nothing is acknowledged before the response: one fsync wait covers the whole stream.
        await self._await_flushed(stored)
        return commitlog_pb2.SendStreamResponse(results=[_result(r, self.broker_name) for r in stored])

    async def ViewMessage(self, request: commitlog_pb2.ViewMessageRequest, context: grpc.aio.ServicerContext) -> commitlog_pb2.ViewMessageResponse:
        try:
            rec = self.store.read(request.physical_offset)
        except StoreError as exc:
            await _abort(context, exc)
            raise
        return commitlog_pb2.ViewMessageResponse(message=to_stored(rec, self.broker_name))

    async def GetMessages(self, request: commitlog_pb2.GetMessagesRequest, context: grpc.aio.ServicerContext) -> commitlog_pb2.GetMessagesResponse:
        if len(request.physical_offsets) > MAX_GET_OFFSETS:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"physical_offsets: at most {MAX_GET_OFFSETS}, got {len(request.physical_offsets)}")
        response = commitlog_pb2.GetMessagesResponse()
        for i, offset in enumerate(request.physical_offsets):
            if offset < 0:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"physical_offsets[{i}]: must be >= 0")
            try:
                response.messages.append(to_stored(self.store.read(offset), self.broker_name))
            except (NotFound, Expired):
                response.not_found.append(offset)
        return response

    async def PullMessages(self, request: commitlog_pb2.PullMessagesRequest, context: grpc.aio.ServicerContext) -> commitlog_pb2.PullMessagesResponse:
        try:
            validate_topic(request.topic)
        except TopicError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        if not 1 <= request.max_count <= MAX_PULL:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"max_count: must be 1..{MAX_PULL}")
        try:
            records, next_offset, min_off, max_off = self.store.pull(request.topic, request.queue_id, request.queue_offset, request.max_count)
        except StoreError as exc:
            await _abort(context, exc)
            raise
        return commitlog_pb2.PullMessagesResponse(
            messages=[to_stored(r, self.broker_name) for r in records],
            next_queue_offset=next_offset, min_queue_offset=min_off, max_queue_offset=max_off,
        )

    async def Tail(self, request: commitlog_pb2.TailRequest, context: grpc.aio.ServicerContext) -> AsyncIterator[commitlog_pb2.TailResponse]:
        if not 0 <= request.max_batch <= 4096:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "max_batch: must be 0..4096 (0 means 512)")
        batch = request.max_batch or DEFAULT_TAIL_BATCH
        offset = request.from_offset
        try:
            self.store.check_tail_start(offset)
        except StoreError as exc:
            await _abort(context, exc)
            raise
        while not self.stopping.is_set():
            event = self.flushed.current()
            committed = self.store.committed_offset
            if offset < committed:
                try:
                    cached = self.store.dispatch_cache.get(offset, batch, committed)
                    # A reader behind the cache reads the log: off the loop, which keeps serving sends.
                    infos, next_offset = cached if cached is not None else await asyncio.to_thread(self.store.read_dispatch, offset, batch, committed)
                except StoreError as exc:
                    await _abort(context, exc)
                    raise
                if next_offset == offset:  # no progress would mean spinning: say where and stop
                    await context.abort(grpc.StatusCode.NOT_FOUND, f"no record can be read at physical offset {offset}")
                offset = next_offset
                response = commitlog_pb2.TailResponse(next_offset=offset, max_offset=committed)
                add = response.records.add
                for d in infos:
                    add(physical_offset=d.physical_offset, size=d.size, topic=d.topic, queue_id=d.queue_id,
                        queue_offset=d.queue_offset, keys=d.keys or "", unique_key=d.unique_key or "",
                        tags_code=d.tags_code, store_timestamp=d.store_timestamp, sys_flag=d.sys_flag)
                yield response
                continue
            self.store.request_flush()  # in ASYNC mode a waiting tailer should not wait a whole interval
            await self.flushed.wait(event, TAIL_IDLE_S)
            if self.store.committed_offset <= offset and not self.stopping.is_set():
                yield commitlog_pb2.TailResponse(next_offset=offset, max_offset=self.store.committed_offset)

    async def SearchOffsetByTime(self, request: commitlog_pb2.SearchOffsetByTimeRequest, context: grpc.aio.ServicerContext) -> commitlog_pb2.SearchOffsetByTimeResponse:
        try:
            validate_topic(request.topic)
        except TopicError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        if request.queue_id < 0:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "queue_id: must be >= 0")
        if request.timestamp < 0:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "timestamp: must be >= 0 (epoch milliseconds)")
        queues = self.store.topics.get(request.topic)
        if queues is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"topic {request.topic} does not exist")
        if request.queue_id >= queues:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"queue {request.queue_id} does not exist: topic {request.topic} has queues 0..{queues - 1}")
        cq = self.store.cqs.existing(request.topic, request.queue_id)
        if cq is None:
            return commitlog_pb2.SearchOffsetByTimeResponse()
        boundary = UPPER if request.boundary == common_pb2.BOUNDARY_TYPE_UPPER else LOWER
        offset = await asyncio.to_thread(search_offset_by_time, self.store, cq, request.timestamp, boundary)
        return commitlog_pb2.SearchOffsetByTimeResponse(queue_offset=offset, min_queue_offset=cq.min_offset, max_queue_offset=cq.max_offset)

    async def BrowseMessages(self, request: commitlog_pb2.BrowseMessagesRequest, context: grpc.aio.ServicerContext) -> commitlog_pb2.BrowseMessagesResponse:
        try:
            validate_topic(request.topic)
            tags = tag_expression.parse(request.tag_expression)
        except (TopicError, tag_expression.TagExpressionError) as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        req = BrowseRequest(
            topic=request.topic, begin=request.begin_timestamp, end=request.end_timestamp, tags=tags,
            newest_first=not request.oldest_first, max_count=request.max_count,
            cursors={(c.topic, c.queue_id): c.next_offset for c in request.cursors},
            done={(c.topic, c.queue_id) for c in request.done},
            queue_ids=list(request.queue_ids) or None, include_parked=not request.queue_ids,
        )
        try:
            # Off the loop: a window can take many reads, and sends must keep being served.
            page = await asyncio.to_thread(browse, self.store, req)
        except StoreError as exc:
            await _abort(context, exc)
            raise
        return commitlog_pb2.BrowseMessagesResponse(
            messages=[to_stored(b.record, self.broker_name) for b in page.records],
            queues=[commitlog_pb2.BrowseQueueState(topic=q.topic, queue_id=q.queue_id, window_begin_offset=q.window_begin,
                                                   window_end_offset=q.window_end, exhausted=q.exhausted) for q in page.queues],
        )

    async def GetStoreStatus(self, request: commitlog_pb2.GetStoreStatusRequest, context: grpc.aio.ServicerContext) -> commitlog_pb2.GetStoreStatusResponse:
        st = self.store.status()
        host = self.store.config.store_host
        return commitlog_pb2.GetStoreStatusResponse(
            broker_name=self.broker_name,
            store_host=common_pb2.HostAddress(ip=host[0], port=host[1]),
            min_offset=st.min_offset, max_offset=st.max_offset, committed_offset=st.committed_offset,
            segments=[commitlog_pb2.SegmentInfo(file_name=n, start_offset=s, written_bytes=w, size=z) for n, s, w, z in st.segments],
            topics=[commitlog_pb2.TopicInfo(topic=t, queue_count=len(q), max_queue_offsets=q) for t, q in st.topics.items()],
            flush_mode=commitlog_pb2.FLUSH_MODE_SYNC if st.flush_mode == "SYNC" else commitlog_pb2.FLUSH_MODE_ASYNC,
            read_only=st.read_only, corruption=st.corruption, recovered=st.recovered,
        )


def serve(args: argparse.Namespace) -> int:
    configure_logging()
    asyncio.run(_serve(args))
    return 0


async def _serve(args: argparse.Namespace) -> None:
    store = CommitLogStore(
        StoreConfig(
            store_dir=Path(args.store_dir), store_host=resolve_store_host(args.advertise), segment_size=args.segment_size,
            cq_units_per_file=args.cq_units_per_file, flush_mode=args.flush_mode, flush_interval_ms=args.flush_interval_ms,
            sync_flush_timeout_ms=args.sync_flush_timeout_ms, auto_create_topics=args.auto_create_topics,
            default_queues=args.default_queues, max_message_size=args.max_message_size,
            file_reserved_hours=args.file_reserved_hours, read_only=args.read_only,
            dispatch_cache_records=args.tail_cache_records,
        )
    )
    stopping = threading.Event()
    metrics.start_metrics_server(args.metrics_port, args.bind.rsplit(":", 1)[0].strip("[]"))
    flushed = FlushSignal(asyncio.get_running_loop())
    store.add_flush_listener(flushed.fire)
    servicer = CommitLogServicer(store, args.broker_name, stopping, flushed)
    name = commitlog_pb2.DESCRIPTOR.services_by_name["CommitLogService"].full_name
    # Bodies above the limit are refused by gRPC before the payload is buffered.
    running = await start_aio_server(
        "commitlog", args.bind,
        [Registration(lambda s: commitlog_pb2_grpc.add_CommitLogServiceServicer_to_server(servicer, s), name)],
        max_message_bytes=max(args.max_message_size * 2 + (1 << 20), 64 * 1024 * 1024 + (1 << 20)),
    )
    heartbeat = None
    ip, port = store.config.store_host
    store_host_text = f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"
    if args.router:
        def _registration() -> router_pb2.RegisterBrokerRequest:
            return router_pb2.RegisterBrokerRequest(
                broker_name=args.broker_name, commitlog_addr=args.advertise, indexer_addr=args.indexer_addr,
                store_host=store_host_text, cluster_name=args.cluster_name, heartbeat_interval_ms=args.heartbeat_interval_ms,
                topics=[router_pb2.TopicQueues(topic=t, queue_count=n) for t, n in sorted(store.topics.items())],
            )

        heartbeat = Heartbeat(args.router, _registration, args.heartbeat_interval_ms).start()
        servicer.on_topic_created = heartbeat.beat_now
    log_event(log, "store ready", dir=args.store_dir, end=store.write_offset, recovered=store.recovered, flush_mode=args.flush_mode)

    def _stop() -> None:
        stopping.set()
        if heartbeat is not None:
            # No unregister: until it expires, the router keeps reporting this broker as not
            # answering instead of silently leaving its messages out of answers.
            heartbeat.stop(unregister=False)
        store.close()

    def _before_grace() -> None:
        stopping.set()  # lets Tail streams end so the grace period is not spent on them
        flushed.fire()

    await aio_wait_for_termination(running, "commitlog", on_stop=_stop, before_stop=_before_grace)
