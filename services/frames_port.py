"""The TCP frames port: quarry.v1.MultiplexService's carried calls over plain TCP connections
read on the event loop (quarry/frames.py has the framing and says why). Each connection is
one carrier for MultiplexServicer.carry, exactly as a Calls stream is."""
from __future__ import annotations

import asyncio
import ipaddress
import logging
import os
import socket
from typing import AsyncIterator

from google.protobuf.message import DecodeError

from quarry.frames import FRAME_SLACK, HELLO, MAGIC, TOKEN_BYTES, FrameError, read_frame, watch_peer, write_frame, write_frame_now
from quarry.services.log import log_event
from quarry.services.multiplex import MultiplexServicer
from quarry.v1 import multiplex_pb2

log = logging.getLogger("quarry.frames")

HELLO_TIMEOUT_S = 10.0  # a connection that does not say hello by then is closed
# At stop, how long answers already written may take to leave before their connections are
# cut: a caller that does not read them would hold the stop for ever.
CLOSE_FLUSH_S = 1.0


def _peer(address: object) -> str:
    """A socket peer name as gRPC writes it (ipv4:1.2.3.4:5 / ipv6:[::1]:5), for the handlers."""
    if isinstance(address, tuple) and len(address) >= 2:
        host, port = address[0], address[1]
        if host.startswith("::ffff:"):  # an IPv4 caller of a dual-stack socket, as gRPC names it
            try:
                mapped = ipaddress.IPv6Address(host).ipv4_mapped
            except ValueError:
                mapped = None
            if mapped is not None:
                return f"ipv4:{mapped}:{port}"
        return f"ipv6:[{host}]:{port}" if ":" in host else f"ipv4:{host}:{port}"
    return "unknown"


def _dual_stack_socket(port: int) -> socket.socket | None:
    """A listening socket on every IPv6 and IPv4 address; None where this host has no IPv6."""
    try:
        sock = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
    except OSError:
        return None
    try:
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("::", port))
        sock.listen(128)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


async def _closed(writer: asyncio.StreamWriter) -> None:
    try:
        await writer.wait_closed()
    except (ConnectionError, OSError):
        pass


class FramesPort:
    """A TCP listener whose connections carry a MultiplexServicer's calls."""

    def __init__(self, multiplexer: MultiplexServicer, max_receive_bytes: int) -> None:
        self._multiplexer = multiplexer
        self._frame_limit = max_receive_bytes + FRAME_SLACK
        self._server: asyncio.AbstractServer | None = None
        self._connections: dict[asyncio.StreamWriter, asyncio.Task[None]] = {}  # each open connection's handler
        self.port = 0
        self.token = os.urandom(TOKEN_BYTES)  # tells this port from whatever holds it after this server

    async def start(self, host: str, port: int) -> int:
        """Listen on host:port (0: any free port); returns the port."""
        if host in ("", "::"):
            # Every address, as gRPC listens on "[::]": one dual-stack socket (asyncio would
            # make an IPv6 one IPv6-only, refusing the IPv4 callers the gRPC port takes, and
            # for "" one socket per family, each with its own free port).
            sock = _dual_stack_socket(port)
            if sock is not None:
                self._server = await asyncio.start_server(self._connection, sock=sock)
                self.port = sock.getsockname()[1]
                return self.port
        self._server = await asyncio.start_server(self._connection, host or None, port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    def close(self) -> None:
        """Take no new connection (those open stay until close_connections)."""
        if self._server is not None:
            self._server.close()

    async def close_connections(self) -> None:
        """End every connection (their callers see the carrier end, as when a server stops)
        and cancel the calls still running on them, as grpc cancels a stopped server's calls:
        none outlives the server's stop."""
        connections, self._connections = self._connections, {}
        for writer, task in connections.items():
            writer.close()
            task.cancel()
        if connections:
            await asyncio.wait(connections.values())
            closing = [asyncio.ensure_future(_closed(writer)) for writer in connections]
            _, stuck = await asyncio.wait(closing, timeout=CLOSE_FLUSH_S)
            for writer in connections:
                if not writer.transport.is_closing() or writer.transport.get_write_buffer_size():
                    writer.transport.abort()  # its answers were not read: dropped, as the calls are
            if stuck:
                await asyncio.wait(stuck)
        if self._server is not None:
            await self._server.wait_closed()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = _peer(writer.get_extra_info("peername"))
        watch_peer(writer)
        task = asyncio.current_task()
        assert task is not None  # asyncio runs each connection's handler as a task
        self._connections[writer] = task
        try:
            magic, caller_limit = HELLO.unpack(await asyncio.wait_for(reader.readexactly(HELLO.size), HELLO_TIMEOUT_S))
            if magic != MAGIC:
                raise FrameError(f"not a frames hello (first bytes {magic!r})")
            writer.write(MAGIC + self.token)

            async def frames() -> AsyncIterator[multiplex_pb2.CallsRequest]:
                while True:
                    data = await read_frame(reader, self._frame_limit)
                    if data is None:
                        # A caller never half-closes: the end of its connection is the caller
                        # gone (as a cancelled Calls stream), so its calls in flight are cancelled.
                        raise ConnectionResetError("the caller closed the connection")
                    yield multiplex_pb2.CallsRequest.FromString(data)

            async def write(responses: list[multiplex_pb2.MultiplexedResponse]) -> None:
                await write_frame(writer, multiplex_pb2.CallsResponse(responses=responses).SerializeToString())

            await self._multiplexer.carry(frames(), write, peer, (), caller_limit,
                                          lambda responses: write_frame_now(writer, multiplex_pb2.CallsResponse(responses=responses).SerializeToString))
        except (FrameError, DecodeError, asyncio.IncompleteReadError, TimeoutError) as exc:
            log_event(log, "frames connection closed", logging.WARNING, peer=peer, reason=f"{type(exc).__name__}: {exc}")
        except (ConnectionError, OSError):
            pass  # the caller went away: its calls were cancelled with the carrier
        except asyncio.CancelledError:
            # close_connections (the server stops): its calls were cancelled with the carrier.
            # Not re-raised: asyncio's streams log a connection task that ends cancelled as an error.
            pass
        finally:
            self._connections.pop(writer, None)
            writer.close()
            if writer.transport.get_write_buffer_size():
                writer.transport.abort()  # answers the caller is not reading: not kept until it does
