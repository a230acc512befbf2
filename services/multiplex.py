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
from typing import Any, AsyncIterator, Awaitable, Callable

import grpc

from quarry.frames import FRAMES_PORT_KEY, FRAMES_TOKEN_KEY
from quarry.multiplex import GRPC_DEFAULT_MAX_RECEIVE, MAX_RECEIVE_KEY, FrameWriter
from quarry.services.call_tracking import CallTracker
from quarry.services.eager import start_eagerly
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
    """What a handler sees of its call when the call came carried: its own deadline and
    status, and the carrier's peer and metadata. `abort` ends the call, not the carrier."""

    def __init__(self, peer: str, metadata: Any, timeout_ms: int) -> None:
        self._peer = peer
        self._metadata = metadata
        self._deadline = time.monotonic() + timeout_ms / 1000.0 if timeout_ms else None
        self._code: grpc.StatusCode | None = None
        self._details = ""

    async def abort(self, code: grpc.StatusCode, details: str = "", trailing_metadata: Any = ()) -> None:
        raise _Aborted(code, details)

    def time_remaining(self) -> float | None:
        return None if self._deadline is None else max(0.0, self._deadline - time.monotonic())

    def peer(self) -> str:
        return self._peer

    def invocation_metadata(self) -> Any:
        return self._metadata

    def set_code(self, code: grpc.StatusCode) -> None:
        self._code = code

    def set_details(self, details: str) -> None:
        self._details = details

    def code(self) -> grpc.StatusCode | None:
        return self._code

    def details(self) -> str:
        return self._details


# A stream's calls running at once; past it the server reads no further frame until one ends
# (a caller cannot make a server hold more work than this per stream). Answers waiting for
# a frame are bounded the same way.
MAX_CALLS_IN_FLIGHT = 512
_METHOD_ECHO = 200  # characters of an unknown method's name quoted back


