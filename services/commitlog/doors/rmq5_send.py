"""SendMessage: an SDK message becomes the RocketMQ record RocketMQ 5's proxy would write.

    body                              → body
    topic.name                        → topic
    system_properties.tag             → TAGS
    system_properties.keys            → KEYS (space-joined)
    system_properties.message_id      → UNIQ_KEY (the id the SDK returns and the router finds)
    system_properties.born_timestamp  → the record's born time, and BORN_TIMESTAMP
    system_properties.born_host       → __BORNHOST (the record's born host is the connection's peer)
    system_properties.message_group   → __SHARDINGKEY (FIFO)
    system_properties.delivery_timestamp → TIMER_DELIVER_MS (delay; stored under its real topic)
    system_properties.queue_id        → the queue (the queue the SDK chose, when it says)
    user_properties                   → properties, sorted by name (none may be a system name)
Transactional messages go through transaction.py instead (half records).
"""
from __future__ import annotations

import re
import time

from quarry.formats.properties import BORN_HOST, BORN_TIMESTAMP, SHARDING_KEY, SYSTEM_PROPERTY_NAMES, TIMER_DELIVER_MS
from quarry.services.commitlog.storage.message_input import Host, NewMessage, Property
from quarry.services.rmq5.contract import Code, service, v2
from quarry.services.rmq5.status import RmqError, ok

MAX_MESSAGE_GROUP = 64  # RocketMQ proxy's maxMessageGroupSize
MAX_USER_PROPERTIES = 128  # RocketMQ proxy's userPropertyMaxNum
MAX_DELAY_MS = 24 * 3_600_000  # RocketMQ proxy's maxDelayTimeMills (1 day)


_CONTROL = re.compile("[\x00-\x1f\x7f]")
# The enum values read per message, looked up once (each read through protobuf's enum
# wrapper is a Python __getattr__).
_NORMAL, _FIFO, _DELAY, TRANSACTION = v2.MessageType.NORMAL, v2.MessageType.FIFO, v2.MessageType.DELAY, v2.MessageType.TRANSACTION
_UNSUPPORTED_TYPES = (v2.MessageType.LITE, v2.MessageType.PRIORITY)


def _has_control(text: str) -> bool:
    return _CONTROL.search(text) is not None


def _check_tag(tag: str, field: str) -> None:
    """RocketMQ's tag rule: not only whitespace, no '|' (the expression separator), no control
    characters. `field` is the message's; the tag's own name is made only for an error."""
    if not tag:
        return
    if not tag.strip():
        raise RmqError(Code.ILLEGAL_MESSAGE_TAG, f"{field}.system_properties.tag: must not be only whitespace")
    if "|" in tag:
        raise RmqError(Code.ILLEGAL_MESSAGE_TAG, f"{field}.system_properties.tag: must not contain '|' (it separates tags in subscriptions)")
    if _has_control(tag):
        raise RmqError(Code.ILLEGAL_MESSAGE_TAG, f"{field}.system_properties.tag: must not contain control characters")


def _check_type(sp: v2.SystemProperties, field: str) -> None:
    """The message type must agree with the properties that make it (as the SDKs set them)."""
    t = sp.message_type
    if t == _NORMAL:  # (what the others must or must not carry is checked below)
        return
    has_group, has_delay = bool(sp.message_group), sp.HasField("delivery_timestamp")
    if t == _FIFO and not has_group:
        raise RmqError(Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE, f"{field}.system_properties.message_group: required for a FIFO message")
    if t == _DELAY and not has_delay:
        raise RmqError(Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE, f"{field}.system_properties.delivery_timestamp: required for a DELAY message")
    if t == TRANSACTION and (has_group or has_delay):
        raise RmqError(Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE, f"{field}.system_properties: a TRANSACTION message must set neither message_group nor delivery_timestamp")
    if t in _UNSUPPORTED_TYPES:
        raise RmqError(Code.UNSUPPORTED, f"{field}.system_properties.message_type: {v2.MessageType.Name(t)} messages are not supported by Quarry")


