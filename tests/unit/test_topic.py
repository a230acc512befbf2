"""RocketMQ's topic naming rule (formats/topic.py): the error names the field and the rule, and
is_valid_topic answers the same question without raising."""
from __future__ import annotations

import pytest

from quarry.formats.topic import TOPIC_MAX_BYTES, TopicError, is_valid_topic, validate_topic

GOOD = ["OrderTopic", "a", "%DLQ%group-1", "%RETRY%g|x", "TBW102", "x" * TOPIC_MAX_BYTES]
BAD = [("", "must not be empty"), ("x" * (TOPIC_MAX_BYTES + 1), "at most 127 bytes"), ("has space", "must match"),
       ("Topic\n", "must match"), ("é", "must match"), ("a.b", "must match")]


@pytest.mark.parametrize("topic", GOOD)
def test_valid_topics_pass(topic: str) -> None:
    validate_topic(topic)
    assert is_valid_topic(topic)


@pytest.mark.parametrize(("topic", "rule"), BAD)
def test_invalid_topics_name_the_field_and_the_rule(topic: str, rule: str) -> None:
    with pytest.raises(TopicError) as refused:
        validate_topic(topic, field="message.topic")
    assert str(refused.value).startswith("message.topic: ") and rule in str(refused.value)
    assert not is_valid_topic(topic)
