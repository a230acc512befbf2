"""A record's body as its reader gets it.

A RocketMQ producer compresses a body over 4 KiB and sets sysFlag 0x1; since 4.9.x it also
names the codec in sysFlag bits 8-10 (LZ4 1, ZSTD 2, ZLIB 3; none: zlib, the only codec
before). `MessageDecoder.decode` inflates the body for the reader and keeps the sysFlag as
stored, and so does every Quarry answer; the store keeps the bytes as they were written (a
RocketMQ broker's own store holds them compressed). Quarry's own records are never compressed:
a compressed send is stored inflated (services/commitlog/broker/message_mapping.py).
"""
from __future__ import annotations

import zlib

from quarry.formats.record import SYSFLAG_COMPRESSED

COMPRESSION_TYPE_MASK = 0x7 << 8
_ZLIB_CODECS = (0, 0x3 << 8)
# Bounds what one answer inflates (a few KiB compressed can claim gigabytes); the largest
# gRPC message a Quarry service sends.
READABLE_LIMIT = 128 << 20


class BodyError(ValueError):
    """A compressed body that cannot be given inflated: `reason` says why; `too_big` when it
    inflates beyond the limit (else it does not inflate at all)."""

    def __init__(self, reason: str, too_big: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.too_big = too_big


def inflate(body: bytes, limit: int) -> bytes:
    """A zlib-compressed body, inflated; BodyError when it does not inflate or exceeds `limit` bytes."""
    d = zlib.decompressobj()
    try:
        out = d.decompress(body, limit + 1)
    except zlib.error as exc:
        raise BodyError(f"does not inflate (zlib: {exc})") from None
    if len(out) > limit or d.unconsumed_tail:
        raise BodyError(f"inflates beyond {limit} bytes", too_big=True)
    return out


def readable_body(body: bytes, sys_flag: int, limit: int = READABLE_LIMIT) -> bytes:
    """The body a reader gets: inflated when the sysFlag says zlib-compressed. As stored when it
    is not compressed, when its codec is LZ4 or ZSTD, or when it does not inflate within `limit`:
    the sysFlag, which every answer carries, then still says it is compressed."""
    if not sys_flag & SYSFLAG_COMPRESSED or sys_flag & COMPRESSION_TYPE_MASK not in _ZLIB_CODECS:
        return body
    try:
        return inflate(body, limit)
    except BodyError:
        return body
