"""Partition planning: which contiguous byte range of which segment each Spark task reads.

Two plans:

* **per segment** — one task per segment file, walking it from its first byte. No
  pre-scan; right when there are at least as many segments as cores.
* **by record boundaries** — a first, parallel pass walks each segment's record headers
  (TOTALSIZE + structure, no CRC, no decoding) and cuts it at the first record boundary
  past every `split_bytes` bytes; each piece becomes a task. Right for a few large
  segments (RocketMQ's default is 1 GiB) on many cores.

Either way a task covers a contiguous offset range that starts on a record boundary, and
the task that reads a segment's last range walks to the segment's end of data, where it
finds the end-of-segment blank record, the zero fill, or a corrupt record.
"""
from __future__ import annotations

import mmap
import os
from dataclasses import dataclass
from typing import Iterable, Sequence

from quarry.formats.segment_walk import probe
from quarry.pipeline.stores import Segment, Store

MIN_SPLIT_BYTES = 1 << 20  # never cut finer than 1 MiB
SPLITS_PER_CORE = 3  # auto plan: about this many tasks per core, for balance


@dataclass(frozen=True)
class Split:
    """One task's input: bytes [begin, end) of a segment file, `end=None` meaning its end of data."""

    index: int  # position in the broker's offset order (global across the plan)
    broker: str
    path: str
    segment_start: int  # physical offset of the file's first byte
    file_size: int
    begin: int  # offset within the file: a record boundary
    end: int | None  # offset within the file (a record boundary), or None: to the segment's end of data
    segment_no: int  # position of the segment within its broker's segments
    last_segment: bool  # the broker's newest segment (its zero fill is the end of the log)

    @property
    def physical_begin(self) -> int:
        return self.segment_start + self.begin

    @property
    def nominal_bytes(self) -> int:
        return (self.end if self.end is not None else self.file_size) - self.begin

    @property
    def name(self) -> str:
        return os.path.basename(self.path)


@dataclass(frozen=True)
class SegmentCuts:
    """Result of the boundary pass over one segment: cut points within the file."""

    path: str
    cuts: tuple[int, ...]  # offsets within the file where a new task starts (excluding 0)
    records_seen: int
    stopped_at: int  # where the header walk stopped (blank, zero fill, end or a bad header)


def auto_split_bytes(stores: Sequence[Store], parallelism: int) -> int:
    """0 (one task per segment) when segments ≥ cores; else a size giving ~3 tasks per core."""
    segments = sum(len(s.segments) for s in stores)
    if segments >= parallelism * 2 or segments == 0:
        return 0
    total = sum(s.total_bytes for s in stores)
    return max(MIN_SPLIT_BYTES, total // max(1, parallelism * SPLITS_PER_CORE))


def per_segment_plan(stores: Sequence[Store]) -> list[Split]:
    """One split per segment, in (broker, offset) order."""
    splits: list[Split] = []
    for store in stores:
        n = len(store.segments)
        for i, seg in enumerate(store.segments):
            splits.append(Split(len(splits), seg.broker, seg.path, seg.start_offset, seg.file_size, 0, None, i, i == n - 1))
    return splits


def plan_from_cuts(stores: Sequence[Store], cuts: dict[str, SegmentCuts]) -> list[Split]:
    """Splits from each segment's cut points (segments without cuts stay whole)."""
    splits: list[Split] = []
    for store in stores:
        n = len(store.segments)
        for i, seg in enumerate(store.segments):
            points = [0, *sorted(c for c in (cuts[seg.path].cuts if seg.path in cuts else ()) if 0 < c < seg.file_size)]
            for j, begin in enumerate(points):
                end = points[j + 1] if j + 1 < len(points) else None
                splits.append(Split(len(splits), seg.broker, seg.path, seg.start_offset, seg.file_size, begin, end, i, i == n - 1))
    return splits


def scan_cuts(segment: Segment, split_bytes: int) -> SegmentCuts:
    """Walk one segment's record headers and cut at the first boundary past every split_bytes.

    Stops cutting at the first blank record, zero fill or bad header; whatever is beyond
    stays with the last piece, whose task reports it. A record with a sound header but a
    bad body is hopped over, as the walker's skip does.
    """
    cuts: list[int] = []
    records = 0
    pos = 0
    size = segment.file_size
    if size == 0:
        return SegmentCuts(segment.path, (), 0, 0)
    with open(segment.path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        last_cut = 0
        while pos < size:
            head = probe(buf, pos, size)
            if head.kind != "record":
                break
            if pos - last_cut >= split_bytes and pos > 0:
                cuts.append(pos)
                last_cut = pos
            records += 1
            pos += head.size
    return SegmentCuts(segment.path, tuple(cuts), records, pos)


def describe_plan(splits: Iterable[Split]) -> str:
    items = list(splits)
    segments = {s.path for s in items}
    whole = sum(1 for s in items if s.begin == 0 and s.end is None)
    return f"{len(items)} tasks over {len(segments)} segments ({whole} whole segments, {len(items) - whole} pieces)"
