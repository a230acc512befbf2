"""Walk CommitLog segment files the way RocketMQ's recovery does.

Segments are files named by their 20-digit start offset. Within a segment records follow
one another; a blank record (BLANK magic) ends the segment and the walk continues at the
next one; TOTALSIZE/MAGIC of zero means the end of the data. Anything else is corruption:
the walk stops there and says where and why.
"""
from __future__ import annotations

import mmap
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from quarry.formats.record import BLANK_HEADER_SIZE, BLANK_MAGIC, FIXED_SIZE, MESSAGE_MAGIC, CorruptRecordError, Record, decode_record, read_size_and_magic

SEGMENT_NAME = re.compile(r"^\d{20}$")


def segment_name(start_offset: int) -> str:
    return f"{start_offset:020d}"


def list_segments(commitlog_dir: str | os.PathLike[str]) -> list[tuple[int, Path]]:
    """(start offset, path) of every segment file, oldest first; other files are ignored."""
    root = Path(commitlog_dir)
    if not root.is_dir():
        return []
    found = [(int(p.name), p) for p in root.iterdir() if SEGMENT_NAME.match(p.name) and p.is_file()]
    return sorted(found)


@dataclass(frozen=True)
class Probe:
    """What starts at a position of a segment, from its 8-byte header alone."""

    kind: str  # "record" | "blank" | "end" (zero fill or < 8 bytes left) | "bad"
    size: int = 0
    reason: str = ""
    magic: int = 0


def probe(buf: bytes | mmap.mmap | memoryview, pos: int, size: int) -> Probe:
    """Classify the header at `pos` of a segment of `size` bytes (no decoding, no CRC): the
    one header classification of recovery, the segment walk and the pipeline's planner."""
    left = size - pos
    if left < BLANK_HEADER_SIZE:
        return Probe("end", left)
    total, magic = read_size_and_magic(buf, pos)
    if magic == MESSAGE_MAGIC:
        if FIXED_SIZE <= total <= left:
            return Probe("record", total, magic=magic)
        return Probe("bad", total, f"TOTALSIZE {total} outside {FIXED_SIZE}..{left} (record runs past the end of the file or is too short)", magic)
    if magic == BLANK_MAGIC:
        return Probe("blank", total, magic=magic)
    if total == 0 and magic == 0:
        return Probe("end", 0)
    return Probe("bad", total, f"bad magic code 0x{magic:08X} (TOTALSIZE {total})", magic)


@dataclass
class SegmentEnd:
    """How the walk of one segment ended."""

    data_end: int  # offset inside the segment just past the last record
    blank_at: int | None = None  # in-segment offset of a blank record, if one closed the segment
    blank_size: int | None = None
    corruption: CorruptRecordError | None = None
    reason: str = ""


def walk_buffer(buf: bytes | mmap.mmap | memoryview, base_offset: int, start: int = 0, check_crc: bool = True, end: SegmentEnd | None = None) -> Iterator[Record]:
    """Yield records of one segment held in buf from in-segment offset `start`.

    When the generator finishes, `end` (if given) says where the data ended and why.
    """
    end = end if end is not None else SegmentEnd(start)
    pos = start
    size_total = len(buf)
    while True:
        head = probe(buf, pos, size_total)
        if head.kind == "end":
            end.data_end, end.reason = pos, "end of segment" if size_total - pos < BLANK_HEADER_SIZE else "end of data"
            return
        if head.kind == "blank":
            end.data_end, end.blank_at, end.blank_size, end.reason = pos, pos, head.size, "blank record"
            return
        if head.magic == MESSAGE_MAGIC:  # a record, or one whose size is wrong: decoding says which check failed
            try:
                record = decode_record(buf, pos, physical_offset=base_offset + pos, check_crc=check_crc)
            except CorruptRecordError as exc:
                end.data_end, end.corruption, end.reason = pos, exc, f"corrupt: {exc.reason}"
                return
            yield record
            pos += record.store_size
            continue
        end.data_end = pos
        end.corruption = CorruptRecordError(base_offset + pos, head.reason)
        end.reason = f"corrupt: {end.corruption.reason}"
        return


@dataclass
class WalkResult:
    """Where a multi-segment walk stopped."""

    end_offset: int = 0  # physical offset just past the last good record
    corruption: CorruptRecordError | None = None
    segment_ends: dict[int, SegmentEnd] = field(default_factory=dict)


def walk_segments(commitlog_dir: str | os.PathLike[str], from_offset: int | None = None, check_crc: bool = True, result: WalkResult | None = None) -> Iterator[Record]:
    """Yield every record from `from_offset` (default: the first segment's start) in log order.

    A blank record moves to the next segment; end of data or corruption ends the walk
    (`result.corruption` says which). Files are mapped read-only, never changed.
    """
    result = result if result is not None else WalkResult()
    segments = list_segments(commitlog_dir)
    if not segments:
        result.end_offset = from_offset or 0
        return
    if from_offset is None:
        from_offset = segments[0][0]
    result.end_offset = from_offset
    for i, (start, path) in enumerate(segments):
        size = path.stat().st_size
        if start + size <= from_offset:
            continue
        if start > result.end_offset:
            # A gap between segments: what lies between was lost.
            result.corruption = CorruptRecordError(result.end_offset, f"missing segment before {path.name}")
            return
        end = SegmentEnd(0)
        with open(path, "rb") as fh:
            if size == 0:
                result.end_offset = start
                return
            with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
                for record in walk_buffer(mm, start, max(0, from_offset - start), check_crc, end):
                    yield record
                    result.end_offset = record.physical_offset + record.store_size
        result.segment_ends[start] = end
        if end.corruption is not None:
            result.corruption = end.corruption
            result.end_offset = start + end.data_end
            return
        if end.blank_at is None:
            result.end_offset = start + end.data_end
            return
        # Blank record: the log continues at the next segment.
        result.end_offset = start + size
        if i + 1 == len(segments):
            return
