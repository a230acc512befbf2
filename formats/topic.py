"""RocketMQ topic naming rule, shared by every service and client."""
from __future__ import annotations

import re

TOPIC_PATTERN = re.compile(r"^[%|a-zA-Z0-9_-]+$")
TOPIC_MAX_BYTES = 127  # TOPICLEN is a signed byte
# RocketMQ's TopicValidator.AUTO_CREATE_TOPIC_KEY_TOPIC: a broker that creates topics on first
# send registers this topic (with its default queue count), and a producer sends a topic no
# broker holds yet along this topic's route, i.e. to the brokers that will create it.
AUTO_CREATE_TOPIC_KEY = "TBW102"
# Queues per broker a producer uses for a topic it auto-creates (DefaultMQProducer's
# defaultTopicQueueNums), at most the broker's own default.
DEFAULT_TOPIC_QUEUE_NUMS = 4


# The topics RocketMQ derives from a consumer group: where its messages are retried and where
# they go after the last attempt.
RETRY_PREFIX = "%RETRY%"
DLQ_PREFIX = "%DLQ%"
# A group name is held to the topic rule and short enough that both derived topics stay valid.
GROUP_MAX_BYTES = TOPIC_MAX_BYTES - max(len(RETRY_PREFIX), len(DLQ_PREFIX))


def retry_topic(group: str) -> str:
    return RETRY_PREFIX + group


def dlq_topic(group: str) -> str:
    return DLQ_PREFIX + group


class TopicError(ValueError):
    """A topic that breaks the naming rule; the message names the field and the rule."""


_VALID: set[str] = set()  # topics already checked: a batch repeats one topic thousands of times


def validate_topic(topic: str, field: str = "topic") -> None:
    """Raise TopicError unless topic matches ^[%|a-zA-Z0-9_-]+$ and is at most 127 bytes."""
    if topic in _VALID:
        return
    if not topic:
        raise TopicError(f"{field}: must not be empty")
    if len(topic.encode("utf-8")) > TOPIC_MAX_BYTES:
        raise TopicError(f"{field}: at most {TOPIC_MAX_BYTES} bytes (TOPICLEN is a signed byte), got {len(topic.encode('utf-8'))}")
    if not TOPIC_PATTERN.fullmatch(topic):  # fullmatch: "$" would accept a trailing newline
        raise TopicError(f"{field}: {topic!r} must match ^[%|a-zA-Z0-9_-]+$")
    if len(_VALID) < 100_000:
        _VALID.add(topic)


def is_valid_topic(topic: str) -> bool:
    """validate_topic as a yes/no: whether a topic may be routed and sent to at all."""
    try:
        validate_topic(topic)
    except TopicError:
        return False
    return True


def validate_group(group: str, field: str = "group") -> None:
    """Raise TopicError unless group may name a consumer group: the topic characters, at most
    GROUP_MAX_BYTES so that its %RETRY% and %DLQ% topics are valid topics."""
    if not group:
        raise TopicError(f"{field}: must not be empty")
    if len(group.encode("utf-8")) > GROUP_MAX_BYTES or not TOPIC_PATTERN.fullmatch(group):
        raise TopicError(f"{field}: {group!r} must match ^[%|a-zA-Z0-9_-]+$, at most {GROUP_MAX_BYTES} bytes (its {RETRY_PREFIX} and {DLQ_PREFIX} topics must be valid topics)")
