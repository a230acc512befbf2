"""quarry.v1.MultiplexService's frames over a plain TCP connection: the framing both sides use.

Over gRPC every frame of calls is a stream message, and a stream message costs each side
about what a small unary call does (grpc.aio hands every read and write between its poller
thread and the event loop). Over a TCP connection read on the event loop itself, a frame is
a length and a protobuf. A server offers this carrier only with TLS and ACL off, and says on
which port in the Calls stream's initial metadata (FRAMES_PORT_KEY), with the token that
port answers with (FRAMES_TOKEN_KEY, hex: random per server start); the caller connects to
that port on the host it dialled, and keeps the gRPC stream when it cannot or the port
answers with another token (another server, or another start of this one, has the port now:
ports 0 are reused).

A connection opens with the caller's hello (MAGIC, then the largest message it takes, u32
big-endian) and the server's MAGIC and token back; then each frame is a u32 big-endian length and a
serialized CallsRequest (caller to server) or CallsResponse (server to caller). The calls and
their answers mean exactly what they mean on the gRPC stream (protos/quarry/v1/multiplex.proto).
"""
from __future__ import annotations

import asyncio
import socket
import struct
from typing import Callable

MAGIC = b"QMX1"
HELLO = struct.Struct(">4sI")
_LENGTH = struct.Struct(">I")
# The initial-metadata key of a Calls stream that names the server's frames port.
FRAMES_PORT_KEY = "quarry-frames-port"
# ... and the token its connections answer the hello with (after MAGIC), in hex.
FRAMES_TOKEN_KEY = "quarry-frames-token"
TOKEN_BYTES = 16
# What a frame may hold beyond its largest message: ids, codes, details, lengths.
FRAME_SLACK = 64 * 1024


# A peer gone without a word (a half-open connection) is found by TCP itself, as gRPC's channels
# find it with keepalive pings (quarry/channels.py): probes after this long idle, this far
# apart, this many unanswered; and data unacknowledged this long ends the connection (else
# ~15 min of retransmits). On Linux the user timeout also decides when unanswered probes end
# an idle connection, and (since 5.11) counts a peer that stops reading (a zero window): it is
# well above any stall of a live peer, the frames' own back-pressure included.
KEEPALIVE_IDLE_S = 10
KEEPALIVE_INTERVAL_S = 5
KEEPALIVE_PROBES = 3
USER_TIMEOUT_MS = 60_000


def watch_peer(writer: asyncio.StreamWriter) -> None:
    """TCP keepalive and a user timeout on a frames connection (either side); where the
    platform lacks an option, the connection works without it."""
    sock = writer.get_extra_info("socket")
    if sock is None:
        return
    for level, name, value in ((socket.SOL_SOCKET, "SO_KEEPALIVE", 1), (socket.IPPROTO_TCP, "TCP_KEEPIDLE", KEEPALIVE_IDLE_S),
                               (socket.IPPROTO_TCP, "TCP_KEEPINTVL", KEEPALIVE_INTERVAL_S), (socket.IPPROTO_TCP, "TCP_KEEPCNT", KEEPALIVE_PROBES),
                               (socket.IPPROTO_TCP, "TCP_USER_TIMEOUT", USER_TIMEOUT_MS)):
        option = getattr(socket, name, None)
        if option is not None:
            try:
                sock.setsockopt(level, option, value)
            except OSError:
                pass


class FrameError(Exception):
    """The peer broke the framing (a bad hello, a frame over the limit): close the connection."""


class FrameCut(FrameError):
    """The connection ended inside a frame: the peer died or the connection broke mid-write."""


def framed(data: bytes) -> tuple[bytes, bytes]:
    """One frame, to pass to a StreamWriter's writelines."""
    return _LENGTH.pack(len(data)), data


async def write_frame(writer: asyncio.StreamWriter, data: bytes) -> None:
    """Write one frame and wait until the transport is below its high-water mark."""
    writer.writelines(framed(data))
    await writer.drain()


def write_frame_now(writer: asyncio.StreamWriter, data: Callable[[], bytes]) -> bool:
    """Hand the frame of `data()` to the transport if nothing waits to be sent before it, so
    the caller need not wait for the socket (an empty buffer is below any high-water mark);
    False, without building the frame, when it did not (closing, or earlier bytes buffered:
    the caller writes it and waits)."""
    transport = writer.transport
    if transport.is_closing() or transport.get_write_buffer_size():
        return False
    writer.writelines(framed(data()))
    return True


async def read_frame(reader: asyncio.StreamReader, limit: int) -> bytes | None:
    """The next frame's payload; None when the peer closed the connection between frames."""
    try:
        head = await reader.readexactly(4)
    except asyncio.IncompleteReadError as exc:
        if exc.partial:
            raise FrameCut("connection closed inside a frame's length") from None
        return None
    (n,) = _LENGTH.unpack(head)
    if n > limit:
        raise FrameError(f"frame of {n} bytes, over the {limit}-byte limit")
    try:
        return await reader.readexactly(n)
    except asyncio.IncompleteReadError:
        raise FrameCut(f"connection closed inside a frame ({n} bytes announced)") from None
