"""ConsumeQueues: `consumequeue/<topic>/<queueId>/<20-digit start>` files of 20-byte units.

Unit n of a queue (its queue offset n) sits at byte n*20 of the queue's concatenated files,
as RocketMQ lays them out. A unit of size 0 is unwritten space.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable

from quarry.formats.consume_queue import CQ_UNIT, CQ_UNIT_SIZE
from quarry.formats.segment_walk import list_segments, segment_name


class ConsumeQueue:
    """One topic/queue's units."""

    def __init__(self, directory: Path, units_per_file: int, read_only: bool) -> None:
        self.directory = directory
        self.file_size = units_per_file * CQ_UNIT_SIZE
        self.read_only = read_only
        self.fds: dict[int, int] = {}
        self.dirty: set[int] = set()
        for start, path in list_segments(directory):
            self.fds[start] = os.open(path, os.O_RDONLY if read_only else os.O_RDWR)
        self.min_offset = (min(self.fds) // CQ_UNIT_SIZE) if self.fds else 0
        self.max_offset = self._scan_max()

    def _scan_max(self) -> int:
        """One past the last written unit (scans the newest file backwards)."""
        for start in sorted(self.fds, reverse=True):
            data = os.pread(self.fds[start], self.file_size, 0)
            n = len(data) // CQ_UNIT_SIZE
            for i in range(n - 1, -1, -1):
                if CQ_UNIT.unpack_from(data, i * CQ_UNIT_SIZE)[1] != 0:
                    return (start // CQ_UNIT_SIZE) + i + 1
        return self.min_offset

    def _fd(self, start: int, create: bool) -> int | None:
        fd = self.fds.get(start)
        if fd is None and create:
            self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd = os.open(self.directory / segment_name(start), os.O_RDWR | os.O_CREAT, 0o600)
            os.ftruncate(fd, self.file_size)
            self.fds[start] = fd
        return fd

    def write_units(self, queue_offset: int, units: bytes) -> None:
        """Write consecutive units starting at queue_offset."""
        pos = queue_offset * CQ_UNIT_SIZE
        start = pos - pos % self.file_size
        fd = self.fds.get(start)
        if fd is not None and pos - start + len(units) <= self.file_size:  # the usual case: one file, open
            os.pwrite(fd, units, pos - start)
            self.dirty.add(start)
            end = queue_offset + len(units) // CQ_UNIT_SIZE
            if end > self.max_offset:
                self.max_offset = end
            return
        view = memoryview(units)
        while view:
            start = pos - pos % self.file_size
            fd = self._fd(start, create=True)
            assert fd is not None
            chunk = view[: self.file_size - (pos - start)]
            os.pwrite(fd, chunk, pos - start)
            self.dirty.add(start)
            view = view[len(chunk):]
            pos += len(chunk)
            # Raised chunk by chunk: when a later file cannot be made or written (disk full),
            # the units already on disk are below max_offset, where truncate_from_phy (the
            # append's rollback) looks for them.
            self.max_offset = max(self.max_offset, pos // CQ_UNIT_SIZE)

    def read_units(self, queue_offset: int, count: int) -> list[tuple[int, int, int]]:
        """Up to `count` (phyOffset, size, tagsCode) units from queue_offset, stopping at a hole."""
        out: list[tuple[int, int, int]] = []
        pos = queue_offset * CQ_UNIT_SIZE
        end = min(self.max_offset, queue_offset + count) * CQ_UNIT_SIZE
        while pos < end:
            start = pos - pos % self.file_size
            fd = self._fd(start, create=False)
            if fd is None:
                break
            data = os.pread(fd, min(end - pos, self.file_size - (pos - start)), pos - start)
            for i in range(0, len(data) - CQ_UNIT_SIZE + 1, CQ_UNIT_SIZE):
                unit = CQ_UNIT.unpack_from(data, i)
                if unit[1] == 0:
                    return out
                out.append(unit)
            if not data:
                break
            pos += len(data)
        return out

    def truncate_from_phy(self, phy_offset: int) -> None:
        """Erase units pointing at or past phy_offset (the log was truncated there)."""
        offset = self.max_offset
        while offset > self.min_offset:
            unit = self.read_units(offset - 1, 1)
            if unit and unit[0][0] < phy_offset:
                break
            offset -= 1
        if offset < self.max_offset:
            self._zero(offset, self.max_offset)
            self.max_offset = offset

    def _zero(self, first: int, end: int) -> None:
        blank = bytes(CQ_UNIT_SIZE)
        for q in range(first, end):
            pos = q * CQ_UNIT_SIZE
            start = pos - pos % self.file_size
            fd = self._fd(start, create=False)
            if fd is not None:
                os.pwrite(fd, blank, pos - start)
                self.dirty.add(start)

    def take_dirty(self) -> list[int]:
        """File descriptors written since the last call (to fsync outside the store lock)."""
        fds = [self.fds[start] for start in self.dirty]
        self.dirty.clear()
        return fds

    def flush(self) -> None:
        for fd in self.take_dirty():
            os.fdatasync(fd)

    def close(self) -> None:
        if not self.read_only:
            self.flush()
        for fd in self.fds.values():
            os.close(fd)
        self.fds.clear()


class MemoryConsumeQueue:
    """One queue's units held in memory only: rebuilt from the CommitLog of a read-only store
    that has no `consumequeue/` (a dead broker's copied log), so nothing is written to it."""

    def __init__(self) -> None:
        self.units = bytearray()
        self.min_offset = 0  # queue offset of the first unit held
        self.max_offset = 0

    def write_units(self, queue_offset: int, units: bytes) -> None:
        if not self.units:
            self.min_offset = self.max_offset = queue_offset
        if queue_offset < self.min_offset:  # out of log order (a damaged log): keep every unit
            self.units[0:0] = bytes((self.min_offset - queue_offset) * CQ_UNIT_SIZE)
            self.min_offset = queue_offset
        pos = (queue_offset - self.min_offset) * CQ_UNIT_SIZE
        if pos > len(self.units):
            self.units.extend(bytes(pos - len(self.units)))  # a hole reads as unwritten
        self.units[pos:pos + len(units)] = units
        self.max_offset = self.min_offset + len(self.units) // CQ_UNIT_SIZE

    def read_units(self, queue_offset: int, count: int) -> list[tuple[int, int, int]]:
        out: list[tuple[int, int, int]] = []
        first = max(queue_offset, self.min_offset)
        if first != queue_offset:
            return out  # below the first unit held: expired, as a file queue answers
        for q in range(first, min(self.max_offset, queue_offset + count)):
            unit = CQ_UNIT.unpack_from(self.units, (q - self.min_offset) * CQ_UNIT_SIZE)
            if unit[1] == 0:
                break
            out.append(unit)
        return out

    def truncate_from_phy(self, phy_offset: int) -> None:
        while self.max_offset > self.min_offset:
            unit = self.read_units(self.max_offset - 1, 1)
            if unit and unit[0][0] < phy_offset:
                break
            self.max_offset -= 1
            del self.units[-CQ_UNIT_SIZE:]

    def drop_below_phy(self, phy_offset: int) -> None:
        """Forget the units of records below phy_offset (their segments were deleted): the
        queue's minimum moves as RocketMQ's does when its CommitLog expires."""
        cut = 0
        while cut < len(self.units) and CQ_UNIT.unpack_from(self.units, cut)[0] < phy_offset:
            cut += CQ_UNIT_SIZE
        if cut:
            del self.units[:cut]
            self.min_offset += cut // CQ_UNIT_SIZE

    def take_dirty(self) -> list[int]:
        return []

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.units = bytearray()


class ConsumeQueueStore:
    """Every queue under one `consumequeue/` directory, opened on first use; or, `in_memory`,
    queues that exist only in memory (filled by recovery from the CommitLog)."""

    def __init__(self, root: Path, units_per_file: int, read_only: bool, in_memory: bool = False,
                 make_queue: Callable[[Path], Any] | None = None) -> None:
        self.root = root
        self.make_queue = make_queue  # another kind of queue over root/topic/queueId (follow mode)
        self.units_per_file = units_per_file
        self.read_only = read_only
        self.in_memory = in_memory
        self.queues: dict[tuple[str, int], ConsumeQueue | MemoryConsumeQueue] = {}
        if root.is_dir() and not in_memory:
            for topic_dir in sorted(root.iterdir()):
                if not topic_dir.is_dir():
                    continue
                for qdir in sorted(topic_dir.iterdir()):
                    if qdir.is_dir() and qdir.name.isdigit():
                        self.queue(topic_dir.name, int(qdir.name))

    def queue(self, topic: str, queue_id: int) -> ConsumeQueue | MemoryConsumeQueue:
        key = (topic, queue_id)
        cq = self.queues.get(key)
        if cq is None:
            directory = self.root / topic / str(queue_id)
            if self.make_queue is not None:
                cq = self.make_queue(directory)
            else:
                cq = MemoryConsumeQueue() if self.in_memory else ConsumeQueue(directory, self.units_per_file, self.read_only)
            self.queues[key] = cq
        return cq

    def existing(self, topic: str, queue_id: int) -> ConsumeQueue | MemoryConsumeQueue | None:
        return self.queues.get((topic, queue_id))

    def take_dirty(self) -> list[int]:
        """Every queue file written since the last call; the caller fsyncs them."""
        return [fd for cq in self.queues.values() for fd in cq.take_dirty()]

    def flush(self) -> None:
        for fd in self.take_dirty():
            os.fdatasync(fd)

    def close(self) -> None:
        for cq in self.queues.values():
            cq.close()
        self.queues.clear()
