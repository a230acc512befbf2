"""The remoting frame codec: both header forms as RocketMQ lays them out, and hostile frames."""
from __future__ import annotations

import base64
import hashlib
import hmac
import json
import struct

import pytest

from quarry.services.remoting import codes
from quarry.services.remoting.acl import sign, signature
from quarry.services.remoting.command import FrameError, HeaderFieldError, RemotingCommand, decode_frame, encode_frame


def _split(frame: bytes) -> tuple[int, int, int, bytes]:
    total, mark = struct.unpack_from(">ii", frame, 0)
    return total, mark >> 24, mark & 0xFFFFFF, frame[8:]


def test_json_frame_layout_and_round_trip() -> None:
    cmd = RemotingCommand(code=105, opaque=7, flag=0, remark=None, ext_fields={"topic": "T"}, body=b"xyz")
    frame = encode_frame(cmd)
    total, kind, hlen, rest = _split(frame)
    assert total == len(frame) - 4 and kind == codes.SERIALIZE_JSON
    header = json.loads(rest[:hlen])
    assert header["code"] == 105 and header["opaque"] == 7 and header["extFields"] == {"topic": "T"}
    assert rest[hlen:] == b"xyz"
    back = decode_frame(frame[4:])
    assert (back.code, back.opaque, back.ext_fields, back.body) == (105, 7, {"topic": "T"}, b"xyz")


def test_json_header_values_become_strings_as_java_reads_them() -> None:
    header = json.dumps({"code": 10, "opaque": 1, "flag": 2, "language": "JAVA", "version": 121,
                         "extFields": {"queueId": 3, "unitMode": False, "n": None, "t": "x"}}).encode()
    cmd = decode_frame(struct.pack(">i", len(header)) + header)
    assert cmd.ext_fields == {"queueId": "3", "unitMode": "false", "t": "x"}
    assert cmd.is_oneway and not cmd.is_response


def _binary_header(code: int, lang: int, version: int, opaque: int, flag: int, remark: bytes, ext: list[tuple[bytes, bytes]]) -> bytes:
    ext_bytes = b"".join(struct.pack(">h", len(k)) + k + struct.pack(">i", len(v)) + v for k, v in ext)
    return struct.pack(">hbhii", code, lang, version, opaque, flag) + struct.pack(">i", len(remark)) + remark + struct.pack(">i", len(ext_bytes)) + ext_bytes


def test_rocketmq_binary_header_decodes_and_encodes_the_same_bytes() -> None:
    header = _binary_header(12, 0, 399, 42, 0, b"", [(b"topic", b"T"), (b"key", b"k\xc3\xa9")])
    frame = struct.pack(">i", (1 << 24) | len(header)) + header + b"BODY"
    cmd = decode_frame(frame)
    assert (cmd.code, cmd.language, cmd.version, cmd.opaque, cmd.serialize_type) == (12, "JAVA", 399, 42, codes.SERIALIZE_ROCKETMQ)
    assert cmd.ext_fields == {"topic": "T", "key": "ké"} and cmd.body == b"BODY"
    resp = cmd.response(codes.QUERY_NOT_FOUND, "none", {"indexLastUpdateTimestamp": 5})
    total, kind, hlen, rest = _split(encode_frame(resp))
    assert kind == codes.SERIALIZE_ROCKETMQ
    assert rest[:hlen] == _binary_header(22, 3, 0, 42, 1, b"none", [(b"indexLastUpdateTimestamp", b"5")])


@pytest.mark.parametrize("frame, why", [
    (b"\x00\x00", "shorter than its header-length field"),
    (struct.pack(">i", 100) + b"{}", "header length 100 exceeds"),
    (struct.pack(">i", (7 << 24) | 2) + b"{}", "serialization type 7"),
    (struct.pack(">i", 2) + b"[]", "expected an object"),
    (struct.pack(">i", 3) + b"{x}", "does not parse"),
    (struct.pack(">i", 12) + b'{"code":"a"}', "field code"),
    (struct.pack(">i", (1 << 24) | 5) + b"\x00" * 5, "shorter than its fixed part"),
])
def test_malformed_frames_raise_frame_error_naming_the_part(frame: bytes, why: str) -> None:
    with pytest.raises(FrameError, match=why):
        decode_frame(frame)


def test_binary_lengths_past_the_header_are_refused() -> None:
    header = _binary_header(12, 0, 0, 1, 0, b"", [(b"k", b"v")])
    broken = header[:-1]  # value one byte short
    with pytest.raises(FrameError, match="extFields length"):
        decode_frame(struct.pack(">i", (1 << 24) | len(broken)) + broken)
    huge_remark = struct.pack(">hbhii", 1, 0, 0, 1, 0) + struct.pack(">i", 1 << 30) + b"\x00" * 4
    with pytest.raises(FrameError, match="remark length"):
        decode_frame(struct.pack(">i", (1 << 24) | len(huge_remark)) + huge_remark)


def test_header_fields_are_typed_and_named_when_wrong() -> None:
    cmd = RemotingCommand(11, ext_fields={"queueId": "x", "maxMsgNums": "5000000000"})
    with pytest.raises(HeaderFieldError, match="queueId: 'x' is not an integer"):
        cmd.integer("queueId")
    with pytest.raises(HeaderFieldError, match="topic: missing"):
        cmd.text("topic")
    with pytest.raises(HeaderFieldError, match="maxMsgNums: 5000000000 is outside"):
        cmd.integer("maxMsgNums", hi=(1 << 31) - 1)


def test_acl_signature_is_hmac_sha1_over_sorted_values_then_body() -> None:
    fields = {"b": "2", "a": "1", "AccessKey": "ak", codes.UNIQUE_KEY_QUERY_FLAG: "true"}
    expected = base64.b64encode(hmac.new(b"sk", b"ak12" + b"body", hashlib.sha1).digest()).decode()
    assert signature("sk", fields, b"body") == expected
    cmd = RemotingCommand(12, ext_fields={"b": "2", "a": "1"}, body=b"body")
    sign(cmd, "ak", "sk")
    assert cmd.ext_fields["Signature"] == expected and cmd.ext_fields["AccessKey"] == "ak"
