"""A process that writes a CommitLog directory the way a RocketMQ broker does, for follow-mode tests.

Like RocketMQ's MappedFile/AllocateMappedFileService: segment files of a fixed (small) size
are preallocated full of zeros ahead of use (the file first set to a part of its size, then
grown, then zero-filled through the mapping, as warmMappedFile does), records are written
through mmap in pieces (a reader sees a growing prefix), a segment that cannot take the next
record is closed by a BLANK record, and the oldest segments are deleted past --keep-segments.

  python -m tests.store_writer generate --store-dir D --count N [--keep-segments K]
  python -m tests.store_writer golden --store-dir D --segments-of tests/golden/messages/basic_ipv4/commitlog

Each record written whole is printed as a JSON line {"offset", "size", ...}; with --stop-mid-record N
the writer writes part of record N, prints {"mid_record": offset} and waits to be killed.
A restarted `generate` run finds the end of what is whole (as RocketMQ's recovery does),
writes over a torn record and goes on numbering from the records already there.
"""
from __future__ import annotations

import argparse
import json
import mmap
import os
import sys
import threading
import time
from datetime import datetime
from pathlib import Path

from quarry.formats.offset_msg_id import create as offset_msg_id
from quarry.formats.properties import KEYS, TAGS, UNIQ_KEY, encode_properties
from quarry.formats.record import BLANK_HEADER_SIZE, blank_record, decode_record, encode_record
from quarry.formats.consume_queue import CQ_UNIT_SIZE, decode_unit, encode_unit
from quarry.formats.dispatch import dispatch_info
from quarry.formats.index_file import IndexFile
from quarry.formats.index_keys import INDEX_FILE_NAME, index_file_name, index_names
from quarry.formats.unique_key import UniqueKeyGenerator
from quarry.formats.segment_walk import SegmentEnd, WalkResult, list_segments, segment_name, walk_buffer, walk_segments

TOPIC = "FollowTopic"
QUEUES = 4


