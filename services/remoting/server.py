"""The remoting transport's server side: an asyncio Protocol per connection, frames parsed as
bytes arrive, handlers by request code.

A handler that answers at once (a plain function returning its response) is answered where
its frame is parsed; one that must wait (a coroutine: a long-polling pull must not hold up a
send on the same connection) runs as its own task. Responses carry the request's opaque and
header form; the answers to what one read brought leave in one write, as do those tasks give
in one turn of the event loop. One-way requests get no response. A handler's RemotingError
becomes its response code and remark; any other error a SYSTEM_ERROR naming it. A malformed or oversized frame closes that connection with a log
line; the process and other connections carry on.

What a peer can make the server hold (Limits): at most `connections_per_peer` connections per
IP, and a frame must arrive whole within `frame_timeout_s` of its length. With ACL on
(`admits_header` given), a frame is unauthenticated until its handler's ACL check, and the
signature covers the body, so the header is checked first: a request whose header names no
known account is refused and its connection closed without waiting for its body; and the bytes
of frames being read are counted against a cap per IP and one in total as they arrive, so a
frame going over either closes its connection. A refused peer is logged once per limit, not
per attempt.
"""
from __future__ import annotations

import argparse
import asyncio
import inspect
import logging
import os
from dataclasses import dataclass, field
from typing import Awaitable, Callable, Container, cast

from quarry.services.log import log_event
from quarry.services.remoting import codes
from quarry.services.remoting.command import FrameError, HeaderFieldError, RemotingCommand, decode_frame, encode_frame
from quarry.services.remoting.request_names import request_name
from quarry.services.settings import EnvArgumentParser, StartupError, cannot_listen, named

log = logging.getLogger("quarry.remoting")

DEFAULT_MAX_FRAME_BYTES = 16 * 1024 * 1024  # RocketMQ's default frameMaxLength
MAX_IN_FLIGHT = 256  # requests of one connection being handled at once; reading pauses beyond
FLUSH_AT = 64 * 1024  # bytes of answers one read may queue before they are written (and the transport may push back)
IDLE_S = 120.0  # a connection silent this long between frames is closed, as RocketMQ's channel idle limit
_TOLD_PEERS = 4096  # (peer, limit) pairs whose refusal was logged; forgotten all at once beyond (a bound, not a cache)


@dataclass(frozen=True)
class Limits:
    """What one peer (an IP) and all of them together may hold; see add_limit_settings."""

    connections_per_peer: int = 64
    frame_timeout_s: float = 10.0
    unauthenticated_bytes_per_peer: int = 32 * 1024 * 1024
    unauthenticated_bytes: int = 128 * 1024 * 1024


def add_limit_settings(p: EnvArgumentParser) -> None:
    """The remoting port's limits on what peers hold (a service with a remoting port)."""
    d = Limits()
    p.add_setting("--remoting-connections-per-peer", "QUARRY_REMOTING_CONNECTIONS_PER_PEER", d.connections_per_peer,
                  "remoting connections one IP may hold open; more are closed at once. A RocketMQ 4 client instance keeps one "
                  "connection per broker, so 64 is many client processes on one host (raise it for clients behind one NAT address)",
                  int, minimum=1)
    p.add_setting("--remoting-frame-timeout-ms", "QUARRY_REMOTING_FRAME_TIMEOUT_MS", int(d.frame_timeout_s * 1000),
                  "a remoting frame must arrive whole within this long of its length field, or its connection is closed (a peer "
                  "that stops mid-frame holds its buffer no longer); RocketMQ 4 clients give up on a send after 3 s by default",
                  int, minimum=100)
    p.add_setting("--remoting-unauthenticated-bytes-per-peer", "QUARRY_REMOTING_UNAUTHENTICATED_BYTES_PER_PEER", d.unauthenticated_bytes_per_peer,
                  "with ACL on, bytes of remoting frames one IP may have in reading before their signature is checked; a frame over "
                  "it closes its connection (at least --remoting-max-frame-bytes; the default holds 8 sends of RocketMQ's 4 MiB largest "
                  "message at once)", int, minimum=1024)
    p.add_setting("--remoting-unauthenticated-bytes", "QUARRY_REMOTING_UNAUTHENTICATED_BYTES", d.unauthenticated_bytes,
                  "with ACL on, bytes of remoting frames all peers together may have in reading before their signature is checked; "
                  "a frame over it closes its connection (at least --remoting-unauthenticated-bytes-per-peer)", int, minimum=1024)


