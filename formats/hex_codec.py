"""RocketMQ's hex codec for ids: `UtilAll.bytes2string` and `UtilAll.string2bytes`.

Ids (offsetMsgId, UNIQ_KEY) are written as upper-case hex. Java's reader is lenient: it
upper-cases its input, ignores an odd trailing character, gives null for "", and reads any
character outside 0-9A-F as the nibble -1, which ORs into the byte: an invalid second character
makes the byte 0xFF, an invalid first one makes it 0xF0 | the low nibble.

Quarry's id decoders refuse non-hex input with an error instead (`hex_error`), so a typo is
reported rather than turned into another id; `string2bytes` states what RocketMQ itself would
read, for tools that must agree with a Java broker byte for byte.
"""
from __future__ import annotations

_NIBBLES = "0123456789ABCDEF"


def bytes2string(data: bytes) -> str:
    """Upper-case hex, two characters per byte ("" for no bytes)."""
    return data.hex().upper()


def _nibble(ch: str) -> int:
    return _NIBBLES.find(ch)  # -1 for anything else, as Java's String.indexOf


def string2bytes(text: str) -> bytes | None:
    """What `UtilAll.string2bytes` returns: None for "", else len(text)//2 bytes."""
    if text == "":
        return None
    upper = text.upper()
    if len(upper) % 2 == 0 and hex_error(upper) is None:
        return bytes.fromhex(upper)
    out = bytearray()
    for i in range(len(upper) // 2):
        # Java: (byte) (charToByte(hi) << 4 | charToByte(lo)), with charToByte = indexOf (-1 when absent).
        value = (_nibble(upper[2 * i]) << 4) | _nibble(upper[2 * i + 1])
        out.append(value & 0xFF)
    return bytes(out)


def hex_error(text: str) -> str | None:
    """Why `text` is not strict hex (an even number of 0-9, A-F, a-f), or None when it is."""
    if len(text) % 2:
        return f"odd number of hex characters ({len(text)})"
    for i, ch in enumerate(text):
        if ch not in "0123456789ABCDEFabcdef":
            return f"character {i} ({ch!r}) is not hexadecimal (0-9, A-F)"
    return None
