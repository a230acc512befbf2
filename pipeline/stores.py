"""Input stores: `[NAME=]PATH` specs and the CommitLog segment files they hold.

A Quarry store directory and an Apache RocketMQ 4.x store directory have the same layout
(`<store>/commitlog/<20-digit start offset>`), so both are read the same way. PATH may be
the store directory or its `commitlog/` directory itself.
"""
from __future__ import annotations

import mmap
import os
import re
from dataclasses import dataclass
from pathlib import Path

from quarry.formats.segment_walk import SEGMENT_NAME, probe
from quarry.formats.segment_walk import list_segments as list_segment_files

BROKER_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")


class StoreError(ValueError):
    """A store spec or directory that cannot be read; the message names the path and the rule."""


@dataclass(frozen=True)
class Segment:
    """One CommitLog segment file of one broker."""

    broker: str
    path: str
    start_offset: int
    file_size: int

    @property
    def name(self) -> str:
        return os.path.basename(self.path)


@dataclass(frozen=True)
class Store:
    broker: str
    commitlog_dir: str
    segments: tuple[Segment, ...]
    # Where the data of the newest segment ends: RocketMQ (and Quarry) preallocate a segment
    # at full size, so the rest is zero fill that is neither read nor counted.
    last_data_end: int | None = None

    @property
    def total_bytes(self) -> int:
        """Bytes the jobs read: every older segment, and the written part of the newest."""
        if not self.segments:
            return 0
        last = self.segments[-1].file_size if self.last_data_end is None else self.last_data_end
        return sum(s.file_size for s in self.segments[:-1]) + last


def data_end(segment: Segment) -> int:
    """Offset within the file where its records end (zero fill, a blank record, a bad header
    or the end of the file), from record headers alone."""
    if segment.file_size == 0:
        return 0
    pos = 0
    with open(segment.path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        while pos < segment.file_size:
            head = probe(buf, pos, segment.file_size)
            if head.kind != "record":
                break
            pos += head.size
    return pos


def parse_store_spec(spec: str) -> tuple[str, Path]:
    """`broker-a=/data/a` → ('broker-a', /data/a); a bare path takes its directory's name."""
    name, sep, path = spec.partition("=")
    if sep and name and not os.path.exists(spec):
        broker, p = name.strip(), Path(path)
    else:
        p = Path(spec)
        base = p.resolve()
        if base.name == "commitlog":
            base = base.parent
        broker = base.name
    if not broker or not BROKER_NAME.match(broker):
        raise StoreError(f"--store {spec!r}: broker name {broker!r} must match {BROKER_NAME.pattern} (use NAME=PATH)")
    return broker, p


def commitlog_dir_of(path: Path) -> Path:
    """The commitlog/ directory of a store path (the path itself when it holds segments)."""
    if not path.is_dir():
        raise StoreError(f"store {path}: not a directory")
    sub = path / "commitlog"
    if sub.is_dir():
        return sub
    if any(SEGMENT_NAME.match(n) for n in os.listdir(path)):
        return path
    raise StoreError(f"store {path}: no commitlog/ directory and no 20-digit segment files in it")


def list_segments(broker: str, commitlog_dir: Path) -> tuple[Segment, ...]:
    """Segment files in offset order; a name that disagrees with its neighbours is an error."""
    segments = [Segment(broker, str(path.resolve()), start, path.stat().st_size) for start, path in list_segment_files(commitlog_dir)]
    for prev, cur in zip(segments, segments[1:]):
        if prev.start_offset + prev.file_size > cur.start_offset:
            raise StoreError(
                f"{commitlog_dir}: segment {prev.name} ({prev.file_size} bytes) overlaps segment {cur.name}"
            )
    return tuple(segments)


def open_stores(specs: list[str]) -> list[Store]:
    """Resolve `--store` specs; broker names must be distinct."""
    if not specs:
        raise StoreError("--store: at least one store is required")
    stores: list[Store] = []
    seen: set[str] = set()
    for spec in specs:
        broker, path = parse_store_spec(spec)
        if broker in seen:
            raise StoreError(f"--store {spec!r}: broker name {broker!r} given twice")
        seen.add(broker)
        cdir = commitlog_dir_of(path)
        segments = list_segments(broker, cdir)
        stores.append(Store(broker, str(cdir.resolve()), segments, data_end(segments[-1]) if segments else None))
    return stores
