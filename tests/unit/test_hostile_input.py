"""Property-based tests of every decoder: random and mutated bytes yield a value or a clear
error, never a crash, a hang or an unbounded allocation."""
from __future__ import annotations

import struct
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from quarry.formats import offset_msg_id, unique_key
from quarry.formats.consume_queue import CQ_UNIT_SIZE, decode_unit, encode_unit
from quarry.formats.index_file import HEADER_SIZE, IndexFile, IndexFileError, file_size
from quarry.formats.properties import PropertyError, decode_pairs, encode_properties, properties_map, validate_pairs
from quarry.formats.batch_body import decode_batch_body
from quarry.formats.record import CorruptRecordError, decode_record, encode_record
from quarry.formats.segment_walk import SegmentEnd, walk_buffer
from quarry.services.query.merge import BadTokenError, decode_token, encode_token, PageToken

SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

VALID = bytes(encode_record(
    topic="TopicTest", body=b"hello world", properties="KEYS\x01a b\x02UNIQ_KEY\x01ABC", queue_id=1, flag=0,
    queue_offset=3, physical_offset=0, sys_flag=0, born_timestamp=1, born_host=("10.0.0.1", 5),
    store_timestamp=2, store_host=("10.0.0.2", 6),
))


@SETTINGS
@given(st.binary(max_size=512))
def test_random_bytes_decode_to_a_record_or_a_clear_error(data: bytes) -> None:
    try:
        rec = decode_record(data)
    except CorruptRecordError as exc:
        assert exc.reason
    else:
        assert rec.store_size <= len(data)


@SETTINGS
@given(st.lists(st.tuples(st.integers(0, len(VALID) - 1), st.integers(0, 255)), min_size=1, max_size=8))
def test_mutated_records_are_detected_or_decode_consistently(flips: list[tuple[int, int]]) -> None:
    data = bytearray(VALID)
    for pos, byte in flips:
        data[pos] = byte
    try:
        rec = decode_record(bytes(data))
    except CorruptRecordError:
        return
    # Whatever decoded passed every check: its frame fits and its CRC matches its body.
    assert rec.store_size == len(data)


@SETTINGS
@given(st.binary(max_size=2048))
def test_segment_walk_on_garbage_ends_with_a_reason(data: bytes) -> None:
    end = SegmentEnd(0)
    records = list(walk_buffer(data + bytes(8), 0, 0, True, end))
    assert end.reason
    assert sum(r.store_size for r in records) <= len(data) + 8


@SETTINGS
@given(st.binary(min_size=CQ_UNIT_SIZE, max_size=CQ_UNIT_SIZE))
def test_consume_queue_units_always_decode(data: bytes) -> None:
    # Every 20 bytes are some unit: decoding loses nothing (it encodes back to the same bytes).
    assert encode_unit(*decode_unit(data)) == data


@SETTINGS
@given(st.text(max_size=80))
def test_offset_msg_ids_decode_or_raise_a_clear_error(text: str) -> None:
    try:
        d = offset_msg_id.decode(text)
    except offset_msg_id.OffsetMsgIdError as exc:
        assert str(exc)
    else:
        assert 0 <= d.port <= 65535


@SETTINGS
@given(st.text(max_size=80), st.integers(0, 2**45))
def test_unique_keys_never_crash(text: str, now: int) -> None:
    from datetime import timezone

    from quarry.services.query.unique_key_window import search_window

    kind = unique_key.id_kind(text)
    assert kind in ("", "v4", "v5")
    w = search_window(text, now, 3_600_000, 7 * 86_400_000)
    assert w.begin <= w.end
    if kind == "v4":
        unique_key.nearly_time_from_id(text, now, timezone.utc)


