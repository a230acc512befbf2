"""A message handed to the store, validated and turned into record bytes.

Validation runs before the store's lock is taken, and so does the encoding: under the lock
only the queue offset, physical offset and store timestamp are patched in.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from quarry.formats.properties import DELAY, PropertyError, message_properties
from quarry.formats.record import SYSFLAG_TRANSACTION_MASK, encode_fields, store_timestamp_pos, takes_queue_offset
from quarry.formats.scheduled import SCHEDULE_TOPIC
from quarry.formats.topic import TopicError, validate_topic
from quarry.services.commitlog.errors import InvalidArgument


@dataclass(slots=True)
class NewMessage:
    """What a producer sends (RocketMQ `Message` plus the born fields)."""

    topic: str
    body: bytes
    keys: list[str] = field(default_factory=list)
    tags: str = ""
    unique_key: str = ""
    properties: list[tuple[str, str]] = field(default_factory=list)
    flag: int = 0
    queue_id: int = -1
    born_timestamp: int = 0
    born_host: tuple[str, int] = ("127.0.0.1", 0)
    sys_flag: int = 0
    reconsume_times: int = 0
    prepared_transaction_offset: int = 0


@dataclass(slots=True)
class Prepared:
    """A validated message: record bytes with placeholders, and what the index needs."""

    topic: str
    queue_id: int  # -1: the store picks
    record: bytes
    unique_key: str
    takes_queue_offset: bool  # prepared and rollback records do not advance their queue
    stored_sys_flag: int  # as encoded: transaction bits plus the IPv6 host bits
    store_timestamp_pos: int  # where the append patches the store time in (IPv4/IPv6 born host)
    prepared_transaction_offset: int
    # The dispatch rule's inputs, as a reader of the stored properties sees them (None: absent).
    has_properties: bool
    keys: str | None
    tags: str | None
    delay_level: str | None


def prepare_many(msgs: list[NewMessage], max_message_size: int, store_host: tuple[str, int], now_ms: int) -> list[Prepared]:
    """prepare() for each message; an error names the message's index when there are several."""
    out = []
    for i, msg in enumerate(msgs):
        try:
            out.append(prepare(msg, max_message_size, store_host, "", now_ms))
        except InvalidArgument:
            if len(msgs) == 1:
                raise
            prepare(msg, max_message_size, store_host, f"messages[{i}].", now_ms)  # raises, naming the index
            raise
    return out


def _raise_range_error(msg: NewMessage, field_prefix: str) -> None:
    if msg.queue_id < -1:
        raise InvalidArgument(f"{field_prefix}queue_id", "must be >= 0, or -1 to let the broker choose")
    if msg.born_timestamp < 0:
        raise InvalidArgument(f"{field_prefix}born_timestamp", "must be >= 0")
    if msg.reconsume_times < 0:
        raise InvalidArgument(f"{field_prefix}reconsume_times", "must be >= 0")
    if msg.prepared_transaction_offset < 0:
        raise InvalidArgument(f"{field_prefix}prepared_transaction_offset", "must be >= 0")
    raise InvalidArgument(f"{field_prefix}born_host.port", "must be 0..65535")


def prepare(msg: NewMessage, max_message_size: int, store_host: tuple[str, int], field_prefix: str = "", now_ms: int = 0) -> Prepared:
    """Validate and encode; InvalidArgument names the field and the rule."""
    try:
        validate_topic(msg.topic, f"{field_prefix}topic")
    except TopicError as exc:
        raise InvalidArgument(str(exc).split(":", 1)[0], str(exc).split(": ", 1)[1]) from None
    body = msg.body
    if not body:
        raise InvalidArgument(f"{field_prefix}body", "must not be empty")
    if len(body) > max_message_size:
        raise InvalidArgument(f"{field_prefix}body", f"{len(body)} bytes exceeds the max message size {max_message_size}")
    if msg.queue_id < -1 or msg.born_timestamp < 0 or msg.reconsume_times < 0 or msg.prepared_transaction_offset < 0 or not 0 <= msg.born_host[1] <= 65535:
        _raise_range_error(msg, field_prefix)
    try:
        properties = message_properties(msg.keys, msg.tags, msg.unique_key, msg.properties, field_prefix)
    except PropertyError as exc:
        field, _, rule = str(exc).partition(": ")
        raise InvalidArgument(field, rule) from None
    sys_flag = msg.sys_flag & SYSFLAG_TRANSACTION_MASK
    try:
        # Offsets and store time are patched in under the append lock (positional: once per message).
        record, stored_flag = encode_fields(msg.topic, body, properties, max(0, msg.queue_id), msg.flag, 0, 0, sys_flag,
                                            msg.born_timestamp or now_ms, msg.born_host, 0, store_host,
                                            msg.reconsume_times, msg.prepared_transaction_offset)
    except ValueError as exc:
        raise InvalidArgument(f"{field_prefix}born_host", str(exc)) from None
    # Only a delayed message's DELAY matters to dispatch; the last non-empty one is what a reader sees.
    delay = next((v for n, v in reversed(msg.properties) if n == DELAY and v), None) if msg.topic == SCHEDULE_TOPIC else None
    return Prepared(msg.topic, msg.queue_id, record, msg.unique_key,
                    takes_queue_offset(sys_flag), stored_flag, store_timestamp_pos(stored_flag),
                    msg.prepared_transaction_offset, bool(properties), " ".join(msg.keys) if msg.keys else None,
                    msg.tags or None, delay)
