"""One RocketMQ IndexFile: a hash table of `topic#key` → physical offsets, memory-mapped.

Layout: a 40-byte header (beginTimestamp, endTimestamp, beginPhyOffset, endPhyOffset i64;
hashSlotCount, indexCount i32), `slots` 4-byte slots holding the newest entry number of each
slot, then `index_num` 20-byte entries (keyHash i32, phyOffset i64, timeDiff i32 seconds
since beginTimestamp, prevIndex i32). Entries are numbered from 1, so a file holds
index_num - 1 of them. Putting and selecting follow RocketMQ 4.x exactly, quirks included
(see tests/golden/README.md): the golden images are the arbiter.
"""
from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

from quarry.formats.java_hash import index_key_hash

HEADER_SIZE = 40
SLOT_SIZE = 4
ENTRY_SIZE = 20
INT_MAX = 2**31 - 1

_HEADER = struct.Struct(">qqqqii")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
_ENTRY = struct.Struct(">iqii")


class IndexFileError(ValueError):
    """An IndexFile that cannot be opened as asked (wrong size, corrupt header)."""


@dataclass
class IndexHeader:
    begin_timestamp: int = 0
    end_timestamp: int = 0
    begin_phy_offset: int = 0
    end_phy_offset: int = 0
    hash_slot_count: int = 0
    index_count: int = 1  # in memory it starts at 1; disk shows 0 until the first write or flush


def file_size(slots: int, index_num: int) -> int:
    return HEADER_SIZE + SLOT_SIZE * slots + ENTRY_SIZE * index_num


