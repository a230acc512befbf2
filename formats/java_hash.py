"""Java `String.hashCode()` and RocketMQ's IndexFile key hash.

Java hashes UTF-16 code units, so a character outside the BMP counts as two units, and
lone surrogates (which Python strings can hold) hash as themselves.
"""
from __future__ import annotations

import array
import functools
import operator
import sys
from typing import Sequence

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
    h = _unsigned_hash(s)[0]
    return h - (1 << 32) if h & 0x80000000 else h


def _unsigned_hash(s: str) -> tuple[int, int]:
    """(hashCode as an unsigned 32-bit value, UTF-16 units of s)."""
    units = s.encode("ascii") if s.isascii() else _code_units(s)
    return sum(map(operator.mul, units, _powers(len(units)))) & _MASK, len(units)


def _index_hash(h: int) -> int:
    """IndexFile's key hash of an unsigned hashCode: |hashCode|, 0 for Integer.MIN_VALUE."""
    return (1 << 32) - h if h > 0x80000000 else (0 if h == 0x80000000 else h)


def index_key_hash(key: str) -> int:
    """IndexFile's key hash: |hashCode|, or 0 when the hash is Integer.MIN_VALUE."""
    return _index_hash(_unsigned_hash(key)[0])


# Prefixes are topic names a key query asks under (a topic and the parking topics): few, asked
# again and again; bounded all the same.
_prefix_hash = functools.lru_cache(maxsize=1024)(_unsigned_hash)


def index_key_hashes_of(prefixes: Sequence[str], suffix: str) -> list[int]:
    """index_key_hash(p + suffix) for each prefix p, the suffix hashed once: Java's hash of a
    concatenation is hash(p)·31^len(suffix) + hash(suffix), wrapped to 32 bits."""
    tail, n = _unsigned_hash(suffix)
    shift = pow(31, n, 1 << 32)
    return [_index_hash((_prefix_hash(p)[0] * shift + tail) & _MASK) for p in prefixes]


def tags_code(tags: str | None) -> int:
    """ConsumeQueue tagsCode of a message: the Java hashCode of its TAGS, 0 when it has none."""
    return java_string_hash(tags) if tags else 0

