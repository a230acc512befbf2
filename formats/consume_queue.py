"""The ConsumeQueue unit: 20 bytes per message — phyOffset i64, size i32, tagsCode i64."""
from __future__ import annotations

import struct

CQ_UNIT = struct.Struct(">qiq")
CQ_UNIT_SIZE = CQ_UNIT.size  # 20


def encode_unit(physical_offset: int, size: int, tags_code: int) -> bytes:
    return CQ_UNIT.pack(physical_offset, size, tags_code)


def decode_unit(data: bytes | memoryview, pos: int = 0) -> tuple[int, int, int]:
    """(physical offset, size, tagsCode) of the unit at pos."""
    return CQ_UNIT.unpack_from(data, pos)
