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


def test_group_names_leave_room_for_their_retry_and_dlq_topics() -> None:
    from quarry.formats.topic import GROUP_MAX_BYTES, TopicError, dlq_topic, is_valid_topic, retry_topic, validate_group

    longest = "g" * GROUP_MAX_BYTES
    validate_group(longest)
    assert is_valid_topic(retry_topic(longest)) and is_valid_topic(dlq_topic(longest))
    assert (retry_topic("G"), dlq_topic("G")) == ("%RETRY%G", "%DLQ%G")
    with pytest.raises(TopicError, match=rf"consumer_group: .* at most {GROUP_MAX_BYTES} bytes"):
        validate_group(longest + "g", "consumer_group")
    with pytest.raises(TopicError, match="group.name: 'bad group!' must match"):
        validate_group("bad group!", "group.name")
    with pytest.raises(TopicError, match="group: must not be empty"):
        validate_group("")
