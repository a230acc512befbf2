"""Delayed messages parked before delivery are found by key and unique key under their real topic."""
from __future__ import annotations

from pathlib import Path

from quarry.formats.dispatch import DispatchInfo
from quarry.formats.scheduled import SCHEDULE_TOPIC, TIMER_TOPIC, index_topics
from quarry.services.indexer.index_store import IndexStore, IndexStoreConfig
from quarry.services.query.merge import key_matches, unique_key_matches
from quarry.v1 import common_pb2


def _d(off: int, topic: str, keys: str, uniq: str = "") -> DispatchInfo:
    return DispatchInfo(off, 100, topic, 0, 0, 0, keys, uniq or None, 1_700_000_000_000 + off, 0, 0)


def test_index_topics_of_a_topic_include_the_parking_topics() -> None:
    assert index_topics("T") == ("T", SCHEDULE_TOPIC, TIMER_TOPIC)
    assert index_topics(SCHEDULE_TOPIC) == (SCHEDULE_TOPIC,)


def test_query_topics_merges_newest_first_and_caps_exactly(tmp_path: Path) -> None:
    store = IndexStore.open(tmp_path / "i", IndexStoreConfig(hash_slot_num=11, index_num=100, max_msgs_num_batch=4))
    store.index_records([_d(100, "T", "k"), _d(200, SCHEDULE_TOPIC, "k"), _d(300, "T", "k"), _d(400, TIMER_TOPIC, "k"),
                         _d(500, "Other", "k"), _d(600, SCHEDULE_TOPIC, "k")])
    assert store.query_topics(index_topics("T"), "k", 10, 0, 2**62) == [600, 400, 300, 200]
    assert store.query_topics(index_topics("T"), "k", 10, 0, 2**62, below=300) == [200, 100]
    assert store.query_topics(("T",), "k", 10, 0, 2**62) == [300, 100]
    store.close()


def test_router_matches_parked_messages_by_their_real_topic() -> None:
    parked = common_pb2.StoredMessage(topic=SCHEDULE_TOPIC, keys=["k"], unique_key="U", scheduled=True, real_topic="T")
    other = common_pb2.StoredMessage(topic=SCHEDULE_TOPIC, keys=["k"], unique_key="U", scheduled=True, real_topic="X")
    plain = common_pb2.StoredMessage(topic="T", keys=["k"], unique_key="U")
    assert key_matches(parked, "T", "k") and unique_key_matches(parked, "T", "U")
    assert not key_matches(other, "T", "k") and not unique_key_matches(other, "T", "U")
    assert key_matches(plain, "T", "k") and not key_matches(plain, "X", "k")
    # a record stored under T with a REAL_TOPIC naming another topic is still T's, not the other's
    stray = common_pb2.StoredMessage(topic="T", keys=["k"], real_topic="X", scheduled=True)
    assert not key_matches(stray, "X", "k")