@SETTINGS
@given(st.text(max_size=200))
def test_continuation_tokens_from_anywhere_are_rejected_cleanly(text: str) -> None:
    try:
        token = decode_token(text, "digest")
    except BadTokenError as exc:
        assert str(exc).startswith("continuation_token: ")  # names the field
    else:  # text that happens to be a token for this query: it means what it says
        assert token.query_digest == "digest" and decode_token(encode_token(token), "digest") == token


@SETTINGS
@given(st.dictionaries(st.text(max_size=8), st.integers(-1, 2**40), max_size=5))
def test_tokens_round_trip(bounds: dict[str, int]) -> None:
    token = PageToken(bounds, "d")
    assert decode_token(encode_token(token), "d") == token


@SETTINGS
@given(st.text(max_size=300))
def test_property_strings_always_parse(text: str) -> None:
    pairs = decode_pairs(text)
    # One pair per \x02-separated item holding a \x01, nothing else; and they encode back.
    assert len(pairs) == (sum(1 for item in text.split("\x02") if "\x01" in item) if text else 0)
    assert decode_pairs(encode_properties(pairs)) == pairs
    assert all(k and v for k, v in properties_map(text).items())


@SETTINGS
@given(st.lists(st.tuples(st.text(max_size=10), st.text(max_size=10)), max_size=5))
def test_property_validation_accepts_exactly_clean_pairs(pairs: list[tuple[str, str]]) -> None:
    clean = all(n and "\x01" not in n + v and "\x02" not in n + v for n, v in pairs)
    try:
        validate_pairs(pairs)
        assert clean
    except PropertyError:
        assert not clean


@SETTINGS
@given(st.binary(max_size=512))
def test_batch_bodies_decode_or_raise(data: bytes) -> None:
    try:
        items = decode_batch_body(data)
    except ValueError as exc:  # UnicodeDecodeError included
        assert str(exc)
    else:  # the messages cover the body exactly: 22 header bytes + body + properties each
        assert sum(22 + len(i.body) + len(i.properties.encode()) for i in items) == len(data)


@SETTINGS
@given(header=st.binary(min_size=HEADER_SIZE, max_size=HEADER_SIZE), body=st.binary(max_size=200), key=st.text(max_size=12))
def test_index_files_with_hostile_bytes_never_hang(tmp_path_factory: pytest.TempPathFactory, header: bytes, body: bytes, key: str) -> None:
    slots, num = 7, 10
    path: Path = tmp_path_factory.mktemp("ix") / "20260101000000000"
    raw = bytearray(file_size(slots, num))
    raw[:HEADER_SIZE] = header
    raw[HEADER_SIZE:HEADER_SIZE + len(body)] = body[: len(raw) - HEADER_SIZE]
    path.write_bytes(bytes(raw))
    try:
        f = IndexFile(path, slots, num, read_only=True)
    except IndexFileError:
        return
    f.header_problems()
    got = f.select_phy_offsets(f"T#{key}", 64, 0, 2**62)
    assert len(got) <= 64
    f.close()


def test_a_cyclic_chain_in_a_corrupt_index_file_ends(tmp_path: Path) -> None:
    f = IndexFile(tmp_path / "20260101000000000", 7, 10)
    f.put_key("T#a", 100, 1_700_000_000_000)
    f.put_key("T#a", 200, 1_700_000_000_000)
    f.flush()
    f.close()
    raw = bytearray((tmp_path / "20260101000000000").read_bytes())
    # entry 1's prev → 2 and entry 2's prev → 1: a cycle RocketMQ's checks do not catch; key hash bent so nothing matches.
    for entry, prev in ((1, 2), (2, 1)):
        pos = HEADER_SIZE + 4 * 7 + 20 * entry
        struct.pack_into(">i", raw, pos, 12345)
        struct.pack_into(">i", raw, pos + 16, prev)
    (tmp_path / "20260101000000000").write_bytes(bytes(raw))
    again = IndexFile(tmp_path / "20260101000000000", 7, 10, read_only=True)
    assert again.select_phy_offsets("T#a", 64, 0, 2**62) == []
    again.close()
