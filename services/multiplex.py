"""quarry.v1.MultiplexService, the server's side: the unary calls a stream carries, run by the
same handlers as the unary calls, counted in the same metrics, answered with the same status
codes and details (quarry/multiplex.py is the caller's side and says why).

Only the quarry.v1 services' unary methods are carried: RocketMQ 5's service checks a
signature in each call's own metadata, which a carried call does not have. The server offers
the stream only when ACL is off (services/serving.py): ACL signs and checks every call.
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, AsyncIterator

import grpc

from quarry.multiplex import FrameWriter
from quarry.services.call_tracking import CallTracker
from quarry.services.log import log_event
from quarry.v1 import multiplex_pb2, multiplex_pb2_grpc

log = logging.getLogger("quarry.multiplex")

SERVICE = "quarry.v1.MultiplexService"
_CARRIED = "/quarry.v1."


class _Aborted(Exception):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code, self.details = code, details


class CallContext:
    """What a handler sees of its call when the call came over the stream: its own deadline
    and status, and the stream's peer and metadata. `abort` ends the call, not the stream."""

    def __init__(self, stream: grpc.aio.ServicerContext, timeout_ms: int) -> None:
        self._stream = stream
        self._deadline = time.monotonic() + timeout_ms / 1000.0 if timeout_ms else None
        self._code: grpc.StatusCode | None = None
        self._details = ""

    async def abort(self, code: grpc.StatusCode, details: str = "", trailing_metadata: Any = ()) -> None:
        raise _Aborted(code, details)

    def time_remaining(self) -> float | None:
        return None if self._deadline is None else max(0.0, self._deadline - time.monotonic())

    def peer(self) -> str:
        return self._stream.peer()  # type: ignore[no-any-return]

    def invocation_metadata(self) -> Any:
        return self._stream.invocation_metadata()

    def set_code(self, code: grpc.StatusCode) -> None:
        self._code = code

    def set_details(self, details: str) -> None:
        self._details = details

    def code(self) -> grpc.StatusCode | None:
        return self._code

    def details(self) -> str:
        return self._details

    def cancelled(self) -> bool:
        return False


class MultiplexServicer(multiplex_pb2_grpc.MultiplexServiceServicer):
    """Runs each carried call as its own task; answers go back coalesced into frames."""

    def __init__(self, handlers: dict[str, grpc.RpcMethodHandler], tracker: CallTracker) -> None:
        self._handlers = {m: h for m, h in handlers.items()
                          if m.startswith(_CARRIED) and not m.startswith(f"/{SERVICE}/")
                          and not h.request_streaming and not h.response_streaming}
        self._tracker = tracker

    async def Calls(self, request_iterator: AsyncIterator[multiplex_pb2.CallsRequest], context: grpc.aio.ServicerContext) -> None:
        async def write(responses: list[multiplex_pb2.MultiplexedResponse]) -> None:
            await context.write(multiplex_pb2.CallsResponse(responses=responses))

        writer: FrameWriter[multiplex_pb2.MultiplexedResponse] = FrameWriter(write, lambda r: len(r.payload), lambda exc: None)
        running: set[asyncio.Task[None]] = set()
        try:
            async for frame in request_iterator:
                for request in frame.requests:
                    task = asyncio.ensure_future(self._answer(request, context, writer))
                    running.add(task)
                    task.add_done_callback(running.discard)
            # The caller is done writing: answer what it asked, then end the stream.
            if running:
                await asyncio.wait(list(running))
            await writer.drained()
        finally:
            for task in running:
                task.cancel()

    async def _answer(self, request: multiplex_pb2.MultiplexedRequest, stream: grpc.aio.ServicerContext,
                      writer: FrameWriter[multiplex_pb2.MultiplexedResponse]) -> None:
        method = request.method
        handler = self._handlers.get(method)
        if handler is None:
            writer.send(multiplex_pb2.MultiplexedResponse(
                id=request.id, code=grpc.StatusCode.UNIMPLEMENTED.value[0], details=f"method {method!r} is not carried by this server's {SERVICE}"))
            return
        token = self._tracker.begin(method)
        code, details, payload = grpc.StatusCode.OK, "", b""
        context = CallContext(stream, request.timeout_ms)
        try:
            message = handler.request_deserializer(request.payload)  # type: ignore[misc]
            if request.timeout_ms:
                async with asyncio.timeout(request.timeout_ms / 1000.0):
                    response = await handler.unary_unary(message, context)  # type: ignore[misc]
            else:
                response = await handler.unary_unary(message, context)  # type: ignore[misc]
            payload = handler.response_serializer(response)  # type: ignore[misc]
        except _Aborted as exc:
            code, details = exc.code, exc.details
        except TimeoutError:
            code, details = grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded"
        except asyncio.CancelledError:
            self._tracker.end(token, "CANCELLED")
            raise
        except Exception as exc:  # as grpc answers a unary handler's unexpected error
            log_event(log, "carried call failed", method=method, error=f"{type(exc).__name__}: {exc}", level=logging.ERROR)
            code, details = grpc.StatusCode.UNKNOWN, f"Unexpected error in handler: {type(exc).__name__}: {exc}"
        else:
            if context.code() not in (None, grpc.StatusCode.OK):  # set_code without abort
                code, details, payload = context.code(), context.details(), b""  # type: ignore[assignment]
        self._tracker.end(token, code.name)
        writer.send(multiplex_pb2.MultiplexedResponse(id=request.id, code=code.value[0], details=details, payload=payload))