class Writer:
    def __init__(self, directory: Path, segment_size: int, pause_s: float, keep_segments: int) -> None:
        self.dir = directory / "commitlog"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.segment_size = segment_size
        self.pause = threading.Event()
        self.pause_s = pause_s
        self.keep = keep_segments
        self.maps: dict[int, tuple[int, mmap.mmap]] = {}

    def _map(self, start: int) -> mmap.mmap:
        if start not in self.maps:
            path = self.dir / segment_name(start)
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            if os.fstat(fd).st_size < self.segment_size:
                # Preallocation caught in the middle: part of the size first, then the rest.
                os.ftruncate(fd, self.segment_size // 2)
                self.pause.wait(self.pause_s)
                os.ftruncate(fd, self.segment_size)
            mm = mmap.mmap(fd, self.segment_size, access=mmap.ACCESS_WRITE)
            self.maps[start] = (fd, mm)
        return self.maps[start][1]

    def open_segment(self, start: int) -> None:
        """The segment of `start`, then the next one: RocketMQ allocates a file before it is needed."""
        for s in (start, start + self.segment_size):
            if s not in self.maps:
                mm = self._map(s)
                if not any(mm[: self.segment_size]):
                    mm[: self.segment_size] = bytes(self.segment_size)  # warmMappedFile: zeros through the map

    def write(self, offset: int, data: bytes, pieces: int = 3) -> None:
        """Write data at a log offset through the mapping, in pieces, as a growing prefix."""
        start = offset - offset % self.segment_size
        mm = self._map(start)
        pos = offset - start
        step = max(1, -(-len(data) // pieces))
        for i in range(0, len(data), step):
            chunk = data[i:i + step]
            mm[pos + i:pos + i + len(chunk)] = chunk
            self.pause.wait(self.pause_s)

    def room(self, offset: int) -> int:
        return self.segment_size - offset % self.segment_size

    def close_segment(self, offset: int) -> int:
        """Write the BLANK record that ends the segment holding offset; returns the next start."""
        remaining = self.room(offset)
        self.write(offset, blank_record(remaining)[:BLANK_HEADER_SIZE], pieces=1)
        return offset + remaining

    def expire(self) -> None:
        segs = list_segments(self.dir)
        while self.keep and len(segs) > self.keep + 1:  # +1: the preallocated next file
            start, path = segs.pop(0)
            fd_mm = self.maps.pop(start, None)
            if fd_mm:
                fd_mm[1].close()
                os.close(fd_mm[0])
            os.unlink(path)
            emit({"deleted": path.name})


class QueueWriter:
    """The broker's ConsumeQueue dispatch: each record's 20-byte unit written into
    consumequeue/<topic>/<queueId>/ a record late (RocketMQ's dispatch runs behind the log),
    files of `units` units, created full of zeros; files wholly below the log's minimum deleted."""

    def __init__(self, root: Path, units: int) -> None:
        self.root, self.units = root, units
        self.pending: tuple[int, int, int, int, int] | None = None  # (queue id, queue offset, offset, size, tags code)

    def put(self, queue_id: int, queue_offset: int, offset: int, size: int, tags_code: int) -> None:
        if self.pending is not None:
            self._write(*self.pending)
        self.pending = (queue_id, queue_offset, offset, size, tags_code)

    def finish(self) -> None:
        if self.pending is not None:
            self._write(*self.pending)
            self.pending = None

    def _write(self, queue_id: int, queue_offset: int, offset: int, size: int, tags_code: int) -> None:
        d = self.root / TOPIC / str(queue_id)
        d.mkdir(parents=True, exist_ok=True)
        file_bytes = self.units * CQ_UNIT_SIZE
        pos = queue_offset * CQ_UNIT_SIZE
        path = d / segment_name(pos - pos % file_bytes)
        with open(path, "r+b" if path.exists() else "w+b") as fh:
            if fh.seek(0, 2) < file_bytes:
                fh.truncate(file_bytes)
            fh.seek(pos % file_bytes)
            fh.write(encode_unit(offset, size, tags_code))

    def expire(self, log_min: int) -> None:
        for qdir in (self.root / TOPIC).glob("*"):
            files = list_segments(qdir)
            for _start, path in files[:-1]:
                data = path.read_bytes()
                last = max((decode_unit(data, i)[0] for i in range(0, len(data), CQ_UNIT_SIZE) if decode_unit(data, i)[1]), default=-1)
                if last < log_min:
                    path.unlink()


class IndexWriter:
    """The broker's IndexService: every record's keys and unique key put into index/ as it is
    dispatched, a new IndexFile (named by the time) when one is full."""

    def __init__(self, directory: Path, slots: int, entries: int) -> None:
        self.dir, self.slots, self.entries = directory, slots, entries
        directory.mkdir(parents=True, exist_ok=True)
        existing = sorted(p for p in directory.iterdir() if INDEX_FILE_NAME.match(p.name))
        self.file = IndexFile(existing[-1], slots, entries, create=False) if existing else None

    def put(self, topic: str, key: str, uniq: str, offset: int, store_ts: int) -> None:
        for name in index_names(topic, key, uniq):
            if self.file is None or not self.file.put_key(name, offset, store_ts):
                end_phy, end_ts = (self.file.header.end_phy_offset, self.file.header.end_timestamp) if self.file else (0, 0)
                if self.file is not None:
                    self.file.close()
                now = int(time.time() * 1000)
                while (self.dir / index_file_name(now)).exists():
                    now += 1
                self.file = IndexFile(self.dir / index_file_name(now), self.slots, self.entries, end_phy, end_ts)
                emit({"index_file": self.file.path.name})
                assert self.file.put_key(name, offset, store_ts)


def emit(obj: dict[str, object]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def recover_end(directory: Path) -> tuple[int, int]:
    """(end of the whole records, number of the next record, from the last one's key): a
    restarted writer goes on from there, as RocketMQ's recovery finds the end of its log."""
    result = WalkResult()
    last = None
    for last in walk_segments(directory / "commitlog", result=result):
        pass
    return result.end_offset, (int(last.keys[0].rsplit("-", 1)[1]) + 1 if last is not None else 0)


def generate(args: argparse.Namespace) -> None:
    w = Writer(Path(args.store_dir), args.segment_size, args.pause_ms / 1000.0, args.keep_segments)
    offset, done = recover_end(Path(args.store_dir))
    if done:
        emit({"recovered": offset, "records": done})
    # Queue offsets go on from the whole records (the torn one is written again).
    next_qoff = [0] * QUEUES
    for rec in walk_segments(w.dir):
        next_qoff[rec.queue_id] = rec.queue_offset + 1
    host, port = args.store_host.rsplit(":", 1)
    index = IndexWriter(Path(args.store_dir) / "index", args.hash_slots, args.index_num) if args.index else None
    queues = QueueWriter(Path(args.store_dir) / "consumequeue", args.cq_units) if args.cq_units else None
    ids = UniqueKeyGenerator("10.0.0.9", os.getpid(), 1, datetime.now().astimezone().tzinfo)  # type: ignore[arg-type]
    for n in range(done, args.count):
        qid = n % QUEUES
        ids.set_counter(n)
        uniq = ids.next_id()
        props = encode_properties([(KEYS, f"follow-key-{n}"), (TAGS, "TagA" if n % 2 else "TagB"), (UNIQ_KEY, uniq)])
        body = (f"follow body {n} " * (1 + n % 7)).encode()
        make = lambda at: encode_record(topic=TOPIC, body=body, properties=props, queue_id=qid, flag=0, queue_offset=next_qoff[qid],
                                        physical_offset=at, sys_flag=0, born_timestamp=int(time.time() * 1000), born_host=("10.0.0.9", 50000),
                                        store_timestamp=int(time.time() * 1000), store_host=(host, int(port)))
        data = make(offset)
        if len(data) + BLANK_HEADER_SIZE > w.room(offset):
            offset = w.close_segment(offset)
            data = make(offset)
        w.open_segment(offset - offset % args.segment_size)
        if n == args.stop_mid_record:
            w.write(offset, data[: len(data) // 2], pieces=2)
            emit({"mid_record": offset})
            threading.Event().wait()  # the test kills the process here
        w.write(offset, data)
        if queues is not None:
            queues.put(qid, next_qoff[qid], offset, len(data), dispatch_info(decode_record(data, physical_offset=offset)).tags_code)
        if index is not None:
            index.put(TOPIC, f"follow-key-{n}", uniq, offset, int.from_bytes(data[56:64], "big"))
        emit({"offset": offset, "size": len(data), "n": n, "queue_id": qid, "queue_offset": next_qoff[qid], "key": f"follow-key-{n}",
              "uniq_key": uniq, "msg_id": offset_msg_id(host, int(port), offset), "topic": TOPIC})
        next_qoff[qid] += 1
        offset += len(data)
        w.expire()
        if queues is not None and w.keep:
            queues.expire(list_segments(w.dir)[0][0])
        if args.step:
            sys.stdin.readline()  # the test says when to write the next record
    if queues is not None:
        queues.finish()
    emit({"done": offset})
    threading.Event().wait(0 if args.exit else 3600)


def golden(args: argparse.Namespace) -> None:
    """Write a golden store's segments record by record into preallocated files."""
    src = Path(args.segments_of)
    segments = list_segments(src)
    size = segments[0][1].stat().st_size
    w = Writer(Path(args.store_dir), size, args.pause_ms / 1000.0, 0)
    for start, path in segments:
        data = path.read_bytes()
        w.open_segment(start)
        end = SegmentEnd(0)
        for rec in walk_buffer(data, start, 0, True, end):
            at = rec.physical_offset - start
            w.write(rec.physical_offset, data[at:at + rec.store_size])
            emit({"offset": rec.physical_offset, "size": rec.store_size})
            if args.step:
                sys.stdin.readline()
        if end.blank_at is not None:
            w.write(start + end.blank_at, data[end.blank_at:end.blank_at + BLANK_HEADER_SIZE], pieces=1)
    emit({"done": True})
    threading.Event().wait(0 if args.exit else 3600)


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(prog="store_writer")
    p.add_argument("mode", choices=["generate", "golden"])
    p.add_argument("--store-dir", required=True)
    p.add_argument("--segment-size", type=int, default=4096)
    p.add_argument("--count", type=int, default=50)
    p.add_argument("--keep-segments", type=int, default=0, help="delete the oldest segments past this many (0: keep all)")
    p.add_argument("--pause-ms", type=float, default=2.0, help="pause between the pieces of a record")
    p.add_argument("--store-host", default="10.20.30.40:10911")
    p.add_argument("--stop-mid-record", type=int, default=-1)
    p.add_argument("--segments-of", default="")
    p.add_argument("--index", action="store_true", help="also keep index/ as the broker's IndexService does")
    p.add_argument("--hash-slots", type=int, default=101)
    p.add_argument("--index-num", type=int, default=50)
    p.add_argument("--cq-units", type=int, default=0, help="also write consumequeue/ with files of this many units (0: none)")
    p.add_argument("--step", action="store_true", help="after each record, wait for a line on stdin")
    p.add_argument("--exit", action="store_true", help="exit when done instead of waiting to be stopped")
    args = p.parse_args(argv)
    (generate if args.mode == "generate" else golden)(args)


if __name__ == "__main__":
    main(sys.argv[1:])