class IndexFile:
    """A single IndexFile. Not thread-safe: the caller serialises puts and selects."""

    def __init__(self, path: str | os.PathLike[str], slots: int, index_num: int, end_phy_offset: int = 0, end_timestamp: int = 0, *, read_only: bool = False, create: bool = True) -> None:
        """Open `path`, creating it (sparse) when absent and create=True.

        A new file continues from `end_phy_offset`/`end_timestamp` (the previous file's end),
        as RocketMQ's IndexService does when a file fills up.
        """
        if slots <= 0 or index_num <= 1:
            raise IndexFileError(f"slots must be > 0 and index_num > 1, got {slots}, {index_num}")
        self.path = Path(path)
        self.slots = slots
        self.index_num = index_num
        self.read_only = read_only
        self.size = file_size(slots, index_num)
        self.entries_pos = HEADER_SIZE + SLOT_SIZE * slots
        existed = self.path.exists()
        if not existed and (read_only or not create):
            raise IndexFileError(f"{self.path}: no such index file")
        if existed:
            actual = self.path.stat().st_size
            if actual != self.size:
                raise IndexFileError(f"{self.path}: size {actual} != {self.size} expected for {slots} slots and {index_num} entries")
        self._fh = open(self.path, "rb" if read_only else ("r+b" if existed else "w+b"))
        try:
            if not existed:
                self._fh.truncate(self.size)  # sparse: untouched pages take no disk
            self._mm = mmap.mmap(self._fh.fileno(), self.size, access=mmap.ACCESS_READ if read_only else mmap.ACCESS_WRITE)
        except Exception:
            self._fh.close()
            raise
        self.header = IndexHeader()
        if existed:
            self._load_header()
        else:
            if end_phy_offset > 0:
                self.header.begin_phy_offset = self.header.end_phy_offset = end_phy_offset
                self._write_header_fields()
            if end_timestamp > 0:
                self.header.begin_timestamp = self.header.end_timestamp = end_timestamp
                self._write_header_fields()

    # -- header ---------------------------------------------------------------------------
    def _load_header(self) -> None:
        bt, et, bp, ep, hsc, ic = _HEADER.unpack_from(self._mm, 0)
        self.header = IndexHeader(bt, et, bp, ep, hsc, ic)

    def reload_header(self) -> None:
        """Read the header again: another process (a RocketMQ broker) writes this file."""
        self._load_header()

    def _write_header_fields(self) -> None:
        h = self.header
        # indexCount is written only once it moved past its initial in-memory 1, as RocketMQ does.
        on_disk_count = _I32.unpack_from(self._mm, 36)[0]
        _HEADER.pack_into(self._mm, 0, h.begin_timestamp, h.end_timestamp, h.begin_phy_offset, h.end_phy_offset, h.hash_slot_count, on_disk_count)

    def header_problems(self) -> list[str]:
        """Inconsistencies in the header that make the file untrustworthy (empty when sound)."""
        h = self.header
        problems = []
        if not 0 <= h.index_count <= self.index_num:
            problems.append(f"indexCount {h.index_count} outside 0..{self.index_num}")
        if not 0 <= h.hash_slot_count <= self.slots:
            problems.append(f"hashSlotCount {h.hash_slot_count} outside 0..{self.slots}")
        if h.index_count > 1 and h.hash_slot_count > h.index_count - 1:
            problems.append(f"hashSlotCount {h.hash_slot_count} exceeds entries {h.index_count - 1}")
        if h.begin_phy_offset < 0 or h.end_phy_offset < h.begin_phy_offset:
            problems.append(f"phy offsets {h.begin_phy_offset}..{h.end_phy_offset} out of order")
        if h.begin_timestamp < 0 or h.end_timestamp < 0:
            problems.append("negative timestamps")
        return problems

    @property
    def entries(self) -> int:
        """Entries written (entry 0 is never used)."""
        return max(0, self.header.index_count - 1)

    def is_write_full(self) -> bool:
        return self.header.index_count >= self.index_num

    # -- put ------------------------------------------------------------------------------
    def put_key(self, key: str, phy_offset: int, store_timestamp: int) -> bool:
        """Index `key` at `phy_offset`; False (nothing written) when the file is full."""
        return self.put_keys([(key, phy_offset, store_timestamp)]) == 1

    def put_keys(self, items: Sequence[tuple[str | int, int, int]]) -> int:
        """put_key for each (key, phy_offset, store_timestamp) in order; returns how many fit.

        A key may be given as its index key hash (an int) when the caller computed it.

        The file's bytes after the call equal those after the same put_key calls; the header
        is written once at the end instead of after every entry (the indexer's batch path).
        """
        if self.read_only:
            raise IndexFileError(f"{self.path}: opened read-only")
        h = self.header
        mm, slots, entries_pos, capacity = self._mm, self.slots, self.entries_pos, self.index_num
        pack_entry, unpack_i32, pack_i32 = _ENTRY.pack_into, _I32.unpack_from, _I32.pack_into
        count = h.index_count
        done = 0
        for key, phy_offset, store_timestamp in items:
            if count >= capacity:
                break
            key_hash = key if isinstance(key, int) else index_key_hash(key)
            slot_pos = HEADER_SIZE + (key_hash % slots) * SLOT_SIZE
            slot_value = unpack_i32(mm, slot_pos)[0]
            if slot_value <= 0 or slot_value > count:
                slot_value = 0
            if h.begin_timestamp <= 0:
                time_diff = 0
            else:
                diff = store_timestamp - h.begin_timestamp
                time_diff = 0 if diff < 0 else min(diff // 1000, INT_MAX)
            pack_entry(mm, entries_pos + count * ENTRY_SIZE, key_hash, phy_offset, time_diff, slot_value)
            pack_i32(mm, slot_pos, count)
            if count <= 1:
                h.begin_phy_offset = phy_offset
                h.begin_timestamp = store_timestamp
            if slot_value == 0:
                h.hash_slot_count += 1
            count += 1
            h.end_phy_offset = phy_offset
            h.end_timestamp = store_timestamp
            done += 1
        h.index_count = count
        if done:
            _HEADER.pack_into(mm, 0, h.begin_timestamp, h.end_timestamp, h.begin_phy_offset, h.end_phy_offset, h.hash_slot_count, h.index_count)
        return done

    # -- select ---------------------------------------------------------------------------
    def select_phy_offsets(self, key: str | int, max_num: int, begin: int, end: int, into: list[int] | None = None, below: int | None = None) -> list[int]:
        """Offsets indexed under `key` with time in [begin, end], newest first, up to max_num
        (counting what `into` already holds). Equal-hash keys are all returned.

        A key may be given as its index key hash (an int): a caller asking many files hashes once.
        `below` (not in RocketMQ) skips offsets >= below without counting them: it lets a
        caller page through a key's entries.
        """
        out = into if into is not None else []
        h = self.header
        count = h.index_count
        mm = self._mm
        key_hash = key if isinstance(key, int) else index_key_hash(key)
        slot_value = _I32.unpack_from(mm, HEADER_SIZE + (key_hash % self.slots) * SLOT_SIZE)[0]
        last_entry = self.index_num - 1  # beyond the file: only a corrupt header points there
        if slot_value <= 0 or slot_value > count or count <= 1 or slot_value > last_entry:
            return out
        current = slot_value
        # A sound chain visits each entry at most once; a corrupt one may loop (RocketMQ only
        # guards prev == current), so the walk is bounded by the entry count.
        steps = min(count, last_entry)
        while len(out) < max_num and steps > 0:
            steps -= 1
            hash_read, phy_read, diff, prev = _ENTRY.unpack_from(mm, self.entries_pos + current * ENTRY_SIZE)
            if diff < 0:
                break
            time_read = h.begin_timestamp + diff * 1000
            if hash_read == key_hash and begin <= time_read <= end and (below is None or phy_read < below):
                out.append(phy_read)
            if prev <= 0 or prev > count or prev == current or time_read < begin or prev > last_entry:
                break
            current = prev
        return out

    def entry(self, number: int) -> tuple[int, int, int]:
        """(keyHash, phyOffset, entry time in ms: its record's store time, to the second, or
        exactly for entry 1) of entry `number` (1..entries)."""
        if not 1 <= number <= self.entries:
            raise IndexFileError(f"{self.path}: entry {number} outside 1..{self.entries}")
        key_hash, phy, diff, _prev = _ENTRY.unpack_from(self._mm, self.entries_pos + number * ENTRY_SIZE)
        if number == 1:
            # The first put's timeDiff counts from the beginTimestamp the file had before it
            # (a continuing file's: the previous file's end), which that put then replaced by
            # its record's own store time: the header holds entry 1's exact time.
            return key_hash, phy, self.header.begin_timestamp
        return key_hash, phy, self.header.begin_timestamp + diff * 1000

    def last_entry_at_or_below(self, phy_offset: int) -> int:
        """The number of the last entry whose phyOffset is <= `phy_offset` (0 when none): entries
        are written in log order, so this is a binary search."""
        lo, hi = 0, self.entries  # entry lo is at or below (0: virtual), entries above hi are not
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if _I64.unpack_from(self._mm, self.entries_pos + mid * ENTRY_SIZE + 4)[0] <= phy_offset:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def truncate_entries(self, keep: int, end_timestamp: int) -> int:
        """Drop every entry after entry `keep` (the log they point into was cut below them) and
        return how many were dropped. Each dropped entry's slot falls back along its chain to
        the newest kept entry, so the file reads as if the dropped puts never happened; the
        header ends at entry `keep`, stored at `end_timestamp` (its record's own time)."""
        if self.read_only:
            raise IndexFileError(f"{self.path}: opened read-only")
        count = self.header.index_count
        keep = max(0, min(keep, count - 1))
        mm = self._mm
        for number in range(count - 1, keep, -1):  # newest first: a slot's head is always the newest
            key_hash, _phy, _diff, prev = _ENTRY.unpack_from(mm, self.entries_pos + number * ENTRY_SIZE)
            slot_pos = HEADER_SIZE + (key_hash % self.slots) * SLOT_SIZE
            if _I32.unpack_from(mm, slot_pos)[0] == number:
                head = prev if 0 < prev < number else 0
                _I32.pack_into(mm, slot_pos, head)
                if head == 0:
                    self.header.hash_slot_count = max(0, self.header.hash_slot_count - 1)
            mm[self.entries_pos + number * ENTRY_SIZE: self.entries_pos + (number + 1) * ENTRY_SIZE] = bytes(ENTRY_SIZE)
        h = self.header
        h.index_count = keep + 1
        if keep:
            h.end_phy_offset = _I64.unpack_from(mm, self.entries_pos + keep * ENTRY_SIZE + 4)[0]
            h.end_timestamp = end_timestamp
        else:  # empty again: the next put sets the beginning afresh
            h.end_phy_offset, h.end_timestamp = h.begin_phy_offset, h.begin_timestamp
        self.write_header()
        return count - 1 - keep

    @staticmethod
    def entry_time_window(begin: int, end: int) -> tuple[int, int]:
        """The entry times (as select reads them) that can hold store times in [begin, end].

        An entry keeps whole seconds since the file's beginTimestamp, so its time reads up to
        999 ms earlier than the store time: a select over [begin - 999, end] misses nothing,
        and the caller checks each record's own store time to drop the extra ones.
        """
        return max(0, begin - 999), end

    def is_time_matched(self, begin: int, end: int) -> bool:
        """True when [begin, end] meets the file's time range (RocketMQ's test)."""
        fb, fe = self.header.begin_timestamp, self.header.end_timestamp
        return (begin < fb and end > fe) or fb <= begin <= fe or fb <= end <= fe

    def key_hash_chunks(self, first: int, stop: int, chunk: int = 1 << 16) -> "Iterator[np.ndarray]":
        """The keyHash of entries first..stop-1 (entry numbers, from 1), `chunk` at a time, read
        through a descriptor of its own: what an in-memory summary of the file is built from,
        outside the caller's lock (the mapping may be closed meanwhile; a deleted file's
        descriptor still reads, and the caller drops what it built). IndexFileError when the
        file holds fewer entries than asked."""
        first, stop = max(1, first), min(stop, self.index_num)
        if stop <= first:
            return
        with open(self.path, "rb", buffering=0) as fh:
            buf = bytearray(chunk * ENTRY_SIZE)
            for start in range(first, stop, chunk):
                n = min(chunk, stop - start)
                got = os.preadv(fh.fileno(), [memoryview(buf)[: n * ENTRY_SIZE]], self.entries_pos + start * ENTRY_SIZE)
                if got < n * ENTRY_SIZE:
                    # A summary missing entries would hide them from queries: refuse instead.
                    raise IndexFileError(f"{self.path}: entries {start}..{start + n - 1} cut short ({got} of {n * ENTRY_SIZE} bytes)")
                # keyHash is the first 4 bytes (big-endian) of each 20-byte entry.
                yield np.ndarray((n,), dtype=">i4", buffer=buf, strides=(ENTRY_SIZE,)).astype(np.int64)

    # -- life cycle -----------------------------------------------------------------------
    def flush(self) -> None:
        """Write the whole header (indexCount included) and force the mapping to disk."""
        self.write_header()
        self.sync()

    def write_header(self) -> None:
        """Write the whole header (indexCount included) into the mapping (no disk I/O)."""
        if self.read_only:
            return
        h = self.header
        _HEADER.pack_into(self._mm, 0, h.begin_timestamp, h.end_timestamp, h.begin_phy_offset, h.end_phy_offset, h.hash_slot_count, h.index_count)

    def sync(self) -> None:
        """Force what the mapping holds to disk. fsync of the file, not mmap.flush: on Linux
        both write a shared mapping's dirty pages, but mmap.flush holds the GIL for the whole
        msync (~0.25 s per 400 MB dirty, the process stalled), fsync lets other threads run."""
        if self.read_only:
            return
        try:
            fd = self._fh.fileno()
        except ValueError:  # closed meanwhile (a stop): the closer flushed it
            return
        os.fsync(fd)

    def close(self) -> None:
        if not self._mm.closed:
            self._mm.close()
        self._fh.close()
