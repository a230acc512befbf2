"""Java `String.hashCode()` and RocketMQ's IndexFile key hash.

Java hashes UTF-16 code units, so a character outside the BMP counts as two units, and
lone surrogates (which Python strings can hold) hash as themselves.
"""
from __future__ import annotations

import array
import sys

_MASK = 0xFFFFFFFF
_INT_MIN = -(1 << 31)


def _code_units(s: str) -> array.array:
    units = array.array("H")
    units.frombytes(s.encode("utf-16-le" if sys.byteorder == "little" else "utf-16-be", "surrogatepass"))
    return units


def java_string_hash(s: str) -> int:
    """`s.hashCode()` as Java computes it: h = 31*h + unit over UTF-16 units, wrapped to int32."""
    h = 0
    if s.isascii():
        for ch in s.encode("ascii"):
            h = (31 * h + ch) & _MASK
    else:
        for unit in _code_units(s):
            h = (31 * h + unit) & _MASK
    return h - (1 << 32) if h & 0x80000000 else h


def index_key_hash(key: str) -> int:
    """IndexFile's key hash: |hashCode|, or 0 when the hash is Integer.MIN_VALUE."""
    h = java_string_hash(key)
    return 0 if h == _INT_MIN else abs(h)


def tags_code(tags: str | None) -> int:
    """ConsumeQueue tagsCode of a message: the Java hashCode of its TAGS, 0 when it has none."""
    return java_string_hash(tags) if tags else 0
