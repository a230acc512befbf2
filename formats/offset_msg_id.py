"""offsetMsgId: where a record lives, as RocketMQ 4.x `MessageDecoder` writes and reads it.

The id is the upper-case hex of the store host's IP (4 bytes, or 16 for IPv6), the port as
an i32 and the physical offset as an i64: 32 or 56 characters. An IPv4-mapped IPv6 address
is written as IPv4, and a 56-character id holding one decodes to IPv4.
"""
from __future__ import annotations

import functools
import ipaddress
import struct
from dataclasses import dataclass
from typing import Callable

from quarry.formats.hex_codec import bytes2string

_PORT_OFFSET = struct.Struct(">iq")


class OffsetMsgIdError(ValueError):
    """An id that does not decode; the message says which rule it breaks."""


@dataclass(frozen=True)
class DecodedId:
    """The store host and physical offset held by an offsetMsgId."""

    ip: str
    port: int
    offset: int

    @property
    def is_ipv6(self) -> bool:
        return ":" in self.ip


@functools.lru_cache(maxsize=4096)
def ip_bytes(ip: str) -> bytes:
    """4 bytes for IPv4 (and IPv4-mapped IPv6), 16 for other IPv6 (cached: hosts repeat)."""
    addr = ipaddress.ip_address(ip.strip("[]"))
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    return addr.packed


def create(ip: str, port: int, offset: int) -> str:
    """The offsetMsgId of the record at `offset` stored by host ip:port."""
    return bytes2string(ip_bytes(ip) + _PORT_OFFSET.pack(port, _to_i64(offset)))


def formatter(ip: str, port: int) -> Callable[[int], str]:
    """`create(ip, port, offset)` for one store host, as a function of the offset: the host's
    hex is made once (a store answers thousands of sends a second from one host)."""
    host = create(ip, port, 0)[:-16]  # the offset's i64 is the last 16 hex digits
    with_offset = f"{host}{{:016X}}".format

    def offset_msg_id(offset: int) -> str:
        return with_offset(offset if offset >= 0 else offset & 0xFFFFFFFFFFFFFFFF)  # (an i64's bits, as create)

    return offset_msg_id


def _to_i64(value: int) -> int:
    return ((value + (1 << 63)) % (1 << 64)) - (1 << 63)


def java_host_address(raw: bytes) -> str:
    """Java's getHostAddress(): dotted IPv4, or IPv6 as eight unpadded hex groups (no ::)."""
    if len(raw) == 4:
        return "%d.%d.%d.%d" % (raw[0], raw[1], raw[2], raw[3])  # (what IPv4Address prints, at a fifth of its cost: every record read has two)
    mapped = ipaddress.IPv6Address(raw).ipv4_mapped
    if mapped is not None:
        return str(mapped)
    return ":".join(f"{int.from_bytes(raw[i:i + 2], 'big'):x}" for i in range(0, 16, 2))


def decode(msg_id: str) -> DecodedId:
    """Decode an offsetMsgId; OffsetMsgIdError names the rule an invalid id breaks."""
    if not msg_id:
        raise OffsetMsgIdError("offsetMsgId is empty")
    if len(msg_id) not in (32, 56):
        raise OffsetMsgIdError(f"offsetMsgId must be 32 (IPv4) or 56 (IPv6) hex characters, got {len(msg_id)}")
    try:
        raw = bytes.fromhex(msg_id)
    except ValueError:
        raise OffsetMsgIdError("offsetMsgId must be hexadecimal (0-9, A-F)") from None
    ip_len = 4 if len(raw) == 16 else 16
    port, offset = _PORT_OFFSET.unpack_from(raw, ip_len)
    if not 0 <= port <= 65535:
        raise OffsetMsgIdError(f"port out of range: {port}")
    return DecodedId(java_host_address(raw[:ip_len]), port, offset)
