"""The query router's gRPC servicer: validates, calls the registry and the query engine. Errors
are raised as the services' own and mapped to status codes by services/status.py. No format
logic lives here."""
from __future__ import annotations

import logging
import time
from typing import Awaitable, TypeVar

import grpc

from quarry.formats.addresses import normalize_host_port
from quarry.v1 import common_pb2, router_pb2, router_pb2_grpc
from quarry.services.query import metrics
from quarry.services.log import log_event
from quarry.services.query.browse import browse_topic, search_offset
from quarry.services.errors import Conflict, InvalidArgument, NotFound, ServiceError, checked_topic
from quarry.services.query.queries import Answer, Queries, Scan
from quarry.services.query.registry import Broker, BrokerRegistry, UnknownBrokerError
from quarry.services.status import rpc_errors, status_code

log = logging.getLogger("quarry.router")
AnswerT = TypeVar("AnswerT", bound=Answer)  # a query's own answer type (a browse page adds its expired ranges)


def _result(answer: Answer) -> router_pb2.QueryResult:
    return router_pb2.QueryResult(
        messages=answer.messages,
        brokers=[
            common_pb2.BrokerOutcome(
                broker_name=o.key,
                answered=o.ok,
                error_code=o.error_code,
                error_message=o.error_message,
                messages_returned=len(o.value) if o.ok and isinstance(o.value, (list, Scan)) else 0,
                latency_ms=o.latency_ms,
                attempts=o.attempts,
                ruled_out_by_key_filter=o.ruled_out,
                key_filter_position=o.ruled_out_at if o.ruled_out else 0,
            )
            for o in answer.outcomes
        ],
        complete=answer.complete,
        collisions_filtered=answer.collisions,
        copies=answer.copies,
        searched_begin_timestamp=answer.begin,
        searched_end_timestamp=answer.end,
        notes=answer.notes,
        next_continuation_token=answer.next_token,
    )


async def _run(kind: str, query: Awaitable[AnswerT]) -> AnswerT:
    t0 = time.perf_counter()
    try:
        answer = await query
    except ServiceError as exc:
        code = status_code(exc).name
        metrics.QUERIES.labels(kind, code.lower())[0] += 1
        log_event(log, "query failed", kind=kind, code=code, detail=exc.message)
        raise
    metrics.QUERY_LATENCY.labels(kind).observe(time.perf_counter() - t0)
    metrics.QUERIES.labels(kind, "ok" if answer.complete else "incomplete")[0] += 1
    for o in answer.outcomes:
        if o.ruled_out:  # not a call: its zero latency is not one
            metrics.KEY_FILTER_RULED_OUT.labels(o.key)[0] += 1
            continue
        metrics.FANOUT_LATENCY.labels(o.key).observe(o.latency_ms / 1000.0)
        if not o.ok:
            metrics.FANOUT_FAILURES.labels(o.key, o.error_code)[0] += 1
    return answer


