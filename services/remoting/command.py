"""RocketMQ's RemotingCommand and its frame, both header forms (JSON and ROCKETMQ binary).

A frame is: int32 length of everything after it; int32 whose high byte is the header's
serialization type and whose low three bytes are the header length; the header; the body.
Every length is checked against what is left, so a hostile frame raises FrameError
instead of allocating or reading past its end.
"""
from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from typing import Any

import orjson

from quarry.services.remoting import codes

_INT = struct.Struct(">i")
_BIN_FIXED = struct.Struct(">hbhii")  # code, language, version, opaque, flag

JAVA_INT = (-(1 << 31), (1 << 31) - 1)  # a Java int's range: header fields a client sends as int


class FrameError(ValueError):
    """A frame or header that does not decode; the message says which part and why."""


class HeaderFieldError(ValueError):
    """A request header field that is missing or not of its type (answered, not fatal)."""


@dataclass
class RemotingCommand:
    """One request or response."""

    code: int
    opaque: int = 0
    flag: int = 0
    remark: str | None = None
    ext_fields: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    language: str = "PYTHON"
    version: int = 0
    serialize_type: int = codes.SERIALIZE_JSON
    caller: object = field(default=None, compare=False, repr=False)  # the account that signed it (set by the ACL check)

    @property
    def is_response(self) -> bool:
        return bool(self.flag & codes.FLAG_RESPONSE)

    @property
    def is_oneway(self) -> bool:
        return bool(self.flag & codes.FLAG_ONEWAY)

    def response(self, code: int = codes.SUCCESS, remark: str | None = None, fields: dict[str, Any] | None = None, body: bytes = b"") -> "RemotingCommand":
        """The response to this request: same opaque and header form, RPC_TYPE bit set."""
        return RemotingCommand(code, self.opaque, codes.FLAG_RESPONSE, remark, to_ext_fields(fields or {}), body,
                               serialize_type=self.serialize_type)

    # -- typed access to the request header (CommandCustomHeader fields) ---------------------
    def text(self, name: str, default: str | None = None) -> str:
        value = self.ext_fields.get(name)
        if value is None:
            if default is None:
                raise HeaderFieldError(f"header field {name}: missing (required)")
            return default
        return value

    def integer(self, name: str, default: int | None = None, lo: int = -(1 << 63), hi: int = (1 << 63) - 1) -> int:
        value = self.ext_fields.get(name)
        if value is None or value == "":
            if default is None:
                raise HeaderFieldError(f"header field {name}: missing (required)")
            return default
        try:
            number = int(value)
        except ValueError:
            raise HeaderFieldError(f"header field {name}: {value[:64]!r} is not an integer") from None
        if not lo <= number <= hi:
            raise HeaderFieldError(f"header field {name}: {number} is outside {lo}..{hi}")
        return number

    def boolean(self, name: str, default: bool = False) -> bool:
        value = self.ext_fields.get(name)
        if value is None or value == "":
            return default
        return value.strip().lower() == "true"


def to_ext_fields(fields: dict[str, Any]) -> dict[str, str]:
    """Header fields as RocketMQ puts them on the wire: strings; None left out; booleans as Java prints them."""
    out = {}
    for k, v in fields.items():
        if v is None:
            continue
        out[k] = ("true" if v else "false") if isinstance(v, bool) else str(v)
    return out


# -- encoding ----------------------------------------------------------------------------------
def encode_header(cmd: RemotingCommand) -> bytes:
    if cmd.serialize_type == codes.SERIALIZE_ROCKETMQ:
        return _encode_binary_header(cmd)
    header: dict[str, Any] = {"code": cmd.code, "language": cmd.language, "version": cmd.version, "opaque": cmd.opaque,
                              "flag": cmd.flag, "serializeTypeCurrentRPC": "JSON"}
    if cmd.remark is not None:
        header["remark"] = cmd.remark
    if cmd.ext_fields:
        header["extFields"] = cmd.ext_fields
    return orjson.dumps(header)  # compact, UTF-8 as it is (what json.dumps gives with ensure_ascii off)


def _encode_binary_header(cmd: RemotingCommand) -> bytes:
    lang = codes.LANGUAGES.index(cmd.language) if cmd.language in codes.LANGUAGES else codes.LANGUAGES.index("OTHER")
    parts = [_BIN_FIXED.pack(cmd.code, lang, cmd.version, cmd.opaque, cmd.flag)]
    remark = (cmd.remark or "").encode("utf-8")
    parts += [_INT.pack(len(remark)), remark]
    ext = bytearray()
    for k, v in cmd.ext_fields.items():
        kb, vb = k.encode("utf-8"), v.encode("utf-8")
        ext += struct.pack(">h", len(kb)) + kb + _INT.pack(len(vb)) + vb
    parts += [_INT.pack(len(ext)), bytes(ext)]
    return b"".join(parts)


def encode_frame(cmd: RemotingCommand) -> bytes:
    header = encode_header(cmd)
    if len(header) > 0xFFFFFF:
        raise FrameError(f"header: {len(header)} bytes does not fit the 24-bit header length")
    return b"".join((_INT.pack(4 + len(header) + len(cmd.body)), _INT.pack((cmd.serialize_type << 24) | len(header)), header, cmd.body))


