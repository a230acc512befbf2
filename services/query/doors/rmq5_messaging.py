"""MessagingService at the router, the SDKs' access point: QueryRoute, QueryAssignment (a
PushConsumer's share; the brokers ask it here for the clients that ask them), plus the client
lifecycle RPCs. Sends go to the brokers' endpoints QueryRoute returns (local mode); a send
addressed here is answered ILLEGAL_ACCESS_POINT saying so. asyncio flavour, on the router's
event loop: a Telemetry stream is a task, not a worker thread, so their number is not capped.
"""
from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator

from quarry.services.query.registry import BrokerRegistry
from quarry.services.rmq5 import client_calls, telemetry
from quarry.services.rmq5.auth import Authenticator
from quarry.services.rmq5.contract import Code, service, service_grpc, v2
from quarry.services.query.doors.rmq5_route import assignments, query_route
from quarry.services.rmq5.sessions import Sessions
from quarry.services.rmq5.status import check_group, RmqError, ok, status_of
from quarry.services.rmq5.unsupported import fill_unsupported

_SEND_HERE = "this is the access point (router): SDKs send to the broker endpoints QueryRoute returns"


class RouterMessagingServicer(service_grpc.MessagingServiceServicer):
    def __init__(self, registry: BrokerRegistry, auth: Authenticator, policy: telemetry.ServerPolicy) -> None:
        self.registry = registry
        self.auth = auth
        self.policy = policy
        self.sessions = Sessions()
        self._closing = asyncio.Event()

    def close(self) -> None:
        """End open Telemetry streams (they would otherwise hold the stop's grace period)."""
        self._closing.set()

    async def QueryRoute(self, request: service.QueryRouteRequest, context: Any) -> service.QueryRouteResponse:
        try:
            # As RocketMQ's ACL: a route is shown to producers and consumers (PUB or SUB).
            self.auth.check(client_calls.metadata(context), "QueryRoute", ("publish", "query"), [request.topic.name])
            queues = query_route(self.registry, request.topic)
        except RmqError as exc:
            return service.QueryRouteResponse(status=status_of(exc))
        except Exception as exc:  # never an unanswered call
            return service.QueryRouteResponse(status=client_calls.internal(exc, "QueryRoute"))
        return service.QueryRouteResponse(status=ok(), message_queues=queues)

    async def QueryAssignment(self, request: service.QueryAssignmentRequest, context: Any) -> service.QueryAssignmentResponse:
        """A PushConsumer's share of a topic: every broker holding it (route.assignments)."""
        try:
            self.auth.check(client_calls.metadata(context), "QueryAssignment", "query", [request.topic.name], group=request.group.name)
            check_group(request.group)
            queues = query_route(self.registry, request.topic)
        except RmqError as exc:
            return service.QueryAssignmentResponse(status=status_of(exc))
        except Exception as exc:  # never an unanswered call
            return service.QueryAssignmentResponse(status=client_calls.internal(exc, "QueryAssignment"))
        return service.QueryAssignmentResponse(status=ok(), assignments=assignments(queues))

    async def Heartbeat(self, request: service.HeartbeatRequest, context: Any) -> service.HeartbeatResponse:
        return client_calls.heartbeat(self.auth, self.sessions, request, client_calls.metadata(context))

    async def NotifyClientTermination(self, request: service.NotifyClientTerminationRequest, context: Any) -> service.NotifyClientTerminationResponse:
        return client_calls.terminate(self.auth, self.sessions, request, client_calls.metadata(context), context.peer())

    async def Telemetry(self, request_iterator: AsyncIterator[service.TelemetryCommand], context: Any) -> AsyncIterator[service.TelemetryCommand]:
        async for reply in client_calls.telemetry_stream(self.auth, self.sessions, self.policy, request_iterator, context, self._closing):
            yield reply

    async def SendMessage(self, request: service.SendMessageRequest, context: Any) -> service.SendMessageResponse:
        return service.SendMessageResponse(status=v2.Status(code=Code.ILLEGAL_ACCESS_POINT, message=_SEND_HERE))

    async def EndTransaction(self, request: service.EndTransactionRequest, context: Any) -> service.EndTransactionResponse:
        return service.EndTransactionResponse(status=v2.Status(code=Code.ILLEGAL_ACCESS_POINT, message=_SEND_HERE))


fill_unsupported(RouterMessagingServicer, aio=True)
