"""Which IndexFiles may hold a key hash: one Bloom filter per sealed file, stacked bit-sliced
so a single probe tests every file at once.

A broker keeps many IndexFiles (a thousand at RocketMQ's rates over days), and RocketMQ's
proportions (4 entries per slot) leave no slot empty, so asking each file costs a chain
walk per file. Here every filtered file owns one column of a bit matrix whose rows are
Bloom positions: a key hash sets `K` rows in its file's column, and the AND of those `K`
rows (each read as one integer over all columns) names the files that may hold it. The
probe costs the same for 1 or 1,000 files; only candidates are walked, and the walk decides
(a Bloom filter has false positives, never false negatives), so answers stay exact.

Memory follows what is filtered, not what could be: only sealed files get a column (the
index store walks the file still being written and files whose column is not built yet),
and a row holds as many bits as there are columns, rounded up to 1, 2, 4, then to whole
bytes growing by an eighth. So the cost is `BITS_PER_KEY` bits per entry a sealed file
holds (2.86 MiB per million), at most 2x that below 64 files and 1.125x beyond, and nothing
while no file is sealed. The rows are cut into blocks of `BLOCK_ROWS`, widened one block at
a time, so growing costs one block of extra memory, never a second matrix.

Threads: `reserve`, `publish`, `release` and `candidates` run under the caller's lock;
`build` (the expensive part) runs outside it in one builder thread at a time. It only writes
a column not yet published (probes mask columns by `_live`) and swaps whole blocks, each
read by a probe as one (bytes, width) pair, so a probe never sees a torn layout.
"""
from __future__ import annotations

from typing import Generic, Iterable, TypeVar

import numpy as np

T = TypeVar("T")

# 24 bits and 4 rows per key: about 1 false candidate in 1,800 files per probe (a wasted
# chain walk of a few µs), 3 bytes of memory per entry of a sealed file.
BITS_PER_KEY = 24
K = 4
BLOCK_SHIFT = 18
BLOCK_ROWS = 1 << BLOCK_SHIFT  # a multiple of 8: a block starts on a byte of a column's bits
_BLOCK_MASK = BLOCK_ROWS - 1
_FLAG_ROWS = 1 << 25  # a build sets its rows in a byte per row up to this many rows
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


