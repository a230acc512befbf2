"""The remoting transport's server side: asyncio TCP, frames in, handlers by request code.

Each request runs as its own task (a long-polling pull must not hold up a send on the same
connection); responses carry the request's opaque and header form. One-way requests get no
response. A handler's RemotingError becomes its response code and remark; any other error
a SYSTEM_ERROR naming it. A malformed or oversized frame closes that connection with a log
line; the process and other connections carry on.
"""
from __future__ import annotations

import asyncio
import logging
import os
from dataclasses import dataclass, field
from typing import Awaitable, Callable

from quarry.services.log import log_event
from quarry.services.remoting import codes
from quarry.services.remoting.command import FrameError, HeaderFieldError, RemotingCommand, decode_frame, encode_frame
from quarry.services.settings import cannot_listen

log = logging.getLogger("quarry.remoting")

DEFAULT_MAX_FRAME_BYTES = 16 * 1024 * 1024  # RocketMQ's default frameMaxLength
MAX_IN_FLIGHT = 256  # requests of one connection being handled at once; reading pauses beyond
IDLE_S = 120.0  # a connection silent this long (or stuck inside a frame) is closed, as RocketMQ's channel idle limit


class RemotingError(Exception):
    """Answer the request with this response code and remark."""

    def __init__(self, code: int, remark: str) -> None:
        super().__init__(remark)
        self.code = code
        self.remark = remark


@dataclass(eq=False)
class Connection:
    """One client connection; handlers may attach what they learn about the client."""

    peer: tuple[str, int]
    writer: asyncio.StreamWriter
    attributes: dict[str, object] = field(default_factory=dict)

    def send(self, cmd: RemotingCommand) -> None:
        if not self.writer.is_closing():
            self.writer.write(encode_frame(cmd))


Handler = Callable[[RemotingCommand, Connection], Awaitable[RemotingCommand | None]]
Authorizer = Callable[[RemotingCommand], None]  # raises RemotingError to refuse


class RemotingServer:
    """Serves `handlers` (request code → coroutine) on one address."""

    def __init__(self, name: str, handlers: dict[int, Handler], max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
                 authorize: Authorizer | None = None) -> None:
        self.name = name
        self.handlers = handlers
        self.max_frame_bytes = max_frame_bytes
        self.authorize = authorize
        self.idle_s = IDLE_S
        self.on_close: list[Callable[[Connection], None]] = []
        self._server: asyncio.base_events.Server | None = None
        self._connections: set[Connection] = set()
        self.port = 0

    async def start(self, bind: str, flag: str = "--remoting-bind") -> int:
        """Listen on `bind`; an address that cannot be listened on is a StartupError naming
        `flag` (the setting it came from), so the service stops with one line, not a traceback."""
        host, _, port = bind.rpartition(":")
        try:
            self._server = await asyncio.start_server(self._serve, host.strip("[]") or None, int(port), reuse_address=True)
        except OSError as exc:
            # (asyncio words a bind error at length; the errno's own words are the reason)
            reason = os.strerror(exc.errno) if isinstance(exc.errno, int) and exc.errno > 0 else exc.strerror or str(exc)
            raise cannot_listen(flag, bind, reason) from None
        self.port = int(self._server.sockets[0].getsockname()[1])
        log_event(log, "remoting server started", service=self.name, address=f"{host}:{self.port}")
        return self.port

    def stop_accepting(self) -> None:
        """Refuse new connections and close the open ones (their pending requests are dropped)."""
        if self._server is not None:
            self._server.close()
        for conn in list(self._connections):
            conn.writer.close()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            for conn in list(self._connections):
                conn.writer.close()
            await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peername = writer.get_extra_info("peername") or ("", 0)
        conn = Connection((str(peername[0]), int(peername[1])), writer)
        self._connections.add(conn)
        in_flight = asyncio.Semaphore(MAX_IN_FLIGHT)
        tasks: set[asyncio.Task[None]] = set()
        try:
            while True:
                try:
                    async with asyncio.timeout(self.idle_s):  # (not wait_for: no task per read, no cancellation lost on 3.11)
                        head = await reader.readexactly(4)
                except (asyncio.IncompleteReadError, ConnectionError):
                    return  # the client closed the connection between frames
                except asyncio.TimeoutError:
                    log_event(log, "idle connection closed", service=self.name, peer=f"{conn.peer[0]}:{conn.peer[1]}", idle_s=self.idle_s)
                    return
                length = int.from_bytes(head, "big", signed=True)
                if length < 4 or length > self.max_frame_bytes:
                    raise FrameError(f"frame length {length}: must be 4..{self.max_frame_bytes}")
                try:
                    async with asyncio.timeout(self.idle_s):
                        frame = await reader.readexactly(length)
                except asyncio.IncompleteReadError as exc:
                    raise FrameError(f"connection closed inside a frame ({len(exc.partial)} of {length} bytes)") from None
                except asyncio.TimeoutError:
                    raise FrameError(f"no complete frame of {length} bytes within {self.idle_s:g} s") from None
                cmd = decode_frame(frame)
                if cmd.is_response:
                    continue  # Quarry sends clients no requests, so no response is awaited
                await in_flight.acquire()
                task = asyncio.create_task(self._handle(cmd, conn))
                tasks.add(task)
                task.add_done_callback(lambda t: (tasks.discard(t), in_flight.release()))
        except FrameError as exc:
            log_event(log, "malformed frame; connection closed", logging.WARNING, service=self.name, peer=f"{conn.peer[0]}:{conn.peer[1]}", reason=str(exc))
        except ConnectionError:
            pass
        finally:
            self._connections.discard(conn)
            for callback in self.on_close:
                try:
                    callback(conn)
                except Exception:  # noqa: BLE001 - a listener's bug must not stop the cleanup
                    log.exception("connection close listener failed")
            writer.close()

    async def _handle(self, cmd: RemotingCommand, conn: Connection) -> None:
        response = await self.answer(cmd, conn)
        if response is not None and not cmd.is_oneway:
            try:
                conn.send(response)
                await conn.writer.drain()  # a client that stops reading holds its own requests back, not memory
            except (ConnectionError, RuntimeError):
                pass  # the client went away; nothing to answer

    async def answer(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand | None:
        """The response to one request (None: the handler answers nothing)."""
        handler = self.handlers.get(cmd.code)
        if handler is None:
            return cmd.response(codes.REQUEST_CODE_NOT_SUPPORTED, f" request type {cmd.code} not supported")
        try:
            if self.authorize is not None:
                self.authorize(cmd)
            return await handler(cmd, conn)
        except RemotingError as exc:
            return cmd.response(exc.code, exc.remark)
        except HeaderFieldError as exc:
            return cmd.response(codes.SYSTEM_ERROR, str(exc))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - answer, log, keep serving
            log.exception("remoting handler failed: code=%s", cmd.code)
            return cmd.response(codes.SYSTEM_ERROR, f"{type(exc).__name__}: {exc}")
