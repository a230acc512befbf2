"""The dispatch rule: what a ConsumeQueue or an index needs of a record (RocketMQ's DispatchRequest).

`build_dispatch` is the one implementation of the rule; the append (from the fields it was
given), Tail reads of the log (`decode_dispatch`) and recovery (`dispatch_info`) all call it.
keys is "" when the record has no properties at all and None when it has properties but no
KEYS; tagsCode is the Java hashCode of TAGS, except that a delayed message's tagsCode is its
deliver time.
"""
from __future__ import annotations

from typing import NamedTuple

from quarry.formats.java_hash import tags_code as java_tags_code
from quarry.formats.properties import DELAY, KEYS, TAGS, UNIQ_KEY, properties_map
from quarry.formats.record import Record, decode_dispatch_fields
from quarry.formats.scheduled import SCHEDULE_TOPIC, delay_level_deliver_time


class DispatchInfo(NamedTuple):
    """What an index or consume queue needs of a record (RocketMQ's DispatchRequest).

    A NamedTuple: built once per record on the send path, where a frozen dataclass's
    field-by-field __init__ cost more than the rest of the dispatch work."""

    physical_offset: int
    size: int
    topic: str
    queue_id: int
    queue_offset: int
    tags_code: int
    keys: str | None
    unique_key: str | None
    store_timestamp: int
    sys_flag: int
    prepared_transaction_offset: int


def build_dispatch(physical_offset: int, size: int, topic: str, queue_id: int, queue_offset: int,
                   has_properties: bool, keys: str | None, tags: str | None, unique_key: str | None, delay_level: str | None,
                   store_timestamp: int, sys_flag: int, prepared_transaction_offset: int) -> DispatchInfo:
    """The DispatchRequest of a record, as RocketMQ's checkMessageAndReturnSize builds it, from
    its KEYS, TAGS, UNIQ_KEY and DELAY properties (None when absent). The send path builds the
    same fields as a plain tuple, with `dispatch_keys` and `tags_code`."""
    return DispatchInfo(physical_offset, size, topic, queue_id, queue_offset, tags_code(topic, tags, delay_level, store_timestamp),
                        dispatch_keys(has_properties, keys), unique_key, store_timestamp, sys_flag, prepared_transaction_offset)


def dispatch_keys(has_properties: bool, keys: str | None) -> str | None:
    """The KEYS a DispatchRequest carries: "" for a record without properties, None without KEYS."""
    return keys if has_properties else ""


def tags_code(topic: str, tags: str | None, delay_level: str | None, store_timestamp: int) -> int:
    """tagsCode: the Java hashCode of TAGS, or a delayed message's deliver time."""
    if delay_level is not None and topic == SCHEDULE_TOPIC:
        deliver = delay_level_deliver_time(delay_level, store_timestamp)
        if deliver is not None:
            return deliver
    return java_tags_code(tags)


def _from_properties(physical_offset: int, size: int, topic: str, queue_id: int, queue_offset: int, properties_text: str,
                     props: dict[str, str], store_timestamp: int, sys_flag: int, prepared_transaction_offset: int) -> DispatchInfo:
    return build_dispatch(physical_offset, size, topic, queue_id, queue_offset, has_properties=bool(properties_text),
                          keys=props.get(KEYS), tags=props.get(TAGS), unique_key=props.get(UNIQ_KEY), delay_level=props.get(DELAY),
                          store_timestamp=store_timestamp, sys_flag=sys_flag, prepared_transaction_offset=prepared_transaction_offset)


def dispatch_info(rec: Record) -> DispatchInfo:
    """The DispatchInfo of a decoded record."""
    return _from_properties(rec.physical_offset, rec.store_size, rec.topic, rec.queue_id, rec.queue_offset, rec.properties_text,
                            rec.properties, rec.store_timestamp, rec.sys_flag, rec.prepared_transaction_offset)


def decode_dispatch(buf: bytes | memoryview, pos: int, physical_offset: int) -> DispatchInfo:
    """The DispatchInfo of the record at buf[pos:] without copying its body or checking its CRC
    (see record.decode_dispatch_fields: the frame is still validated)."""
    size, topic, queue_id, queue_offset, store_ts, sys_flag, prepared, props_text = decode_dispatch_fields(buf, pos, physical_offset)
    return _from_properties(physical_offset, size, topic, queue_id, queue_offset, props_text, properties_map(props_text),
                            store_ts, sys_flag, prepared)
