"""MessagingService at the router, the SDKs' access point: QueryRoute, plus the client
lifecycle RPCs. Sends go to the brokers' endpoints QueryRoute returns (local mode); a send
addressed here is answered ILLEGAL_ACCESS_POINT saying so. Thread-pool flavour.
"""
from __future__ import annotations

import logging
import threading
from typing import Any, Iterator

from quarry.services.log import log_event
from quarry.services.query.registry import BrokerRegistry
from quarry.services.rmq5 import client_calls, telemetry
from quarry.services.rmq5.auth import CLIENT_ID, Authenticator
from quarry.services.rmq5.contract import Code, service, service_grpc, v2
from quarry.services.rmq5.route import query_route
from quarry.services.rmq5.sessions import Sessions
from quarry.services.rmq5.status import RmqError, ok, status_of
from quarry.services.rmq5.unsupported import fill_unsupported

log = logging.getLogger("quarry.rmq5")
_SEND_HERE = "this is the access point (router): SDKs send to the broker endpoints QueryRoute returns"


# A Telemetry stream holds one of the router's worker threads for its whole life. The SDKs open
# theirs to the brokers' endpoints, seldom to the access point; this cap keeps clients that do
# from taking every worker the queries need.
MAX_TELEMETRY_STREAMS = 8


class RouterMessagingServicer(service_grpc.MessagingServiceServicer):
    def __init__(self, registry: BrokerRegistry, auth: Authenticator, policy: telemetry.ServerPolicy,
                 max_telemetry_streams: int = MAX_TELEMETRY_STREAMS) -> None:
        self.registry = registry
        self.auth = auth
        self.policy = policy
        self.sessions = Sessions()
        self._streams = threading.BoundedSemaphore(max_telemetry_streams)
        self._max_streams = max_telemetry_streams

    def QueryRoute(self, request: service.QueryRouteRequest, context: Any) -> service.QueryRouteResponse:
        try:
            # As RocketMQ's ACL: a route is shown to producers and consumers (PUB or SUB).
            self.auth.check(client_calls.metadata(context), "QueryRoute", ("publish", "query"), [request.topic.name])
            if request.topic.resource_namespace:
                raise RmqError(Code.BAD_REQUEST, f"topic.resource_namespace: namespaces are not supported (got {request.topic.resource_namespace!r})")
            queues = query_route(self.registry, request.topic)
        except RmqError as exc:
            return service.QueryRouteResponse(status=status_of(exc))
        except Exception as exc:  # never an unanswered call
            return service.QueryRouteResponse(status=client_calls.internal(exc, "QueryRoute"))
        return service.QueryRouteResponse(status=ok(), message_queues=queues)

    def Heartbeat(self, request: service.HeartbeatRequest, context: Any) -> service.HeartbeatResponse:
        return client_calls.heartbeat(self.auth, self.sessions, request, client_calls.metadata(context))

    def NotifyClientTermination(self, request: service.NotifyClientTerminationRequest, context: Any) -> service.NotifyClientTerminationResponse:
        return client_calls.terminate(self.auth, self.sessions, request, client_calls.metadata(context), context.peer())

    def Telemetry(self, request_iterator: Iterator[service.TelemetryCommand], context: Any) -> Iterator[service.TelemetryCommand]:
        md = client_calls.metadata(context)
        refusal = client_calls.telemetry_refusal(self.auth, md)
        if refusal is not None:
            yield refusal
            return
        if not self._streams.acquire(blocking=False):
            log_event(log, "telemetry stream refused", logging.WARNING, peer=context.peer(), open=self._max_streams)
            yield service.TelemetryCommand(status=v2.Status(
                code=Code.TOO_MANY_REQUESTS,
                message=f"the router holds at most {self._max_streams} Telemetry streams; open Telemetry to the broker endpoints QueryRoute returns"))
            return
        try:
            for command in request_iterator:
                reply = telemetry.answer(command, md.get(CLIENT_ID, ""), self.sessions, self.policy, context.peer())
                if reply is not None:
                    yield reply
        finally:
            self._streams.release()

    def SendMessage(self, request: service.SendMessageRequest, context: Any) -> service.SendMessageResponse:
        return service.SendMessageResponse(status=v2.Status(code=Code.ILLEGAL_ACCESS_POINT, message=_SEND_HERE))

    def EndTransaction(self, request: service.EndTransactionRequest, context: Any) -> service.EndTransactionResponse:
        return service.EndTransactionResponse(status=v2.Status(code=Code.ILLEGAL_ACCESS_POINT, message=_SEND_HERE))


fill_unsupported(RouterMessagingServicer, aio=False)
