"""The commitlog gRPC servicer: one method per RPC over the store. Protobuf conversion is in
`convert`, the process start-up in `main`; store errors reach callers as status codes through
the one mapping (services/status.py)."""
from __future__ import annotations

import asyncio
import logging
import time
from typing import AsyncIterator

import grpc

from quarry.formats import tag_expression
from quarry.formats.topic import TopicError, validate_group, validate_topic
from quarry.v1 import commitlog_pb2, commitlog_pb2_grpc, common_pb2
from quarry.services.commitlog.storage.browse import LOWER, UPPER, BrowseRequest, browse, search_offset_by_time
from quarry.services.commitlog.broker import consume_status, consumer_progress
from quarry.services.commitlog.broker.core import Broker
from quarry.services.commitlog.doors.quarry_v1_convert import peer_host, send_result, send_result_columns, send_results, to_group_status
from quarry.services.stored_message import to_stored
from quarry.services.commitlog.storage.errors import DamagedRecord, Expired, InvalidArgument, NotFound
from quarry.services.errors import checked_topic
from quarry.services.commitlog.storage.flushing import TAILER_FLUSH_GAP_S
from quarry.services.commitlog.broker.flush_signal import FlushSignal
from quarry.services.commitlog.storage.store import Appended
from quarry.services.status import rpc_errors

log = logging.getLogger("quarry.commitlog")

MAX_GET_OFFSETS = 1024
MAX_PULL = 1024
DEFAULT_TAIL_BATCH = 512
TAIL_IDLE_S = 1.0  # an empty element this often keeps the indexer's view of max_offset fresh


