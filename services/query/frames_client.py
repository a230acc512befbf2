"""The router's side of the frames carrier (quarry/frames.py): one TCP connection per broker
address, learnt from the gRPC port's WHERE, carrying the quarry.v1 stubs' unary calls with gRPC's
meaning: the call's timeout is its deadline (DEADLINE_EXCEEDED, the server told to stop), a caller
cancelled cancels the call on the server, answers and status codes are the servicer's. A call that
cannot be sent (no connection yet, or it is closing) goes by gRPC instead; a connection lost with a
call in flight fails it UNAVAILABLE as gRPC words a lost connection (the fan-out's one retry)."""
from __future__ import annotations

import asyncio
import time
from typing import Any, Callable

import grpc
from google.protobuf.descriptor import ServiceDescriptor
from google.protobuf.message_factory import GetMessageClass

from quarry.formats.addresses import split_host_port
from quarry.frames import ANNOUNCE, ANSWER, CALL, CANCEL, HELLO, KIND_CALL, KIND_CANCEL, MAGIC, SLACK, FrameError, frame, read_frame, watch_peer

CONNECT_S = 5.0  # WHERE, connecting and the hello each within this
RETRY_S = 5.0  # after a carrier ended (or was never offered), ask again this much later
_CODES = {code.value[0]: code for code in grpc.StatusCode}


def _error(code: grpc.StatusCode, details: str) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details)


def _expire(future: asyncio.Future[tuple[int, bytes]]) -> None:
    if not future.done():
        future.set_exception(_error(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded"))


class FramesCarrier:
    """One broker address's frames connection, opened in the background when made."""

    def __init__(self, address: str, channel: grpc.aio.Channel, max_receive: int) -> None:
        self._limit = max_receive
        self._writer: asyncio.StreamWriter | None = None
        self._pending: dict[int, asyncio.Future[tuple[int, bytes]]] = {}
        self._next_id = 0
        self._max_request = 0
        self.ended_at: float | None = None  # monotonic, once it ended or was refused
        self._task = asyncio.ensure_future(self._run(address, channel))

    def retry_due(self) -> bool:
        return self.ended_at is not None and time.monotonic() - self.ended_at >= RETRY_S

    @property
    def ready(self) -> bool:
        return self._writer is not None and not self._writer.transport.is_closing()

    async def close(self) -> None:
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self, address: str, channel: grpc.aio.Channel) -> None:
        writer = None
        try:
            where = await channel.unary_unary("/quarry.frames.Frames/Where")(b"", timeout=CONNECT_S)
            port, token, self._max_request = ANNOUNCE.unpack(where)
            reader, writer = await asyncio.wait_for(asyncio.open_connection(split_host_port(address)[0], port), CONNECT_S)
            watch_peer(writer)
            writer.write(HELLO.pack(MAGIC, token, self._limit))
            if await asyncio.wait_for(reader.readexactly(len(MAGIC)), CONNECT_S) != MAGIC:
                return
            self._writer = writer
            while (body := await read_frame(reader, self._limit + SLACK)) is not None:
                call_id, code = ANSWER.unpack_from(body)
                future = self._pending.pop(call_id, None)
                if future is not None and not future.done():
                    future.set_result((code, body[ANSWER.size:]))
        except (grpc.RpcError, OSError, FrameError, asyncio.IncompleteReadError, TimeoutError, ValueError):
            pass  # not offered (UNIMPLEMENTED), not reachable, or ended: calls go by gRPC
        finally:
            self._writer, self.ended_at = None, time.monotonic()
            if writer is not None:
                writer.close()
            pending, self._pending = self._pending, {}
            for future in pending.values():
                if not future.done():
                    future.set_exception(_error(grpc.StatusCode.UNAVAILABLE, "Socket closed: the frames connection ended mid-call"))

    async def call(self, method: bytes, request: Any, response_type: Any, timeout: float | None, by_grpc: Callable[..., Any]) -> Any:
        writer = self._writer
        data = request.SerializeToString()
        if writer is None or writer.transport.is_closing() or len(data) > self._max_request:
            return await by_grpc(request, timeout=timeout)  # never sent here (gRPC words an oversized request)
        self._next_id = call_id = (self._next_id + 1) & 0xFFFFFFFF
        loop = asyncio.get_running_loop()
        future: asyncio.Future[tuple[int, bytes]] = loop.create_future()
        self._pending[call_id] = future
        timer = loop.call_later(timeout, _expire, future) if timeout is not None else None
        writer.write(frame(CALL.pack(KIND_CALL, call_id, max(1, int(timeout * 1000)) if timeout is not None else 0, len(method)), method, data))
        try:
            code, body = await future
        except BaseException:
            if self._pending.pop(call_id, None) is not None and not writer.transport.is_closing():
                writer.write(frame(CANCEL.pack(KIND_CANCEL, call_id)))  # deadline passed or the caller went away
            raise
        finally:
            if timer is not None:
                timer.cancel()
        if code == 0:
            return response_type.FromString(body)
        raise _error(_CODES.get(code, grpc.StatusCode.UNKNOWN), body.decode(errors="replace"))


class FramedStub:
    """A generated quarry.v1 stub whose unary methods go over the carrier while it is up."""

    def __init__(self, stub: Any, service: ServiceDescriptor, carrier: Callable[[], FramesCarrier | None]) -> None:
        self._stub = stub
        for m in service.methods:
            if not m.client_streaming and not m.server_streaming:
                setattr(self, m.name, self._unary(getattr(stub, m.name), f"/{service.full_name}/{m.name}".encode(), GetMessageClass(m.output_type), carrier))

    @staticmethod
    def _unary(by_grpc: Any, method: bytes, response_type: Any, carrier: Callable[[], FramesCarrier | None]) -> Callable[..., Any]:
        async def call(request: Any, timeout: float | None = None, **options: Any) -> Any:
            c = carrier()
            if c is None or options:
                return await by_grpc(request, timeout=timeout, **options)
            return await c.call(method, request, response_type, timeout, by_grpc)
        return call

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stub, name)  # streaming methods: gRPC's
