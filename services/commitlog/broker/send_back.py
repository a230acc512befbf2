"""A consumed message sent back by its consumer group (RocketMQ 4's CONSUMER_SEND_MSG_BACK, and
a send to %RETRY%<group> by the client itself), decided as a RocketMQ 4.9 broker decides it.

- It is retried through %RETRY%<group> with a delay level: the one asked for, or, when 0 was
  asked, 3 + the times it was already reconsumed (RocketMQ's 10 s, 30 s, 1 min, ... ladder);
  parked as any delayed message (parking.py) and delivered when due (delayed_delivery.py).
- It goes to %DLQ%<group> (one queue, not delayed) once it was reconsumed `max_reconsume_times`
  times (the consumer's maxReconsumeTimes, 16 by default), or at once when a negative level
  was asked.

The copy is the stored record as the broker re-stores it: body (as stored) and sysFlag
(transaction bits cleared: a new plain message), flag, born time and host, tags, keys, unique
key and properties kept; RETRY_TOPIC set to the topic it was first consumed from
(once), ORIGIN_MESSAGE_ID to the first stored copy's offsetMsgId (once), DELAY to the level (0
for the DLQ); reconsume times one more. Protocol-free: doors/remoting.py translates.
"""
from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass

from quarry.formats.properties import DELAY, KEYS, TAGS, UNIQ_KEY
from quarry.formats.record import SYSFLAG_TRANSACTION_MASK, Record
from quarry.formats.topic import dlq_topic, retry_topic
from quarry.services.commitlog.storage.message_input import Host, NewMessage, Property

DEFAULT_MAX_RECONSUME_TIMES = 16  # RocketMQ's SubscriptionGroupConfig.retryMaxTimes
FIRST_RETRY_LEVEL = 3  # a retry asked with level 0 is parked at 3 + reconsume times
DLQ_QUEUES = 1  # RocketMQ's DLQ_NUMS_PER_GROUP
RETRY_TOPIC = "RETRY_TOPIC"
ORIGIN_MESSAGE_ID = "ORIGIN_MESSAGE_ID"
_OWN_FIELDS = (KEYS, TAGS, UNIQ_KEY)  # a NewMessage carries these in fields of their own
_SET_HERE = (DELAY,)


@dataclass(frozen=True)
class Destination:
    topic: str
    delay_level: int  # 0: not delayed (the DLQ)
    dead: bool  # to the DLQ


def destination(group: str, reconsume_times: int, max_reconsume_times: int | None, delay_level: int) -> Destination:
    """Where a message of `group` reconsumed `reconsume_times` times goes when sent back asking
    `delay_level` (0: the broker's ladder; negative: straight to the DLQ)."""
    limit = DEFAULT_MAX_RECONSUME_TIMES if max_reconsume_times is None else max_reconsume_times
    if reconsume_times >= limit or delay_level < 0:
        return Destination(dlq_topic(group), 0, True)
    return Destination(retry_topic(group), delay_level or FIRST_RETRY_LEVEL + reconsume_times, False)


def copy_for(record: Record, where: Destination, queues: int, rng: random.Random | None = None) -> NewMessage:
    """The message to store for `record` sent back to `where` (a topic of `queues` queues: one
    chosen at random, as RocketMQ chooses it)."""
    props = record.properties
    pairs = [(n, v) for n, v in record.properties_pairs if n not in _OWN_FIELDS and n not in _SET_HERE]
    if RETRY_TOPIC not in props:
        pairs.append((RETRY_TOPIC, record.topic))
    if not props.get(ORIGIN_MESSAGE_ID, "").strip():
        pairs = [(n, v) for n, v in pairs if n != ORIGIN_MESSAGE_ID] + [(ORIGIN_MESSAGE_ID, record.offset_msg_id)]
    pairs.append((DELAY, str(where.delay_level)))
    properties = [Property(n, v) for n, v in pairs]
    return NewMessage(
        where.topic, record.body, record.keys, record.tags or "", record.unique_key or "", properties,
        record.flag, (rng or random).randrange(max(1, queues)), record.born_timestamp, Host(*record.born_host),
        record.sys_flag & ~SYSFLAG_TRANSACTION_MASK, record.reconsume_times + 1, 0,
    )


def retried_send(topic: str, reconsume_times: int, max_reconsume_times: int | None) -> Destination | None:
    """A client's own send to %RETRY%<group> (its fallback when CONSUMER_SEND_MSG_BACK failed,
    and the orderly consumer's last resort): to %DLQ%<group>, undelayed, once the header's
    reconsume times reach the max (RocketMQ's handleRetryAndDLQ); None: stored as sent."""
    if not topic.startswith("%RETRY%"):
        return None
    group = topic[len("%RETRY%"):]
    limit = DEFAULT_MAX_RECONSUME_TIMES if max_reconsume_times is None else max_reconsume_times
    if reconsume_times >= limit:
        return Destination(dlq_topic(group), 0, True)
    return None


def dead_lettered(msg: NewMessage, where: Destination) -> NewMessage:
    """A client's retry send (retried_send said dead) as stored: under %DLQ%<group>, its one
    queue, not delayed (DELAY 0, as RocketMQ's setDelayTimeLevel(0) leaves it)."""
    props = [p for p in msg.properties if p.name != DELAY] + [Property(DELAY, "0")]
    return dataclasses.replace(msg, topic=where.topic, queue_id=0, properties=props)
