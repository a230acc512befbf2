"""The append packs records itself, a batch at a time: its bytes must be exactly what the
golden-tested encoder (formats.record.encode_record) makes of the same fields, whether the
store is handed in-process messages or a request's protobuf messages as they are."""
from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from quarry.formats.properties import message_properties
from quarry.formats.record import SYSFLAG_TRANSACTION_MASK, encode_record
from quarry.services.commitlog.storage.message_input import NewMessage
from quarry.services.commitlog.storage.store import CommitLogStore, StoreConfig
from quarry.v1 import common_pb2

_text = st.text(alphabet=st.characters(blacklist_characters="\x01\x02 ", blacklist_categories=("Cs",)), min_size=1, max_size=12)
_messages = st.builds(
    NewMessage,
    topic=st.just("T"),
    body=st.binary(min_size=1, max_size=700),
    keys=st.lists(_text, max_size=3),
    tags=st.one_of(st.just(""), _text),
    unique_key=st.one_of(st.just(""), _text),
    properties=st.lists(st.tuples(st.sampled_from(["DELAY", "a", "b"]), st.one_of(st.just(""), _text)), max_size=3),
    flag=st.integers(-2**31, 2**31 - 1),
    queue_id=st.sampled_from([-1, 0, 3]),
    born_timestamp=st.sampled_from([0, 1, 2**40]),
    born_host=st.sampled_from([("127.0.0.1", 1), ("::1", 2), ("2001:db8::5", 65535)]),
    sys_flag=st.sampled_from([0, 0x4, 0x8, 0xC, 0x1]),
    reconsume_times=st.integers(0, 16),
    prepared_transaction_offset=st.integers(0, 2**40),
)


def _proto(m: NewMessage) -> common_pb2.MessageInput:
    return common_pb2.MessageInput(
        topic=m.topic, body=m.body, keys=m.keys, tags=m.tags, unique_key=m.unique_key,
        properties=[common_pb2.Property(name=n, value=v) for n, v in m.properties], flag=m.flag, queue_id=m.queue_id,
        born_timestamp=m.born_timestamp, born_host=common_pb2.HostAddress(ip=m.born_host.ip, port=m.born_host.port),
        sys_flag=m.sys_flag, reconsume_times=m.reconsume_times, prepared_transaction_offset=m.prepared_transaction_offset)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.lists(_messages, min_size=1, max_size=6), min_size=1, max_size=5),
       st.sampled_from([("127.0.0.1", 10911), ("fe80::9", 10911)]), st.booleans())
def test_stored_bytes_are_what_the_encoder_makes(batches: list[list[NewMessage]], store_host: tuple[str, int], as_proto: bool) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        # Small segments: batches roll over segment ends (blank records between them).
        store = CommitLogStore(StoreConfig(store_dir=Path(tmp), segment_size=4096, store_host=store_host))
        try:
            for batch in batches:
                sent = [_proto(m) for m in batch] if as_proto else batch
                appended = store.append_many(sent)
                for m, r in zip(batch, appended):
                    _, stored = store.read_bytes(r.physical_offset)
                    assert stored == encode_record(
                        topic=m.topic, body=m.body, properties=message_properties(m.keys, m.tags, m.unique_key, m.properties),
                        queue_id=r.queue_id, flag=m.flag, queue_offset=r.queue_offset, physical_offset=r.physical_offset,
                        sys_flag=m.sys_flag & SYSFLAG_TRANSACTION_MASK, born_timestamp=m.born_timestamp or r.store_timestamp,
                        born_host=m.born_host, store_timestamp=r.store_timestamp, store_host=store_host,
                        reconsume_times=m.reconsume_times, prepared_transaction_offset=m.prepared_transaction_offset)
        finally:
            store.close()


def test_a_message_without_a_born_host_was_born_at_the_peer(tmp_path: Path) -> None:
    store = CommitLogStore(StoreConfig(store_dir=tmp_path))
    try:
        r = store.append_many([common_pb2.MessageInput(topic="T", body=b"x")], peer=("10.1.2.3", 4567))[0]
        assert store.read(r.physical_offset).born_host == ("10.1.2.3", 4567)
    finally:
        store.close()
