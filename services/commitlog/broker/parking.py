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
from quarry.services.commitlog.storage.message_input import Host, MessageFields, NewMessage, Property, not_one_topic, reject
from quarry.services.commitlog.storage.store import CommitLogStore

_NOT_PARKED = (SYSFLAG_TRANSACTION_PREPARED, SYSFLAG_TRANSACTION_ROLLBACK)
_SET_HERE = (REAL_TOPIC, REAL_QID)  # a copy sent again (a 4.x client's retry) carries older ones: replaced, not repeated


def _past_last(level_text: str) -> bool:
    try:
        return int(level_text) > MAX_DELAY_LEVEL
    except ValueError:
        return False


def level_of(msg: MessageFields) -> int:
    """The delay level `msg` is parked for; 0: stored where it is sent."""
    level = 0
    for p in msg.properties:  # (the last DELAY wins, as in a property map built from them)
        if p.name == DELAY:
            level = delay_level(p.value)
    if not level or msg.topic in PARKING_TOPICS or msg.sys_flag & SYSFLAG_TRANSACTION_MASK in _NOT_PARKED:
        return 0
    return level


def park(store: CommitLogStore, msgs: Sequence[MessageFields], same_topic: bool, peer: tuple[str, int] | None) -> tuple[Sequence[MessageFields], list[str]]:
    """`msgs` with every delayed message replaced by its parked form, and the real topics of
    those parked (the caller makes the missing ones once the append succeeds, as a send
    makes its topic). With any parked the batch holds two topics: checked here for one, as the
    append would. A delayed message is checked first (message_input.reject: the append's
    rules, the field named as sent), then its own queue is chosen (store.queue_for), so
    REAL_QID says where it goes."""
    out: list[MessageFields] | None = None
    real_topics: list[str] = []
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
            if same_topic:  # (the append would check it, but the batch now holds two topics)
                first = msgs[0].topic
                for j, other in enumerate(msgs):
                    if other.topic != first:
                        raise not_one_topic(j, first)
            out = list(msgs)
        prefix = f"messages[{i}]." if many else ""
        reject(m, prefix, store.config.max_message_size, peer)
        queue = store.queue_for(m.topic, m.queue_id, prefix)
        store.ensure_queues(SCHEDULE_TOPIC, MAX_DELAY_LEVEL)
        if m.topic not in real_topics:
            real_topics.append(m.topic)
        bh = m.born_host
        capped = str(level)  # (a level past the last is stored as the last, as RocketMQ stores it)
        out[i] = NewMessage(
            SCHEDULE_TOPIC, m.body, list(m.keys), m.tags, m.unique_key,
            [*(Property(p.name, capped if p.name == DELAY and _past_last(p.value) else p.value) for p in m.properties if p.name not in _SET_HERE),
             Property(REAL_TOPIC, m.topic), Property(REAL_QID, str(queue))],
            m.flag, level - 1, m.born_timestamp, Host(bh.ip, bh.port), m.sys_flag, m.reconsume_times, m.prepared_transaction_offset,
        )
    return (msgs, real_topics) if out is None else (out, real_topics)
