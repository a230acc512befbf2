"""Which IndexFiles may hold a key hash: one Bloom filter per file, stacked bit-sliced so a
single probe tests every file at once.

A broker keeps many IndexFiles (a thousand at RocketMQ's rates over days), and RocketMQ's
proportions (4 entries per slot) leave no slot empty, so asking each file costs a chain
walk per file. Here every file owns one column of a bit matrix whose rows are Bloom
positions: a key hash sets `K` rows in its file's column, and the AND of those `K` rows
(each read as one integer over all columns) names the files that may hold it. The probe
costs the same for 1 or 1,000 files; only candidates are walked, and the walk decides
(a Bloom filter has false positives, never false negatives), so answers stay exact.

All files share one row count, sized for a full file (`index_num` entries), because every
IndexFile of a store has the same capacity. The filter lives in memory only and is built
from the files' own entries (`sync`), so the IndexFiles stay byte-compatible with RocketMQ.
"""
from __future__ import annotations

from typing import Generic, TypeVar

import numpy as np

T = TypeVar("T")

# 24 bits and 4 rows per key: about 1 false candidate in 1,800 files per probe (a wasted
# chain walk of a few µs), 3 bytes of memory per entry a file can hold.
BITS_PER_KEY = 24
K = 4
_M32 = 0xFFFFFFFF
# Row i of a key hash h is the fastrange of bits 64(i+1)..64(i+1)+31 of h * _MULT: each is
# the top of a multiply-shift hash (a universal family) with its own multiplier, and one
# multiplication gives all four (the probe is the per-query cost, so its ops are counted).
_MULT = 0xB5297A4D3F84D5B5_68E31DA4B0F2C7A3_9E3779B97F4A7C15_C4CEB9FE1A85EC53_FF51AFD7ED558CCD
_LIMBS = [(_MULT >> (32 * j)) & _M32 for j in range(2 * K + 1)]


def rows_of(key_hashes: np.ndarray, rows: int) -> list[np.ndarray]:
    """The K rows of each key hash (0 <= h < 2**32), as the probe computes them with Python
    ints: the product is built 32 bits at a time so no uint64 overflows."""
    # A negative keyHash (only a foreign or damaged file has one) never equals a query's
    # hash; masking keeps the arithmetic in range and only adds a harmless bit.
    h = (np.asarray(key_hashes).astype(np.int64) & _M32).astype(np.uint64)
    carry = np.zeros_like(h)
    fields = []
    m32, m = np.uint64(_M32), np.uint64(rows)
    for j, limb in enumerate(_LIMBS):
        acc = h * np.uint64(limb) + carry  # < 2**63 + 2**32
        if j >= 2 and j % 2 == 0:
            fields.append((((acc & m32) * m) >> np.uint64(32)).astype(np.intp))
        carry = acc >> np.uint64(32)
    return fields


class StackedKeyFilter(Generic[T]):
    """Bloom filters of many files, one column each. Not thread-safe (the index's lock)."""

    def __init__(self, capacity_per_file: int, bits_per_key: int = BITS_PER_KEY) -> None:
        if capacity_per_file <= 0 or bits_per_key <= 0:
            raise ValueError(f"capacity_per_file and bits_per_key must be > 0, got {capacity_per_file}, {bits_per_key}")
        self.rows = max(64, capacity_per_file * bits_per_key)
        if self.rows >= 1 << 32:
            raise ValueError(f"{capacity_per_file} entries per file need {self.rows} filter rows; at most 2**32 - 1")
        self._stride = 1  # bytes per row: 8 columns; doubled when they run out
        self._bits = np.zeros((self.rows, self._stride), dtype=np.uint8)
        self._view = memoryview(self._bits).cast("B")
        self._items: list[T | None] = [None] * 8
        self._seq: list[int] = [0] * 8
        self._covered: list[int] = [0] * 8
        self._columns: dict[T, int] = {}  # item (hashed by identity for a file) -> column
        self._next_seq = 0

    # -- membership of files ---------------------------------------------------------------
    def add(self, item: T) -> None:
        """Give `item` (a file, newer than every file added before) an empty column."""
        if item in self._columns:
            return
        try:
            col = self._items.index(None)
        except ValueError:
            col = len(self._items)
            self._grow()
        self._items[col] = item
        self._seq[col] = self._next_seq
        self._covered[col] = 0
        self._next_seq += 1
        self._columns[item] = col

    def remove(self, item: T) -> None:
        """Forget `item`: its column is cleared for the next file."""
        col = self._columns.pop(item, None)
        if col is None:
            return
        self._bits[:, col >> 3] &= np.uint8(0xFF ^ (1 << (col & 7)))
        self._items[col] = None
        self._covered[col] = 0

    def _grow(self) -> None:
        bits = np.zeros((self.rows, self._stride * 2), dtype=np.uint8)
        bits[:, : self._stride] = self._bits
        self._view.release()
        self._bits, self._stride = bits, self._stride * 2
        self._view = memoryview(self._bits).cast("B")
        grown = self._stride * 8 - len(self._items)
        self._items += [None] * grown
        self._seq += [0] * grown
        self._covered += [0] * grown

    # -- keys -----------------------------------------------------------------------------
    def covered(self, item: T) -> int:
        """How many of `item`'s entries (counted from its first) the filter holds."""
        return self._covered[self._columns[item]]

    def add_hashes(self, item: T, hashes: np.ndarray, covered: int) -> None:
        """Set the rows of `hashes` in `item`'s column; the filter then covers `covered` entries."""
        col = self._columns[item]
        if len(hashes):
            bit = np.uint8(1 << (col & 7))
            for r in rows_of(hashes, self.rows):
                self._bits[r, col >> 3] |= bit
        self._covered[col] = covered

    def candidates(self, key_hash: int) -> list[T]:
        """The files that may hold `key_hash`, newest first."""
        p = key_hash * _MULT
        m, s, view, fb = self.rows, self._stride, self._view, int.from_bytes
        # K = 4 rows, unrolled (rows_of's arithmetic): these lines are the filter's whole cost.
        o0 = ((p >> 64 & _M32) * m >> 32) * s
        o1 = ((p >> 128 & _M32) * m >> 32) * s
        o2 = ((p >> 192 & _M32) * m >> 32) * s
        o3 = ((p >> 256 & _M32) * m >> 32) * s
        hit = fb(view[o0:o0 + s], "little") & fb(view[o1:o1 + s], "little") & fb(view[o2:o2 + s], "little") & fb(view[o3:o3 + s], "little")
        if not hit:
            return []
        items = self._items
        if not hit & (hit - 1):
            return [items[hit.bit_length() - 1]]  # type: ignore[list-item]
        cols = []
        while hit:
            top = hit.bit_length() - 1
            cols.append(top)
            hit ^= 1 << top
        seq = self._seq
        cols.sort(key=lambda c: seq[c], reverse=True)
        return [items[c] for c in cols]  # type: ignore[misc]

    def memory_bytes(self) -> int:
        return int(self._bits.nbytes)
