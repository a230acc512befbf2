"""Resending dead letters: a message of a group's %DLQ% topic sent again, as a new message, to
the topic it was first consumed from.

That topic is the RETRY_TOPIC property a broker's send-back sets once (RocketMQ 4 consumers,
send_back.py), else DLQ_ORIGIN_TOPIC (RocketMQ 5 pop consumers); a value naming a %RETRY% or
%DLQ% topic is passed over (a pop revive names the retry topic in RETRY_TOPIC). The resend keeps the body,
keys, tags, flag and the user's own properties; RocketMQ's own properties (retry bookkeeping,
delay, the old UNIQ_KEY) are left out, so it gets its own message id and is delivered at once.
RESENT_FROM names the dead letter's offsetMsgId, linking the two. A dead letter this console
process already resent is refused (Resent), naming the earlier resend.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from quarry.clients.model import Message
from quarry.formats.properties import SYSTEM_PROPERTY_NAMES
from quarry.formats.topic import DLQ_PREFIX, RETRY_PREFIX, TopicError, validate_topic

ORIGIN_PROPERTIES = ("RETRY_TOPIC", "DLQ_ORIGIN_TOPIC")
RESENT_FROM = "RESENT_FROM"
MAX_RESEND = 256  # one confirmation's worth; a page of the DLQ view at most
MAX_REMEMBERED = 100_000  # resends a console process remembers (Resent): a few MB at most


class Resent:
    """The dead letters this console process resent (by offsetMsgId, upper-case), each with
    what its resend answered, so that a second confirmation (another click, another browser)
    refuses them instead of sending again. Held in memory for the last `limit` resends: a
    console restart, another console process, or a resend older than that is not remembered
    (the resent message's RESENT_FROM still names its dead letter)."""

    def __init__(self, limit: int = MAX_REMEMBERED) -> None:
        self.limit = limit
        self._lock = threading.Lock()
        self._sent: OrderedDict[str, dict[str, Any] | None] = OrderedDict()  # None: being sent now

    def refusal(self, oid: str) -> tuple[str, dict[str, Any] | None] | None:
        """Why `oid` must not be sent again (and the earlier resend's answer), or None."""
        with self._lock:
            if oid not in self._sent:
                return None
            sent = self._sent[oid]
        if sent is None:
            return "being resent by another request of this console now", None
        return f"already resent by this console, as message id {sent['msgId']} (offsetMsgId {sent['offsetMsgId']})", sent

    def claim(self, oid: str) -> tuple[str, dict[str, Any] | None] | None:
        """refusal(oid), else None with `oid` marked as being sent (then done() or release())."""
        with self._lock:
            if oid not in self._sent:
                self._sent[oid] = None
                return None
        return self.refusal(oid)

    def done(self, oid: str, sent: dict[str, Any]) -> None:
        with self._lock:
            self._sent[oid] = sent
            while len(self._sent) > self.limit:
                self._sent.popitem(last=False)

    def release(self, oid: str) -> None:
        """The send failed: `oid` may be resent."""
        with self._lock:
            self._sent.pop(oid, None)


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
