"""The RocketMQ 5 SDK's own ceiling: a MessagingService that answers each SendMessage at once.

`bench/ceiling.py`'s echo is driven by a lean asyncio client; the official SDK spends far more
of the machine per send before a byte leaves (message ids, metrics, signing, a thread hand-off
and back), so a send through the SDK can never approach that echo. This echo, driven by the
same SDK, at the same concurrency, with the same messages, in the same run, is what the SDK
itself can do on this machine right now: the SDK path's rate over it is Quarry's share of the
gap. It answers QueryRoute with one queue at its own endpoint, Telemetry's settings as a broker
does (the SDK waits for them at start), Heartbeat with OK, and SendMessage with an OK entry per
message, storing nothing. Its own process, as Quarry's services are.
"""
from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, AsyncIterator

import grpc

from bench.ceiling import ServerProcess


def _serve(port_file: str) -> None:
    from quarry.services.rmq5.contract import Code, service, service_grpc, v2
    from quarry.services.query.doors.rmq5_route import ACCEPTED_TYPES, endpoints
    from quarry.services.rmq5.telemetry import ServerPolicy, server_settings
    from quarry.services.rmq5.unsupported import fill_unsupported

    ok = v2.Status(code=Code.OK, message="OK")
    policy = ServerPolicy(max_body_size=4 << 20)

    class Echo(service_grpc.MessagingServiceServicer):
        address = ""

        async def QueryRoute(self, request: Any, context: Any) -> Any:
            broker = v2.Broker(name="echo", id=0, endpoints=endpoints(self.address))
            queue = v2.MessageQueue(topic=request.topic, id=0, permission=v2.Permission.READ_WRITE, broker=broker, accept_message_types=ACCEPTED_TYPES)
            return service.QueryRouteResponse(status=ok, message_queues=[queue])

        async def Heartbeat(self, request: Any, context: Any) -> Any:
            return service.HeartbeatResponse(status=ok)

        async def Telemetry(self, request_iterator: AsyncIterator[Any], context: Any) -> AsyncIterator[Any]:
            async for command in request_iterator:
                if command.WhichOneof("command") == "settings":
                    yield service.TelemetryCommand(status=ok, settings=server_settings(command.settings, policy))

        async def NotifyClientTermination(self, request: Any, context: Any) -> Any:
            return service.NotifyClientTerminationResponse(status=ok)

        async def SendMessage(self, request: Any, context: Any) -> Any:
            return service.SendMessageResponse(status=ok, entries=[
                service.SendResultEntry(status=ok, message_id=m.system_properties.message_id, offset=0) for m in request.messages])

    fill_unsupported(Echo, aio=True)

    async def main() -> None:
        server = grpc.aio.server()
        echo = Echo()
        service_grpc.add_MessagingServiceServicer_to_server(echo, server)
        port = server.add_insecure_port("127.0.0.1:0")
        echo.address = f"127.0.0.1:{port}"
        await server.start()
        Path(port_file).write_text(str(port))
        await server.wait_for_termination()

    asyncio.run(main())


class SdkEcho(ServerProcess):
    """The SDK echo's process; `address` is its access point (QueryRoute points back at it)."""

    module = "bench.rmq5_echo"
