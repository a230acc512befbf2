"""A key query's record check (read_key_fields: decode_dispatch_fields(checked=True), a few
fields) refuses what decode_record refuses, as the store's DamagedRecord, and reads what it reads."""
from __future__ import annotations

import struct
from pathlib import Path

import pytest

from quarry.formats.record import (
    FIXED_SIZE, IPV6_EXTRA, SYSFLAG_BORNHOST_V6, SYSFLAG_POS, CorruptRecordError, decode_dispatch_fields, decode_record,
)
from quarry.services.commitlog.storage.errors import DamagedRecord
from quarry.services.commitlog.storage.message_input import Host, NewMessage, Property
from quarry.services.commitlog.storage.store import CommitLogStore, StoreConfig


def _store(tmp_path: Path) -> CommitLogStore:
    return CommitLogStore(StoreConfig(store_dir=tmp_path, segment_size=1 << 20))


@pytest.mark.parametrize("damage, reason", [
    ("SYSFLAG claims an IPv6 born host", "TOTALSIZE too small for its IPv6 hosts"),
    ("properties not UTF-8", "topic or properties are not UTF-8"),
])
def test_a_damaged_record_is_refused_as_decode_record_refuses_it(damage: str, reason: str, tmp_path: Path) -> None:
    """Damage outside the body CRC of a 99-byte record (too small for an IPv6 host): SYSFLAG
    flipped to claim an IPv6 born host, or the properties' last byte (they end the record) no
    longer UTF-8. Both decoders raise CorruptRecordError for the same reason (not struct.error,
    nor text with replacement characters), so the store's key read raises DamagedRecord (a
    StoreError, which a key query skips) as its read does, and reports the corruption once."""
    store = _store(tmp_path)
    try:
        result = store.append(NewMessage(topic="T", body=b"x", keys=["k"]))
        store.flush()
        offset, size = result.physical_offset, result.size
        seg = store.segments.find(offset)
        assert seg is not None and size < FIXED_SIZE + IPV6_EXTRA
        if damage == "SYSFLAG claims an IPv6 born host":
            seg.write(offset + SYSFLAG_POS, struct.pack(">i", SYSFLAG_BORNHOST_V6))
        else:
            seg.write(offset + size - 1, b"\xff")
        data = bytes(seg.read(offset, size))
        with pytest.raises(CorruptRecordError) as decoded:
            decode_record(data, 0, physical_offset=offset)
        with pytest.raises(CorruptRecordError) as fields:
            decode_dispatch_fields(data, 0, offset, checked=True)
        assert reason in decoded.value.reason and fields.value.reason == decoded.value.reason
        with pytest.raises(DamagedRecord) as key_read:
            store.read_key_fields(offset)
        assert store.status().corruption == [str(fields.value)]  # reported, at its offset
        with pytest.raises(DamagedRecord) as read:
            store.read(offset)
        assert str(key_read.value) == str(read.value)
    finally:
        store.close()


def test_a_sound_records_key_fields_are_decode_records(tmp_path: Path) -> None:
    """Records with IPv4 and IPv6 born hosts, tags, keys and non-ASCII properties: the key read's
    fields and bytes are the full read's, and decode_dispatch_fields(checked=True) reads what
    decode_record reads."""
    store = _store(tmp_path)
    try:
        messages = [
            NewMessage(topic="T", body=b"x", keys=["k"]),
            NewMessage(topic="T2", body=b"body" * 100, keys=["k1", "k2"], tags="TagA", unique_key="U0001", born_host=Host("::1", 5)),
            NewMessage(topic="T", body=b"\xff\xfe", keys=["ключ"], properties=[Property("a", "b")]),
        ]
        sys_flags = []
        for msg in messages:
            offset = store.append(msg).physical_offset
            record, data = store.read_bytes(offset)
            sys_flags.append(record.sys_flag)
            assert store.read_key_fields(offset) == (record.topic, record.store_timestamp, record.properties_text, data)
            assert decode_dispatch_fields(data, 0, offset, checked=True) == (
                record.store_size, record.topic, record.queue_id, record.queue_offset, record.store_timestamp, record.sys_flag,
                record.prepared_transaction_offset, record.properties_text)
            assert decode_record(data, 0, physical_offset=offset) == record
        assert [bool(f & SYSFLAG_BORNHOST_V6) for f in sys_flags] == [False, True, False]
        assert store.status().corruption == []
    finally:
        store.close()
