"""The frames carrier's server (quarry/frames.py has the wire format): a TCP port whose calls run
the same quarry.v1 servicer methods the gRPC port serves, answered with the status codes gRPC
would give (the methods report ServiceErrors through services/status.py's context.abort), and
counted by the gRPC server's call tracker, so a stop waits for them as for gRPC calls."""
from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import Any, Callable, Iterable

import grpc

from quarry.frames import ANNOUNCE, ANSWER, CALL, CANCEL, HELLO, KIND_CANCEL, MAGIC, SLACK, WHERE, FrameError, frame, read_frame, watch_peer
from quarry.services.call_tracking import CallTracker
from quarry.services.log import log_event
from quarry.services.security import configured_accounts, server_credentials
from quarry.services.settings import cannot_listen

log = logging.getLogger("quarry.frames")
HELLO_TIMEOUT_S = 10.0  # a connection that does not say hello by then is closed


def refusal() -> str:
    """Why the carrier may not start in this process ('' when it may): it neither signs nor encrypts."""
    if configured_accounts() is not None:
        return "ACL accounts are configured (QUARRY_ACL_FILE): calls stay on gRPC, where they are checked"
    if server_credentials() is not None:
        return "TLS is on: calls stay on gRPC, which encrypts them"
    return ""


class _Aborted(Exception):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code, self.details = code, details


class _Context:
    """What the quarry.v1 servicer methods ask of a grpc.aio ServicerContext."""

    def __init__(self, peer: str, deadline: float | None) -> None:
        self._peer, self._deadline = peer, deadline

    def peer(self) -> str:
        return self._peer

    def time_remaining(self) -> float | None:
        return None if self._deadline is None else max(0.0, self._deadline - time.monotonic())

    def invocation_metadata(self) -> tuple[()]:
        return ()

    async def abort(self, code: grpc.StatusCode, details: str = "") -> None:
        raise _Aborted(code, details)


class _Methods:
    """Takes the unary-unary method handlers a generated add_*Servicer_to_server registers."""

    def __init__(self) -> None:
        self.unary: dict[str, grpc.RpcMethodHandler] = {}

    def add_generic_rpc_handlers(self, handlers: Any) -> None:
        pass

    def add_registered_method_handlers(self, service: str, handlers: dict[str, grpc.RpcMethodHandler]) -> None:
        self.unary.update({f"/{service}/{name}": h for name, h in handlers.items() if not h.request_streaming and not h.response_streaming})