# -- decoding ----------------------------------------------------------------------------------
def decode_frame(frame: bytes) -> RemotingCommand:
    """Decode what follows the 4-byte total length (header-length field, header, body)."""
    if len(frame) < 4:
        raise FrameError(f"frame: {len(frame)} bytes, shorter than its header-length field")
    (mark,) = _INT.unpack_from(frame, 0)
    serialize_type = (mark >> 24) & 0xFF
    header_len = mark & 0xFFFFFF
    if header_len > len(frame) - 4:
        raise FrameError(f"header length {header_len} exceeds the frame ({len(frame) - 4} bytes after the length fields)")
    header = frame[4:4 + header_len]
    if serialize_type == codes.SERIALIZE_JSON:
        cmd = _decode_json_header(header)
    elif serialize_type == codes.SERIALIZE_ROCKETMQ:
        cmd = _decode_binary_header(header)
    else:
        raise FrameError(f"serialization type {serialize_type}: expected 0 (JSON) or 1 (ROCKETMQ)")
    cmd.serialize_type = serialize_type
    cmd.body = frame[4 + header_len:]
    return cmd


def _as_int(header: dict[str, Any], name: str, lo: int, hi: int, default: int | None = None) -> int:
    value = header.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise FrameError(f"JSON header field {name}: expected an integer in {lo}..{hi}, got {str(value)[:64]!r}")
    return value


def _ext_value(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, str)):
        return str(value)
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() else repr(value)
    return json.dumps(value)


def _decode_json_header(header: bytes) -> RemotingCommand:
    try:
        data = orjson.loads(header)
    except ValueError as exc:  # (orjson's JSONDecodeError, invalid UTF-8 included)
        raise FrameError(f"JSON header: does not parse ({exc})") from None
    if not isinstance(data, dict):
        raise FrameError("JSON header: expected an object")
    ext = data.get("extFields") or {}
    if not isinstance(ext, dict):
        raise FrameError("JSON header field extFields: expected an object")
    remark = data.get("remark")
    language = data.get("language", "JAVA")
    code, opaque, flag, version = data.get("code"), data.get("opaque", 0), data.get("flag", 0), data.get("version", 0)
    lo, hi = JAVA_INT
    if not (type(code) is int and type(opaque) is int and type(flag) is int and type(version) is int
            and lo <= code <= hi and lo <= opaque <= hi and lo <= flag <= hi and lo <= version <= hi):
        # (what a client sends; else the field at fault is named)
        code, opaque = _as_int(data, "code", lo, hi), _as_int(data, "opaque", lo, hi, 0)
        flag, version = _as_int(data, "flag", lo, hi, 0), _as_int(data, "version", lo, hi, 0)
    return RemotingCommand(
        code, opaque, flag, remark if isinstance(remark, str) else None,
        # (RocketMQ's clients send every value as a string: then the object is taken as it is)
        ext if all(type(v) is str for v in ext.values()) else {str(k): s for k, v in ext.items() if (s := _ext_value(v)) is not None},
        language=language if isinstance(language, str) else "OTHER", version=version,
    )


def _decode_binary_header(header: bytes) -> RemotingCommand:
    if len(header) < _BIN_FIXED.size + 8:
        raise FrameError(f"ROCKETMQ header: {len(header)} bytes, shorter than its fixed part ({_BIN_FIXED.size + 8})")
    code, lang, version, opaque, flag = _BIN_FIXED.unpack_from(header, 0)
    pos = _BIN_FIXED.size
    remark, pos = _binary_string(header, pos, 4, "remark")
    if len(header) - pos < 4:
        raise FrameError(f"ROCKETMQ header: extFields length truncated at byte {pos}")
    (ext_len,) = _INT.unpack_from(header, pos)
    pos += 4
    if ext_len < 0 or ext_len > len(header) - pos:
        raise FrameError(f"ROCKETMQ header: extFields length {ext_len} exceeds the {len(header) - pos} bytes left")
    end = pos + ext_len
    ext: dict[str, str] = {}
    while pos < end:
        key, pos = _binary_string(header, pos, 2, "extFields key", end)
        value, pos = _binary_string(header, pos, 4, f"extFields[{key}]", end)
        ext[key] = value
    return RemotingCommand(code=code, opaque=opaque, flag=flag, remark=remark or None, ext_fields=ext,
                           language=codes.LANGUAGES[lang] if 0 <= lang < len(codes.LANGUAGES) else "OTHER", version=version)


def _binary_string(buf: bytes, pos: int, width: int, what: str, end: int | None = None) -> tuple[str, int]:
    end = len(buf) if end is None else end
    if end - pos < width:
        raise FrameError(f"ROCKETMQ header: {what} length truncated at byte {pos}")
    (n,) = struct.unpack_from(">h" if width == 2 else ">i", buf, pos)
    pos += width
    if n < 0 or n > end - pos:
        raise FrameError(f"ROCKETMQ header: {what} length {n} exceeds the {end - pos} bytes left")
    try:
        return buf[pos:pos + n].decode("utf-8"), pos + n
    except UnicodeDecodeError:
        raise FrameError(f"ROCKETMQ header: {what} is not UTF-8") from None
