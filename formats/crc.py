"""The CRC32 RocketMQ stores as a record's BODYCRC (Java's java.util.zip.CRC32, zlib's
polynomial), implemented once: every body CRC Quarry computes or checks calls `crc32`.

It is ISA-L's (python-isal): the same function as zlib.crc32, bit for bit, and much faster
on the bodies the send path checksums per message (docs/decisions/isal-crc32.md).
The masking and the empty-body rule are formats.record.body_crc's.
"""
from __future__ import annotations

from isal.isal_zlib import crc32

__all__ = ["crc32"]
