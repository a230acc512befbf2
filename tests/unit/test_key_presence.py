"""The key presence Bloom filter (services/key_presence.py): no false negatives, a false
"may hold" rate near what its size promises, and a copy rebuilt from chunks equal to it."""
from __future__ import annotations

import random

import numpy as np
import pytest

from quarry.services.key_presence import BITS_PER_KEY, MAX_LOG2_BITS, MIN_LOG2_BITS, KeyPresence, log2_bits_for


def _hashes(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(0, 1 << 31) for _ in range(n)]


def test_every_key_added_may_be_held_and_absent_keys_rarely_are() -> None:
    added, absent = _hashes(50_000, 1), _hashes(50_000, 2)
    f = KeyPresence(log2_bits_for(len(added)))
    f.add(np.array(added[:25_000]))
    f.add(added[25_000:])  # a list works as well as an array
    assert all(f.may_hold(h) for h in added)
    held = set(added)
    false = sum(f.may_hold(h) for h in absent if h not in held)
    assert false / len(absent) < 0.02  # sized at BITS_PER_KEY bits per key: about 1 %
    assert f.added == len(added)


def test_the_scalar_probe_reads_the_bits_the_vector_add_sets() -> None:
    for h in [0, 1, (1 << 31) - 1, 123456789, *_hashes(200, 3)]:
        f = KeyPresence(12)
        f.add([h])
        bits = f.chunks(1 << 20)[0][1]
        set_bits = {n * 8 + b for n, byte in enumerate(bits) for b in range(8) if byte >> b & 1}
        assert set_bits == set(f.positions(h))


def test_a_copy_from_chunks_equals_the_filter() -> None:
    f = KeyPresence(16)
    f.add(_hashes(3000, 4))
    copy = KeyPresence(16, f.hashes)
    for offset, chunk in f.chunks(1000):
        copy.merge(chunk, offset)
    assert copy.chunks(1 << 20) == f.chunks(1 << 20)


def test_sizes_follow_the_keys_within_bounds() -> None:
    assert log2_bits_for(0) == MIN_LOG2_BITS
    assert log2_bits_for(10**12) == MAX_LOG2_BITS
    n = 10_000_000
    assert (1 << log2_bits_for(n)) >= n * BITS_PER_KEY > (1 << (log2_bits_for(n) - 1))


@pytest.mark.parametrize("make, field", [
    (lambda: KeyPresence(2), "log2_bits"),
    (lambda: KeyPresence(MAX_LOG2_BITS + 1), "log2_bits"),
    (lambda: KeyPresence(10, 0), "hashes"),
    (lambda: KeyPresence(10, bits=b"\0" * 3), "bits"),
    (lambda: KeyPresence(10).merge(b"\0" * 10, 120), "chunk_offset"),
])
def test_bad_sizes_name_the_field(make, field: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match=f"^{field}:"):
        make()