@rpc_errors
class CommitLogServicer(commitlog_pb2_grpc.CommitLogServiceServicer):
    """Every commitlog RPC over one store, on the event loop. Store calls made here are short
    (CPU, page-cache reads and writes); the only long waits, for fsync and for new records,
    are awaited on the FlushSignal."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.store = broker.store
        self.broker_name = broker.name
        self.stopping = broker.stopping
        self.flushed = broker.flushed
        self.sending = broker.sending
        self.watches = broker.watches

    async def SendMessage(self, request: commitlog_pb2.SendMessageRequest, context: grpc.aio.ServicerContext) -> commitlog_pb2.SendMessageResponse:
        appended = await self.sending.append_in_turn(request.message, "SendMessage", peer=peer_host(context))
        return commitlog_pb2.SendMessageResponse(result=send_result(appended, self.broker_name))

    async def SendBatch(self, request: commitlog_pb2.SendBatchRequest, context: grpc.aio.ServicerContext) -> commitlog_pb2.SendBatchResponse:
        # The request's messages go to the store as they are: no object per message between
        # the protobuf and the log bytes.
        appended = await self.sending.append_flushed(request.messages, "SendBatch", peer=peer_host(context))
        response = commitlog_pb2.SendBatchResponse()
        if request.compact_results:
            send_result_columns(appended, self.broker_name, self.store.config.store_host, response.compact)
        else:
            send_results(appended, self.broker_name, response.results.add)  # filled in place
        return response

    async def SendStream(self, request_iterator: AsyncIterator[commitlog_pb2.SendStreamRequest], context: grpc.aio.ServicerContext) -> commitlog_pb2.SendStreamResponse:
        stored: list[Appended] = []
        peer = peer_host(context)
        i = 0
        async for req in request_iterator:
            prefix = f"stream message {i} rejected ({i} stored before it): "
            stored.append(await self.sending.append_flushed((req.message,), "SendStream", prefix, wait_flush=False, peer=peer))
            i += 1
        response = commitlog_pb2.SendStreamResponse()
        if stored:
            # Nothing is acknowledged before the response: one fsync wait covers the whole stream.
            await self.sending.await_flushed(stored[-1])
            for appended in stored:
                appended.flushed = stored[-1].flushed
                send_results(appended, self.broker_name, response.results.add)
        return response

    async def ViewMessage(self, request: commitlog_pb2.ViewMessageRequest, context: grpc.aio.ServicerContext) -> commitlog_pb2.ViewMessageResponse:
        rec = self.store.read(request.physical_offset)
        return commitlog_pb2.ViewMessageResponse(message=to_stored(rec, self.broker_name))

    async def GetMessages(self, request: commitlog_pb2.GetMessagesRequest, context: grpc.aio.ServicerContext) -> commitlog_pb2.GetMessagesResponse:
        if len(request.physical_offsets) > MAX_GET_OFFSETS:
            raise InvalidArgument(f"physical_offsets: at most {MAX_GET_OFFSETS}, got {len(request.physical_offsets)}")
        response = commitlog_pb2.GetMessagesResponse()
        for i, offset in enumerate(request.physical_offsets):
            if offset < 0:
                raise InvalidArgument(f"physical_offsets[{i}]: must be >= 0")
            try:
                response.messages.append(to_stored(self.store.read(offset), self.broker_name))
            except DamagedRecord:
                response.damaged.append(offset)
            except (NotFound, Expired):
                response.not_found.append(offset)
        return response

    async def PullMessages(self, request: commitlog_pb2.PullMessagesRequest, context: grpc.aio.ServicerContext) -> commitlog_pb2.PullMessagesResponse:
        checked_topic(request.topic)
        if not 1 <= request.max_count <= MAX_PULL:
            raise InvalidArgument(f"max_count: must be 1..{MAX_PULL}")
        records, next_offset, min_off, max_off = self.store.pull(request.topic, request.queue_id, request.queue_offset, request.max_count)
        return commitlog_pb2.PullMessagesResponse(
            messages=[to_stored(r, self.broker_name) for r in records],
            next_queue_offset=next_offset, min_queue_offset=min_off, max_queue_offset=max_off,
        )

    async def ConsumeStatus(self, request: commitlog_pb2.ConsumeStatusRequest, context: grpc.aio.ServicerContext) -> commitlog_pb2.ConsumeStatusResponse:
        checked_topic(request.topic)
        if request.queue_offset < 0:
            raise InvalidArgument("queue_offset: must be >= 0")
        records, _, lo, hi = self.store.pull(request.topic, request.queue_id, request.queue_offset, 1)
        if not records or records[0].queue_offset != request.queue_offset:
            raise NotFound(f"no message at queue offset {request.queue_offset} of {request.topic}/{request.queue_id}; valid range is [{lo}, {hi})")
        found = consume_status.statuses(self.store.consumer_groups, self.store.consumer_offsets, request.topic, request.queue_id,
                                        request.queue_offset, records[0].tags, int(time.time() * 1000), self.broker.consumer_max_attempts)
        online = self.broker.online_groups()
        return commitlog_pb2.ConsumeStatusResponse(groups=[to_group_status(g, g.group in online) for g in found])

    async def GetConsumerProgress(self, request: commitlog_pb2.GetConsumerProgressRequest, context: grpc.aio.ServicerContext) -> commitlog_pb2.GetConsumerProgressResponse:
        try:
            if request.topic:
                validate_topic(request.topic)
            if request.group:
                validate_group(request.group)
        except TopicError as exc:
            raise InvalidArgument(str(exc)) from None
        ranges = consumer_progress.queue_ranges(self.store.state, request.topic)
        groups = consumer_progress.progress(ranges, self.store.consumer_offsets, self.store.consumer_groups, request.group)
        return commitlog_pb2.GetConsumerProgressResponse(
            broker_name=self.broker_name,
            queues=[commitlog_pb2.QueueOffsetRange(topic=r.topic, queue_id=r.queue_id, min_queue_offset=r.min_offset, max_queue_offset=r.max_offset)
                    for r in ranges],
            groups=[commitlog_pb2.GroupQueueProgress(group=g.group, topic=g.topic, queue_id=g.queue_id, consumer_offset=g.consumer_offset,
                                                     max_queue_offset=g.max_offset, lag=g.lag, source=g.source) for g in groups])

    async def Tail(self, request: commitlog_pb2.TailRequest, context: grpc.aio.ServicerContext) -> AsyncIterator[commitlog_pb2.TailResponse]:
        if not 0 <= request.max_batch <= 4096:
            raise InvalidArgument("max_batch: must be 0..4096 (0 means 512)")
        batch = request.max_batch or DEFAULT_TAIL_BATCH
        offset = request.from_offset
        self.store.check_tail_start(offset)
        appended = self.sending.appended_signal()
        cuts = self.store.state.cuts
        while not self.stopping.is_set():
            flushed = self.flushed.current()
            committed = self.store.committed_offset
            if self.store.state.cuts != cuts and committed < offset:
                # A followed writer's log was cut below this reader: what it was sent past the
                # cut is gone, so it must start again and check what it built from it.
                raise Expired(f"the log was cut back to {committed}, below this Tail's position {offset}: start again from a record the log still holds")
            if offset < committed:
                cached = self.store.dispatch_cache.get(offset, batch, committed)
                # A reader behind the cache reads the log: off the loop, which keeps serving sends.
                infos, next_offset = cached if cached is not None else await asyncio.to_thread(self.store.read_dispatch, offset, batch, committed)
                if next_offset == offset:  # no progress would mean spinning: say where and stop
                    raise NotFound(f"no record can be read at physical offset {offset}")
                offset = next_offset
                response = commitlog_pb2.TailResponse(next_offset=offset, max_offset=committed)
                add = response.records.add
                for d in infos:
                    add(physical_offset=d.physical_offset, size=d.size, topic=d.topic, queue_id=d.queue_id,
                        queue_offset=d.queue_offset, keys=d.keys or "", unique_key=d.unique_key or "",
                        tags_code=d.tags_code, store_timestamp=d.store_timestamp, sys_flag=d.sys_flag)
                yield response
                continue
            # In ASYNC mode a waiting tailer should not wait a whole interval. Asked only with
            # something to flush; when nothing is yet, the next append wakes it to ask (a request
            # made right after a flush was dropped, and a paced writer's records then waited for
            # the interval: ~300 ms of index lag at 50k msg/s against ~40 ms flat out).
            if self.store.write_offset > committed:
                self.store.request_flush(TAILER_FLUSH_GAP_S)
                wake: tuple[asyncio.Event, ...] = (flushed,)
            else:
                wake = (flushed, appended.current())  # taken before the second look: no append is missed
                if self.store.write_offset > committed:
                    continue
            woken = await FlushSignal.wait_first(wake, TAIL_IDLE_S)
            if not woken and self.store.committed_offset <= offset and not self.stopping.is_set():
                yield commitlog_pb2.TailResponse(next_offset=offset, max_offset=self.store.committed_offset)

    async def SearchOffsetByTime(self, request: commitlog_pb2.SearchOffsetByTimeRequest, context: grpc.aio.ServicerContext) -> commitlog_pb2.SearchOffsetByTimeResponse:
        checked_topic(request.topic)
        if request.queue_id < 0:
            raise InvalidArgument("queue_id: must be >= 0")
        if request.timestamp < 0:
            raise InvalidArgument("timestamp: must be >= 0 (epoch milliseconds)")
        queues = self.store.topics.get(request.topic)
        if queues is None:
            raise NotFound(f"topic {request.topic} does not exist")
        if request.queue_id >= queues:
            raise NotFound(f"queue {request.queue_id} does not exist: topic {request.topic} has queues 0..{queues - 1}")
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
            raise InvalidArgument(str(exc)) from None
        req = BrowseRequest(
            topic=request.topic, begin=request.begin_timestamp, end=request.end_timestamp, tags=tags,
            newest_first=not request.oldest_first, max_count=request.max_count,
            cursors={(c.topic, c.queue_id): c.next_offset for c in request.cursors},
            done={(c.topic, c.queue_id) for c in request.done},
            queue_ids=list(request.queue_ids) or None, include_parked=not request.queue_ids,
        )
        # Off the loop: a window can take many reads, and sends must keep being served.
        page = await asyncio.to_thread(browse, self.store, req)
        gone = page.gone
        return commitlog_pb2.BrowseMessagesResponse(
            messages=[to_stored(b.record, self.broker_name) for b in page.records],
            queues=[commitlog_pb2.BrowseQueueState(topic=q.topic, queue_id=q.queue_id, window_begin_offset=q.window_begin,
                                                   window_end_offset=q.window_end, exhausted=q.exhausted) for q in page.queues],
            expired=None if gone is None else common_pb2.ExpiredRange(
                broker_name=self.broker_name, from_physical_offset=0, to_physical_offset=gone.below_physical_offset,
                stored_at_or_before=gone.stored_at_or_before,
                queues=[common_pb2.ExpiredQueueRange(topic=g.topic, queue_id=g.queue_id, from_queue_offset=g.first, to_queue_offset=g.end)
                        for g in gone.queues]),
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
            problems=list(self.store.state.problems) + self.watches.stalls(),
        )