def system_pairs(m: v2.Message, field: str, now_ms: int, born: int) -> list[Property]:
    """The system properties a message carries besides KEYS/TAGS/UNIQ_KEY (validated); `born`
    is its born time (`born_ms`)."""
    sp = m.system_properties
    pairs: list[Property] = []
    group = sp.message_group
    if group:
        if len(group) > MAX_MESSAGE_GROUP or _has_control(group) or not group.strip():
            raise RmqError(Code.ILLEGAL_MESSAGE_GROUP, f"{field}.system_properties.message_group: at most {MAX_MESSAGE_GROUP} characters, not blank, no control characters")
        pairs.append(Property(SHARDING_KEY, group))
    if sp.HasField("delivery_timestamp"):
        at = sp.delivery_timestamp.seconds * 1000 + sp.delivery_timestamp.nanos // 1_000_000
        if at - now_ms > MAX_DELAY_MS:
            raise RmqError(Code.ILLEGAL_DELIVERY_TIME, f"{field}.system_properties.delivery_timestamp: at most {MAX_DELAY_MS // 3_600_000} h ahead, got {(at - now_ms) // 1000} s")
        pairs.append(Property(TIMER_DELIVER_MS, str(at)))
    born_host = sp.born_host
    if born_host:
        pairs.append(Property(BORN_HOST, born_host))
    if sp.HasField("born_timestamp"):
        pairs.append(Property(BORN_TIMESTAMP, str(born)))
    return pairs


def born_ms(sp: v2.SystemProperties) -> int:
    if not sp.HasField("born_timestamp"):
        return 0
    ts = sp.born_timestamp
    return ts.seconds * 1000 + ts.nanos // 1_000_000


def user_pairs(m: v2.Message, field: str) -> list[Property]:
    props = m.user_properties
    if not props:
        return []
    if len(props) > MAX_USER_PROPERTIES:
        raise RmqError(Code.MESSAGE_PROPERTIES_TOO_LARGE, f"{field}.user_properties: at most {MAX_USER_PROPERTIES}, got {len(props)}")
    pairs = [Property(name, value) for name, value in sorted(props.items())]
    for name, value in pairs:
        if name in SYSTEM_PROPERTY_NAMES:
            raise RmqError(Code.ILLEGAL_MESSAGE_PROPERTY_KEY, f"{field}.user_properties[{name!r}]: {name} is a RocketMQ system property")
        if not name:
            raise RmqError(Code.ILLEGAL_MESSAGE_PROPERTY_KEY, f"{field}.user_properties: a name must not be empty")
        if _has_control(name) or _has_control(value):
            raise RmqError(Code.ILLEGAL_MESSAGE_PROPERTY_KEY, f"{field}.user_properties[{name!r}]: names and values must not contain control characters")
    return pairs


def check_message(m: v2.Message, field: str) -> None:
    """Rules the store does not know (it checks topic, body, keys, sizes)."""
    if m.topic.resource_namespace:
        raise RmqError(Code.BAD_REQUEST, f"{field}.topic.resource_namespace: namespaces are not supported (got {m.topic.resource_namespace!r}); leave it empty")
    sp = m.system_properties
    message_id = sp.message_id
    if not message_id:
        raise RmqError(Code.ILLEGAL_MESSAGE_ID, f"{field}.system_properties.message_id: must not be empty (it becomes UNIQ_KEY)")
    if len(message_id) > 128 or _has_control(message_id):
        raise RmqError(Code.ILLEGAL_MESSAGE_ID, f"{field}.system_properties.message_id: at most 128 characters, no control characters")
    _check_tag(sp.tag, field)
    _check_type(sp, field)


def to_new_message(m: v2.Message, peer: tuple[str, int], field: str = "messages[0]", now_ms: int | None = None) -> NewMessage:
    """The record an SDK message becomes (not for TRANSACTION messages: see transaction.py)."""
    now = now_ms if now_ms is not None else int(time.time() * 1000)
    check_message(m, field)
    sp = m.system_properties
    born = born_ms(sp)
    # Built as NewMessage keeps them (Host, Property), so it converts nothing.
    return NewMessage(
        m.topic.name, m.body, list(sp.keys), sp.tag, sp.message_id,
        system_pairs(m, field, now, born) + user_pairs(m, field),
        0, sp.queue_id, born, peer if type(peer) is Host else Host(*peer),
    )


# An answer's statuses, copied into each answer: building a Status from keywords costs more
# than copying a whole answer (upb), and every SendMessage answers one.
_ANSWER = service.SendMessageResponse(status=ok())
_ENTRY = service.SendResultEntry(status=ok())


def answer(entries: list[tuple[str, int, str]]) -> service.SendMessageResponse:
    """An OK SendMessageResponse: one entry per stored message, (id, queue offset, transaction id)."""
    response = service.SendMessageResponse()
    response.CopyFrom(_ANSWER)
    add = response.entries.add
    for message_id, queue_offset, transaction_id in entries:
        entry = add()
        entry.CopyFrom(_ENTRY)
        entry.message_id, entry.offset, entry.transaction_id = message_id, queue_offset, transaction_id
    return response
