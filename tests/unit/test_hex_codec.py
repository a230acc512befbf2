"""The id hex codec beyond the golden cases: ids are written with it, and Java's lenient reader
differs from Quarry's strict decoders only on input those refuse with a reason."""
from __future__ import annotations

import pytest

from quarry.formats import offset_msg_id
from quarry.formats.hex_codec import bytes2string, hex_error, string2bytes


def test_ids_are_written_with_bytes2string_and_read_back() -> None:
    msg_id = offset_msg_id.create("10.108.115.217", 10911, 16400)
    assert msg_id == bytes2string(string2bytes(msg_id) or b"")
    assert offset_msg_id.decode(msg_id.lower()) == offset_msg_id.decode(msg_id)  # Java upper-cases first


@pytest.mark.parametrize("text", ["", "00", "0a6C73d9", "FFFF"])
def test_strict_hex_reads_as_java_does(text: str) -> None:
    assert hex_error(text) is None
    assert string2bytes(text) == (bytes.fromhex(text) if text else None)


@pytest.mark.parametrize(("text", "reason"), [("A", "odd number"), ("0G", "character 1"), (" 1", "character 0")])
def test_lenient_input_is_named_by_hex_error(text: str, reason: str) -> None:
    assert reason in (hex_error(text) or "")
    with pytest.raises(offset_msg_id.OffsetMsgIdError):
        offset_msg_id.decode(text * (32 // len(text)))
