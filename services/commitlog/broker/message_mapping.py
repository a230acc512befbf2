"""How a RocketMQ client's message becomes the store's NewMessage: one rule for every front door.

A RocketMQ producer sends its properties as one string (KEYS, TAGS, UNIQ_KEY and the user's
properties). They are split into the fields the store encodes, so a message sent over the
remoting protocol is stored exactly as the same message sent over quarry.v1: same record
bytes, same offsetMsgId rules. A compressed body (sysFlag bit 0x1, zlib) is stored inflated,
as the consumer of a Quarry record expects an uncompressed body.
"""
from __future__ import annotations

from quarry.formats import body as body_rules
from quarry.formats.properties import KEYS, TAGS, UNIQ_KEY, decode_pairs, key_tokens
from quarry.services.commitlog.storage.errors import InvalidArgument
from quarry.formats.record import SYSFLAG_COMPRESSED
from quarry.services.commitlog.storage.message_input import Host, NewMessage, Property


def split_properties(text: str) -> tuple[list[str], str, str, list[Property]]:
    """(keys, tags, unique_key, other properties in order) from RocketMQ's properties string.
    KEYS holds space-separated keys; empty tokens are dropped as RocketMQ's readers drop them."""
    keys: list[str] = []
    tags = unique_key = ""
    rest: list[Property] = []
    for name, value in decode_pairs(text):
        if name == KEYS:
            keys = key_tokens(value)
        elif name == TAGS:
            tags = value
        elif name == UNIQ_KEY:
            unique_key = value
        else:
            rest.append(Property(name, value))
    return keys, tags, unique_key, rest


def inflate(body: bytes, max_size: int) -> bytes:
    """A zlib-compressed body, inflated; InvalidArgument when it does not inflate or exceeds max_size."""
    try:
        return body_rules.inflate(body, max_size)
    except body_rules.BodyError as exc:
        if exc.too_big:
            raise InvalidArgument("body", f"inflates beyond the max message size {max_size}") from None
        raise InvalidArgument("body", f"sysFlag says compressed but the body {exc.reason}") from None


def from_client_message(topic: str, body: bytes, properties: str, *, flag: int = 0, queue_id: int = -1, born_timestamp: int = 0,
                        born_host: tuple[str, int] = ("127.0.0.1", 0), sys_flag: int = 0, reconsume_times: int = 0,
                        prepared_transaction_offset: int = 0, max_message_size: int = 4 * 1024 * 1024) -> NewMessage:
    """The store's message for a RocketMQ client's (topic, body, properties string, header numbers)."""
    if sys_flag & SYSFLAG_COMPRESSED:
        body = inflate(body, max_message_size)
    keys, tags, unique_key, rest = split_properties(properties)
    return NewMessage(topic, body, keys, tags, unique_key, rest, flag, queue_id, born_timestamp, Host(*born_host),
                      sys_flag, reconsume_times, prepared_transaction_offset)
