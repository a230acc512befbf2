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

A file is known by its identity (device, inode), not its name. After a crash the writer's
recovery (RocketMQ's MappedFileQueue.truncateDirtyFiles) ends its log at the last whole
record: the files after it are deleted, the next one is later allocated again under the
same name, and other records are written from the cut. So files deleted at the end are let
go of, a file replaced under its name is reopened, and the heads of the newest records (and
blanks) served are kept: when the last one is no longer on disk as served, the log was cut
back, and everything from the oldest kept one gone on is dropped (write offset, queue
units, Tail's cache), reported once, and followed again. A cut that leaves the old bytes in
place is seen once the writer writes over the last record served.

`progress` says how far the writer's files reach and how far the follower got: a record that
stays unreadable while they reach past it stalls it, and is reported once.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from pathlib import Path
from typing import Callable, NamedTuple, Sequence

from quarry.formats.dispatch import DispatchInfo, dispatch_info
from quarry.formats.record import BLANK_HEADER_SIZE, CorruptRecordError, Record, decode_record
from quarry.formats.segment_walk import probe
from quarry.services.commitlog.storage.dispatchers import Dispatcher
from quarry.services.commitlog.storage.followed_queue import FollowedConsumeQueue, Identity, fd_identity, writers_files
from quarry.services.commitlog.storage.segments import Segment
from quarry.services.commitlog.storage.store_state import StoreState
from quarry.services.log import FailureReport, log_event
from quarry.services.progress import Progress

log = logging.getLogger("quarry.follow")

WINDOW = 4 * 1024 * 1024  # bytes read per step: a follower far behind never reads a whole segment at once
QUEUE_REFRESH_S = 0.5  # how often the writer's own ConsumeQueue files are looked at again
STUCK_REPORT_S = 10.0  # a record still unreadable this long while the writer has written past it stalls the follower
HEAD = 80  # bytes of a record's head kept to know it again: size, CRC, queue offset, timestamps (a record has >= 91)
SERVED_KEPT = 4096  # newest records served whose heads are kept (~1 MB): how far back a cut is placed exactly


class Served(NamedTuple):
    """A record (or a segment's closing blank) handed out, as it was on disk."""

    offset: int
    end: int
    head: bytes
    record: bool


def complete(record: Record) -> bool:
    """Whether a decoded record is whole: the writer's unwritten bytes are zeros, which a valid
    topic or properties text never holds (its body is covered by the CRC, checked by decoding)."""
    return "\0" not in record.topic and "\0" not in record.properties_text and record.store_timestamp > 0


class Follower:
    """Keeps `state` (segments, write offset, in-memory queues) up with the writer's directory."""

    def __init__(self, state: StoreState, dispatchers: Sequence[Dispatcher], notify: Callable[[], None], interval_ms: int,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.state = state
        self.dispatchers = dispatchers  # the store's: its records dispatched as the append's
        self.notify = notify
        self.interval_s = interval_ms / 1000.0
        self.directory = Path(state.dir) / "commitlog"
        self.progress = Progress("follower", "bytes", stall_after_s=STUCK_REPORT_S, clock=clock)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._blocked: tuple[int, str, int] | None = None  # (offset, why, bytes written up to) of a record not readable this round
        self._reported: set[int] = set()
        self._served: deque[Served] = deque(maxlen=SERVED_KEPT)
        self._forgot_served = False  # whether older served records fell out of `_served`
        self._identities: dict[Segment, Identity] = {}  # of the files held open
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
        cut = self._check_served()
        if cut or time.monotonic() - self._queues_refreshed >= QUEUE_REFRESH_S:
            self._queues_refreshed = time.monotonic()
            self._refresh_queues()
        added = 0
        while not self._stop.is_set():
            n = self._advance()
            if n == 0:
                break
            added += n
        self._account()
        if added or moved or cut:
            self.notify()
        return added

    def _identity(self, seg: Segment) -> Identity:
        known = self._identities.get(seg)
        if known is None:
            known = self._identities[seg] = fd_identity(seg.fd)
        return known

    def _open(self, path: Path, start: int) -> Segment:
        """A segment of the writer's, read-only, as large as its file is now."""
        seg = Segment(path, start, 0, read_only=True)
        seg.size = os.fstat(seg.fd).st_size
        return seg

    def _retire(self, seg: Segment) -> None:
        self._identities.pop(seg, None)
        self._retired.append(seg)

    def _sync_segments(self) -> bool:
        """Open new segment files, reopen files replaced under their name, follow a file still
        growing (preallocation), and let go of files the writer deleted. Returns whether the
        minimum offset moved."""
        state = self.state
        on_disk = writers_files(self.directory)
        moved = False
        with state.lock:
            segs = state.segments.segments
            for gone in self._retired:
                gone.close()  # detached a round ago: no read started before that still uses it
            self._retired = []
            # Expiry: the writer deletes its oldest files. A hole in the middle is not
            # RocketMQ's doing: the open descriptor keeps serving that file.
            while segs and segs[0].start not in on_disk:
                gone = segs.pop(0)
                self._retire(gone)
                moved = True
                log_event(log, "segment deleted by the writer", file=gone.path.name, min_offset=state.segments.min_offset)
            # Recovery: the files after the writer's last whole record are deleted (the end goes),
            # and allocated again later under the same names (another file: reopened).
            while segs and segs[-1].start not in on_disk:
                gone = segs.pop()
                self._retire(gone)
                log_event(log, "segment deleted at the end of the log by the writer", logging.WARNING, file=gone.path.name)
            for i, seg in enumerate(segs):
                found = on_disk.get(seg.start)
                if found is None or found.identity == self._identity(seg):
                    continue
                try:
                    segs[i] = self._open(found.path, seg.start)  # one assignment: readers see either file
                except FileNotFoundError:
                    continue  # deleted again since the listing: next round
                self._retire(seg)
                log_event(log, "segment replaced by the writer under its name: reopened", logging.WARNING, file=seg.path.name)
            known = {s.start for s in segs}
            last = segs[-1].start if segs else -1
            for start, found in sorted(on_disk.items()):
                if start in known or start < last:
                    continue
                try:
                    segs.append(self._open(found.path, start))
                except FileNotFoundError:
                    continue  # deleted between the listing and the open
                last = start
                log_event(log, "segment picked up", file=found.path.name)
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
            while self._served and self._served[0].offset < low:
                self._served.popleft()  # expired, not cut: never looked at again
            for cq in list(state.cqs.queues.values()):
                drop = getattr(cq, "drop_below_phy", None)
                if drop is not None:
                    drop(low)
        return moved

    def _refresh_queues(self) -> None:
        """The writer's ConsumeQueue files: new units and files, deleted files (under the lock:
        the follower's dispatch and the refresh both change a queue)."""
        with self.state.lock:
            low = self.state.segments.min_offset  # the writer deleted what lies below
            for cq in list(self.state.cqs.queues.values()):
                refresh = getattr(cq, "refresh", None)
                if refresh is not None:
                    refresh(low)

    # -- the writer's log cut back -------------------------------------------------------------
    def _check_served(self) -> bool:
        """Whether the last record served is gone from the disk (zeroed, written over, its file
        deleted or replaced); if so the log is cut back at the oldest kept one that is gone
        (a crash may lose pages out of order: one still there after a lost one is not kept)."""
        served = self._served
        if not served or self._still_there(served[-1]):
            return False
        first_gone = next(i for i, s in enumerate(served) if not self._still_there(s))
        # The oldest kept is gone too: exact only if nothing served before it was forgotten.
        self._cut(served[first_gone].offset, exact=first_gone > 0 or not self._forgot_served)
        return True

    def _still_there(self, served: Served) -> bool:
        state = self.state
        if served.offset < state.min_offset:
            return True  # expired (its file deleted from the front), not cut
        seg = state.segments.find(served.offset)
        return seg is not None and seg.read(served.offset, len(served.head)) == served.head

    def _cut(self, cut: int, exact: bool) -> None:
        """Forget everything served from `cut` on, say so once, and follow again from there."""
        state = self.state
        dropped = 0
        with state.lock:
            end = state.write_offset
            while self._served and self._served[-1].offset >= cut:
                dropped += self._served.pop().record
            # The end first: no reader is handed a unit or an offset past it from now on.
            state.write_offset = state.flushed_offset = cut
            state.cuts += 1  # Tail readers past the cut start again (and check what they built)
            for cq in list(state.cqs.queues.values()):
                if isinstance(cq, FollowedConsumeQueue):
                    cq.truncate_from_phy(cut)
            state.dispatch_cache.clear()
        self._blocked = None
        self._reported = {o for o in self._reported if o < cut}  # other records may come to stand there
        unchecked = "" if exact else f"; records before {cut} were not kept to compare, and are served as they are"
        log_event(log, "the writer's log was cut back: records served past the cut dropped", logging.WARNING,
                  cut=cut, previous_end=end, records_dropped=dropped, exact=exact)
        state.report(f"the writer's log was cut back to {cut} (its recovery after a crash): {dropped} records served "
                     f"from {cut} to {end} are gone from its files and were dropped; following again from {cut}{unchecked}")

    # -- reading on ----------------------------------------------------------------------------
    def _advance(self) -> int:
        """Read what the writer added past the write offset (one window); returns records added."""
        state = self.state
        self._blocked = None
        pos = state.write_offset
        seg = state.segments.find(pos)
        if seg is None:
            return 0  # the next segment does not exist yet (or is still empty)
        buf = seg.read(pos, min(seg.end - pos, WINDOW))
        left = seg.end - pos  # bytes to the segment's end, for the header classification
        records: list[Record] = []
        served: list[Served] = []
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
                served.append(Served(pos + at, seg.end, bytes(buf[at:at + BLANK_HEADER_SIZE]), False))
                break
            if head.kind == "bad" or at + head.size > len(buf):
                if head.kind == "record" and at == 0:
                    buf = seg.read(pos, head.size)  # one record larger than the window
                    if len(buf) < head.size:
                        break
                    continue
                if head.kind == "bad":
                    self._not_yet_whole(pos + at, f"header: {head.reason}", pos + at + BLANK_HEADER_SIZE)
                break
            try:
                record = decode_record(buf, at, physical_offset=pos + at, check_crc=True)
            except CorruptRecordError as exc:
                self._not_yet_whole(pos + at, exc.reason, pos + at + head.size)
                break
            if not complete(record):
                self._not_yet_whole(pos + at, "zero bytes where the topic or properties are written", pos + at + head.size)
                break
            records.append(record)
            served.append(Served(pos + at, pos + at + record.store_size, bytes(buf[at:at + HEAD]), True))
            at += record.store_size
        if not records and next_pos is None:
            return 0
        end = pos + at if next_pos is None else next_pos
        self._publish(records, end)
        self._forgot_served = self._forgot_served or len(self._served) + len(served) > SERVED_KEPT
        self._served.extend(served)
        return max(1, len(records))

    def _next_exists(self, seg: Segment) -> bool:
        return any(s.start == seg.end for s in self.state.segments.segments)

    def _not_yet_whole(self, offset: int, why: str, written_to: int) -> None:
        """A record still being written is read again next round; one that stays unreadable
        while the writer's files reach past it stalls the follower (`_account`)."""
        self._blocked = (offset, why, written_to)

    def _account(self) -> None:
        """Tell `progress` how far the writer's files reach and where the follower is; a record
        that stays unreadable while they reach past it is reported once."""
        pos = self.state.write_offset
        blocked = self._blocked
        reach = max(pos, blocked[2] if blocked else 0, self._files_reach(pos))
        if blocked is not None:
            self.progress.block(f"record at {blocked[0]} unreadable: {blocked[1]}")
        elif reach > pos:
            self.progress.block(f"nothing readable at {pos} (zeros or no file) while a later file holds records")
        else:
            self.progress.block("")
        self.progress.input(reach)
        self.progress.advanced(pos)
        if blocked is not None and blocked[0] not in self._reported and self.progress.check():
            self._reported.add(blocked[0])
            self.state.report(f"record at {blocked[0]} still unreadable after {self.progress.stall_after_s:.0f} s ({blocked[1]}); "
                              "reads stop there until the writer completes it")

    def _files_reach(self, pos: int) -> int:
        """How far the newest file past `pos` holding anything reaches, from its first header
        alone (0 when none does): the writer has gone on past the follower."""
        for seg in reversed(self.state.segments.segments):
            if seg.start <= pos:
                break
            first = seg.read(seg.start, BLANK_HEADER_SIZE)
            if len(first) < BLANK_HEADER_SIZE:
                continue  # being allocated (or shorter than its size said)
            head = probe(first, 0, seg.size)
            if head.kind != "end":
                return seg.start + (head.size if head.kind == "record" else BLANK_HEADER_SIZE)
        return 0

    def _publish(self, records: list[Record], end: int) -> None:
        """Make the records readable (write offset first: a queue unit never points past it),
        then dispatch them (queue units, Tail's cache)."""
        state = self.state
        infos: list[DispatchInfo] = [dispatch_info(r) for r in records]
        with state.lock:
            state.write_offset = state.flushed_offset = end
            topics = state.topics
            for record in records:
                if record.store_host not in state.store_hosts_seen:
                    # Copy on write as well: the heartbeat thread reads the set to announce it.
                    state.store_hosts_seen = state.store_hosts_seen | {record.store_host}
                if topics.get(record.topic, 0) <= record.queue_id:
                    # Copy on write: other threads iterate the topic table without the lock.
                    topics = dict(topics)
                    topics[record.topic] = record.queue_id + 1
            for dispatcher in self.dispatchers:
                dispatcher.dispatch(infos)
            state.topics = topics