@rpc_errors
class QueryRouterServicer(router_pb2_grpc.QueryRouterServiceServicer):
    """Registry RPCs and the four queries."""

    def __init__(self, registry: BrokerRegistry, queries: Queries) -> None:
        self.registry = registry
        self._refused: dict[str, str] = {}  # broker name -> why its registration is refused now
        self.queries = queries

    async def RegisterBroker(self, request: router_pb2.RegisterBrokerRequest, context: grpc.aio.ServicerContext) -> router_pb2.RegisterBrokerResponse:
        if not request.broker_name:
            raise InvalidArgument("broker_name: must not be empty")
        if not request.commitlog_addr:
            raise InvalidArgument("commitlog_addr: must not be empty (host:port)")
        if not request.store_host or ":" not in request.store_host:
            raise InvalidArgument("store_host: must be ip:port (the address in offsetMsgIds)")
        for i, host in enumerate(request.other_store_hosts):
            if ":" not in host or not host.rpartition(":")[2].isdigit():
                raise InvalidArgument(f"other_store_hosts[{i}]: must be ip:port, got {host!r}")
        if request.rmq5_endpoint and not request.rmq5_endpoint.rpartition(":")[2].isdigit():
            raise InvalidArgument("rmq5_endpoint: must be host:port (or empty)")
        topics: dict[str, int] = {}
        for i, t in enumerate(request.topics):
            checked_topic(t.topic, f"topics[{i}].topic")
            if t.queue_count <= 0:
                raise InvalidArgument(f"topics[{i}].queue_count: must be > 0")
            topics[t.topic] = t.queue_count
        known = {b.name: b for b in self.registry.known()}
        old = known.get(request.broker_name)
        store_host = normalize_host_port(request.store_host)
        try:
            self.registry.register(
                Broker(
                    name=request.broker_name,
                    commitlog_addr=request.commitlog_addr,
                    indexer_addr=request.indexer_addr,
                    store_host=store_host,
                    cluster_name=request.cluster_name or "DefaultCluster",
                    topics=topics,
                    rmq5_endpoint=request.rmq5_endpoint,
                    other_store_hosts=list(request.other_store_hosts),
                    remoting_addr=request.remoting_addr,
                )
            )
        except Conflict as exc:
            # Refused at every heartbeat until the other broker goes: logged when the reason changes.
            if self._refused.get(request.broker_name) != exc.message:
                log_event(log, "broker registration refused", logging.WARNING, broker=request.broker_name, reason=exc.message)
            self._refused[request.broker_name] = exc.message
            raise
        self._refused.pop(request.broker_name, None)
        if old is None or old.missing or old.commitlog_addr != request.commitlog_addr or old.store_host != store_host:
            log_event(log, "broker registered", broker=request.broker_name, commitlog=request.commitlog_addr, indexer=request.indexer_addr, store_host=store_host)
        return router_pb2.RegisterBrokerResponse(expiry_ms=self.registry.expiry_ms)

    async def UnregisterBroker(self, request: router_pb2.UnregisterBrokerRequest, context: grpc.aio.ServicerContext) -> router_pb2.UnregisterBrokerResponse:
        try:
            self.registry.unregister(request.broker_name)
        except UnknownBrokerError as exc:
            raise NotFound(f"broker_name: {exc}") from None
        log_event(log, "broker unregistered", broker=request.broker_name)
        return router_pb2.UnregisterBrokerResponse()

    async def GetTopicRoute(self, request: router_pb2.GetTopicRouteRequest, context: grpc.aio.ServicerContext) -> router_pb2.GetTopicRouteResponse:
        checked_topic(request.topic)
        brokers = [b for b in self.registry.holding(request.topic) if request.topic in b.topics and not b.missing]
        if not brokers:
            raise NotFound(f"no route for topic {request.topic}")
        return router_pb2.GetTopicRouteResponse(
            topic=request.topic,
            brokers=[router_pb2.BrokerQueues(broker_name=b.name, commitlog_addr=b.commitlog_addr, queue_count=b.topics[request.topic]) for b in brokers],
        )

    async def ListBrokers(self, request: router_pb2.ListBrokersRequest, context: grpc.aio.ServicerContext) -> router_pb2.ListBrokersResponse:
        return router_pb2.ListBrokersResponse(
            brokers=[
                router_pb2.BrokerInfo(
                    broker_name=b.name,
                    cluster_name=b.cluster_name,
                    commitlog_addr=b.commitlog_addr,
                    indexer_addr=b.indexer_addr,
                    store_host=b.store_host,
                    topics=[router_pb2.TopicQueues(topic=t, queue_count=n) for t, n in sorted(b.topics.items())],
                    last_heartbeat_ms=b.last_heartbeat_ms,
                    rmq5_endpoint=b.rmq5_endpoint,
                    remoting_addr=b.remoting_addr,
                    missing=b.missing,
                )
                for b in self.registry.known()
            ]
        )

    async def ListTopics(self, request: router_pb2.ListTopicsRequest, context: grpc.aio.ServicerContext) -> router_pb2.ListTopicsResponse:
        return router_pb2.ListTopicsResponse(topics=self.registry.topics())

    async def QueryMsgByKey(self, request: router_pb2.QueryMsgByKeyRequest, context: grpc.aio.ServicerContext) -> router_pb2.QueryMsgByKeyResponse:
        answer = await _run("key", self.queries.by_key(
            request.topic, request.key, request.max_num, request.begin_timestamp, request.end_timestamp, request.timeout_ms, request.continuation_token
        ))
        return router_pb2.QueryMsgByKeyResponse(result=_result(answer))

    async def QueryMsgByUniqueKey(self, request: router_pb2.QueryMsgByUniqueKeyRequest, context: grpc.aio.ServicerContext) -> router_pb2.QueryMsgByUniqueKeyResponse:
        answer = await _run("unique_key", self.queries.by_unique_key(
            request.topic, request.unique_key, request.return_all, request.timeout_ms, request.begin_timestamp, request.end_timestamp
        ))
        return router_pb2.QueryMsgByUniqueKeyResponse(result=_result(answer))

    async def QueryMsgById(self, request: router_pb2.QueryMsgByIdRequest, context: grpc.aio.ServicerContext) -> router_pb2.QueryMsgByIdResponse:
        answer = await _run("id", self.queries.by_id(request.offset_msg_id, request.timeout_ms))
        return router_pb2.QueryMsgByIdResponse(result=_result(answer))

    async def QueryMsgByOffset(self, request: router_pb2.QueryMsgByOffsetRequest, context: grpc.aio.ServicerContext) -> router_pb2.QueryMsgByOffsetResponse:
        answer = await _run("offset", self.queries.by_offset(request.topic, request.broker_name, request.queue_id, request.queue_offset, request.timeout_ms))
        return router_pb2.QueryMsgByOffsetResponse(result=_result(answer))

    async def BrowseTopic(self, request: router_pb2.BrowseTopicRequest, context: grpc.aio.ServicerContext) -> router_pb2.BrowseTopicResponse:
        answer = await _run("browse", browse_topic(
            self.queries, request.topic, request.begin_timestamp, request.end_timestamp, request.tag_expression, request.oldest_first,
            request.max_num, request.continuation_token, request.timeout_ms, request.broker_name,
            request.queue_id if request.has_queue_id else None,
        ))
        return router_pb2.BrowseTopicResponse(result=_result(answer), expired=answer.expired)

    async def TrackMessage(self, request: router_pb2.TrackMessageRequest, context: grpc.aio.ServicerContext) -> router_pb2.TrackMessageResponse:
        holder: list[router_pb2.TrackMessageResponse] = []

        async def _track() -> Answer:
            groups, outcome = await self.queries.track(request.topic, request.broker_name, request.queue_id, request.queue_offset, request.timeout_ms)
            holder.append(router_pb2.TrackMessageResponse(groups=groups))
            return Answer(outcomes=[outcome])

        await _run("track", _track())
        return holder[0]

    async def SearchOffset(self, request: router_pb2.SearchOffsetRequest, context: grpc.aio.ServicerContext) -> router_pb2.SearchOffsetResponse:
        holder: list[router_pb2.SearchOffsetResponse] = []

        async def _search() -> Answer:
            found, outcome = await search_offset(self.queries, request.topic, request.broker_name, request.queue_id, request.timestamp, request.boundary, request.timeout_ms)
            holder.append(router_pb2.SearchOffsetResponse(queue_offset=found.queue_offset, min_queue_offset=found.min_queue_offset,
                                                          max_queue_offset=found.max_queue_offset, broker_name=request.broker_name))
            return Answer(outcomes=[outcome])

        await _run("search_offset", _search())
        return holder[0]
