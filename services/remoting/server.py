"""The remoting transport's server side: asyncio TCP, frames in, handlers by request code.

Each request runs as its own task (a long-polling pull must not hold up a send on the same
connection); responses carry the request's opaque and header form, and those of one turn of
the event loop leave in one write. One-way requests get no
response. A handler's RemotingError becomes its response code and remark; any other error
a SYSTEM_ERROR naming it. A malformed or oversized frame closes that connection with a log
line; the process and other connections carry on.

What a peer can make the server hold (Limits): at most `connections_per_peer` connections per
IP, and a frame must arrive whole within `frame_timeout_s` of its length. With ACL on
(`admits_header` given), a frame is unauthenticated until its handler's ACL check, and the
signature covers the body, so the header is read first: a request whose header names no known
account is refused and its connection closed before a byte of its body is read; and the bytes
of frames being read are counted against a cap per IP and one in total as they arrive, so a
frame going over either closes its connection. A refused peer is logged once per limit, not
per attempt.
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import os
from dataclasses import dataclass, field
from typing import Awaitable, Callable, Container

from quarry.services.log import log_event
from quarry.services.remoting import codes
from quarry.services.remoting.command import FrameError, HeaderFieldError, RemotingCommand, decode_frame, encode_frame
from quarry.services.remoting.request_names import request_name
from quarry.services.settings import EnvArgumentParser, StartupError, cannot_listen, named

log = logging.getLogger("quarry.remoting")

DEFAULT_MAX_FRAME_BYTES = 16 * 1024 * 1024  # RocketMQ's default frameMaxLength
MAX_IN_FLIGHT = 256  # requests of one connection being handled at once; reading pauses beyond
IDLE_S = 120.0  # a connection silent this long between frames is closed, as RocketMQ's channel idle limit
_CHUNK = 256 * 1024  # most bytes taken from a connection's buffer at once while counting (ACL on)
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
    writer: asyncio.StreamWriter
    attributes: dict[str, object] = field(default_factory=dict)
    in_flight: int = 0  # its requests being handled now (a handler may wait for the others' company)
    _replies: list[bytes] = field(default_factory=list, repr=False)  # frames reply() queued this turn

    def send(self, cmd: RemotingCommand) -> None:
        """Write one frame now (a request the server sends its client)."""
        if not self.writer.is_closing():
            self.writer.write(encode_frame(cmd))

    def reply(self, cmd: RemotingCommand) -> None:
        """Queue a response: those queued in one turn of the event loop leave together, in
        order, in one write (a send() each was most of the cost of a small request)."""
        if self.writer.is_closing():
            return
        self._replies.append(encode_frame(cmd))
        if len(self._replies) == 1:
            asyncio.get_running_loop().call_soon(self.flush)

    def flush(self) -> None:
        """Write the queued responses."""
        replies, self._replies = self._replies, []
        if replies and not self.writer.is_closing():
            self.writer.writelines(replies)


Handler = Callable[[RemotingCommand, Connection], Awaitable[RemotingCommand | None]]
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
    fires early (a timeout context per read armed and cancelled a timer twice a request).
    When the deadline passes, the connection's task is cancelled; `expired` says so."""

    def __init__(self, step: float) -> None:
        self.task = asyncio.current_task()
        self.loop = asyncio.get_running_loop()
        self.step = step
        self.at = float("inf")
        self.frame_length = 0  # the frame being read when the deadline is a frame's (0: between frames)
        self.expired = False
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
        elif self.task is not None:
            self.expired = True
            self.task.cancel()


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
    """Serves `handlers` (request code → coroutine) on one address."""

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
        peer = self._peers.setdefault(conn.peer[0], _Peer())
        if peer.connections >= self.limits.connections_per_peer:
            self._tell(conn, "connections per peer", f"{peer.connections} open, the most one IP may hold (--remoting-connections-per-peer)")
            writer.close()
            return
        peer.connections += 1
        self._connections.add(conn)
        in_flight = asyncio.Semaphore(MAX_IN_FLIGHT)
        tasks: set[asyncio.Task[None]] = set()

        def handled(task: asyncio.Task[None]) -> None:
            tasks.discard(task)
            conn.in_flight -= 1
            in_flight.release()

        deadline = _Deadline(min(self.idle_s, self.limits.frame_timeout_s))
        try:
            while True:
                deadline.set(self.idle_s)
                try:
                    head = await reader.readexactly(4)
                except (asyncio.IncompleteReadError, ConnectionError):
                    return  # the client closed the connection between frames
                length = int.from_bytes(head, "big", signed=True)
                if length < 4 or length > self.max_frame_bytes:
                    if head[:2] == b"\x16\x03":  # a TLS record (handshake, version 3.x) read as a length
                        raise FrameError("a TLS handshake: the client has TLS on (RocketMQ's -Dtls.enable=true) and this remoting "
                                         "port serves plaintext only")
                    raise FrameError(f"frame length {length}: must be 4..{self.max_frame_bytes}")
                deadline.set(self.limits.frame_timeout_s, length)
                try:
                    if self.admits_header is None:
                        cmd = decode_frame(await reader.readexactly(length))
                    else:
                        cmd = await self._read_checked(reader, length, peer)
                except asyncio.IncompleteReadError:
                    raise FrameError(f"connection closed inside a frame of {length} bytes") from None
                if cmd.is_response:
                    continue  # Quarry sends clients no requests, so no response is awaited
                deadline.clear()  # (a client whose requests are all in flight is not idle)
                await in_flight.acquire()
                conn.in_flight += 1
                task = asyncio.create_task(self._handle(cmd, conn))
                tasks.add(task)
                task.add_done_callback(handled)
        except asyncio.CancelledError:
            if not deadline.expired or deadline.task is None or deadline.task.uncancel():
                raise  # (not the deadline's doing: the server is stopping)
            if not deadline.frame_length:
                log_event(log, "idle connection closed", service=self.name, peer=f"{conn.peer[0]}:{conn.peer[1]}", idle_s=self.idle_s)
            else:
                log_event(log, "malformed frame; connection closed", logging.WARNING, service=self.name, peer=f"{conn.peer[0]}:{conn.peer[1]}",
                          reason=f"no complete frame of {deadline.frame_length} bytes within {self.limits.frame_timeout_s:g} s")
        except FrameError as exc:
            log_event(log, "malformed frame; connection closed", logging.WARNING, service=self.name, peer=f"{conn.peer[0]}:{conn.peer[1]}", reason=str(exc))
        except _Refused as refused:
            if refused.request is not None and not refused.request.is_oneway:
                conn.send(refused.request.response(codes.NO_PERMISSION, refused.reason))  # (flushed by the close)
            self._tell(conn, refused.limit, refused.reason)
        except ConnectionError:
            pass
        finally:
            deadline.close()
            self._connections.discard(conn)
            peer.connections -= 1
            if not peer.connections:
                del self._peers[conn.peer[0]]
            for callback in self.on_close:
                try:
                    callback(conn)
                except Exception:  # noqa: BLE001 - a listener's bug must not stop the cleanup
                    log.exception("connection close listener failed")
            conn.flush()
            writer.close()

    async def _read_checked(self, reader: asyncio.StreamReader, length: int, peer: _Peer) -> RemotingCommand:
        """One frame with ACL on: its header checked before its body is read, and its bytes,
        as they arrive, counted against the caps until it is whole (_Refused closes the connection)."""
        held = 0

        async def take(n: int) -> bytes:
            # (chunks as they arrive rather than readexactly: a body is counted before it is all
            # buffered, and a declared length that never comes holds nothing)
            nonlocal held
            parts: list[bytes] = []
            while n:
                chunk = await reader.read(min(n, _CHUNK))
                if not chunk:
                    raise asyncio.IncompleteReadError(b"".join(parts), n)
                self._hold(peer, len(chunk))
                held += len(chunk)
                parts.append(chunk)
                n -= len(chunk)
            return b"".join(parts)

        try:
            mark = await reader.readexactly(4)
            header_length = int.from_bytes(mark, "big") & 0xFFFFFF
            if header_length > length - 4:
                raise FrameError(f"header length {header_length} exceeds the frame ({length - 4} bytes after the length fields)")
            cmd = decode_frame(mark + await take(header_length))
            why = "" if cmd.is_response else self.admits_header(cmd.ext_fields)  # type: ignore[misc]
            if why:
                raise _Refused("header", why, cmd)
            cmd.body = await take(length - 4 - header_length)
            return cmd
        finally:
            peer.unauthenticated -= held
            self._unauthenticated -= held

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

    async def _handle(self, cmd: RemotingCommand, conn: Connection) -> None:
        response = await self.answer(cmd, conn)
        if response is not None and not cmd.is_oneway:
            try:
                conn.reply(response)
                # A client that stops reading holds its own requests back, not memory (the
                # transport pauses once the turn's replies fill its buffer past its high mark).
                await conn.writer.drain()
            except (ConnectionError, RuntimeError):
                pass  # the client went away; nothing to answer

    async def answer(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand | None:
        """The response to one request (None: the handler answers nothing)."""
        handler = self.handlers.get(cmd.code)
        if handler is None:
            return cmd.response(codes.REQUEST_CODE_NOT_SUPPORTED, f"request type {cmd.code} ({request_name(cmd.code)}) not supported by Quarry ({self.name})")
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
