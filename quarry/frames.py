"""The frames carrier's wire format: quarry.v1 unary calls as length-prefixed frames on one TCP
connection per broker address, multiplexed by call id (docs/decisions/internal-transport-plain-grpc.md
says why it exists). Shared by the server (services/frames_server.py) and the router's client
(services/query/frames_client.py).

A server offering the carrier says where on its gRPC port: the unary method WHERE answers
(raw bytes) with its frames port, a random token and the largest request it takes. The caller
connects to that port on the host it dialled and opens with HELLO (MAGIC, the token, the largest
answer it takes); the server answers MAGIC, or closes the connection when the token is not its
own (another process has the port).
Then each frame is a u32 big-endian length and a body:
  caller to server  CALL:   kind, id, timeout ms (0: none), method name length, method, request
                    CANCEL: kind, id
  server to caller  id, status code (grpc.StatusCode's number; 0 OK), then the serialized
                    response (OK) or the status details (UTF-8).
"""
from __future__ import annotations

import asyncio
import socket
import struct

WHERE = "/quarry.frames.Frames/Where"
MAGIC = b"QFR1"
TOKEN_BYTES = 16
ANNOUNCE = struct.Struct(">H16sI")  # WHERE's answer: port, token, largest request
HELLO = struct.Struct(">4s16sI")
LENGTH = struct.Struct(">I")
CALL = struct.Struct(">BIIH")  # kind, id, timeout ms, method name length
CANCEL = struct.Struct(">BI")
ANSWER = struct.Struct(">IB")  # id, status code
KIND_CALL, KIND_CANCEL = 1, 2
SLACK = 64 * 1024  # what a frame holds besides its message


# A peer gone without a word (a half-open connection) is found by TCP itself, as gRPC's channels
# find it by keepalive pings (quarry/channels.py): probes after 10 s idle, 5 s apart, 3 unanswered;
# data unacknowledged for 20 s ends the connection (gRPC's keepalive timeout).
_WATCH = (("SOL_SOCKET", "SO_KEEPALIVE", 1), ("IPPROTO_TCP", "TCP_KEEPIDLE", 10), ("IPPROTO_TCP", "TCP_KEEPINTVL", 5),
          ("IPPROTO_TCP", "TCP_KEEPCNT", 3), ("IPPROTO_TCP", "TCP_USER_TIMEOUT", 20_000))


def watch_peer(writer: asyncio.StreamWriter) -> None:
    """Keepalive and a user timeout on a frames connection (either side), where the platform has them."""
    sock = writer.get_extra_info("socket")
    for level, name, value in _WATCH:
        if sock is not None and hasattr(socket, name):
            try:
                sock.setsockopt(getattr(socket, level), getattr(socket, name), value)
            except OSError:
                pass


class FrameError(Exception):
    """The peer broke the framing (a frame over the limit, a bad hello): drop the connection."""


def frame(*parts: bytes) -> bytes:
    body = b"".join(parts)
    return LENGTH.pack(len(body)) + body


async def read_frame(reader: asyncio.StreamReader, limit: int) -> bytes | None:
    """The next frame's body; None when the peer closed the connection between frames."""
    try:
        head = await reader.readexactly(LENGTH.size)
    except asyncio.IncompleteReadError as exc:
        if exc.partial:
            raise FrameError("connection closed inside a frame") from None
        return None
    (n,) = LENGTH.unpack(head)
    if n > limit:
        raise FrameError(f"frame of {n} bytes, over the {limit}-byte limit")
    try:
        return await reader.readexactly(n)
    except asyncio.IncompleteReadError:
        raise FrameError("connection closed inside a frame") from None
