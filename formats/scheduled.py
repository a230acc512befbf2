"""Delayed (scheduled) messages: where a RocketMQ broker parks them and when they are due.

A 4.x broker stores a message sent with a delay level under SCHEDULE_TOPIC_XXXX, queue
level-1, with its own topic and queue in REAL_TOPIC / REAL_QID; it is delivered at store
time + the level's delay. A 5.x broker with the timer wheel parks messages carrying
TIMER_DELIVER_MS (or TIMER_DELAY_SEC / TIMER_DELAY_MS, relative to the store time) under
rmq_sys_wheel_timer, also with REAL_TOPIC. A record still under its own topic that carries
one of these properties (a store that did not park it) is due at the same computed time.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from quarry.formats.properties import DELAY, REAL_TOPIC

SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
# RocketMQ's default messageDelayLevel "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h".
DELAY_LEVEL_MS = [1_000, 5_000, 10_000, 30_000, 60_000, 120_000, 180_000, 240_000, 300_000, 360_000,
                  420_000, 480_000, 540_000, 600_000, 1_200_000, 1_800_000, 3_600_000, 7_200_000]
MAX_DELAY_LEVEL = len(DELAY_LEVEL_MS)  # SCHEDULE_TOPIC_XXXX has a queue per level: level n parks in queue n - 1
TIMER_TOPIC = "rmq_sys_wheel_timer"
PARKING_TOPICS = (SCHEDULE_TOPIC, TIMER_TOPIC)
TIMER_DELIVER_MS = "TIMER_DELIVER_MS"
TIMER_DELAY_SEC = "TIMER_DELAY_SEC"
TIMER_DELAY_MS = "TIMER_DELAY_MS"
TIMER_OUT_MS = "TIMER_OUT_MS"  # the deliver time a 5.x timer record carries once parked


@dataclass(frozen=True)
class Schedule:
    """A delayed message: the topic it is for and when it is (or was) due."""

    real_topic: str
    deliver_timestamp: int
    parked: bool  # stored under a parking topic (not yet delivered by that store)


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def delay_level(level_text: str | None) -> int:
    """The delay level a DELAY property asks for, levels past the last taken as the last (a
    4.x broker's put rule); 0 for none: absent, not a number or not positive."""
    level = _int(level_text)
    if level is None or level <= 0:
        return 0
    return min(level, MAX_DELAY_LEVEL)


def delay_level_deliver_time(level_text: str | None, store_timestamp: int) -> int | None:
    """A 4.x delay level's deliver time: store time + the level's delay (levels past the last
    use the last); None when the level is absent, not a number or not positive."""
    level = delay_level(level_text)
    return store_timestamp + DELAY_LEVEL_MS[level - 1] if level else None


def deliver_time(props: Mapping[str, str], store_timestamp: int) -> int | None:
    """When a message with these properties is due, or None when it carries no delay."""
    at = delay_level_deliver_time(props.get(DELAY), store_timestamp)
    if at is not None:
        return at
    for name in (TIMER_OUT_MS, TIMER_DELIVER_MS):
        at = _int(props.get(name))
        if at is not None and at > 0:
            return at
    seconds = _int(props.get(TIMER_DELAY_SEC))
    if seconds is not None and seconds > 0:
        return store_timestamp + seconds * 1000
    millis = _int(props.get(TIMER_DELAY_MS))
    if millis is not None and millis > 0:
        return store_timestamp + millis
    return None


def due_at(topic: str, props: Mapping[str, str], store_timestamp: int) -> int | None:
    """When a record stored under `topic` (not a parking topic) may be consumed; None: at once.
    A delivered copy, under the topic its REAL_TOPIC names, is due at once: a broker writes
    the copy's properties before it clears the level, so the copy keeps DELAY."""
    if props.get(REAL_TOPIC) == topic:
        return None
    return deliver_time(props, store_timestamp)


def schedule_of(topic: str, props: Mapping[str, str], store_timestamp: int) -> Schedule | None:
    """The Schedule of a stored record, or None for an ordinary message (or a delivered copy)."""
    if topic in PARKING_TOPICS:
        real = props.get(REAL_TOPIC)
        if not real:
            return None
        at = deliver_time(props, store_timestamp)
        return Schedule(real, at if at is not None else store_timestamp, True)
    at = due_at(topic, props, store_timestamp)
    if at is None:
        return None
    return Schedule(topic, at, False)


def belongs_to(topic: str, props: Mapping[str, str], wanted: str) -> bool:
    """True when a record is a message of `wanted`: stored under it, or parked for it."""
    return topic == wanted or (topic in PARKING_TOPICS and props.get(REAL_TOPIC) == wanted)


def index_topics(topic: str) -> tuple[str, ...]:
    """The topics a key of `topic` is indexed under: its own and, for messages parked before
    delivery, the parking topics (an IndexFile names a record by the topic it is stored under)."""
    return (topic,) if topic in PARKING_TOPICS else (topic, *PARKING_TOPICS)