def limits_from(args: argparse.Namespace, acl: bool) -> Limits:
    """The Limits of add_limit_settings; with ACL on (the byte caps apply), StartupError when a
    cap would refuse the largest legitimate frame or one peer's share exceeds the whole."""
    per_peer, total = args.remoting_unauthenticated_bytes_per_peer, args.remoting_unauthenticated_bytes
    if acl and per_peer < args.remoting_max_frame_bytes:
        raise StartupError(f"{named('--remoting-unauthenticated-bytes-per-peer')}: {per_peer} is below "
                           f"{named('--remoting-max-frame-bytes')} ({args.remoting_max_frame_bytes}): the largest frame could never be read")
    if acl and total < per_peer:
        raise StartupError(f"{named('--remoting-unauthenticated-bytes')}: {total} is below {named('--remoting-unauthenticated-bytes-per-peer')} ({per_peer})")
    return Limits(args.remoting_connections_per_peer, args.remoting_frame_timeout_ms / 1000.0, per_peer, total)


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
    writer: asyncio.WriteTransport  # (its is_closing, write, writelines, close)
    attributes: dict[str, object] = field(default_factory=dict)
    in_flight: int = 0  # its requests being handled now (a handler may wait for the others' company)
    _replies: list[bytes] = field(default_factory=list, repr=False)  # frames reply() queued this turn
    queued_bytes: int = 0  # their size

    def send(self, cmd: RemotingCommand) -> None:
        """Write one frame now (a request the server sends its client)."""
        if not self.writer.is_closing():
            self.writer.write(encode_frame(cmd))

    def reply(self, cmd: RemotingCommand) -> None:
        """Queue a response: those queued in one turn of the event loop leave together, in
        order, in one write (a send() each was most of the cost of a small request)."""
        self.queue(cmd)
        if len(self._replies) == 1:
            asyncio.get_running_loop().call_soon(self.flush)

    def queue(self, cmd: RemotingCommand) -> None:
        """Queue a response for the caller's flush() (the read loop's, after what one read brought)."""
        if not self.writer.is_closing():
            frame = encode_frame(cmd)
            self._replies.append(frame)
            self.queued_bytes += len(frame)

    def flush(self) -> None:
        """Write the queued responses."""
        replies, self._replies, self.queued_bytes = self._replies, [], 0
        if replies and not self.writer.is_closing():
            self.writer.writelines(replies)


# A handler returns its response (None: none), or an awaitable of it when it has to wait.
Handler = Callable[[RemotingCommand, Connection], "RemotingCommand | None | Awaitable[RemotingCommand | None]"]
Authorizer = Callable[[RemotingCommand], None]  # raises RemotingError to refuse
HeaderCheck = Callable[[dict[str, str]], str]  # a request's header fields → why it is refused ("" admits)


def known_key_check(key_field: str, known: Container[str]) -> HeaderCheck:
    """A HeaderCheck admitting requests whose `key_field` (the ACL's access key) names a known account."""
    def admits(ext_fields: dict[str, str]) -> str:
        return "" if ext_fields.get(key_field, "") in known else f"unknown or missing {key_field}"
    return admits


class _Deadline:
    """One connection's idle and frame time limits on one timer: moving the deadline is an
    assignment, and the timer, never armed further out than `step`, re-arms itself when it
    fires early (a timer armed and cancelled per frame cost more than the frame's handling).
    When the deadline passes, `on_expire` runs; `frame_length` says which limit it was."""

    def __init__(self, step: float, on_expire: Callable[[], None]) -> None:
        self.loop = asyncio.get_running_loop()
        self.step = step
        self.on_expire = on_expire
        self.at = float("inf")
        self.frame_length = 0  # the frame being read when the deadline is a frame's (0: between frames)
        self._timer = self.loop.call_at(self.loop.time() + step, self._fire)

    def set(self, seconds: float, frame_length: int = 0) -> None:
        self.at, self.frame_length = self.loop.time() + seconds, frame_length

    def clear(self) -> None:
        self.at = float("inf")

    def close(self) -> None:
        self._timer.cancel()

    def _fire(self) -> None:
        now = self.loop.time()
        if now < self.at:
            self._timer = self.loop.call_at(min(self.at, now + self.step), self._fire)
        else:
            self.on_expire()


