"""Java `String.hashCode()` and RocketMQ's IndexFile key hash.

Java hashes UTF-16 code units, so a character outside the BMP counts as two units, and
lone surrogates (which Python strings can hold) hash as themselves.
"""
from __future__ import annotations

import array
import operator
import sys

_MASK = 0xFFFFFFFF
_INT_MIN = -(1 << 31)


def _code_units(s: str) -> array.array[int]:
    units = array.array("H")
    units.frombytes(s.encode("utf-16-le" if sys.byteorder == "little" else "utf-16-be", "surrogatepass"))
    return units


_POWERS: dict[int, tuple[int, ...]] = {}


def _powers(n: int) -> tuple[int, ...]:
    """31**k mod 2**32 for k = n-1 … 0, cached per length."""
    got = _POWERS.get(n)
    if got is None:
        got = tuple(pow(31, k, 1 << 32) for k in range(n - 1, -1, -1))
        if len(_POWERS) < 4096:
            _POWERS[n] = got
    return got


def java_string_hash(s: str) -> int:
    """`s.hashCode()` as Java computes it: h = 31*h + unit over UTF-16 units, wrapped to int32.

    Evaluated as Σ unit·31^(n-1-i) with C-level map/sum: the same value, several times
    faster than a Python loop on the indexer's hot path.
    """
    units = s.encode("ascii") if s.isascii() else _code_units(s)
    h: int = sum(map(operator.mul, units, _powers(len(units)))) & _MASK
    return h - (1 << 32) if h & 0x80000000 else h


def index_key_hash(key: str) -> int:
    """IndexFile's key hash: |hashCode|, or 0 when the hash is Integer.MIN_VALUE."""
    h = java_string_hash(key)
    return 0 if h == _INT_MIN else abs(h)


def tags_code(tags: str | None) -> int:
    """ConsumeQueue tagsCode of a message: the Java hashCode of its TAGS, 0 when it has none."""
    return java_string_hash(tags) if tags else 0

