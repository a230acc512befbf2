"""Key presence: one Bloom filter of the IndexFile key hashes an indexer holds.

An indexer keeps one (services/indexer/presence.py) and streams it to every router that
watches it (WatchKeyPresence); a router keeps a copy per broker (services/query/presence.py)
and asks a broker a key or unique-key query only when its copy says the broker may hold the
key. A Bloom filter has false positives (an extra broker asked, who answers nothing) and
never false negatives, so answers stay exact; what keeps the copy current is the watch
protocol, not this module.

The input is RocketMQ's IndexFile key hash of `topic#key` (formats/index_keys.py), which is
what the indexer has for every entry, including entries written before it started, so the
filter can be rebuilt from the files themselves. Plain Python and numpy, no gRPC.
"""
from __future__ import annotations

import numpy as np

BITS_PER_KEY = 10
HASHES = 6  # with 10 bits per key: about 1 false "may hold" in 120 absent keys
MIN_LOG2_BITS = 23  # 1 MiB: small stores still get a filter with room to grow into
MAX_LOG2_BITS = 32  # 512 MiB; beyond its capacity the filter fills and asks more brokers, still exact
_M64 = (1 << 64) - 1
_GOLDEN, _MIX1, _MIX2 = 0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB


def log2_bits_for(keys: int) -> int:
    """The size (log2 of bits) that holds `keys` at BITS_PER_KEY."""
    need = max(1, keys) * BITS_PER_KEY
    return min(MAX_LOG2_BITS, max(MIN_LOG2_BITS, (need - 1).bit_length()))


def _mix(h: int) -> int:
    """splitmix64's finaliser: a 31-bit key hash spread over 64 bits."""
    z = (h + _GOLDEN) & _M64
    z = ((z ^ (z >> 30)) * _MIX1) & _M64
    z = ((z ^ (z >> 27)) * _MIX2) & _M64
    return z ^ (z >> 31)


def _mix_array(hashes: np.ndarray) -> np.ndarray:
    """_mix over an array (uint64 arithmetic wraps mod 2**64, as the masks do above)."""
    z = hashes.astype(np.uint64) + np.uint64(_GOLDEN)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(_MIX1)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(_MIX2)
    return z ^ (z >> np.uint64(31))


class KeyPresence:
    """A Bloom filter of 2**log2_bits bits over IndexFile key hashes (double hashing:
    position i is a + i*b of the mixed hash's low and high halves)."""

    def __init__(self, log2_bits: int, hashes: int = HASHES, bits: bytes | bytearray | None = None) -> None:
        if not 3 <= log2_bits <= MAX_LOG2_BITS:
            raise ValueError(f"log2_bits: must be 3..{MAX_LOG2_BITS}, got {log2_bits}")
        if not 1 <= hashes <= 32:
            raise ValueError(f"hashes: must be 1..32, got {hashes}")
        self.log2_bits, self.hashes = log2_bits, hashes
        self._mask = (1 << log2_bits) - 1
        size = 1 << (log2_bits - 3)
        if bits is not None and len(bits) != size:
            raise ValueError(f"bits: {len(bits)} bytes for a filter of 2**{log2_bits} bits (must be {size})")
        self._bits = bytearray(bits) if bits is not None else bytearray(size)
        self._view = np.frombuffer(self._bits, dtype=np.uint8)
        self.added = 0  # key hashes added (with repeats): how full the filter is getting

    @property
    def nbytes(self) -> int:
        return len(self._bits)

    def positions(self, key_hash: int) -> list[int]:
        z = _mix(key_hash)
        a, b = z & self._mask, (z >> 32) | 1
        return [(a + i * b) & self._mask for i in range(self.hashes)]

    def may_hold(self, key_hash: int) -> bool:
        bits = self._bits
        for p in self.positions(key_hash):
            if not bits[p >> 3] >> (p & 7) & 1:
                return False
        return True

    def add(self, key_hashes: "np.ndarray | list[int]") -> None:
        """Add key hashes (0 <= h < 2**32)."""
        h = np.asarray(key_hashes, dtype=np.int64)
        if h.size == 0:
            return
        z = _mix_array(h & np.int64(0xFFFFFFFF))
        mask = np.uint64(self._mask)
        a, b = z & mask, (z >> np.uint64(32)) | np.uint64(1)
        steps = np.arange(self.hashes, dtype=np.uint64)
        pos = ((a[:, None] + steps[None, :] * b[:, None]) & mask).ravel()
        np.bitwise_or.at(self._view, (pos >> np.uint64(3)).astype(np.intp), (np.uint8(1) << (pos & np.uint64(7)).astype(np.uint8)))
        self.added += int(h.size)

    def merge(self, bits: bytes, offset: int) -> None:
        """OR `bits` into the filter at byte `offset` (a snapshot's chunk)."""
        if offset < 0 or offset + len(bits) > len(self._bits):
            raise ValueError(f"chunk_offset: {offset}+{len(bits)} bytes outside a filter of {len(self._bits)} bytes")
        part = self._view[offset:offset + len(bits)]
        np.bitwise_or(part, np.frombuffer(bits, dtype=np.uint8), out=part)

    def chunks(self, size: int) -> list[tuple[int, bytes]]:
        """The filter as (byte offset, bytes) chunks of at most `size` bytes, copied now."""
        return [(o, bytes(self._bits[o:o + size])) for o in range(0, len(self._bits), size)]