def next_width(width: int, columns: int) -> int:
    """Bits per row holding `columns`: 1, 2, 4, 8, then whole bytes growing by an eighth
    (at most 2x the columns below 64, 1.125x beyond; widening is amortised)."""
    while width < columns:
        width = 1 if width == 0 else width * 2 if width < 8 else width + 8 * max(1, width // 64)
    return width


class StackedKeyFilter(Generic[T]):
    """Bloom filters of many files, one column each (see the module doc for threads)."""

    def __init__(self, capacity_per_file: int, bits_per_key: int = BITS_PER_KEY) -> None:
        if capacity_per_file <= 0 or bits_per_key <= 0:
            raise ValueError(f"capacity_per_file and bits_per_key must be > 0, got {capacity_per_file}, {bits_per_key}")
        self.rows = max(64, capacity_per_file * bits_per_key)
        if self.rows >= 1 << 32:
            raise ValueError(f"{capacity_per_file} entries per file need {self.rows} filter rows; at most 2**32 - 1")
        self.width = 0  # bits per row of every block once widening is done; 0: no memory yet
        n_blocks = (self.rows + BLOCK_ROWS - 1) // BLOCK_ROWS
        self._sizes = [min(BLOCK_ROWS, self.rows - b * BLOCK_ROWS) for b in range(n_blocks)]
        self._arrays: list[np.ndarray] = []
        self._blocks: list[tuple[memoryview, int]] = []  # per block: its bytes, its width
        self._items: list[T | None] = []  # column -> published item
        self._seq: list[int] = []
        self._free: list[int] = []  # released columns (their bits are cleared before reuse)
        self._dirty: set[int] = set()
        self._live = 0  # bit c set: column c is published

    # -- columns (under the caller's lock) ------------------------------------------------
    def reserve(self) -> int:
        """A column for a file about to be built; not seen by probes until `publish`."""
        if self._free:
            return self._free.pop()
        self._items.append(None)
        self._seq.append(0)
        return len(self._items) - 1

    def publish(self, col: int, item: T, seq: int) -> None:
        """Probes name `item` (ordered by `seq`, higher is newer) where `col` is set."""
        self._items[col], self._seq[col] = item, seq
        self._live |= 1 << col

    def release(self, col: int) -> None:
        """Forget `col`'s file (published or not); its bits are cleared before reuse."""
        self._live &= ~(1 << col)
        self._items[col] = None
        self._dirty.add(col)
        self._free.append(col)

    @property
    def published(self) -> int:
        return bin(self._live).count("1")

    # -- bits (one builder thread, outside the lock) --------------------------------------
    def build(self, col: int, hash_chunks: Iterable[np.ndarray]) -> None:
        """Set the rows of every key hash in `hash_chunks` in column `col` (reserved)."""
        if col >= self.width:
            self._widen(next_width(self.width, col + 1))
        if col in self._dirty:
            self._each_column_slice(col, lambda old, _bits: old & 0)
            self._dirty.discard(col)
        # The column's bits first (one file's share of the matrix), then spread into the
        # matrix block by block with sequential writes.
        if self.rows <= _FLAG_ROWS:
            # One byte per row (at most 32 MiB): a plain fancy store, much faster than below
            # (docs/decisions/numpy-key-filters.md).
            flags = np.zeros(self.rows, dtype=np.bool_)
            for hashes in hash_chunks:
                for rows in rows_of(hashes, self.rows):
                    flags[rows] = True
            colbits = np.packbits(flags, bitorder="little")
            del flags
        else:
            colbits = np.zeros((self.rows + 7) // 8, dtype=np.uint8)
            for hashes in hash_chunks:
                if not len(hashes):
                    continue
                rows = np.concatenate(rows_of(hashes, self.rows))
                low = (rows & 7).astype(np.uint8)
                # One pass per bit of a byte: within a pass every write to a byte sets the same
                # bit, so repeated bytes in the fancy index lose nothing (ufunc.at is far slower).
                for bit in range(8):
                    colbits[rows[low == bit] >> 3] |= np.uint8(1 << bit)
        self._each_column_slice(col, lambda old, bits: old | bits, colbits)

    def _each_column_slice(self, col: int, combine, colbits: np.ndarray | None = None) -> None:  # type: ignore[no-untyped-def]
        """Replace column `col` of every block by combine(old column bits, new bits)."""
        for b, nb in enumerate(self._sizes):
            arr, w = self._arrays[b], self.width
            bits = np.zeros(nb, dtype=np.uint8) if colbits is None else np.unpackbits(colbits[b * BLOCK_ROWS // 8:(b * BLOCK_ROWS + nb + 7) // 8], bitorder="little")[:nb]
            if w >= 8:
                view = arr.reshape(nb, w // 8)[:, col >> 3]  # a strided view: written in place
                shift = np.uint8(col & 7)
                view[:] = (view & np.uint8(0xFF ^ (1 << (col & 7)))) | (combine((view >> shift) & np.uint8(1), bits) << shift)
            else:
                grid = np.unpackbits(arr, bitorder="little")[: nb * w].reshape(nb, w)
                grid[:, col] = combine(grid[:, col], bits)
                arr[:] = np.packbits(grid.reshape(-1), bitorder="little")

    def _widen(self, width: int) -> None:
        """Every block to `width` bits per row, one block at a time (a probe reads each block
        with its own width, so a half-widened matrix answers the same)."""
        old_w = self.width
        for b, nb in enumerate(self._sizes):
            new = np.zeros((nb * width + 7) // 8, dtype=np.uint8)
            if old_w >= 8:
                new.reshape(nb, width // 8)[:, : old_w // 8] = self._arrays[b].reshape(nb, old_w // 8)
            elif old_w:
                grid = np.zeros((nb, width), dtype=np.uint8)
                grid[:, :old_w] = np.unpackbits(self._arrays[b], bitorder="little")[: nb * old_w].reshape(nb, old_w)
                new[:] = np.packbits(grid.reshape(-1), bitorder="little")
            block = (new.data.cast("B"), width)
            if b < len(self._arrays):
                self._arrays[b], self._blocks[b] = new, block
            else:
                self._arrays.append(new)
                self._blocks.append(block)
        self.width = width

    # -- probe (under the caller's lock) --------------------------------------------------
    def candidates(self, key_hash: int) -> list[T]:
        """The published files that may hold `key_hash`, newest first."""
        live = self._live
        if not live:
            return []
        p = key_hash * _MULT
        m, blocks, fb = self.rows, self._blocks, int.from_bytes
        hit = live
        # K = 4 rows (rows_of's arithmetic), each read as one integer over the columns.
        for r in ((p >> 64 & _M32) * m >> 32, (p >> 128 & _M32) * m >> 32, (p >> 192 & _M32) * m >> 32, (p >> 256 & _M32) * m >> 32):
            view, w = blocks[r >> BLOCK_SHIFT]
            i = (r & _BLOCK_MASK) * w
            hit &= fb(view[i >> 3:(i + w) >> 3], "little") if w >= 8 else view[i >> 3] >> (i & 7)
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
        return sum(int(a.nbytes) for a in self._arrays)
