"""Resending dead letters: a message of a group's %DLQ% topic sent again, as a new message, to
the topic it was first consumed from.

That topic is the RETRY_TOPIC property a broker's send-back sets once (RocketMQ 4 consumers,
send_back.py), else DLQ_ORIGIN_TOPIC (RocketMQ 5 pop consumers); a value naming a %RETRY% or
%DLQ% topic is passed over (a pop revive names the retry topic in RETRY_TOPIC). The resend keeps the body,
keys, tags, flag and the user's own properties; RocketMQ's own properties (retry bookkeeping,
delay, the old UNIQ_KEY) are left out, so it gets its own message id and is delivered at once.
RESENT_FROM names the dead letter's offsetMsgId, linking the two.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from quarry.clients.model import Message
from quarry.formats.properties import SYSTEM_PROPERTY_NAMES
from quarry.formats.topic import DLQ_PREFIX, RETRY_PREFIX, TopicError, validate_topic

ORIGIN_PROPERTIES = ("RETRY_TOPIC", "DLQ_ORIGIN_TOPIC")
RESENT_FROM = "RESENT_FROM"
MAX_RESEND = 256  # one confirmation's worth; a page of the DLQ view at most


class NotResendable(Exception):
    """A message that cannot be resent, and why."""


@dataclass(frozen=True)
class Resend:
    """What will be sent for one dead letter."""

    topic: str
    body: bytes
    keys: list[str]
    tags: str
    flag: int
    properties: dict[str, str]


def origin_topic(m: Message) -> tuple[str, list[str]]:
    """The first of ORIGIN_PROPERTIES naming a plain topic, and why each one before it did not.
    A retry or dead-letter topic is no origin: a RocketMQ 5 pop consumer's revive sets
    RETRY_TOPIC to the group's %RETRY% topic, and a resend there would reach only that group
    (or, for %DLQ%, no consumer at all)."""
    passed: list[str] = []
    for name in ORIGIN_PROPERTIES:
        value = m.properties.get(name, "").strip()
        if not value:
            continue
        if value.startswith((RETRY_PREFIX, DLQ_PREFIX)):
            kind = "a retry topic" if value.startswith(RETRY_PREFIX) else "a dead-letter topic"
            passed.append(f"{name} is {value}, {kind}, not the topic first sent to")
            continue
        try:
            validate_topic(value, name)
        except TopicError as exc:
            passed.append(str(exc))
            continue
        return value, passed
    return "", passed


def plan(m: Message) -> Resend:
    """The message to send for dead letter `m`; NotResendable saying why there is none."""
    if not m.topic.startswith(DLQ_PREFIX):
        raise NotResendable(f"stored under {m.topic}, not a dead-letter topic ({DLQ_PREFIX}<group>)")
    topic, passed = origin_topic(m)
    if not topic:
        if passed:
            raise NotResendable(f"the original topic is not known: {'; '.join(passed)}")
        raise NotResendable(f"carries neither {' nor '.join(ORIGIN_PROPERTIES)}: the original topic is not known")
    if m.sys_flag & 0x1:
        raise NotResendable("its body is stored compressed (system flag 0x1); resending would store the compressed bytes as the body")
    user = {n: v for n, v in m.property_pairs if n and n not in SYSTEM_PROPERTY_NAMES and n != RESENT_FROM}
    user[RESENT_FROM] = m.offset_msg_id
    return Resend(topic, m.body, list(m.keys), m.tags, m.flag, user)


def plan_json(m: Message, r: Resend | None, why: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {"offsetMsgId": m.offset_msg_id, "uniqueKey": m.unique_key, "dlqTopic": m.topic, "keys": m.keys, "tags": m.tags,
                           "reconsumeTimes": m.reconsume_times, "storeTimestamp": m.store_timestamp}
    if r is not None:
        out["toTopic"] = r.topic
    else:
        out["refused"] = why
    return out
