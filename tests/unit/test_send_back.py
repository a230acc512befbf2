"""A consumed message sent back (services/commitlog/broker/send_back.py): where RocketMQ 4.9's broker
puts it (its consumerSendMsgBack and handleRetryAndDLQ rules) and the copy it stores."""
from __future__ import annotations

import random

from quarry.formats.properties import encode_properties
from quarry.formats.record import Record, decode_record, encode_record
from quarry.services.commitlog.storage.message_input import NewMessage
from quarry.services.commitlog.broker.send_back import (
    DEFAULT_MAX_RECONSUME_TIMES, Destination, copy_for, dead_lettered, destination, retried_send,
)


def record(topic: str = "T", reconsume: int = 0, props: list[tuple[str, str]] | None = None, sys_flag: int = 0) -> Record:
    pairs = [("KEYS", "k1 k2"), ("TAGS", "TagA"), ("UNIQ_KEY", "U1"), ("color", "red"), *(props or [])]
    raw = encode_record(topic=topic, body=b"payload", properties=encode_properties(pairs), queue_id=2, flag=7, queue_offset=5,
                        physical_offset=4096, sys_flag=sys_flag, born_timestamp=1_700_000_000_000, born_host=("10.0.0.9", 4321),
                        store_timestamp=1_700_000_000_100, store_host=("127.0.0.81", 10911), reconsume_times=reconsume)
    return decode_record(raw, physical_offset=4096)


def test_the_delay_ladder_the_asked_level_and_the_dlq() -> None:
    assert destination("G", 0, 2, 0) == Destination("%RETRY%G", 3, False)  # 0 asked: 3 + reconsume times
    assert destination("G", 1, 2, 0) == Destination("%RETRY%G", 4, False)
    assert destination("G", 1, 2, 1) == Destination("%RETRY%G", 1, False)  # a level asked is honoured
    assert destination("G", 2, 2, 1) == Destination("%DLQ%G", 0, True)  # reconsumed max times: dead
    assert destination("G", 0, 2, -1) == Destination("%DLQ%G", 0, True)  # a negative level: dead at once
    assert destination("G", DEFAULT_MAX_RECONSUME_TIMES - 1, None, 0).topic == "%RETRY%G"
    assert destination("G", DEFAULT_MAX_RECONSUME_TIMES, None, 0).dead


def test_the_copy_keeps_the_message_and_names_where_it_came_from() -> None:
    rec = record()
    msg = copy_for(rec, destination("G", 0, 16, 0), 1, random.Random(1))
    props = dict((p.name, p.value) for p in msg.properties)
    assert (msg.topic, msg.queue_id, msg.body, msg.keys, msg.tags, msg.unique_key) == ("%RETRY%G", 0, b"payload", ["k1", "k2"], "TagA", "U1")
    assert props == {"color": "red", "RETRY_TOPIC": "T", "ORIGIN_MESSAGE_ID": rec.offset_msg_id, "DELAY": "3"}
    assert (msg.flag, msg.born_timestamp, tuple(msg.born_host), msg.reconsume_times) == (7, 1_700_000_000_000, ("10.0.0.9", 4321), 1)


def test_a_retried_copy_sent_back_again_keeps_its_first_topic_and_origin() -> None:
    """The second send-back reads the %RETRY% copy (delivered from parking: REAL_TOPIC and the
    old DELAY in its properties): RETRY_TOPIC and ORIGIN_MESSAGE_ID stay, DELAY is the new level."""
    rec = record("%RETRY%G", 1, [("RETRY_TOPIC", "T"), ("ORIGIN_MESSAGE_ID", "AAAA"), ("DELAY", "3"), ("REAL_TOPIC", "%RETRY%G"), ("REAL_QID", "0")])
    msg = copy_for(rec, destination("G", rec.reconsume_times, 16, 0), 1)
    props = [(p.name, p.value) for p in msg.properties]
    assert dict(props)["RETRY_TOPIC"] == "T" and dict(props)["ORIGIN_MESSAGE_ID"] == "AAAA" and dict(props)["DELAY"] == "4"
    assert [n for n, _ in props].count("DELAY") == 1 and msg.reconsume_times == 2


def test_a_copy_is_a_plain_message_and_picks_one_of_the_queues() -> None:
    rec = record(sys_flag=0x8)  # a committed transaction's message: the copy is not one
    assert copy_for(rec, destination("G", 0, 16, 0), 1).sys_flag & 0xC == 0
    picked = {copy_for(rec, destination("G", 0, 16, 0), 3, random.Random(seed)).queue_id for seed in range(40)}
    assert picked == {0, 1, 2}


def test_a_clients_own_send_to_the_retry_topic_goes_to_the_dlq_past_its_last_attempt() -> None:
    assert retried_send("T", 5, 2) is None
    assert retried_send("%RETRY%G", 1, 2) is None
    assert retried_send("%RETRY%G", 2, 2) == Destination("%DLQ%G", 0, True)
    assert retried_send("%RETRY%G", 15, None) is None and retried_send("%RETRY%G", 16, None) is not None
    msg = NewMessage("%RETRY%G", b"x", properties=[("DELAY", "5"), ("a", "b")], queue_id=3)
    dead = dead_lettered(msg, Destination("%DLQ%G", 0, True))
    assert (dead.topic, dead.queue_id, [(p.name, p.value) for p in dead.properties]) == ("%DLQ%G", 0, [("a", "b"), ("DELAY", "0")])