class FramesServer:
    def __init__(self, adds: Iterable[Callable[[Any], None]], tracker: CallTracker, max_request_bytes: int) -> None:
        methods = _Methods()
        for add in adds:
            add(methods)
        self._methods = methods.unary
        self._tracker = tracker
        self._limit = max_request_bytes
        self.token = os.urandom(16)  # tells this server from whatever holds its port later
        self.port = 0
        self._server: asyncio.AbstractServer | None = None
        self._connections: set[asyncio.Task[None]] = set()
        self._closing = False

    def announce(self, server: Any) -> None:
        """Add WHERE (where this carrier listens) to a gRPC server: a Registration's add."""
        async def where(_request: bytes, _context: Any) -> bytes:
            return ANNOUNCE.pack(self.port, self.token, self._limit)
        service, _, method = WHERE[1:].partition("/")
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, {method: grpc.unary_unary_rpc_method_handler(where)}),))

    async def start(self, host: str, port: int) -> int:
        """Listen on host:port (0: a free port); returns the port."""
        self._server = await asyncio.start_server(self._connection, host.strip("[]") or None, port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    def stop_accepting(self) -> None:
        """No new connection, and new calls are answered UNAVAILABLE (as a stopping gRPC server's)."""
        self._closing = True
        if self._server is not None:
            self._server.close()

    async def close(self) -> None:
        """Cut every connection: calls still running are cancelled, their callers see UNAVAILABLE."""
        self.stop_accepting()
        for task in self._connections:
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        host, port = (writer.get_extra_info("peername") or ("", 0))[:2]
        peer = f"ipv6:[{host}]:{port}" if ":" in host else f"ipv4:{host}:{port}"
        calls: dict[int, asyncio.Task[None]] = {}
        watch_peer(writer)
        me = asyncio.current_task()
        assert me is not None
        self._connections.add(me)
        try:
            magic, token, caller_limit = HELLO.unpack(await asyncio.wait_for(reader.readexactly(HELLO.size), HELLO_TIMEOUT_S))
            if magic != MAGIC or token != self.token:
                raise FrameError("not a hello with this server's token")
            writer.write(MAGIC)
            log_event(log, "frames connection opened", peer=peer)
            while (body := await read_frame(reader, self._limit + SLACK)) is not None:
                if body[0] == KIND_CANCEL:
                    task = calls.pop(CANCEL.unpack_from(body)[1], None)
                    if task is not None:
                        task.cancel()
                    continue
                _, call_id, timeout_ms, n = CALL.unpack_from(body)
                method = body[CALL.size:CALL.size + n].decode()
                calls[call_id] = asyncio.ensure_future(self._call(writer, calls, call_id, method, body[CALL.size + n:], timeout_ms, peer, caller_limit))
        except (FrameError, asyncio.IncompleteReadError, TimeoutError, UnicodeDecodeError, IndexError) as exc:
            log_event(log, "frames connection closed", logging.WARNING, peer=peer, reason=f"{type(exc).__name__}: {exc}")
        except (ConnectionError, OSError, asyncio.CancelledError):
            pass  # the caller went away, or this server stops
        finally:
            self._connections.discard(me)
            for task in calls.values():
                task.cancel()  # a caller gone cancels its calls, as with gRPC
            writer.close()

    async def _call(self, writer: asyncio.StreamWriter, calls: dict[int, asyncio.Task[None]], call_id: int, method: str, data: bytes,
                    timeout_ms: int, peer: str, caller_limit: int) -> None:
        handler = self._methods.get(method)
        tracked = self._tracker.begin(method)
        code, out = grpc.StatusCode.UNAVAILABLE, "endpoint closing: the server is stopping"
        try:
            if handler is None:
                code, out = grpc.StatusCode.UNIMPLEMENTED, "Method not found!"
            elif not self._closing:
                timeout = timeout_ms / 1000.0 if timeout_ms else None
                context = _Context(peer, None if timeout is None else time.monotonic() + timeout)
                try:
                    async with asyncio.timeout(timeout):
                        response = await handler.unary_unary(handler.request_deserializer(data), context)
                    code, out = grpc.StatusCode.OK, handler.response_serializer(response)
                    if len(out) > caller_limit:
                        code, out = grpc.StatusCode.RESOURCE_EXHAUSTED, f"CLIENT: Received message larger than max ({len(out)} vs. {caller_limit})"
                except _Aborted as exc:
                    code, out = exc.code, exc.details
                except TimeoutError:
                    code, out = grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded"
                except Exception as exc:  # as grpc.aio reports a handler's unexpected error
                    code, out = grpc.StatusCode.UNKNOWN, f"Unexpected {type(exc)}: {exc}"
        except asyncio.CancelledError:
            code = grpc.StatusCode.CANCELLED
            raise
        finally:
            calls.pop(call_id, None)
            self._tracker.end(tracked, code.name)
        writer.write(frame(ANSWER.pack(call_id, code.value[0]), out if isinstance(out, bytes) else out.encode()))
        try:
            await writer.drain()
        except (ConnectionError, OSError):
            pass


def announced(add: Callable[[Any], None], frames: FramesServer | None) -> Callable[[Any], None]:
    """A Registration's add that also adds the carrier's WHERE, when it runs."""
    def both(server: Any) -> None:
        add(server)
        if frames is not None:
            frames.announce(server)
    return both


async def start_frames(name: str, port: int, bind: str, adds: Iterable[Callable[[Any], None]], tracker: CallTracker,
                       max_request_bytes: int) -> FramesServer | None:
    """The process's frames carrier when --frames-port asks for one and neither ACL nor TLS is on
    (the start-up log says which); add its announce() to the gRPC server's registrations."""
    why = "--frames-port is 0" if port == 0 else refusal()
    if why:
        log_event(log, "frames carrier off", service=name, reason=why)
        return None
    frames = FramesServer(adds, tracker, max_request_bytes)
    host = bind.rsplit(":", 1)[0]
    try:
        await frames.start(host, max(port, 0))
    except OSError as exc:
        raise cannot_listen("--frames-port", f"{host}:{port}", exc.strerror or str(exc)) from None
    log_event(log, "frames carrier listening", service=name, port=frames.port)
    return frames
