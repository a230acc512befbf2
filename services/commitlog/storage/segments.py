"""CommitLog segment files: fixed-size files named by their 20-digit start offset.

Writes go through `os.pwrite` (one call per batch) and reads through `os.pread`; the page
cache keeps written bytes across a process crash, and `fsync` makes them durable. A record
never spans two segments: when it does not fit (keeping 8 bytes spare) a blank record
closes the segment and the record starts the next one.

A new file is sparse; its blocks are allocated `ALLOCATE_AHEAD` bytes at a time ahead of the
writes (`posix_fallocate`), as RocketMQ allocates its mapped files whole: a buffered write
into allocated blocks skips the filesystem's per-page delayed allocation
(docs/decisions/segment-preallocation.md), and the disk holds
at most that much more than what was written. Where the blocks ahead do not fit (a nearly
full disk) the write goes on without them: only the data written needs room.
"""
from __future__ import annotations

import os
from pathlib import Path

from quarry.formats.segment_walk import list_segments, segment_name

ALLOCATE_AHEAD = 16 << 20


class Segment:
    """One segment file, open for reading (and writing unless read-only)."""

    def __init__(self, path: Path, start: int, size: int, read_only: bool, create: bool = False) -> None:
        self.path = path
        self.start = start
        self.size = size
        self.read_only = read_only
        flags = os.O_RDONLY if read_only else os.O_RDWR
        if create:
            flags |= os.O_CREAT | os.O_EXCL
        self.fd = os.open(path, flags, 0o600)
        if create:
            os.ftruncate(self.fd, size)  # sparse; the size marks the segment's capacity
        self.dirty = False
        self._allocated = 0  # bytes from the file's start this process allocated (ALLOCATE_AHEAD)

    @property
    def end(self) -> int:
        return self.start + self.size

    def write(self, at: int, data: bytes | bytearray | memoryview) -> None:
        """Write `data` at physical offset `at` (inside this segment)."""
        pos = at - self.start
        view = memoryview(data)
        if pos + view.nbytes > self._allocated:
            # Allocating blocks that hold data already changes nothing (no bytes are written).
            upto = min(self.size, max(pos + view.nbytes, self._allocated) + ALLOCATE_AHEAD)
            try:
                os.posix_fallocate(self.fd, pos, upto - pos)
                self._allocated = upto
            except OSError:
                # No room for the blocks ahead (a nearly full disk, a quota) or no allocation
                # here: the write alone says whether the data fits, as before allocating ahead.
                pass
        while view:
            n = os.pwrite(self.fd, view, pos)
            view = view[n:]
            pos += n
        self.dirty = True

    def read(self, at: int, size: int) -> bytes:
        """Up to `size` bytes from physical offset `at`, not past the segment's end."""
        pos = at - self.start
        size = max(0, min(size, self.size - pos))
        return os.pread(self.fd, size, pos)

    def zero_from(self, at: int) -> None:
        """Erase everything from `at` to the end (truncate a torn tail)."""
        pos = at - self.start
        os.ftruncate(self.fd, pos)
        os.ftruncate(self.fd, self.size)
        self._allocated = min(self._allocated, pos)
        self.dirty = True

    def fsync(self) -> None:
        if self.dirty and not self.read_only:
            # Cleared first: a write landing during the sync sets it again for the next round.
            self.dirty = False
            os.fdatasync(self.fd)

    def close(self) -> None:
        try:
            self.fsync()
        finally:
            os.close(self.fd)


class StoreLayoutError(Exception):
    """Segment files a writable store cannot use as they are (the message says which and why)."""


class SegmentQueue:
    """The ordered segments of one CommitLog directory.

    Writable, every file must be named by a multiple of the segment size and be exactly that
    long, as RocketMQ requires; the only file allowed short is the newest (torn by a crash):
    it keeps its nominal size here and recovery re-extends it (`torn` says what was found).
    Anything else stops the store with StoreLayoutError. Read-only stores (e.g. Apache
    RocketMQ directories) take the files as they are.
    """

    def __init__(self, directory: Path, segment_size: int, read_only: bool) -> None:
        self.directory = directory
        self.segment_size = segment_size
        self.read_only = read_only
        self.segments: list[Segment] = []
        self.torn: tuple[int, int] | None = None  # (start, bytes on disk) of a short newest file
        found = list_segments(directory)
        for i, (start, path) in enumerate(found):
            size = path.stat().st_size
            if not read_only:
                size = self._check(path, start, size, last=i == len(found) - 1)
            self.segments.append(Segment(path, start, size, read_only))

    def _check(self, path: Path, start: int, size: int, last: bool) -> int:
        nominal = self.segment_size
        if start % nominal:
            raise StoreLayoutError(f"{path}: segment named {start}, not a multiple of --segment-size {nominal} "
                                   "(a store is opened with the segment size it was written with)")
        if size > nominal or (size < nominal and not last):
            raise StoreLayoutError(f"{path}: {size} bytes, every segment but the newest must be --segment-size {nominal} "
                                   "bytes (a store is opened with the segment size it was written with)")
        if size < nominal:
            self.torn = (start, size)
        return nominal

    def restore_sizes(self) -> None:
        """Give every file its nominal size again (a torn newest one is zero-extended)."""
        for seg in self.segments:
            if not self.read_only and os.fstat(seg.fd).st_size != seg.size:
                os.ftruncate(seg.fd, seg.size)
                seg.dirty = True

    @property
    def min_offset(self) -> int:
        return self.segments[0].start if self.segments else 0

    def find(self, offset: int) -> Segment | None:
        """The segment holding `offset`, or None."""
        lo, hi = 0, len(self.segments) - 1
        while lo <= hi:
            mid = (lo + hi) // 2
            seg = self.segments[mid]
            if offset < seg.start:
                hi = mid - 1
            elif offset >= seg.end:
                lo = mid + 1
            else:
                return seg
        return None

    def segment_at(self, offset: int) -> Segment:
        """The segment holding `offset`; created if none does (a writable store's segments
        start at multiples of the segment size, so the append knows every end in advance)."""
        seg = self.find(offset)
        return seg if seg is not None else self._create(offset - offset % self.segment_size)

    def _create(self, start: int) -> Segment:
        existing = self.find(start)
        if existing is not None:
            return existing
        seg = Segment(self.directory / segment_name(start), start, self.segment_size, False, create=True)
        self.segments.append(seg)
        return seg

    def read(self, offset: int, size: int) -> bytes:
        seg = self.find(offset)
        return seg.read(offset, size) if seg else b""

    def truncate(self, offset: int) -> int:
        """Drop everything at and after `offset`: zero the rest of its segment, delete later
        segments. Returns the number of segments deleted."""
        deleted = 0
        for seg in list(self.segments):
            if seg.start >= offset and not (seg.start == offset and seg is self.segments[0]):
                seg.close()
                os.unlink(seg.path)
                self.segments.remove(seg)
                deleted += 1
            elif seg.start <= offset < seg.end:
                seg.zero_from(offset)
        return deleted

    def fsync_all(self) -> None:
        for seg in self.segments:
            seg.fsync()

    def detach_oldest(self) -> Segment:
        """Take the oldest segment out of the queue; the caller deletes it with `remove`."""
        return self.segments.pop(0)

    @staticmethod
    def remove(seg: Segment) -> None:
        """Close and unlink a detached segment (slow for a large file: done outside the store lock)."""
        seg.close()
        os.unlink(seg.path)

    def close(self) -> None:
        for seg in self.segments:
            seg.close()
        self.segments = []
