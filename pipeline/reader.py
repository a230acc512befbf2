"""Task side: walk the records of one split, applying the corrupt-record policy.

The walk itself is `quarry.formats.segment_walk.walk_buffer` (RocketMQ's recovery walk: records
back to back, a blank record closes the segment, zero fill ends the data). This module adds
what a parallel job needs on top of it:

* a split may end before the segment does (at a record boundary found by the planner);
* zero fill in a segment that later segments follow is not the end of the log but a
  corrupt segment, and reported as one;
* under `--skip-corrupt` the walk goes on after a corrupt record. When the corrupt
  record's TOTALSIZE and magic hold and the next header is plausible (a record, a blank,
  the zero fill, or the end of the file) only that record is skipped; otherwise nothing
  after it in the segment can be trusted and the rest of the segment is skipped. The
  planner's boundary scan (`probe`) makes the same call, so the two agree on boundaries.
"""
from __future__ import annotations

import mmap
from dataclasses import dataclass, field
from typing import Iterator

from quarry.formats.record import Record
from quarry.formats.segment_walk import SegmentEnd, probe, walk_buffer
from quarry.pipeline.corrupt import CorruptPolicy, CorruptReport
from quarry.pipeline.planning import Split
from quarry.pipeline.progress import StageCounters


def skippable(buf: bytes | mmap.mmap | memoryview, pos: int, size: int) -> int:
    """The size to skip a corrupt record at `pos` by, or 0 when its size cannot be trusted."""
    head = probe(buf, pos, size)
    if head.kind != "record":
        return 0
    nxt = pos + head.size
    if nxt >= size or probe(buf, nxt, size).kind in ("record", "blank", "end"):
        return head.size
    return 0


@dataclass
class WalkResult:
    """What one split's walk saw (returned to the driver)."""

    split_index: int
    broker: str
    path: str
    records: int = 0
    bytes: int = 0  # bytes of segment file the split covers (a final piece: to the end of the file)
    end_offset: int = 0  # physical offset where the walk stopped (for a blank: the next segment's start)
    end_kind: str = ""  # "limit" | "blank" | "end-of-data" | "corrupt"
    first_offset: int = -1  # physical offset of the first record read
    last_offset: int = -1  # physical offset of the last record read
    last_store_timestamp: int = 0
    corrupt: list[CorruptReport] = field(default_factory=list)


class SplitWalker:
    """Iterate the decoded records (`quarry.formats.record.Record`) of a split; `result` is
    complete once iteration ends."""

    def __init__(self, split: Split, policy: CorruptPolicy, check_crc: bool = True, counters: StageCounters | None = None) -> None:
        self.split = split
        self.policy = policy
        self.check_crc = check_crc
        self.result = WalkResult(split.index, split.broker, split.path)
        # Progress while the split is read (accumulators only reach the driver when it ends).
        self.ticker = counters.ticker(split.index) if counters is not None else None

    def _report(self, pos: int, reason: str, action: str) -> None:
        report = CorruptReport(self.split.broker, self.split.path, self.split.segment_start + pos, reason, action)
        self.policy.handle(report, self.result.corrupt)

    def __iter__(self) -> Iterator[Record]:
        split, res = self.split, self.result
        base = split.segment_start
        if split.file_size == 0:
            res.end_kind, res.end_offset = "end-of-data", base
            return
        with open(split.path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            size = len(buf)
            stop = base + (split.end if split.end is not None else size)
            pos = split.begin
            while True:
                end = SegmentEnd(pos)
                hit_limit = False
                for rec in walk_buffer(buf, base, pos, self.check_crc, end):
                    if rec.physical_offset >= stop:
                        hit_limit = True
                        break
                    res.records += 1
                    if self.ticker is not None and not res.records & 255:
                        self.ticker.tick(res.records, rec.physical_offset - base - split.begin)
                    if res.first_offset < 0:
                        res.first_offset = rec.physical_offset
                    res.last_offset = rec.physical_offset
                    res.last_store_timestamp = rec.store_timestamp
                    yield rec
                if hit_limit:
                    pos, res.end_kind = stop - base, "limit"
                    break
                pos = end.data_end
                if end.corruption is not None:
                    skip = skippable(buf, pos, size)
                    if skip:
                        self._report(pos, end.corruption.reason, f"record skipped ({skip} bytes)")
                        pos += skip
                        if base + pos >= stop:
                            res.end_kind = "limit" if split.end is not None else "end-of-data"
                            break
                        continue
                    self._report(pos, end.corruption.reason, f"rest of segment skipped ({size - pos} bytes)")
                    res.end_kind, pos = "corrupt", size
                elif end.blank_at is not None:
                    res.end_kind, pos = "blank", size  # the log continues at the next segment
                elif split.last_segment:
                    res.end_kind = "end-of-data"
                else:
                    self._report(
                        pos,
                        f"data ends ({end.reason}) without an end-of-segment blank record, yet later segments follow",
                        f"rest of segment skipped ({size - pos} bytes)",
                    )
                    res.end_kind, pos = "corrupt", size
                break
            res.end_offset = base + pos
            # Bytes of the file this split stands for: to its limit, the segment's end after a
            # blank record (the segment is full), or where the data ends (zero fill not counted).
            res.bytes = (split.end if split.end is not None else (pos if res.end_kind == "end-of-data" else size)) - split.begin
            if self.ticker is not None:
                self.ticker.tick(res.records, res.bytes, final=True)
