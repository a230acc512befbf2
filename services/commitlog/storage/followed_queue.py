"""A ConsumeQueue of a followed store (--follow): the writer's own files, read-only, plus in
memory what they lack.

A RocketMQ broker writes `consumequeue/<topic>/<queueId>/` itself, a little after each record
(its dispatch runs behind the CommitLog), and deletes old files when the CommitLog expires.
Units below the files' end are read from the files; the follower queues every record it
reads from the CommitLog, and the units the files do not hold yet (the files are behind, or
the queue has no files at all) are kept in memory until the files catch up. Nothing is
handed out past the records the follower has read, so a unit never points past the end of
the log as Quarry sees it. Files are opened O_RDONLY; none is ever created, and a file is
known by its identity (device, inode), not its name: one deleted and written again under
its name is read anew.

When the writer's recovery cuts its log back (`truncate_from_phy`), its files keep the
units past the cut until it writes over them (RocketMQ's truncateDirtyLogicFiles only moves
its positions): from the first such unit on, a file's unit is handed out only once it agrees
with the record the follower read again there.

When the writer's CommitLog expires, its files of a queue go only once every unit in them
points below the log's new minimum (RocketMQ keeps a queue's newest file): the queue's minimum
is then the first unit still pointing into the log, as RocketMQ's correctMinOffset finds it,
not the start of its oldest file (`phy_floor`).
"""
from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import NamedTuple

from quarry.formats.consume_queue import CQ_UNIT, CQ_UNIT_SIZE
from quarry.formats.segment_walk import SEGMENT_NAME
from quarry.services.commitlog.storage.consume_queue_store import ConsumeQueue, MemoryConsumeQueue

SCAN_UNITS = 4096  # units read at a time when looking for the files' new end

Identity = tuple[int, int]  # (st_dev, st_ino): which file, whatever its name


class WritersFile(NamedTuple):
    path: Path
    identity: Identity


def writers_files(directory: Path) -> dict[int, WritersFile]:
    """The files of a directory named by their 20-digit start, by start, with their identity
    (one stat each, as a listing that checks for regular files does anyway)."""
    found: dict[int, WritersFile] = {}
    try:
        entries = list(os.scandir(directory))
    except (FileNotFoundError, NotADirectoryError):
        return found
    for entry in entries:
        if not SEGMENT_NAME.match(entry.name):
            continue
        try:
            st = entry.stat()
        except FileNotFoundError:
            continue  # deleted since the listing
        if stat.S_ISREG(st.st_mode):
            found[int(entry.name)] = WritersFile(Path(entry.path), (st.st_dev, st.st_ino))
    return found


def fd_identity(fd: int) -> Identity:
    st = os.fstat(fd)
    return st.st_dev, st.st_ino


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
        # From this queue offset on (set when the writer's log was cut back) a file's unit is
        # handed out only where it agrees with the follower's own (in memory): None trusts the files.
        self.verify_from: int | None = None
        self._retired: list[int] = []  # descriptors of deleted files, closed one refresh later
        # The writer's CommitLog minimum as last told (its older files expired), and the first
        # queue offset whose unit points at or past it: units below it point at deleted records.
        self.phy_floor = 0
        self.expired_below = 0

    # -- what readers see ---------------------------------------------------------------------
    @property
    def min_offset(self) -> int:
        if self.files.fds:
            low = self.files.min_offset
        else:
            low = self.memory.min_offset if self.memory.units else self.seen
        return max(low, min(self.expired_below, self.max_offset))

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

    def refresh(self, phy_floor: int = 0) -> None:
        """Pick up the writer's new files and units, let go of deleted files, read a file
        written again under its name anew, and drop the memory units the files now hold;
        `phy_floor`: the CommitLog's minimum now (the queue's minimum moves past units below it)."""
        for fd in self._retired:
            os.close(fd)
        self._retired = []
        files = self.files
        on_disk = writers_files(files.directory)
        for start in list(files.fds):
            found = on_disk.get(start)
            if found is None or found.identity != fd_identity(files.fds[start]):
                self._retired.append(files.fds.pop(start))  # deleted (reopened below if written again)
        for start, found in on_disk.items():
            if start not in files.fds:
                try:
                    files.fds[start] = os.open(found.path, os.O_RDONLY)
                except FileNotFoundError:
                    continue
        files.min_offset = (min(files.fds) // CQ_UNIT_SIZE) if files.fds else 0
        files.max_offset = max(files.max_offset, files.min_offset)
        self._scan_forward()
        if self.memory.units and self.memory.min_offset < files.max_offset:
            self._keep_memory_from(min(files.max_offset, self.memory.max_offset))
        self._raise_floor(phy_floor)

    def _raise_floor(self, phy_offset: int) -> None:
        """Move the queue's minimum past the units pointing below the CommitLog's minimum
        (one unit read when nothing moved; a bisection when it did)."""
        self.phy_floor = max(self.phy_floor, phy_offset)
        if not self.phy_floor:
            return
        end = max(self.files.max_offset, self.memory.max_offset)
        low = self.min_offset
        if low >= end:
            return
        source = self.files if low < self.files.max_offset else self.memory
        units = source.read_units(low, 1)
        if units and units[0][0] >= self.phy_floor:
            return
        first = self._first_pointing_at(self.phy_floor, end)
        if self.files.max_offset <= first < self.memory.min_offset:
            first = self.memory.min_offset  # memory units the expiry let go of (drop_below_phy): below too
        self.expired_below = max(self.expired_below, first)

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
                unit = CQ_UNIT.unpack_from(data, i)
                if unit[1] == 0 or not self._agrees(files.max_offset + whole, unit):
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
        self._raise_floor(phy_offset)

    def _agrees(self, queue_offset: int, unit: tuple[int, int, int]) -> bool:
        """Whether a unit of the writer's files may be handed out: one below a cut of its log,
        or one equal to the unit the follower made from the record it read again there."""
        if self.verify_from is None or queue_offset < self.verify_from:
            return True
        return self.memory.read_units(queue_offset, 1) == [unit]

    def truncate_from_phy(self, phy_offset: int) -> None:
        """The writer's log was cut back at phy_offset (its recovery): units pointing at or past
        it are handed out no more, from memory or the files; the follower queues the records it
        reads there again."""
        end = max(self.files.max_offset, self.memory.max_offset)
        first = self._first_pointing_at(phy_offset, end)
        if first >= end:
            return  # nothing of this queue past the cut
        # Readers take no lock: the end they see moves back first, then what is behind it.
        self.seen = min(self.seen, first)
        self.files.max_offset = min(self.files.max_offset, first)
        self.verify_from = first if self.verify_from is None else min(self.verify_from, first)
        old = self.memory
        if old.units and old.max_offset > first:
            new = MemoryConsumeQueue()
            if first > old.min_offset:
                new.units = old.units[: (first - old.min_offset) * CQ_UNIT_SIZE]
                new.min_offset = old.min_offset
                new.max_offset = first
            self.memory = new

    def _first_pointing_at(self, phy_offset: int, end: int) -> int:
        """The first queue offset below `end` whose unit points at or past phy_offset (`end`
        when none does); a queue's units point forward, so it is bisected."""
        lo, hi = self.min_offset, end
        while lo < hi:
            mid = (lo + hi) // 2
            source = self.files if mid < self.files.max_offset else self.memory
            unit = source.read_units(mid, 1)
            if unit and unit[0][0] < phy_offset:
                lo = mid + 1
            else:
                hi = mid  # at or past the cut (a unit not there is taken as past it)
        return lo

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
