"""A ConsumeQueue of a followed store (--follow): the writer's own files, read-only, plus in
memory what they lack.

A RocketMQ broker writes `consumequeue/<topic>/<queueId>/` itself, a little after each record
(its dispatch runs behind the CommitLog), and deletes old files when the CommitLog expires.
Units below the files' end are read from the files; the follower queues every record it
reads from the CommitLog, and the units the files do not hold yet (the files are behind, or
the queue has no files at all) are kept in memory until the files catch up. Nothing is
handed out past the records the follower has read, so a unit never points past the end of
the log as Quarry sees it. Files are opened O_RDONLY; none is ever created.
"""
from __future__ import annotations

import os
from pathlib import Path

from quarry.formats.consume_queue import CQ_UNIT, CQ_UNIT_SIZE
from quarry.formats.segment_walk import list_segments
from quarry.services.commitlog.consume_queue_store import ConsumeQueue, MemoryConsumeQueue

SCAN_UNITS = 4096  # units read at a time when looking for the files' new end


class _WritersFiles(ConsumeQueue):
    """The writer's files, read-only; their end found by bisecting the newest file (the writer
    fills each file from its start), not by reading every unit of it."""

    def _scan_max(self) -> int:
        for start in sorted(self.fds, reverse=True):
            n = os.fstat(self.fds[start]).st_size // CQ_UNIT_SIZE
            lo, hi = 0, n  # units [0, lo) written, [hi, n) unwritten
            while lo < hi:
                mid = (lo + hi) // 2
                unit = os.pread(self.fds[start], CQ_UNIT_SIZE, mid * CQ_UNIT_SIZE)
                if len(unit) == CQ_UNIT_SIZE and CQ_UNIT.unpack_from(unit, 0)[1] != 0:
                    lo = mid + 1
                else:
                    hi = mid
            if lo:
                return start // CQ_UNIT_SIZE + lo
        return self.min_offset


class FollowedConsumeQueue:
    def __init__(self, directory: Path, units_per_file: int) -> None:
        self.files = _WritersFiles(directory, units_per_file, read_only=True)
        self.memory = MemoryConsumeQueue()
        self.seen = 0  # one past the highest queue offset the follower has read in the CommitLog
        self._retired: list[int] = []  # descriptors of deleted files, closed one refresh later

    # -- what readers see ---------------------------------------------------------------------
    @property
    def min_offset(self) -> int:
        if self.files.fds:
            return self.files.min_offset
        return self.memory.min_offset if self.memory.units else self.seen

    @property
    def max_offset(self) -> int:
        return min(self.seen, max(self.files.max_offset, self.memory.max_offset))

    def read_units(self, queue_offset: int, count: int) -> list[tuple[int, int, int]]:
        count = max(0, min(count, self.max_offset - queue_offset))
        out: list[tuple[int, int, int]] = []
        if queue_offset < self.files.max_offset:
            out = self.files.read_units(queue_offset, min(count, self.files.max_offset - queue_offset))
            if len(out) < min(count, self.files.max_offset - queue_offset):
                return out  # a hole in the writer's files: stop there, as a file queue does
        rest = count - len(out)
        if rest > 0:
            out.extend(self.memory.read_units(queue_offset + len(out), rest))
        return out

    # -- what the follower does -----------------------------------------------------------------
    def write_units(self, queue_offset: int, units: bytes) -> None:
        """Units of records just read from the CommitLog: kept unless the files hold them."""
        n = len(units) // CQ_UNIT_SIZE
        self.seen = max(self.seen, queue_offset + n)
        skip = max(0, min(n, self.files.max_offset - queue_offset))
        if skip < n:
            self.memory.write_units(queue_offset + skip, units[skip * CQ_UNIT_SIZE:])

    def refresh(self) -> None:
        """Pick up the writer's new files and units, let go of deleted files, and drop the
        memory units the files now hold."""
        for fd in self._retired:
            os.close(fd)
        self._retired = []
        files = self.files
        on_disk = dict(list_segments(files.directory))
        for start in [s for s in files.fds if s not in on_disk]:
            self._retired.append(files.fds.pop(start))
        for start, path in on_disk.items():
            if start not in files.fds:
                try:
                    files.fds[start] = os.open(path, os.O_RDONLY)
                except FileNotFoundError:
                    continue
        files.min_offset = (min(files.fds) // CQ_UNIT_SIZE) if files.fds else 0
        files.max_offset = max(files.max_offset, files.min_offset)
        self._scan_forward()
        if self.memory.units and self.memory.min_offset < files.max_offset:
            self._keep_memory_from(min(files.max_offset, self.memory.max_offset))

    def _keep_memory_from(self, queue_offset: int) -> None:
        """Forget memory units below queue_offset. A new object replaces the old one (one
        assignment): a reader without the lock reads either, never a half-trimmed one."""
        old = self.memory
        new = MemoryConsumeQueue()
        new.units = old.units[(queue_offset - old.min_offset) * CQ_UNIT_SIZE:]
        new.min_offset = queue_offset
        new.max_offset = max(old.max_offset, queue_offset)
        self.memory = new

    def _scan_forward(self) -> None:
        """Move the files' end past the units the writer added (a zero unit is unwritten)."""
        files = self.files
        while True:
            pos = files.max_offset * CQ_UNIT_SIZE
            start = pos - pos % files.file_size
            fd = files.fds.get(start)
            if fd is None:
                return
            data = os.pread(fd, min(SCAN_UNITS * CQ_UNIT_SIZE, files.file_size - (pos - start)), pos - start)
            whole = 0
            for i in range(0, len(data) - CQ_UNIT_SIZE + 1, CQ_UNIT_SIZE):
                if CQ_UNIT.unpack_from(data, i)[1] == 0:
                    break
                whole += 1
            files.max_offset += whole
            if whole * CQ_UNIT_SIZE < len(data) or not data:
                return

    def drop_below_phy(self, phy_offset: int) -> None:
        """The CommitLog below phy_offset expired: its units in memory go (the files go when
        the writer deletes them)."""
        mem = self.memory
        first = mem.min_offset
        for unit in mem.read_units(mem.min_offset, mem.max_offset - mem.min_offset):
            if unit[0] >= phy_offset:
                break
            first += 1
        if first > mem.min_offset:
            self._keep_memory_from(first)

    def truncate_from_phy(self, phy_offset: int) -> None:
        pass  # the writer's log is never cut by Quarry

    def take_dirty(self) -> list[int]:
        return []

    def flush(self) -> None:
        pass

    def close(self) -> None:
        for fd in self._retired:
            os.close(fd)
        self._retired = []
        self.files.close()
        self.memory.close()