class _Refused(Exception):
    """A limit closes this connection; `request` is answered first when its header was read."""

    def __init__(self, limit: str, reason: str, request: RemotingCommand | None = None) -> None:
        super().__init__(reason)
        self.limit, self.reason, self.request = limit, reason, request


@dataclass
class _Peer:
    connections: int = 0
    unauthenticated: int = 0  # bytes its frames in reading hold (ACL on)


class RemotingServer:
    """Serves `handlers` (request code → handler: a function answering at once, or one
    returning an awaitable of its answer) on one address."""

    def __init__(self, name: str, handlers: dict[int, Handler], max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
                 authorize: Authorizer | None = None, admits_header: HeaderCheck | None = None, limits: Limits = Limits()) -> None:
        self.name = name
        self.handlers = handlers
        self.max_frame_bytes = max_frame_bytes
        self.authorize = authorize
        self.admits_header = admits_header  # ACL on: headers checked first, unauthenticated bytes capped
        self.limits = limits
        self.idle_s = IDLE_S
        self.on_close: list[Callable[[Connection], None]] = []
        self._server: asyncio.base_events.Server | None = None
        self._connections: set[Connection] = set()
        self._peers: dict[str, _Peer] = {}
        self._unauthenticated = 0  # bytes all frames in reading hold (ACL on)
        self._told: set[tuple[str, str]] = set()
        self.port = 0

    async def start(self, bind: str, flag: str = "--remoting-bind") -> int:
        """Listen on `bind`; an address that cannot be listened on is a StartupError naming
        `flag` (the setting it came from), so the service stops with one line, not a traceback."""
        host, _, port = bind.rpartition(":")
        try:
            self._server = await asyncio.get_running_loop().create_server(
                lambda: _ConnectionProtocol(self), host.strip("[]") or None, int(port), reuse_address=True)
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

    def _hold(self, peer: _Peer, n: int) -> None:
        """Count `n` more unauthenticated bytes of `peer`; _Refused when over a cap."""
        limits = self.limits
        if peer.unauthenticated + n > limits.unauthenticated_bytes_per_peer:
            raise _Refused("unauthenticated bytes per peer", f"this IP's frames not yet authenticated would hold over "
                                                             f"{limits.unauthenticated_bytes_per_peer} bytes (--remoting-unauthenticated-bytes-per-peer)")
        if self._unauthenticated + n > limits.unauthenticated_bytes:
            raise _Refused("unauthenticated bytes", f"frames not yet authenticated would hold over {limits.unauthenticated_bytes} "
                                                    "bytes in all (--remoting-unauthenticated-bytes)")
        peer.unauthenticated += n
        self._unauthenticated += n

    def _release(self, peer: _Peer, n: int) -> None:
        peer.unauthenticated -= n
        self._unauthenticated -= n

    def _tell(self, conn: Connection, limit: str, reason: str) -> None:
        """Log a refusal once per peer and limit: a peer retrying in a loop is not a log flood."""
        told = (conn.peer[0], limit)
        if told in self._told:
            return
        if len(self._told) >= _TOLD_PEERS:
            self._told.clear()
        self._told.add(told)
        log_event(log, "remoting connection refused", logging.WARNING, service=self.name, peer=f"{conn.peer[0]}:{conn.peer[1]}",
                  limit=limit, reason=reason, again="not logged for this peer")

    async def _handle(self, cmd: RemotingCommand, conn: Connection, pending: Awaitable[RemotingCommand | None]) -> None:
        response = await self._finish(cmd, pending)
        if response is not None and not cmd.is_oneway:
            conn.reply(response)

    def _answer(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand | None | Awaitable[RemotingCommand | None]:
        """The response to one request (None: the handler answers nothing), or the handler's
        awaitable of it."""
        handler = self.handlers.get(cmd.code)
        if handler is None:
            return cmd.response(codes.REQUEST_CODE_NOT_SUPPORTED, f"request type {cmd.code} ({request_name(cmd.code)}) not supported by Quarry ({self.name})")
        try:
            if self.authorize is not None:
                self.authorize(cmd)
            return handler(cmd, conn)
        except Exception as exc:  # noqa: BLE001 - answer, log, keep serving
            return self._failed(cmd, exc)

    async def _in_order(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand | None:
        """The handler called when this task starts (after the tasks made before it)."""
        answer = self._answer(cmd, conn)
        return await answer if inspect.isawaitable(answer) else answer

    async def _finish(self, cmd: RemotingCommand, pending: Awaitable[RemotingCommand | None]) -> RemotingCommand | None:
        try:
            return await pending
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - answer, log, keep serving
            return self._failed(cmd, exc)

    def _failed(self, cmd: RemotingCommand, exc: Exception) -> RemotingCommand:
        """A handler's error as its response: the one place remoting errors become codes."""
        if isinstance(exc, RemotingError):
            return cmd.response(exc.code, exc.remark)
        if isinstance(exc, HeaderFieldError):
            return cmd.response(codes.SYSTEM_ERROR, str(exc))
        log.error("remoting handler failed: code=%s", cmd.code, exc_info=exc)
        return cmd.response(codes.SYSTEM_ERROR, f"{type(exc).__name__}: {exc}")


class _ConnectionProtocol(asyncio.Protocol):
    """One client connection: frames parsed from the bytes as they arrive, in the loop's own
    callback (no task woken per frame), each request answered at once when its handler does,
    and the answers to what one read brought leave in one write. Reading pauses while the
    connection has MAX_IN_FLIGHT requests being handled or its replies fill the transport's
    buffer (a client that stops reading holds its own requests back, not memory)."""

    def __init__(self, server: RemotingServer) -> None:
        self.server = server
        self.buf = bytearray()
        self.conn: Connection | None = None
        self.peer: _Peer | None = None
        self.deadline: _Deadline | None = None
        self.in_frame = False  # the buffer starts a frame whose length was read (its deadline runs)
        self.header_checked = False  # ACL on: the header of that frame was admitted
        self.held = 0  # ACL on: bytes of frames in reading counted against the caps
        self.write_paused = False
        self.read_paused = False
        self.closed = False
        self.tasks: set[asyncio.Task[None]] = set()
        self.task_this_read = False  # a frame of the read being handled became a task

    # -- asyncio's callbacks ------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # (uvloop's transports are not asyncio.Transport subclasses)
        server = self.server
        peername = transport.get_extra_info("peername") or ("", 0)
        conn = Connection((str(peername[0]), int(peername[1])), self.transport)
        peer = server._peers.setdefault(conn.peer[0], _Peer())
        if peer.connections >= server.limits.connections_per_peer:
            server._tell(conn, "connections per peer", f"{peer.connections} open, the most one IP may hold (--remoting-connections-per-peer)")
            if not peer.connections:
                del server._peers[conn.peer[0]]
            self.closed = True
            transport.close()
            return
        peer.connections += 1
        self.conn, self.peer = conn, peer
        server._connections.add(conn)
        self.deadline = _Deadline(min(server.idle_s, server.limits.frame_timeout_s), self._expired)
        self.deadline.set(server.idle_s)

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        self.buf += data
        self._read_safely()

    def _read_safely(self) -> None:
        """_read_frames, a frame that does not decode closing its connection (never the loop's callback)."""
        try:
            self._read_frames()
        except _Refused as refused:
            self._refuse(refused)
        except Exception as exc:  # noqa: BLE001 - FrameError, or any other way a frame fails to decode
            self._close_malformed(str(exc) if isinstance(exc, FrameError) else f"{type(exc).__name__}: {exc}")

    def eof_received(self) -> bool | None:
        return None  # (close: a client that half-closes is done; its pending answers are dropped)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.buf = bytearray()  # (now: the protocol may live on in a reference cycle until a collection)
        conn, peer, server = self.conn, self.peer, self.server
        if conn is None or peer is None:
            return
        if self.deadline is not None:
            self.deadline.close()
            self.deadline = None
        if self.held:
            server._release(peer, self.held)
            self.held = 0
        server._connections.discard(conn)
        peer.connections -= 1
        if not peer.connections:
            server._peers.pop(conn.peer[0], None)
        for callback in server.on_close:
            try:
                callback(conn)
            except Exception:  # noqa: BLE001 - a listener's bug must not stop the cleanup
                log.exception("connection close listener failed")

    def pause_writing(self) -> None:
        self.write_paused = True
        self._pause_reading()
        if self.deadline is not None:  # (held back by the server: no limit runs until it resumes)
            self.deadline.clear()
            self.in_frame = False

    def resume_writing(self) -> None:
        self.write_paused = False
        self._resume()

    # -- frames ------------------------------------------------------------------------------
    def _read_frames(self) -> None:
        """Handle every whole frame in the buffer (until the connection is held back), then
        write their answers together, and time what is left."""
        server, conn, buf = self.server, self.conn, self.buf
        assert conn is not None
        pos = 0
        self.task_this_read = False
        try:
            while not self.closed and not self.transport.is_closing() and len(buf) - pos >= 4:
                if conn.in_flight >= MAX_IN_FLIGHT or self.write_paused:
                    self._pause_reading()
                    break
                length = int.from_bytes(buf[pos:pos + 4], "big", signed=True)
                if length < 4 or length > server.max_frame_bytes:
                    if buf[pos:pos + 2] == b"\x16\x03":  # a TLS record (handshake, version 3.x) read as a length
                        raise FrameError("a TLS handshake: the client has TLS on (RocketMQ's -Dtls.enable=true) and this remoting "
                                         "port serves plaintext only")
                    raise FrameError(f"frame length {length}: must be 4..{server.max_frame_bytes}")
                if len(buf) - pos - 4 < length:
                    if server.admits_header is not None and not self.header_checked:
                        self._check_header(pos, length)
                    break
                if server.admits_header is not None:
                    self._count(4 + length)  # (its last bytes too: a frame going over a cap as it completes is refused)
                cmd = decode_frame(bytes(buf[pos + 4:pos + 4 + length]))
                pos += 4 + length
                self.in_frame = False
                if server.admits_header is not None:
                    if not self.header_checked:
                        self._admit(cmd)
                    self._count(0)  # read whole: its signature is its handler's to check
                self.header_checked = False
                if not cmd.is_response:  # (Quarry sends clients no requests, so no response is awaited)
                    self._dispatch(cmd)
                    if conn.queued_bytes > FLUSH_AT:
                        conn.flush()  # (the transport may pause the writing now: checked before the next frame)
        finally:
            del buf[:pos]
            conn.flush()
        if server.admits_header is not None:
            # The frame being read (an incomplete one at the head of the buffer); whole frames
            # waiting while the connection is held back are read, not being read.
            self._count(len(buf) if len(buf) < 4 or len(buf) - 4 < int.from_bytes(buf[:4], "big") else 0)
        self._time_the_rest()

    def _count(self, reading: int) -> None:
        """ACL on: `reading` bytes of a frame not yet authenticated are held now; the difference
        from what was counted is held or released (_Refused when over a cap)."""
        peer = self.peer
        assert peer is not None
        if reading > self.held:
            self.server._hold(peer, reading - self.held)
        elif reading < self.held:
            self.server._release(peer, self.held - reading)
        self.held = reading

    def _check_header(self, pos: int, length: int) -> None:
        """ACL on, a frame still arriving: once its header is here, a header naming no known
        account is refused before its body is waited for."""
        buf = self.buf
        if len(buf) - pos < 8:
            return
        header_length = int.from_bytes(buf[pos + 4:pos + 8], "big") & 0xFFFFFF
        if header_length > length - 4:
            raise FrameError(f"header length {header_length} exceeds the frame ({length - 4} bytes after the length fields)")
        if len(buf) - pos - 8 >= header_length:
            self._admit(decode_frame(bytes(buf[pos + 4:pos + 8 + header_length])))
            self.header_checked = True

    def _admit(self, cmd: RemotingCommand) -> None:
        why = "" if cmd.is_response else self.server.admits_header(cmd.ext_fields)  # type: ignore[misc]
        if why:
            raise _Refused("header", why, cmd)

    def _dispatch(self, cmd: RemotingCommand) -> None:
        server, conn = self.server, self.conn
        assert conn is not None
        # Once a frame of this read became a task (not started yet), the frames after it run
        # after it too: requests take effect in the order they came (a pull's offset commit
        # before a later UPDATE_CONSUMER_OFFSET).
        answer = server._in_order(cmd, conn) if self.task_this_read else server._answer(cmd, conn)
        if inspect.isawaitable(answer):
            self.task_this_read = True
            conn.in_flight += 1
            task = asyncio.ensure_future(server._handle(cmd, conn, answer))
            self.tasks.add(task)
            task.add_done_callback(self._handled)
        elif answer is not None and not cmd.is_oneway:
            try:
                conn.queue(answer)  # written with the others of this read (_read_frames)
            except Exception as exc:  # noqa: BLE001 - (a header over 16 MiB): this request's error, not the connection's
                log.error("remoting response not encodable: code=%s", cmd.code, exc_info=exc)
                conn.queue(cmd.response(codes.SYSTEM_ERROR, f"the response could not be encoded: {type(exc).__name__}: {exc}"))

    def _handled(self, task: asyncio.Task[None]) -> None:
        self.tasks.discard(task)
        assert self.conn is not None
        self.conn.in_flight -= 1
        if self.read_paused and self.conn.in_flight < MAX_IN_FLIGHT:
            self._resume()

    def _time_the_rest(self) -> None:
        """The deadline for what the buffer holds: a frame begun must end within the frame
        limit of its length arriving; between frames, the idle limit; none while held back."""
        deadline = self.deadline
        if deadline is None or self.closed:
            return
        if self.read_paused:
            deadline.clear()
        elif len(self.buf) >= 4:
            if not self.in_frame:
                self.in_frame = True
                deadline.set(self.server.limits.frame_timeout_s, int.from_bytes(self.buf[:4], "big"))
        else:
            self.in_frame = False
            deadline.set(self.server.idle_s)

    def _pause_reading(self) -> None:
        if not self.read_paused and not self.closed:
            self.read_paused = True
            self.transport.pause_reading()

    def _resume(self) -> None:
        """Read again once neither the in-flight bound nor the transport holds the connection back."""
        if not self.read_paused or self.closed or self.write_paused or (self.conn is not None and self.conn.in_flight >= MAX_IN_FLIGHT):
            return
        self.read_paused = False
        self.in_frame = False  # (the frame limit starts again: the wait was the server's)
        self.transport.resume_reading()
        self._read_safely()  # what arrived before the pause

    # -- closing -----------------------------------------------------------------------------
    def _close(self) -> None:
        if not self.closed:
            self.closed = True
            self.buf = bytearray()  # what it was reading is dropped at once, not when the protocol is collected
            if self.conn is not None:
                self.conn.flush()
            self.transport.close()

    def _close_malformed(self, reason: str) -> None:
        conn = self.conn
        assert conn is not None
        log_event(log, "malformed frame; connection closed", logging.WARNING, service=self.server.name, peer=f"{conn.peer[0]}:{conn.peer[1]}", reason=reason)
        self._close()

    def _refuse(self, refused: _Refused) -> None:
        assert self.conn is not None
        if refused.request is not None and not refused.request.is_oneway:
            self.conn.send(refused.request.response(codes.NO_PERMISSION, refused.reason))  # (flushed by the close)
        self.server._tell(self.conn, refused.limit, refused.reason)
        self._close()

    def _expired(self) -> None:
        conn, deadline = self.conn, self.deadline
        assert conn is not None and deadline is not None
        if not deadline.frame_length:
            log_event(log, "idle connection closed", service=self.server.name, peer=f"{conn.peer[0]}:{conn.peer[1]}", idle_s=self.server.idle_s)
        else:
            log_event(log, "malformed frame; connection closed", logging.WARNING, service=self.server.name, peer=f"{conn.peer[0]}:{conn.peer[1]}",
                      reason=f"no complete frame of {deadline.frame_length} bytes within {self.server.limits.frame_timeout_s:g} s")
        self._close()
