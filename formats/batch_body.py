"""The body of a RocketMQ MessageBatch: the messages a producer packs into one send."""
from __future__ import annotations

import struct
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class BatchItem:
    """One message inside a MessageBatch body."""

    flag: int
    body: bytes
    properties: str


def decode_batch_body(data: bytes) -> list[BatchItem]:
    """Split a MessageBatch.encode() body: per message TOTALSIZE, MAGIC, BODYCRC, FLAG, BODYLEN+body, PROPLEN+props."""
    items = []
    pos = 0
    while pos < len(data):
        if len(data) - pos < 22:
            raise ValueError(f"batch body: truncated message header at byte {pos}")
        total, _magic, _crc, flag, body_len = struct.unpack_from(">iiiii", data, pos)
        if total < 22 or pos + total > len(data) or body_len < 0 or 20 + body_len + 2 > total:
            raise ValueError(f"batch body: bad sizes at byte {pos}")
        body = data[pos + 20:pos + 20 + body_len]
        (props_len,) = struct.unpack_from(">h", data, pos + 20 + body_len)
        p = pos + 22 + body_len
        if props_len < 0 or p + props_len != pos + total:
            raise ValueError(f"batch body: bad PROPLEN at byte {pos}")
        items.append(BatchItem(flag, body, data[p:p + props_len].decode("utf-8")))
        pos += total
    return items


def batch_record_properties(message_properties: str, batch_properties: str) -> str:
    """A batch record's properties: the message's, then the batch's (CLUSTER…) after \\x02.

    The separator is added only when the message has properties not already ending in one.
    """
    if not batch_properties:
        return message_properties
    if message_properties and not message_properties.endswith("\x02"):
        return message_properties + "\x02" + batch_properties
    return message_properties + batch_properties