class MultiplexServicer(multiplex_pb2_grpc.MultiplexServiceServicer):
    """Runs each carried call's first step at once, in the step that read its frame
    (services/eager.py): a handler that does not wait is answered there, one that waits goes on
    as a task of its own. Answers go back coalesced into frames. A call is counted as ended
    (and shutdown stops waiting for it) once its answer is written."""

    def __init__(self, handlers: dict[str, grpc.RpcMethodHandler], tracker: CallTracker, max_send_bytes: int) -> None:
        self._handlers = {m: h for m, h in handlers.items()
                          if m.startswith(_CARRIED) and not m.startswith(f"/{SERVICE}/")
                          and not h.request_streaming and not h.response_streaming}
        self._tracker = tracker
        self._max_send = max_send_bytes
        self.stopping = False
        self.frames_port = 0  # the TCP frames port offered to callers, when one is open
        self.frames_token = b""  # what that port answers a hello with

    def stop(self) -> None:
        """The server is stopping: calls that arrive from now on are answered UNAVAILABLE (as
        a new unary call is refused); those running are finished and answered."""
        self.stopping = True

    async def Calls(self, request_iterator: AsyncIterator[multiplex_pb2.CallsRequest], context: grpc.aio.ServicerContext) -> None:
        if self.frames_port:
            # The same calls may come over TCP frames (services/frames_port.py): say where.
            await context.send_initial_metadata(((FRAMES_PORT_KEY, str(self.frames_port)), (FRAMES_TOKEN_KEY, self.frames_token.hex())))

        async def write(responses: list[multiplex_pb2.MultiplexedResponse]) -> None:
            await context.write(multiplex_pb2.CallsResponse(responses=responses))

        metadata = context.invocation_metadata()
        await self.carry(request_iterator, write, context.peer(), metadata, _caller_limit(metadata))

    async def carry(self, frames: AsyncIterator[multiplex_pb2.CallsRequest], write: Callable[[list[multiplex_pb2.MultiplexedResponse]], Awaitable[None]],
                    peer: str, metadata: Any, caller_limit: int, write_now: Callable[[list[multiplex_pb2.MultiplexedResponse]], bool] | None = None) -> None:
        """Run the calls of one carrier (a Calls stream or a TCP connection) until its caller
        stops sending: `frames` are what it sent, `write` sends a frame of answers back, and
        `caller_limit` is the largest message the caller takes."""
        running: dict[int, asyncio.Task[None]] = {}
        # Gather answers while other calls run (the one being answered is still counted).
        writer: FrameWriter[multiplex_pb2.MultiplexedResponse] = FrameWriter(
            write, lambda r: r.ByteSize(), lambda exc, failed, dropped: None, lambda: len(running) > 1, write_now)
        limit = min(self._max_send, caller_limit)
        room = asyncio.Event()
        room.set()
        loop = asyncio.get_running_loop()

        def ended(call_id: int) -> None:
            running.pop(call_id, None)
            if len(running) < MAX_CALLS_IN_FLIGHT:
                room.set()

        try:
            async for frame in frames:
                requests = frame.requests
                together = len(requests) > 1
                if together:
                    writer.hold()  # the answers of those answered at once leave in one frame
                try:
                    for i, request in enumerate(requests):
                        if i and i % MAX_CALLS_IN_FLIGHT == 0:
                            # A big frame: what it answered so far leaves, and the loop runs,
                            # before its next calls (as when each call was a task).
                            writer.release()
                            await (writer.drained() if writer.backlog >= MAX_CALLS_IN_FLIGHT else asyncio.sleep(0))
                            writer.hold()
                        if request.cancel:
                            task = running.get(request.id)
                            if task is not None:
                                task.cancel()
                            continue
                        if self.stopping:
                            writer.send(multiplex_pb2.MultiplexedResponse(
                                id=request.id, code=grpc.StatusCode.UNAVAILABLE.value[0], details="stream removed: the server is stopping"))
                            continue
                        task = self._start(loop, request, peer, metadata, writer, limit)
                        if task is None:
                            continue  # answered in this step
                        running[request.id] = task
                        task.add_done_callback(lambda _t, call_id=request.id: ended(call_id))
                        if len(running) >= MAX_CALLS_IN_FLIGHT:
                            writer.release()
                            room.clear()
                            await room.wait()
                            if together:
                                writer.hold()
                finally:
                    writer.release()
                if writer.backlog >= MAX_CALLS_IN_FLIGHT:
                    await writer.drained()
            # The caller is done writing: answer what it asked, then end the carrier.
            if running:
                await asyncio.wait(list(running.values()))
            await writer.drained()
        finally:
            for task in list(running.values()):
                task.cancel()

    def _start(self, loop: asyncio.AbstractEventLoop, request: multiplex_pb2.MultiplexedRequest, peer: str, metadata: Any,
               writer: FrameWriter[multiplex_pb2.MultiplexedResponse], limit: int) -> "asyncio.Task[None] | None":
        """Run a call up to its handler's first wait: None when it is answered already, else
        the task it goes on in, with its deadline armed."""
        deadline = _Deadline() if request.timeout_ms else None
        started = loop.time()
        call = start_eagerly(loop, self._answer(request, peer, metadata, writer, limit, deadline))
        if call.task is None:
            error = call.error  # (_answer answers a handler's own errors: this is not one)
            if error is not None and not isinstance(error, asyncio.CancelledError):
                log_event(log, "carried call failed", method=request.method, error=f"{type(error).__name__}: {error}", level=logging.ERROR)
            return None
        if deadline is not None:
            deadline.arm(loop, started + request.timeout_ms / 1000.0, call.task)
        return call.task

    async def _answer(self, request: multiplex_pb2.MultiplexedRequest, peer: str, metadata: Any,
                      writer: FrameWriter[multiplex_pb2.MultiplexedResponse], limit: int, deadline: "_Deadline | None") -> None:
        method = request.method
        handler = self._handlers.get(method)
        if handler is None:
            writer.send(multiplex_pb2.MultiplexedResponse(
                id=request.id, code=grpc.StatusCode.UNIMPLEMENTED.value[0],
                details=f"method {method[:_METHOD_ECHO]!r} is not carried by this server's {SERVICE}"))
            return
        token = self._tracker.begin(method)
        code, details, payload = grpc.StatusCode.OK, "", b""
        context = CallContext(peer, metadata, request.timeout_ms)
        try:
            message = handler.request_deserializer(request.payload)  # type: ignore[misc]
            response = await handler.unary_unary(message, context)  # type: ignore[misc]
            payload = handler.response_serializer(response)  # type: ignore[misc]
        except _Aborted as exc:
            code, details = exc.code, exc.details
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if deadline is None or not deadline.expired or task is None or task.uncancel():
                self._tracker.end(token, "CANCELLED")
                raise
            code, details = grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded"
        except Exception as exc:  # a TimeoutError too: the handler's own (a socket's, say), as for a unary call
            code, details = _unexpected(method, exc)
        else:
            if context.code() not in (None, grpc.StatusCode.OK):  # set_code without abort
                code, details, payload = context.code(), context.details(), b""  # type: ignore[assignment]
        finally:
            if deadline is not None:
                deadline.disarm()
        if len(payload) + _ENVELOPE_BYTES > limit:
            # As gRPC answers a unary call whose response exceeds the sender's or the receiver's limit.
            code, details, payload = grpc.StatusCode.RESOURCE_EXHAUSTED, f"Sent message larger than max ({len(payload)} vs. {limit - _ENVELOPE_BYTES})", b""
        name = code.name
        writer.send(multiplex_pb2.MultiplexedResponse(id=request.id, code=code.value[0], details=details, payload=payload),
                    lambda: self._tracker.end(token, name))


class _Deadline:
    """A carried call's deadline. It is armed only if the call waits: one answered in its first
    step (start_eagerly) finished before any timer could have fired."""

    __slots__ = ("expired", "_timer")

    def __init__(self) -> None:
        self.expired = False
        self._timer: asyncio.TimerHandle | None = None

    def arm(self, loop: asyncio.AbstractEventLoop, when: float, task: "asyncio.Task[None]") -> None:
        def expire() -> None:
            self.expired = True
            task.cancel()
        self._timer = loop.call_at(when, expire)

    def disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


# What a frame holding one answer adds to its payload: ids, code, lengths (details are short).
_ENVELOPE_BYTES = 1024


def _caller_limit(metadata: Any) -> int:
    """The largest message the caller takes (its stream's metadata), gRPC's default if unsaid."""
    for key, value in metadata or ():
        if key == MAX_RECEIVE_KEY:
            try:
                return max(0, int(value))
            except ValueError:
                break
    return GRPC_DEFAULT_MAX_RECEIVE


def _unexpected(method: str, exc: Exception) -> tuple[grpc.StatusCode, str]:
    """As grpc answers a unary handler's unexpected error (and logs it)."""
    log_event(log, "carried call failed", method=method, error=f"{type(exc).__name__}: {exc}", level=logging.ERROR)
    return grpc.StatusCode.UNKNOWN, f"Unexpected {type(exc)}: {exc}"
