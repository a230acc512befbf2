"""Unary calls multiplexed over one stream (quarry.v1.MultiplexService), the caller's side.

A unary gRPC call costs its client and its server some 0.15-0.3 ms of CPU each on a small
machine, whatever it carries; the router makes one to three of them per query. Over one
long-lived stream per broker address, calls started while a frame is being written go
together in the next frame, and the server answers the same way, so a call costs the server
a stream message instead of a call (bench router_ab: the brokers' CPU per query 17-40 %
lower). The semantics stay those of the unary call: each call has its own deadline,
cancellation, status code and details.

`MultiplexedChannel` wraps a grpc.aio channel for the generated stubs: their unary-unary
calls go over the stream, every other kind over the channel itself. A server that does not
offer the stream (an older one, or one with ACL on) answers UNIMPLEMENTED and the channel
makes plain unary calls for a while (ASK_AGAIN_AFTER_S), the calls already waiting included:
none of them ran.
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import time
from typing import Any, Awaitable, Callable, Generic, Iterable, TypeVar

import grpc

from quarry.channels import signs_calls
from quarry.formats.addresses import split_host_port
from quarry.frames import FRAME_SLACK, FRAMES_PORT_KEY, FRAMES_TOKEN_KEY, HELLO, MAGIC, TOKEN_BYTES, FrameCut, FrameError, read_frame, watch_peer, write_frame, write_frame_now
from quarry.transport import status_by_number
from quarry.v1 import multiplex_pb2

log = logging.getLogger("quarry.multiplex")

METHOD = "/quarry.v1.MultiplexService/Calls"
# A frame carries at most this many bytes unless one call alone is bigger: a batch of big
# answers is not held back until all of them are serialized into one message, and a frame of
# several stays under any receiver's limit (gRPC's default is 4 MiB).
FRAME_BYTES = 1 << 20
# The stream's metadata key by which a caller names the largest message it takes.
MAX_RECEIVE_KEY = "quarry-max-receive-bytes"
GRPC_DEFAULT_MAX_RECEIVE = 4 << 20
# How long plain unary calls are made to a server that did not offer the stream.
ASK_AGAIN_AFTER_S = 300.0
# A frames port (quarry/frames.py) that could not be reached is tried again after this long;
# meanwhile calls go over the gRPC stream.
FRAMES_RETRY_S = 60.0
FRAMES_CONNECT_TIMEOUT_S = 5.0
# What a server that does not carry the stream answers when it is opened: make unary calls.
_NOT_OFFERED = (grpc.StatusCode.UNIMPLEMENTED, grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED)
# Turns of the event loop a writer lets pass before it takes its first frame while other
# calls are in flight, so that calls started by the same burst of work (a fan-out, a frame of
# answers) share it. Measured at 16 mixed queries in flight over three brokers: 1.05 calls
# per frame with none, 1.29 with two; router CPU per query -7 %, brokers' -30 % against
# unary calls (none: brokers' -15 %). A lone call is written at once.
_GATHER_TURNS = 2
# The largest item written at once (FrameWriter.write_now): what a transport buffers below
# asyncio's default high-water mark, so an item counts as written only when a writer task's
# drain would have returned at once too (a stopping server then keeps no answer buffered).
WRITE_NOW_BYTES = 64 * 1024

Item = TypeVar("Item")


class MultiplexError(grpc.RpcError):
    """A multiplexed call's failure, read as a unary call's (`code()`, `details()`)."""

    def __init__(self, code: grpc.StatusCode, details: str, unsent: bool = False) -> None:
        super().__init__(f"{code.name}: {details}")
        self._code = code
        self._details = details
        self.unsent = unsent  # the call's request never reached the server: it may be sent again

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


def status_of(number: int) -> grpc.StatusCode:
    """The StatusCode of a code number (UNKNOWN for a number gRPC does not define)."""
    return status_by_number(number) or grpc.StatusCode.UNKNOWN


class FrameWriter(Generic[Item]):
    """Coalesces items into frames on one stream: an item starts a writer task; items that
    arrive while it writes go together in its next frame. Both sides use it. A lone small item
    on a carrier that is not busy is handed to the transport at once instead, when the carrier
    can (`write_now`). An item's `written` callback runs once its frame is written (handed to
    the transport below its high-water mark), or dropped because the stream failed. `on_error`
    is told the failure, the items of the frame whose write failed, and those dropped before
    any write was tried."""

    def __init__(self, write: Callable[[list[Item]], Awaitable[None]], size: Callable[[Item], int],
                 on_error: Callable[[BaseException, list[Item], list[Item]], None], busy: Callable[[], bool] = lambda: True,
                 write_now: Callable[[list[Item]], bool] | None = None) -> None:
        self._write = write
        # Writes a lone item's frame at once when that needs no waiting (False: it did not
        # write): no writer task, no turn of the loop, for a call alone on its carrier.
        self._write_now = write_now
        self._size = size
        self._on_error = on_error
        self._busy = busy  # whether more items are likely to come at once (gather them)
        self._queue: list[tuple[Item, Callable[[], None] | None]] = []
        self._task: asyncio.Task[None] | None = None
        self._held = False  # see hold()

    @property
    def backlog(self) -> int:
        """Items waiting for a frame."""
        return len(self._queue)

    def send(self, item: Item, written: Callable[[], None] | None = None) -> None:
        if self._held:
            self._queue.append((item, written))
            return
        if self._may_write_now() and self._size(item) <= WRITE_NOW_BYTES and self._wrote_now([item]):
            if written is not None:
                written()
            return
        self._queue.append((item, written))
        if self._task is None:
            self._task = asyncio.ensure_future(self._run())

    def hold(self) -> None:
        """Keep what is sent from now until release(), which sends it together: the items of
        one step (the answers of a frame's calls) go in one frame."""
        self._held = True

    def release(self) -> None:
        if not self._held:
            return
        self._held = False
        if not self._queue or self._task is not None:
            return
        if self._may_write_now():
            items = self._queue
            batch = [item for item, _ in items]
            if sum(map(self._size, batch)) <= WRITE_NOW_BYTES and self._wrote_now(batch):
                self._queue = []
                _run_callbacks(items)
                return
        self._task = asyncio.ensure_future(self._run())

    def _may_write_now(self) -> bool:
        """Whether items (up to WRITE_NOW_BYTES) may skip the writer task: none runs, the
        carrier can write at once, and it is not busy (nothing to gather)."""
        return self._task is None and self._write_now is not None and not self._busy()

    def _wrote_now(self, items: list[Item]) -> bool:
        try:
            return self._write_now(items)  # type: ignore[misc]
        except Exception:  # (the writer task meets the same failure and reports it as a write's)
            return False

    async def drained(self) -> None:
        """Return once every item sent so far is written (or the stream failed)."""
        while self._task is not None:
            await asyncio.shield(self._task)

    async def _run(self) -> None:
        frame: list[tuple[Item, Callable[[], None] | None]] = []
        try:
            if self._busy():
                for _ in range(_GATHER_TURNS):
                    await asyncio.sleep(0)
            while self._queue:
                taken, used = 0, 0
                for item, _ in self._queue:
                    n = self._size(item)
                    if taken and used + n > FRAME_BYTES:
                        break
                    taken += 1
                    used += n
                frame = self._queue[:taken]
                del self._queue[:taken]
                try:
                    await self._write([item for item, _ in frame])
                finally:
                    _run_callbacks(frame)
                frame = []
        except BaseException as exc:  # the stream is gone: its reader reports it to the callers
            dropped, self._queue = self._queue, []
            _run_callbacks(dropped)
            self._on_error(exc, [item for item, _ in frame], [item for item, _ in dropped])
        finally:
            self._task = None


def _run_callbacks(items: list[tuple[Any, Callable[[], None] | None]]) -> None:
    for _, written in items:
        if written is not None:
            written()


class _Carrier:
    """What carries a channel's calls to one server (a Calls stream or a frames connection)
    and the calls waiting for their answers on it. A subclass writes frames (`_write`, and
    `write_now` where a lone call's frame can be written without waiting) and reads them,
    handing each frame's answers to `_answered` and its end to `_ended`."""

    def __init__(self, write_now: Callable[[list[multiplex_pb2.MultiplexedRequest]], bool] | None = None) -> None:
        self.waiting: dict[int, asyncio.Future[multiplex_pb2.MultiplexedResponse]] = {}
        self.failed: BaseException | None = None
        self._unsent: set[int] = set()  # calls whose request was never sent: safe to send again
        self._ids = itertools.count(1)
        self._writer: FrameWriter[multiplex_pb2.MultiplexedRequest] = FrameWriter(
            self._write, lambda r: r.ByteSize(), self._write_failed, lambda: len(self.waiting) > 1, write_now)

    def _write_failed(self, exc: BaseException, failed: list[multiplex_pb2.MultiplexedRequest],
                      dropped: list[multiplex_pb2.MultiplexedRequest]) -> None:
        """A frame could not be written: the carrier is broken (its reader ends the calls).
        `failed`: the frame whose write failed; `dropped`: requests no write was tried for."""
        raise NotImplementedError

    def _mark_unsent(self, requests: list[multiplex_pb2.MultiplexedRequest]) -> None:
        self._unsent.update(r.id for r in requests if not r.cancel)

    async def _write(self, requests: list[multiplex_pb2.MultiplexedRequest]) -> None:
        raise NotImplementedError

    def start(self, method: str, payload: bytes, timeout_s: float | None) -> tuple[int, asyncio.Future[multiplex_pb2.MultiplexedResponse]]:
        call_id = next(self._ids)
        answer: asyncio.Future[multiplex_pb2.MultiplexedResponse] = asyncio.get_running_loop().create_future()
        self.waiting[call_id] = answer
        timeout_ms = 0 if timeout_s is None else max(1, min(int(timeout_s * 1000), 0xFFFFFFFF))
        self._writer.send(multiplex_pb2.MultiplexedRequest(id=call_id, method=method, payload=payload, timeout_ms=timeout_ms))
        return call_id, answer

    def cancel(self, call_id: int) -> None:
        """Tell the server the caller gave up on `call_id` (it cancels the call)."""
        if self.failed is None:
            self._writer.send(multiplex_pb2.MultiplexedRequest(id=call_id, cancel=True))

    def _answered(self, responses: Iterable[multiplex_pb2.MultiplexedResponse]) -> None:
        waiting = self.waiting
        for response in responses:
            answer = waiting.pop(response.id, None)
            if answer is not None and not answer.done():
                answer.set_result(response)

    def _ended(self, failure: BaseException) -> None:
        """The carrier is gone: every call still waiting fails with `failure`."""
        self.failed = failure
        waiting, self.waiting = self.waiting, {}
        for call_id, answer in waiting.items():
            if not answer.done():
                if call_id in self._unsent and isinstance(failure, MultiplexError):
                    answer.set_exception(MultiplexError(failure.code(), failure.details(), unsent=True))
                else:
                    answer.set_exception(failure)


class _Stream(_Carrier):
    """One open Calls stream."""

    def __init__(self, channel: grpc.aio.Channel, on_not_offered: Callable[[], None], max_receive_bytes: int,
                 on_frames_port: Callable[[int, bytes], None]) -> None:
        self._on_frames_port = on_frames_port
        self._call = channel.stream_stream(METHOD, request_serializer=multiplex_pb2.CallsRequest.SerializeToString,
                                           response_deserializer=multiplex_pb2.CallsResponse.FromString)(
            metadata=((MAX_RECEIVE_KEY, str(max_receive_bytes)),))
        self._on_not_offered = on_not_offered
        self._broken: BaseException | None = None  # why a write failed, if one did
        super().__init__()
        self._reader = asyncio.ensure_future(self._read())

    async def _write(self, requests: list[multiplex_pb2.MultiplexedRequest]) -> None:
        await self._call.write(multiplex_pb2.CallsRequest(requests=requests))

    def _write_failed(self, exc: BaseException, failed: list[multiplex_pb2.MultiplexedRequest],
                      dropped: list[multiplex_pb2.MultiplexedRequest]) -> None:
        # gRPC failed the send: the stream had already ended in its core, so neither the frame
        # nor what waited behind it reached the server. (grpc.aio then reports the stream's end
        # as INTERNAL "Internal error from Core", hiding the real status.)
        self._broken = exc
        self._mark_unsent(failed)
        self._mark_unsent(dropped)
        self._call.cancel()

    async def _read(self) -> None:
        failure: BaseException
        try:
            offer = {key: value for key, value in await self._call.initial_metadata() or ()}
            port, token = offer.get(FRAMES_PORT_KEY, ""), offer.get(FRAMES_TOKEN_KEY, "")
            if isinstance(port, str) and port.isdigit() and isinstance(token, str) and len(token) == 2 * TOKEN_BYTES:
                try:
                    self._on_frames_port(int(port), bytes.fromhex(token))
                except ValueError:
                    pass  # not a token: no frames port
            while True:
                frame = await self._call.read()
                if frame is grpc.aio.EOF:
                    # The server ended the stream (it is stopping): what waits was not answered.
                    failure = MultiplexError(grpc.StatusCode.UNAVAILABLE, "stream removed: the server closed the multiplexed stream")
                    break
                self._answered(frame.responses)
        except grpc.RpcError as exc:
            code = exc.code()  # type: ignore[attr-defined]
            if code in _NOT_OFFERED:
                self._on_not_offered()
            failure = MultiplexError(code, exc.details() or "")  # type: ignore[attr-defined]
        except asyncio.CancelledError:
            failure = MultiplexError(grpc.StatusCode.CANCELLED, "channel closed")
        except Exception as exc:  # a frame that does not parse: the stream cannot be trusted
            self._call.cancel()
            failure = MultiplexError(grpc.StatusCode.INTERNAL, f"multiplexed stream broken: {type(exc).__name__}: {exc}")
        if self._broken is not None and not (isinstance(failure, MultiplexError) and failure.code() in _NOT_OFFERED):
            # The stream broke under a write (the stream's own status is then INTERNAL or
            # CANCELLED, which says nothing): a lost connection, as gRPC words it, which the
            # router's fan-out tries once more (quarry.transport.lost_connection).
            failure = MultiplexError(grpc.StatusCode.UNAVAILABLE, f"stream removed: the Calls stream broke under a write: {self._broken}")
        self._ended(failure)

    def close(self) -> None:
        self._reader.cancel()
        self._call.cancel()


class _FramesStream(_Carrier):
    """One TCP frames connection (quarry/frames.py): the same calls as a Calls stream's,
    without gRPC's cost per frame. It connects in the background; the channel sends calls
    over it only once it is `ready`."""

    def __init__(self, host: str, port: int, token: bytes, max_receive_bytes: int, on_unreachable: Callable[[BaseException], None]) -> None:
        self.ready = False
        self._answer = MAGIC + token  # what the port offered answers the hello with
        self._target = f"{host}:{port}"
        self._on_unreachable = on_unreachable
        self._max_receive = max_receive_bytes
        self._stream_writer: asyncio.StreamWriter | None = None
        super().__init__(self._write_now)
        self._reader = asyncio.ensure_future(self._run(host, port))

    async def _connect(self, host: str, port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        reader, writer = await asyncio.open_connection(host, port)
        watch_peer(writer)
        try:
            writer.write(HELLO.pack(MAGIC, min(self._max_receive, 0xFFFFFFFF)))
            answer = await reader.readexactly(len(self._answer))
            if answer[:len(MAGIC)] != MAGIC:
                raise FrameError("the port did not answer as a frames port")
            if answer != self._answer:
                raise FrameError("the port answered as another server's frames port (the server offering it moved)")
        except BaseException:
            writer.close()
            raise
        return reader, writer

    async def _write(self, requests: list[multiplex_pb2.MultiplexedRequest]) -> None:
        writer = self._stream_writer
        assert writer is not None  # calls are started only once connected
        await write_frame(writer, multiplex_pb2.CallsRequest(requests=requests).SerializeToString())

    def _write_now(self, requests: list[multiplex_pb2.MultiplexedRequest]) -> bool:
        writer = self._stream_writer
        return writer is not None and write_frame_now(writer, multiplex_pb2.CallsRequest(requests=requests).SerializeToString)

    def _write_failed(self, exc: BaseException, failed: list[multiplex_pb2.MultiplexedRequest],
                      dropped: list[multiplex_pb2.MultiplexedRequest]) -> None:
        # What the failed write handed the socket may have arrived; what waited behind it not.
        self._mark_unsent(dropped)
        if self._stream_writer is not None:
            self._stream_writer.close()  # the reader sees the connection end and fails the calls

    async def _run(self, host: str, port: int) -> None:
        failure: BaseException
        try:
            async with asyncio.timeout(FRAMES_CONNECT_TIMEOUT_S):  # (not wait_for: on 3.11 it may swallow close()'s cancellation)
                reader, self._stream_writer = await self._connect(host, port)
        except asyncio.CancelledError:
            self.failed = MultiplexError(grpc.StatusCode.CANCELLED, "channel closed")
            return
        except Exception as exc:  # refused, unreachable, not a frames port: calls stay on the gRPC stream
            self.failed = exc
            self._on_unreachable(exc)
            return
        self.ready = True
        limit = max(self._max_receive, FRAME_BYTES) + FRAME_SLACK
        try:
            while True:
                data = await read_frame(reader, limit)
                if data is None:
                    failure = MultiplexError(grpc.StatusCode.UNAVAILABLE, f"stream removed: the server closed the frames connection to {self._target}")
                    break
                self._answered(multiplex_pb2.CallsResponse.FromString(data).responses)
        except (ConnectionError, OSError, FrameCut) as exc:
            # Worded as gRPC words a lost connection ("stream removed"), which the router's
            # fan-out tries once more (quarry.transport.lost_connection).
            failure = MultiplexError(grpc.StatusCode.UNAVAILABLE, f"stream removed: frames connection to {self._target} lost: {exc}")
        except asyncio.CancelledError:
            failure = MultiplexError(grpc.StatusCode.CANCELLED, "channel closed")
        except Exception as exc:  # a frame that does not parse: the connection cannot be trusted
            failure = MultiplexError(grpc.StatusCode.INTERNAL, f"multiplexed stream broken: {type(exc).__name__}: {exc}")
        self.ready = False
        self._stream_writer.close()
        self._ended(failure)

    def close(self) -> None:
        self._reader.cancel()
        if self._stream_writer is not None:
            # Aborted, not closed: close() keeps the socket until what is buffered has left,
            # for ever when the server reads nothing more; the calls are cancelled anyway.
            self._stream_writer.transport.abort()


def _expire(answer: asyncio.Future[Any]) -> None:
    if not answer.done():
        answer.set_exception(MultiplexError(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded"))


class _UnaryOverStream:
    """What a generated stub holds for one unary method: calls it over the stream."""

    def __init__(self, channel: "MultiplexedChannel", method: str, serialize: Callable[[Any], bytes],
                 deserialize: Callable[[bytes], Any], plain: Any) -> None:
        self._channel = channel
        self._method = method
        self._serialize = serialize
        self._deserialize = deserialize
        self._plain = plain  # the channel's own multicallable, for a server without the stream

    def __call__(self, request: Any, *, timeout: float | None = None, **kwargs: Any) -> Awaitable[Any]:
        if kwargs or not self._channel.multiplexing:
            return self._plain(request, timeout=timeout, **kwargs)  # type: ignore[no-any-return]
        return self._call(request, timeout)

    async def _call(self, request: Any, timeout: float | None) -> Any:
        payload = self._serialize(request)
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            response = await self._carry(payload, timeout)
        except MultiplexError as exc:
            left = None if deadline is None else deadline - time.monotonic()
            if not self._channel.multiplexing and exc.code() in _NOT_OFFERED:
                # The server does not carry the stream, so the call never ran: make it unary.
                if left is not None and left <= 0:
                    raise MultiplexError(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded") from None
                return await self._plain(request, timeout=left)
            if not exc.unsent:
                raise
            # Its carrier broke before the request left (as gRPC retries a call that never
            # reached the server): once more, on the carrier the channel opens next.
            if left is not None and left <= 0:
                raise MultiplexError(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded") from None
            response = await self._carry(payload, left)
        if response.code:
            raise MultiplexError(status_of(response.code), response.details)
        return self._deserialize(response.payload)

    async def _carry(self, payload: bytes, timeout: float | None) -> multiplex_pb2.MultiplexedResponse:
        stream = self._channel.stream()
        call_id, answer = stream.start(self._method, payload, timeout)
        # One timer per call (asyncio.wait_for costs a waiter future and callbacks more).
        timer = None if timeout is None else asyncio.get_running_loop().call_later(timeout, _expire, answer)
        try:
            return await answer
        finally:
            if timer is not None:
                timer.cancel()
            if stream.waiting.pop(call_id, None) is not None:
                stream.cancel(call_id)  # no answer came: timed out or cancelled here


class MultiplexedChannel:
    """A grpc.aio channel as the generated stubs see it, with its unary-unary calls carried
    over one Calls stream (opened on first use, opened again after it fails). Use it on the
    loop that made it."""

    def __init__(self, channel: grpc.aio.Channel, max_receive_bytes: int = GRPC_DEFAULT_MAX_RECEIVE, host: str = "") -> None:
        self.channel = channel
        self.max_receive_bytes = max_receive_bytes  # the channel's own limit, told to the server
        self.host = host  # the host dialled, where a frames port the server offers is reached
        self._unary_until: float | None = None  # set while the server is taken not to offer the stream
        self._stream: _Stream | None = None
        self._frames_port = 0  # offered by the server on the gRPC stream; 0: none
        self._frames_token = b""  # what that port answers the hello with
        self._frames: _FramesStream | None = None
        self._frames_retry_at = 0.0

    @property
    def multiplexing(self) -> bool:
        """Whether calls go over the stream now (not for a while after the server said it does
        not offer it: a server upgraded meanwhile is asked again later)."""
        until = self._unary_until
        if until is None:
            return True
        if time.monotonic() < until:
            return False
        self._unary_until = None
        return True

    def stream(self) -> "_Stream | _FramesStream":
        """The carrier for the next call: the frames connection once it is up, else the gRPC
        stream (which is also where the server offers its frames port)."""
        frames = self._frames
        if frames is not None:
            if frames.ready:
                return frames
            if frames.failed is not None:
                frames = self._frames = None
        if frames is None and self._frames_port and self.host and time.monotonic() >= self._frames_retry_at:
            port, token = self._frames_port, self._frames_token
            self._frames = _FramesStream(self.host, port, token, self.max_receive_bytes,
                                         lambda exc: self._frames_unreachable(port, token, exc))
        stream = self._stream
        if stream is None or stream.failed is not None:
            stream = self._stream = _Stream(self.channel, self._not_offered, self.max_receive_bytes, self._frames_offered)
        return stream

    @property
    def carrier(self) -> str:
        """What the next call goes over: "frames", "stream" or "unary"."""
        if not self.multiplexing:
            return "unary"
        return "frames" if self._frames is not None and self._frames.ready else "stream"

    def _frames_offered(self, port: int, token: bytes) -> None:
        if (port, token) != (self._frames_port, self._frames_token):  # the server restarted: try it at once
            self._frames_port, self._frames_token = port, token
            self._frames_retry_at = 0.0

    def _frames_unreachable(self, port: int, token: bytes, exc: BaseException) -> None:
        if (port, token) != (self._frames_port, self._frames_token):
            return  # a port offered before: the one offered since is tried on its own
        log.warning("frames port %s:%s not reachable (%s: %s): calls stay on the gRPC stream for %.0f s",
                    self.host, self._frames_port, type(exc).__name__, exc, FRAMES_RETRY_S)
        self._frames_retry_at = time.monotonic() + FRAMES_RETRY_S

    def _not_offered(self) -> None:
        self._unary_until = time.monotonic() + ASK_AGAIN_AFTER_S

    def unary_unary(self, method: str, request_serializer: Callable[[Any], bytes] | None = None,
                    response_deserializer: Callable[[bytes], Any] | None = None, **kwargs: Any) -> _UnaryOverStream:
        plain = self.channel.unary_unary(method, request_serializer=request_serializer, response_deserializer=response_deserializer, **kwargs)
        return _UnaryOverStream(self, method, request_serializer or bytes, response_deserializer or bytes, plain)

    def unary_stream(self, *args: Any, **kwargs: Any) -> Any:
        return self.channel.unary_stream(*args, **kwargs)

    def stream_unary(self, *args: Any, **kwargs: Any) -> Any:
        return self.channel.stream_unary(*args, **kwargs)

    def stream_stream(self, *args: Any, **kwargs: Any) -> Any:
        return self.channel.stream_stream(*args, **kwargs)

    async def close(self) -> None:
        if self._stream is not None:
            self._stream.close()
            self._stream = None
        if self._frames is not None:
            self._frames.close()
            self._frames = None
        await self.channel.close()


def multiplexed(channel: grpc.aio.Channel, max_receive_bytes: int, address: str = "") -> "grpc.aio.Channel | MultiplexedChannel":
    """`channel` to `address` (host:port; whose largest message received is `max_receive_bytes`)
    with its unary calls multiplexed, unless this process signs its calls (ACL: each call is
    signed and checked on its own, so it stays a call of its own)."""
    if signs_calls():
        return channel
    try:
        host = split_host_port(address)[0]
    except ValueError:  # not a host:port (a unix socket, say): no frames port is reached from it
        host = ""
    return MultiplexedChannel(channel, max_receive_bytes, host)
