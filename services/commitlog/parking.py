"""Delay levels at put time: a message sent with one is parked as a RocketMQ 4.x broker parks
it (CommitLog.putMessage), and delivered later by delayed_delivery.py.

A message whose DELAY property names a level above 0 (levels past the last taken as the last),
not a prepared or rolled-back transaction record, is stored under SCHEDULE_TOPIC_XXXX in queue
level - 1, its own topic and queue kept in REAL_TOPIC / REAL_QID (appended to its properties,
DELAY kept); the queue's tagsCode is the deliver time (append.py). RocketMQ 4 consumers
read its topic's queues in order, so a message due later must not sit in them ahead of others:
it enters them when it is due, as a copy. A message sent to a parking topic itself is stored
as it is. (RocketMQ 5 SDK messages carry a delivery time, not a level: pop holds those.)
"""
from __future__ import annotations

from typing import Sequence

from quarry.formats.properties import DELAY, REAL_QID, REAL_TOPIC
from quarry.formats.record import SYSFLAG_TRANSACTION_MASK, SYSFLAG_TRANSACTION_PREPARED, SYSFLAG_TRANSACTION_ROLLBACK
from quarry.formats.scheduled import MAX_DELAY_LEVEL, PARKING_TOPICS, SCHEDULE_TOPIC, delay_level
from quarry.services.commitlog.errors import InvalidArgument
from quarry.services.commitlog.message_input import Host, MessageFields, NewMessage, Property
from quarry.services.commitlog.store import CommitLogStore

_NOT_PARKED = (SYSFLAG_TRANSACTION_PREPARED, SYSFLAG_TRANSACTION_ROLLBACK)


def level_of(msg: MessageFields) -> int:
    """The delay level `msg` is parked for; 0: stored where it is sent."""
    level = 0
    for p in msg.properties:  # (the last DELAY wins, as in a property map built from them)
        if p.name == DELAY:
            level = delay_level(p.value)
    if not level or msg.topic in PARKING_TOPICS or msg.sys_flag & SYSFLAG_TRANSACTION_MASK in _NOT_PARKED:
        return 0
    return level


def park(store: CommitLogStore, msgs: Sequence[MessageFields], same_topic: bool) -> tuple[Sequence[MessageFields], bool]:
    """`msgs` with every delayed message replaced by its parked form, and whether any was
    (then the batch holds two topics: checked here for one, as the append would). A parked
    message's own queue is chosen now (store.queue_for), so REAL_QID says where it goes."""
    out: list[MessageFields] | None = None
    many = len(msgs) > 1
    for i, m in enumerate(msgs):
        if not m.properties:  # (most messages: nothing more to look at)
            continue
        if m.topic == SCHEDULE_TOPIC:  # parked by its sender, as a RocketMQ broker stores it: a queue per level here too
            store.ensure_queues(SCHEDULE_TOPIC, MAX_DELAY_LEVEL)
            continue
        level = level_of(m)
        if not level:
            continue
        if out is None:
            out = list(msgs)
            store.ensure_queues(SCHEDULE_TOPIC, MAX_DELAY_LEVEL)
        prefix = f"messages[{i}]." if many else ""
        queue = store.queue_for(m.topic, m.queue_id, prefix)
        bh = m.born_host
        out[i] = NewMessage(
            SCHEDULE_TOPIC, m.body, list(m.keys), m.tags, m.unique_key,
            [*(Property(p.name, p.value) for p in m.properties), Property(REAL_TOPIC, m.topic), Property(REAL_QID, str(queue))],
            m.flag, level - 1, m.born_timestamp, Host(bh.ip, bh.port), m.sys_flag, m.reconsume_times, m.prepared_transaction_offset,
        )
    if out is None:
        return msgs, False
    if same_topic:
        first = msgs[0].topic
        for i, m in enumerate(msgs):
            if m.topic != first:
                raise InvalidArgument(f"messages[{i}].topic", f"a batch holds one topic ({first!r})")
    return out, True
