"""SendBatch's compact answer (SendResultColumns): what a client rebuilds from the columns and
its own messages (clients.batch_results) must equal, field for field, the SendResults the
broker answers without compact_results, for every batch the store takes: queues asked for or
round robin, several topics, transactional records at queue offset 0, messages without a
unique key, an IPv6 store host, segment roll-overs and a SYNC flush timeout."""
from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from quarry.clients.batch_results import batch_send_results, rebuild_send_results
from quarry.clients.errors import QuarryError
from quarry.services.commitlog.doors.quarry_v1_convert import send_result_columns, send_results
from quarry.services.commitlog.storage.store import CommitLogStore, StoreConfig
from quarry.v1 import commitlog_pb2, common_pb2

_messages = st.builds(
    common_pb2.MessageInput,
    topic=st.sampled_from(["A", "B", "%RETRY%g"]),
    body=st.binary(min_size=1, max_size=300),
    unique_key=st.sampled_from(["", "UK-1", "7F0000010DDF18B4AAC2"]),
    keys=st.lists(st.sampled_from(["k1", "k2"]), max_size=2),
    queue_id=st.sampled_from([-1, 0, 1, 3]),
    sys_flag=st.sampled_from([0, 0x4, 0x8, 0xC]),
)


def _answers(store: CommitLogStore, msgs: list[common_pb2.MessageInput], broker: str, flushed: bool = True) -> tuple[list[common_pb2.SendResult], commitlog_pb2.SendBatchResponse]:
    appended = store.append_many(msgs, same_topic=False, peer=("127.0.0.1", 5555))
    appended.flushed = flushed
    full = commitlog_pb2.SendBatchResponse()
    send_results(appended, broker, full.results.add)
    compact = commitlog_pb2.SendBatchResponse()
    send_result_columns(appended, broker, store.config.store_host, compact.compact)
    # As a client gets it: through the wire bytes.
    return list(full.results), commitlog_pb2.SendBatchResponse.FromString(compact.SerializeToString())


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.lists(_messages, min_size=1, max_size=12), min_size=1, max_size=4),
       st.sampled_from([("127.0.0.1", 10911), ("10.1.2.3", 1), ("fe80::9", 10911), ("::ffff:10.0.0.7", 65535)]),
       st.booleans())
def test_rebuilt_results_are_the_full_answer(batches: list[list[common_pb2.MessageInput]], store_host: tuple[str, int], flushed: bool) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        store = CommitLogStore(StoreConfig(store_dir=Path(tmp), segment_size=4096, store_host=store_host))
        try:
            for msgs in batches:
                full, compact = _answers(store, msgs, "broker-a", flushed)
                assert not compact.results and compact.HasField("compact")
                assert batch_send_results(compact, msgs) == full
        finally:
            store.close()


def test_one_topic_is_sent_once_and_several_per_message(tmp_path: Path) -> None:
    store = CommitLogStore(StoreConfig(store_dir=tmp_path))
    try:
        one = [common_pb2.MessageInput(topic="T", body=b"x", unique_key=f"U{i}", queue_id=i % 2) for i in range(5)]
        full, compact = _answers(store, one, "b")
        assert compact.compact.topic == "T" and not compact.compact.topics
        assert list(compact.compact.queue_ids) == [0, 1, 0, 1, 0] and batch_send_results(compact, one) == full
        mixed = [common_pb2.MessageInput(topic=t, body=b"x", queue_id=-1) for t in ("T", "U", "T")]
        full, compact = _answers(store, mixed, "b")
        assert list(compact.compact.topics) == ["T", "U", "T"] and batch_send_results(compact, mixed) == full
        assert [r.topic for r in batch_send_results(compact, mixed)] == ["T", "U", "T"]
    finally:
        store.close()


def test_flush_timeout_status_is_every_messages(tmp_path: Path) -> None:
    store = CommitLogStore(StoreConfig(store_dir=tmp_path))
    try:
        msgs = [common_pb2.MessageInput(topic="T", body=b"x", queue_id=-1) for _ in range(3)]
        full, compact = _answers(store, msgs, "b", flushed=False)
        rebuilt = batch_send_results(compact, msgs)
        assert rebuilt == full and {r.status for r in rebuilt} == {common_pb2.SEND_STATUS_FLUSH_DISK_TIMEOUT}
    finally:
        store.close()


def test_compact_answer_is_a_tenth_of_the_full_one(tmp_path: Path) -> None:
    store = CommitLogStore(StoreConfig(store_dir=tmp_path))
    try:
        msgs = [common_pb2.MessageInput(topic="BenchTopic", body=b"x" * 1024, unique_key=f"{i:032X}", queue_id=-1) for i in range(500)]
        full, compact = _answers(store, msgs, "broker-a")
        assert compact.ByteSize() * 5 < commitlog_pb2.SendBatchResponse(results=full).ByteSize()
    finally:
        store.close()


def test_an_answer_without_columns_is_taken_as_it_is() -> None:
    # A broker that predates compact_results ignores the flag and answers with `results`.
    old = commitlog_pb2.SendBatchResponse(results=[common_pb2.SendResult(status=common_pb2.SEND_STATUS_SEND_OK, unique_key="U", offset_msg_id="X")])
    assert batch_send_results(old, [common_pb2.MessageInput(unique_key="U")]) == list(old.results)


def test_columns_of_the_wrong_length_are_refused() -> None:
    msgs = [common_pb2.MessageInput(topic="T", body=b"x")] * 2
    columns = commitlog_pb2.SendResultColumns(topic="T", physical_offsets=[0, 100], queue_ids=[0], queue_offsets=[0, 1])
    with pytest.raises(QuarryError, match="queue_ids has 1 entries for a batch of 2 messages"):
        rebuild_send_results(columns, msgs)
    columns = commitlog_pb2.SendResultColumns(topic="T", topics=["T"], physical_offsets=[0, 100], queue_ids=[0, 0], queue_offsets=[0, 1])
    with pytest.raises(QuarryError, match="topics has 1 entries"):
        rebuild_send_results(columns, msgs)
