"""QueryAssignment at a commitlog: asked of the router.

A PushConsumer asks a topic's assignment of the access point only when the access point is
one of the route's brokers (RocketMQ's proxy in cluster mode); otherwise it asks a broker of the
route (rocketmq-client-java's pickEndpointsToQueryAssignments). In Quarry's local mode the
brokers are the commitlogs, and a commitlog knows only its own queues, so it asks the routers it
registers with, one after another, passing the client's own signed headers on: the router checks
the client's permissions itself and answers from its registry of every broker
(services/query/doors/rmq5_messaging.py: QueryAssignment).
"""
from __future__ import annotations

from typing import Mapping, Sequence

import grpc

from quarry.channels import open_aio_channel
from quarry.services.rmq5.auth import AUTHORIZATION, CLIENT_ID, DATE_TIME
from quarry.services.rmq5.contract import Code, service, service_grpc
from quarry.services.rmq5.status import RmqError

# The headers a client's call carries that the router needs to see as the client's.
FORWARDED = (AUTHORIZATION, DATE_TIME, CLIENT_ID, "x-mq-language", "x-mq-protocol", "x-mq-client-version", "x-mq-request-id")
TIMEOUT_S = 3.0


class RouterAssignments:
    """Asks `routers` (host:port, in order) for QueryAssignment; channels opened on first use,
    on the event loop that uses them."""

    def __init__(self, routers: Sequence[str], timeout_s: float = TIMEOUT_S) -> None:
        self.routers = list(routers)
        self.timeout_s = timeout_s
        self._channels: dict[str, grpc.aio.Channel] = {}

    def _stub(self, address: str) -> service_grpc.MessagingServiceStub:
        channel = self._channels.get(address)
        if channel is None:
            channel = self._channels[address] = open_aio_channel(address)
        return service_grpc.MessagingServiceStub(channel)

    async def query(self, request: service.QueryAssignmentRequest, md: Mapping[str, str]) -> service.QueryAssignmentResponse:
        """The first router's answer (its status in band, as it gave it); RmqError when this
        broker registers with no router or none answered."""
        if not self.routers:
            raise RmqError(Code.ILLEGAL_ACCESS_POINT, "QueryAssignment: this broker registers with no router (--router), so it does not know "
                                                      "the topic's other brokers; point the SDK at a router")
        headers = tuple((k, md[k]) for k in FORWARDED if k in md)
        failures = []
        for address in self.routers:
            try:
                response: service.QueryAssignmentResponse = await self._stub(address).QueryAssignment(request, metadata=headers, timeout=self.timeout_s)
                return response
            except grpc.aio.AioRpcError as exc:
                failures.append(f"{address}: {exc.code().name} {exc.details() or ''}".strip())
        raise RmqError(Code.PROXY_TIMEOUT, f"QueryAssignment: no router answered ({'; '.join(failures)})")

    async def close(self) -> None:
        channels, self._channels = list(self._channels.values()), {}
        for channel in channels:
            await channel.close()
