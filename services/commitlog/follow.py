"""Follow mode: serve a store directory that another process (a RocketMQ broker) keeps writing.

The writer preallocates whole segment files filled with zeros and writes records through
mmap, so the end of the written data is found from the record headers (`segment_walk.probe`)
and each record is decoded with the one codec (`formats.record.decode_record`). A record
caught half-written (the writer's bytes show up as a growing prefix: zeros where it has not
written yet) fails its frame checks, its body CRC or has zero bytes in its topic or
properties: it is read again next round, until whole. Segment files that appear are opened
read-only; files the writer deletes (expiry) leave the front of the queue, which moves the
minimum offset. Nothing in the directory is ever written, locked or created: every file is
opened O_RDONLY and Quarry's own state (queues rebuilt from the log) lives in memory.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path
from typing import Callable

from quarry.formats.consume_queue import encode_unit
from quarry.formats.dispatch import DispatchInfo, dispatch_info
from quarry.formats.record import BLANK_HEADER_SIZE, CorruptRecordError, Record, decode_record, takes_queue_offset
from quarry.formats.segment_walk import list_segments, probe
from quarry.services.commitlog.segments import Segment
from quarry.services.commitlog.store_state import StoreState
from quarry.services.log import FailureReport, log_event

log = logging.getLogger("quarry.follow")

WINDOW = 4 * 1024 * 1024  # bytes read per step: a follower far behind never reads a whole segment at once
QUEUE_REFRESH_S = 0.5  # how often the writer's own ConsumeQueue files are looked at again
STUCK_REPORT_S = 10.0  # a record still unreadable this long while the writer has written past it is reported


def complete(record: Record) -> bool:
    """Whether a decoded record is whole: the writer's unwritten bytes are zeros, which a valid
    topic or properties text never holds (its body is covered by the CRC, checked by decoding)."""
    return "\0" not in record.topic and "\0" not in record.properties_text and record.store_timestamp > 0


class Follower:
    """Keeps `state` (segments, write offset, in-memory queues) up with the writer's directory."""

    def __init__(self, state: StoreState, notify: Callable[[], None], interval_ms: int) -> None:
        self.state = state
        self.notify = notify
        self.interval_s = interval_ms / 1000.0
        self.directory = Path(state.dir) / "commitlog"
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._stuck_at: tuple[int, float] | None = None  # (offset, since) of a record not yet whole
        self._reported: set[int] = set()
        self._retired: list[Segment] = []  # segments the writer deleted, closed one round later
        self._rounds = FailureReport(log, "following failed; retrying", "following recovered")
        self._queues_refreshed = 0.0

    # -- the thread -------------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="follower", daemon=True)
        self._thread.start()

    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        for gone in self._retired:
            gone.close()
        self._retired = []

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            # Nothing may end this thread: without it the store stops moving.
            self._rounds.run(self.poll)

    @property
    def failing(self) -> str:
        """The error of the last round, "" once one succeeds."""
        return self._rounds.failing

    # -- one round ---------------------------------------------------------------------------
    def poll(self) -> int:
        """Pick up segment changes and new records; returns how many records were added."""
        moved = self._sync_segments()
        if time.monotonic() - self._queues_refreshed >= QUEUE_REFRESH_S:
            self._queues_refreshed = time.monotonic()
            self._refresh_queues()
        added = 0
        while not self._stop.is_set():
            n = self._advance()
            if n == 0:
                break
            added += n
        if added or moved:
            self.notify()
        return added

    def _sync_segments(self) -> bool:
        """Open new segment files, follow a file still growing (preallocation), and let go of
        files the writer deleted. Returns whether the minimum offset moved."""
        state = self.state
        on_disk = dict(list_segments(self.directory))
        moved = False
        with state.lock:
            segs = state.segments.segments
            # Expiry: the writer deletes its oldest files. Only the front goes (a hole in the
            # middle is not RocketMQ's doing: the open descriptor keeps serving that file).
            for gone in self._retired:
                gone.close()  # detached a round ago: no read started before that still uses it
            self._retired = []
            while segs and segs[0].start not in on_disk:
                gone = segs.pop(0)
                self._retired.append(gone)
                moved = True
                log_event(log, "segment deleted by the writer", file=gone.path.name, min_offset=state.segments.min_offset)
            known = {s.start for s in segs}
            last = segs[-1].start if segs else -1
            for start, path in sorted(on_disk.items()):
                if start in known or start < last:
                    continue
                try:
                    segs.append(Segment(path, start, os.stat(path).st_size, read_only=True))
                except FileNotFoundError:
                    continue  # deleted between the listing and the open
                last = start
                log_event(log, "segment picked up", file=path.name)
            # A file being preallocated grows; a segment never reaches into the next one. Only
            # the files from the one being read on can still be growing.
            for i, seg in enumerate(segs):
                if seg.end <= state.write_offset and i + 1 < len(segs):
                    continue
                size = os.fstat(seg.fd).st_size
                if i + 1 < len(segs):
                    size = min(size, segs[i + 1].start - seg.start)
                if size > seg.size:
                    seg.size = size
            if segs and state.write_offset < segs[0].start:
                state.write_offset = state.flushed_offset = segs[0].start
        if moved:
            low = state.segments.min_offset
            for cq in list(state.cqs.queues.values()):
                drop = getattr(cq, "drop_below_phy", None)
                if drop is not None:
                    drop(low)
        return moved

    def _refresh_queues(self) -> None:
        """The writer's ConsumeQueue files: new units and files, deleted files (under the lock:
        the follower's dispatch and the refresh both change a queue)."""
        with self.state.lock:
            for cq in list(self.state.cqs.queues.values()):
                refresh = getattr(cq, "refresh", None)
                if refresh is not None:
                    refresh()

    def _advance(self) -> int:
        """Read what the writer added past the write offset (one window); returns records added."""
        state = self.state
        pos = state.write_offset
        seg = state.segments.find(pos)
        if seg is None:
            return 0  # the next segment does not exist yet (or is still empty)
        buf = seg.read(pos, min(seg.end - pos, WINDOW))
        left = seg.end - pos  # bytes to the segment's end, for the header classification
        records: list[Record] = []
        at = 0
        next_pos: int | None = None
        while True:
            if at + BLANK_HEADER_SIZE > len(buf) and len(buf) < left:
                break  # the window is used up: the next step reads on from here
            head = probe(buf, at, left)
            if head.kind == "end":
                if left - at < BLANK_HEADER_SIZE and self._next_exists(seg):
                    next_pos = seg.end  # full to the last byte (RocketMQ always leaves a blank, others may not)
                break
            if head.kind == "blank":
                next_pos = seg.end  # the segment is closed; the log goes on in the next file
                break
            if head.kind == "bad" or at + head.size > len(buf):
                if head.kind == "record" and at == 0:
                    buf = seg.read(pos, head.size)  # one record larger than the window
                    if len(buf) < head.size:
                        break
                    continue
                if head.kind == "bad":
                    self._not_yet_whole(pos + at, f"header: {head.reason}")
                break
            try:
                record = decode_record(buf, at, physical_offset=pos + at, check_crc=True)
            except CorruptRecordError as exc:
                self._not_yet_whole(pos + at, exc.reason)
                break
            if not complete(record):
                self._not_yet_whole(pos + at, "zero bytes where the topic or properties are written")
                break
            records.append(record)
            at += record.store_size
        self._stuck_at = None if records or next_pos is not None else self._stuck_at
        if not records and next_pos is None:
            return 0
        end = pos + at if next_pos is None else next_pos
        self._publish(records, end)
        return max(1, len(records))

    def _next_exists(self, seg: Segment) -> bool:
        return any(s.start == seg.end for s in self.state.segments.segments)

    def _not_yet_whole(self, offset: int, why: str) -> None:
        """A record still being written is read again next round; one that stays unreadable
        while the writer has moved on is reported once (the follower keeps trying)."""
        now = time.monotonic()
        if self._stuck_at is None or self._stuck_at[0] != offset:
            self._stuck_at = (offset, now)
            return
        if now - self._stuck_at[1] >= STUCK_REPORT_S and offset not in self._reported:
            self._reported.add(offset)
            self.state.report(f"record at {offset} still unreadable after {STUCK_REPORT_S:.0f} s ({why}); reads stop there until the writer completes it")

    def _publish(self, records: list[Record], end: int) -> None:
        """Make the records readable (write offset first: a queue unit never points past it),
        then queue them, then feed Tail's cache."""
        state = self.state
        infos: list[DispatchInfo] = [dispatch_info(r) for r in records]
        with state.lock:
            state.write_offset = state.flushed_offset = end
            topics = state.topics
            for record, info in zip(records, infos):
                if record.store_host not in state.store_hosts_seen:
                    # Copy on write as well: the heartbeat thread reads the set to announce it.
                    state.store_hosts_seen = state.store_hosts_seen | {record.store_host}
                if topics.get(record.topic, 0) <= record.queue_id:
                    # Copy on write: other threads iterate the topic table without the lock.
                    topics = dict(topics)
                    topics[record.topic] = record.queue_id + 1
                if takes_queue_offset(record.sys_flag):
                    state.cqs.queue(record.topic, record.queue_id).write_units(record.queue_offset, encode_unit(info.physical_offset, info.size, info.tags_code))
            state.topics = topics
            state.dispatch_cache.add(infos)
