"""One broker's store: CommitLog segments, ConsumeQueues, topics, checkpoint, recovery.

Plain Python over files (no gRPC). Appends are serialised by one lock; encoding and
validation happen before it. Durability: ASYNC acknowledges once bytes are in the page
cache (they survive a process crash) and fsyncs every interval; SYNC acknowledges after an
fsync that concurrent appenders share (group commit). Tail readers only ever see the
fsynced prefix, which recovery can never truncate.
"""
from __future__ import annotations

import errno
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from quarry.formats import offset_msg_id
from quarry.formats.consume_queue import encode_unit
from quarry.formats.record import (
    BLANK_HEADER_SIZE, BLANK_MAGIC, FIXED_SIZE, MESSAGE_MAGIC, SCHEDULE_TOPIC, CorruptRecordError, DispatchInfo, Record,
    body_crc, decode_dispatch, decode_record, dispatch_info, patch_record, read_size_and_magic, takes_queue_offset,
)
from quarry.formats.segment_walk import WalkResult, walk_segments
from quarry.services.commitlog.checkpoint import StoreCheckpoint, load_checkpoint, save_checkpoint
from quarry.services.commitlog.consume_queue_store import ConsumeQueueStore
from quarry.services.commitlog.dispatch_cache import DispatchCache
from quarry.services.commitlog.errors import DiskFull, Expired, InvalidArgument, NotFound, ReadOnly
from quarry.services.commitlog.message_input import NewMessage, Prepared, prepare_many
from quarry.services.commitlog.segments import SegmentQueue
from quarry.services.commitlog.topic_table import load_topics, save_topics
from quarry.services.log import log_event
from quarry.services.metrics import FLUSH_SECONDS

log = logging.getLogger("quarry.store")

ABORT_FILE = "abort"
MAX_BATCH_MESSAGES = 10_000
MAX_BATCH_BYTES = 64 * 1024 * 1024
READ_WINDOW = 4 * 1024 * 1024  # bytes read_dispatch reads at a time


@dataclass
class StoreConfig:
    """Every store setting, with RocketMQ-like defaults."""

    store_dir: Path
    store_host: tuple[str, int] = ("127.0.0.1", 10911)
    segment_size: int = 1024 * 1024 * 1024
    cq_units_per_file: int = 300_000
    flush_mode: str = "ASYNC"  # or SYNC
    flush_interval_ms: int = 500
    sync_flush_timeout_ms: int = 5000
    auto_create_topics: bool = True
    default_queues: int = 4
    max_message_size: int = 4 * 1024 * 1024
    file_reserved_hours: float = 72.0
    read_only: bool = False
    dispatch_cache_records: int = 32768  # newest records whose dispatch info Tail serves from memory


@dataclass(slots=True)
class AppendResult:
    """Where one message was stored."""

    topic: str
    queue_id: int
    queue_offset: int
    physical_offset: int
    size: int
    store_timestamp: int
    offset_msg_id: str
    unique_key: str
    flushed: bool = True


@dataclass
class StoreStatus:
    min_offset: int
    max_offset: int
    committed_offset: int
    segments: list[tuple[str, int, int, int]]  # name, start, written, size
    topics: dict[str, list[int]]  # topic -> max queue offset per queue
    flush_mode: str
    read_only: bool
    corruption: list[str]
    recovered: bool


@dataclass
class _Pending:
    prepared: Prepared
    index: int
    result: AppendResult | None = None


class CommitLogStore:
    """The store. Thread-safe; one instance per store directory."""

    def __init__(self, config: StoreConfig) -> None:
        self.config = config
        self.dir = Path(config.store_dir)
        self.read_only = config.read_only
        if not self.read_only:
            self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
            (self.dir / "commitlog").mkdir(exist_ok=True, mode=0o700)
        elif not (self.dir / "commitlog").is_dir():
            raise FileNotFoundError(f"{self.dir}: no commitlog/ directory to open read-only")
        self.lock = threading.Lock()
        self.flushed = threading.Condition(threading.Lock())
        self.segments = SegmentQueue(self.dir / "commitlog", config.segment_size, self.read_only)
        self.cqs = ConsumeQueueStore(self.dir / "consumequeue", config.cq_units_per_file, self.read_only)
        self.topics: dict[str, int] = load_topics(self.dir / "config")
        for topic, qid in self.cqs.queues:
            self.topics[topic] = max(self.topics.get(topic, 0), qid + 1)
        self.corruption: list[str] = []
        self.recovered = False
        self.write_offset = 0
        self.flushed_offset = 0
        self._round_robin: dict[str, int] = {}
        self.dispatch_cache = DispatchCache(config.dispatch_cache_records)
        self._flush_listeners: list[Callable[[], None]] = []
        # offsetMsgId = hex(store host ip + port) + hex(offset): the host part never changes.
        self._id_prefix = offset_msg_id.create(config.store_host[0], config.store_host[1], 0)[:-16]
        self._closed = False
        self._stop = threading.Event()
        self._flush_wanted = threading.Event()
        self._open()
        self._flusher: threading.Thread | None = None
        if not self.read_only:
            (self.dir / ABORT_FILE).touch(mode=0o600)
            self._flusher = threading.Thread(target=self._flush_loop, name="flusher", daemon=True)
            self._flusher.start()

    # -- open and recovery ----------------------------------------------------------------
    def _open(self) -> None:
        unclean = (self.dir / ABORT_FILE).exists()
        checkpoint = load_checkpoint(self.dir)
        if not self.segments.segments:
            self.write_offset = self.flushed_offset = 0
            return
        if not self.read_only and not unclean and checkpoint is not None and checkpoint.clean:
            # Clean shutdown: the checkpoint holds the exact end; no rescan.
            self.write_offset = self.flushed_offset = checkpoint.flushed_offset
            log_event(log, "store opened after clean shutdown", dir=str(self.dir), end=self.write_offset)
            return
        if self.read_only:
            start = self.segments.segments[-1].start
            for seg in reversed(self.segments.segments):
                start = seg.start
                if seg.read(seg.start, 8) != bytes(8):
                    break
        else:
            start = checkpoint.flushed_offset if checkpoint else self.segments.min_offset
            start = max(start, self.segments.min_offset)
            self.recovered = True
            log_event(log, "unclean shutdown: recovering", logging.WARNING, dir=str(self.dir), scan_from=start, checkpoint=checkpoint.flushed_offset if checkpoint else None)
        self.write_offset = self._scan_and_repair(start)
        self.flushed_offset = self.write_offset
        if not self.read_only:
            self.segments.fsync_all()
            self.cqs.flush()
            save_checkpoint(self.dir, StoreCheckpoint(self.write_offset, int(time.time() * 1000)))

    def _scan_and_repair(self, start: int) -> int:
        """Walk from `start`, re-write ConsumeQueue units, cut a torn or corrupt tail.

        A record whose CRC fails but whose frame is intact, with valid records after it, is
        kept out of the queues and reported; anything unreadable ends the log there.
        """
        result = WalkResult()
        count = 0
        bad_tail: int | None = None  # first of the CRC-failed records at the very end, if any
        for record in walk_segments(self.dir / "commitlog", from_offset=start, check_crc=False, result=result):
            if record.body and record.body_crc != body_crc(record.body):
                self._report(f"record at {record.physical_offset}: body CRC mismatch (stored {record.body_crc}, computed {body_crc(record.body)}); excluded from queues")
                bad_tail = record.physical_offset if bad_tail is None else bad_tail
                continue
            bad_tail = None  # valid records follow: the bad ones were mid-log, kept and reported
            if not self.read_only:
                self._redispatch(record)
            count += 1
        if result.corruption is not None:
            self._report(f"{result.corruption} ({'log truncated here' if not self.read_only else 'read-only: reads stop here'})")
        end = result.end_offset
        if bad_tail is not None and not self.read_only:
            self._report(f"corrupt tail from {bad_tail}: truncated")
            end = bad_tail
        if not self.read_only:
            deleted = self.segments.truncate(end) if self._has_bytes_after(end) or result.corruption or bad_tail is not None else 0
            for cq in self.cqs.queues.values():
                cq.truncate_from_phy(end)
            if result.corruption is not None or bad_tail is not None or deleted:
                log_event(log, "log truncated", logging.WARNING, at=end, segments_deleted=deleted)
        log_event(log, "scan finished", dir=str(self.dir), start=start, end=end, records=count)
        return end

    def _has_bytes_after(self, end: int) -> bool:
        seg = self.segments.find(end)
        if seg is None:
            return any(s.start > end for s in self.segments.segments)
        tail = seg.read(end, min(4096, seg.end - end))
        return any(tail) or any(s.start > seg.start for s in self.segments.segments)

    def _redispatch(self, record: Record) -> None:
        info = dispatch_info(record)
        self.topics.setdefault(record.topic, max(self.config.default_queues, record.queue_id + 1))
        if takes_queue_offset(record.sys_flag):
            self.cqs.queue(record.topic, record.queue_id).write_units(record.queue_offset, encode_unit(info.physical_offset, info.size, info.tags_code))

    def _report(self, problem: str) -> None:
        self.corruption.append(problem)
        log_event(log, "corruption found", logging.ERROR, dir=str(self.dir), problem=problem)

    # -- append ---------------------------------------------------------------------------
    def append(self, msg: NewMessage) -> AppendResult:
        """Validate, store and (in SYNC mode) fsync one message."""
        return self.append_many([msg])[0]

    def append_many(self, msgs: list[NewMessage], same_topic: bool = True, wait_flush: bool = True) -> list[AppendResult]:
        """Store messages in order with one write per segment touched; all or nothing on bad input.

        In SYNC mode it returns once the messages are fsynced, unless wait_flush is False: the
        caller then waits itself (an event loop must not block; see flushed_offset and
        add_flush_listener), marking results `flushed=False` on timeout."""
        if self.read_only:
            raise ReadOnly("store is read-only")
        if not msgs:
            raise InvalidArgument("messages", "must not be empty")
        if len(msgs) > MAX_BATCH_MESSAGES:
            raise InvalidArgument("messages", f"at most {MAX_BATCH_MESSAGES} per batch, got {len(msgs)}")
        now = int(time.time() * 1000)
        prepared = prepare_many(msgs, self.config.max_message_size, self.config.store_host, now)
        if same_topic and any(p.topic != prepared[0].topic for p in prepared):
            bad = next(i for i, p in enumerate(prepared) if p.topic != prepared[0].topic)
            raise InvalidArgument(f"messages[{bad}].topic", f"a batch holds one topic ({prepared[0].topic!r})")
        for i, p in enumerate(prepared):
            if len(p.record) + BLANK_HEADER_SIZE > self.config.segment_size:  # a record never spans two segments
                raise InvalidArgument(f"messages[{i}].body" if len(prepared) > 1 else "body",
                                      f"the record ({len(p.record)} bytes) does not fit in a {self.config.segment_size}-byte segment")
        if sum(len(p.record) for p in prepared) > MAX_BATCH_BYTES:
            raise InvalidArgument("messages", f"batch exceeds {MAX_BATCH_BYTES} bytes")
        with self.lock:
            results = self._append_locked(prepared)
        if self.config.flush_mode == "SYNC" and wait_flush:
            ok = self._wait_flushed(results[-1].physical_offset + results[-1].size)
            if not ok:
                for r in results:
                    r.flushed = False
        return results

    def _append_locked(self, prepared: list[Prepared]) -> list[AppendResult]:
        if self._closed:
            raise ReadOnly("store is closed")
        for i, p in enumerate(prepared):
            queues = self.topics.get(p.topic)
            if queues is None:
                if not self.config.auto_create_topics:
                    raise NotFound(f"topic {p.topic} does not exist and auto-creation is off")
            elif p.queue_id >= queues:
                field = f"messages[{i}].queue_id" if len(prepared) > 1 else "queue_id"
                raise InvalidArgument(field, f"{p.queue_id} out of range: topic {p.topic} has queues 0..{queues - 1}")
            elif p.queue_id < -1:
                raise InvalidArgument("queue_id", "must be >= -1")
        created = [p.topic for p in prepared if p.topic not in self.topics]
        new_topics = dict(self.topics)
        for topic in created:
            new_topics[topic] = self.config.default_queues
        for i, p in enumerate(prepared):
            if p.queue_id >= new_topics[p.topic]:
                field = f"messages[{i}].queue_id" if len(prepared) > 1 else "queue_id"
                raise InvalidArgument(field, f"{p.queue_id} out of range: topic {p.topic} has queues 0..{new_topics[p.topic] - 1}")
        now = int(time.time() * 1000)
        offset = self.write_offset
        writes: list[tuple[object, int, bytearray]] = []  # (segment, at, buffer)
        cq_writes: dict[tuple[str, int], tuple[int, bytearray]] = {}
        queue_next: dict[tuple[str, int], int] = {}
        results: list[AppendResult] = []
        dispatched: list[DispatchInfo] = []
        rr = dict(self._round_robin)
        id_prefix = self._id_prefix
        buf: bytearray | None = None  # the write buffer of the segment being filled
        buf_seg_end = 0
        for p in prepared:
            queue_id = p.queue_id
            if queue_id < 0:
                if p.queue_id == -1 and results and results[-1].topic == p.topic and len(prepared) > 1:
                    queue_id = results[-1].queue_id  # a batch goes to one queue
                else:
                    n = rr.get(p.topic, -1) + 1
                    rr[p.topic] = n
                    queue_id = n % new_topics[p.topic]
            key = (p.topic, queue_id)
            if key not in queue_next:
                cq = self.cqs.existing(*key)
                queue_next[key] = cq.max_offset if cq else 0
            advances = p.takes_queue_offset
            queue_offset = queue_next[key] if advances else 0
            size = len(p.record)
            if buf is not None and offset + size + BLANK_HEADER_SIZE <= buf_seg_end:
                at = offset  # fast path: the record fits in the segment being filled
            else:
                seg, at, blank = self.segments.segment_for_append(offset, size)
                if blank is not None:
                    writes.append((self.segments.find(offset), offset, bytearray(blank)))
                buf = bytearray()
                buf_seg_end = seg.end
                writes.append((seg, at, buf))
            rec_at = len(buf)
            buf += p.record
            # the queue id is patched too: it may have been chosen here
            patch_record(buf, rec_at, queue_id, queue_offset, at, now, p.store_timestamp_pos)
            if p.topic == SCHEDULE_TOPIC:  # a delayed message's tagsCode is its deliver time: the format's rule
                info = decode_dispatch(buf, rec_at, at)
            else:
                info = DispatchInfo(at, size, p.topic, queue_id, queue_offset, p.tags_code, p.dispatch_keys,
                                    p.unique_key or None, now, p.stored_sys_flag, p.prepared_transaction_offset)
            dispatched.append(info)
            if advances:
                queue_next[key] = queue_offset + 1
                pending = cq_writes.get(key)
                if pending is None:
                    pending = cq_writes[key] = (queue_offset, bytearray())
                pending[1].extend(encode_unit(at, size, info.tags_code))  # as recovery re-dispatches it
            results.append(AppendResult(p.topic, queue_id, queue_offset, at, size, now, f"{id_prefix}{at:016X}", p.unique_key))
            offset = at + size
        try:
            for seg, at, buf in writes:
                seg.write(at, buf)  # type: ignore[attr-defined]
            for (topic, qid), (first, units) in cq_writes.items():
                self.cqs.queue(topic, qid).write_units(first, bytes(units))
        except OSError as exc:
            # Nothing is acknowledged; the next append overwrites whatever part was written.
            for (topic, qid) in cq_writes:
                cq = self.cqs.existing(topic, qid)
                if cq is not None:
                    cq.truncate_from_phy(self.write_offset)
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise DiskFull(f"no space left on device writing {self.dir}: nothing stored") from exc
            raise
        if created:
            self.topics = new_topics
            save_topics(self.dir / "config", self.topics)
            log_event(log, "topic created", topics=",".join(created), queues=self.config.default_queues)
        self._round_robin = rr
        self.write_offset = offset
        self.dispatch_cache.add(dispatched)
        return results

    # -- flush ----------------------------------------------------------------------------
    def _wait_flushed(self, offset: int) -> bool:
        self._flush_wanted.set()
        deadline = time.monotonic() + self.config.sync_flush_timeout_ms / 1000.0
        with self.flushed:
            while self.flushed_offset < offset:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.flushed.wait(left)
        return True

    def _flush_loop(self) -> None:
        interval = self.config.flush_interval_ms / 1000.0
        last_retention = 0.0
        while not self._stop.is_set():
            self._flush_wanted.wait(interval)
            self._flush_wanted.clear()
            if self._stop.is_set():
                break  # close() does the last flush itself
            # Nothing may end this thread: without it the durable end never moves again
            # (SYNC sends time out, tailers see nothing new).
            try:
                self.flush()
            except Exception as exc:
                log_event(log, "flush failed", logging.ERROR, error=repr(exc))
            if time.monotonic() - last_retention > 60:
                last_retention = time.monotonic()
                try:
                    self.delete_expired()
                except Exception as exc:
                    log_event(log, "retention failed", logging.ERROR, error=repr(exc))

    def flush(self, clean: bool = False) -> int:
        """fsync everything written so far; wake SYNC waiters and tailers. Returns the flushed offset."""
        with self.lock:
            target = self.write_offset
            dirty = [s for s in self.segments.segments if s.dirty]
            # Queue units up to `target` were written under the lock; sync them outside it,
            # so appends are never held up by an fsync.
            cq_fds = self.cqs.take_dirty()
        if target == self.flushed_offset and not clean and not dirty and not cq_fds:
            return target
        t0 = time.perf_counter()
        for seg in dirty:
            seg.fsync()
        for fd in cq_fds:
            os.fdatasync(fd)
        FLUSH_SECONDS.observe(time.perf_counter() - t0)
        save_checkpoint(self.dir, StoreCheckpoint(target, int(time.time() * 1000), clean))
        with self.flushed:
            self.flushed_offset = max(self.flushed_offset, target)
            self.flushed.notify_all()
        for listener in self._flush_listeners:
            listener()
        return target

    def add_flush_listener(self, listener: Callable[[], None]) -> None:
        """Call `listener` (from the flushing thread) each time the durable end may have moved."""
        self._flush_listeners.append(listener)

    def request_flush(self) -> None:
        """Flush now rather than at the next interval: someone waits on the durable end
        (a SYNC sender, or a tailer in ASYNC mode, which should not wait a whole interval)."""
        if self.write_offset > self.flushed_offset:
            self._flush_wanted.set()

    @property
    def committed_offset(self) -> int:
        """End of the durable prefix: what Tail may stream."""
        return self.flushed_offset

    # -- read -----------------------------------------------------------------------------
    @property
    def min_offset(self) -> int:
        return self.segments.min_offset

    def read(self, physical_offset: int) -> Record:
        """The record starting at physical_offset (NotFound / Expired / InvalidArgument)."""
        if physical_offset < 0:
            raise InvalidArgument("physical_offset", "must be >= 0")
        if physical_offset < self.min_offset:
            raise Expired(f"physical offset {physical_offset} is below the minimum {self.min_offset}: the message has expired")
        if physical_offset >= self.write_offset:
            raise NotFound(f"physical offset {physical_offset} is past the end of the log ({self.write_offset})")
        seg = self.segments.find(physical_offset)
        if seg is None:
            raise NotFound(f"no segment holds physical offset {physical_offset}")
        head = seg.read(physical_offset, 8)
        if len(head) < 8:
            raise NotFound(f"no record starts at physical offset {physical_offset}")
        size, magic = read_size_and_magic(head, 0)
        # A corrupt TOTALSIZE must not make us read (and allocate) up to a whole segment.
        largest = max(self.config.max_message_size, 4 * 1024 * 1024) + 32767 + 127 + FIXED_SIZE + 24
        if magic != MESSAGE_MAGIC or size <= 0 or size > seg.end - physical_offset or size > largest:
            raise NotFound(f"no record starts at physical offset {physical_offset}")
        data = seg.read(physical_offset, size)
        try:
            return decode_record(data, 0, physical_offset=physical_offset)
        except CorruptRecordError as exc:
            if "PHYSICALOFFSET" in exc.reason or "magic" in exc.reason:
                raise NotFound(f"no record starts at physical offset {physical_offset}") from None
            self._report(str(exc))
            raise NotFound(f"record at physical offset {physical_offset} is corrupt: {exc.reason}") from None

    def pull(self, topic: str, queue_id: int, queue_offset: int, max_count: int) -> tuple[list[Record], int, int, int]:
        """Records of topic/queue from queue_offset; returns (records, next, min, max queue
        offset). `next` passes the units read, skipped ones included (so a consumer never
        reads a record twice or sticks on a damaged unit); below the minimum it is the
        minimum, past the end it is the end."""
        if queue_id < 0:
            raise InvalidArgument("queue_id", "must be >= 0")
        if queue_offset < 0:
            raise InvalidArgument("queue_offset", "must be >= 0")
        queues = self.topics.get(topic)
        if queues is None:
            raise NotFound(f"topic {topic} does not exist")
        if queue_id >= queues:
            raise NotFound(f"queue {queue_id} does not exist: topic {topic} has queues 0..{queues - 1}")
        cq = self.cqs.existing(topic, queue_id)
        if cq is None:
            return [], 0, 0, 0
        records = []
        units = list(cq.read_units(queue_offset, max_count))
        for i, (phy, _size, _tags) in enumerate(units):
            expected = queue_offset + i
            try:
                record = self.read(phy)
            except Expired:
                continue
            except NotFound as exc:
                self._report(f"consume queue {topic}/{queue_id} unit {expected} points at {phy}: {exc}; skipped")
                continue
            # A damaged unit may point at another message: never hand that out as this one.
            if (record.topic, record.queue_id, record.queue_offset) != (topic, queue_id, expected):
                self._report(f"consume queue {topic}/{queue_id} unit {expected} points at {phy}, a record of {record.topic}/{record.queue_id}/{record.queue_offset}; skipped")
                continue
            records.append(record)
        lo, hi = cq.min_offset, cq.max_offset
        next_offset = queue_offset + len(units) if units else min(max(queue_offset, lo), hi)
        return records, next_offset, lo, hi

    def read_dispatch(self, from_offset: int, max_records: int, until: int) -> tuple[list[DispatchInfo], int]:
        """Dispatch infos of records in [from_offset, until), at most max_records; returns
        (infos, next offset). from_offset must be a record start, a segment's blank, or `until`."""
        cached = self.dispatch_cache.get(from_offset, max_records, until)
        if cached is not None:
            return cached
        out: list[DispatchInfo] = []
        offset = from_offset
        largest = max(self.config.max_message_size, READ_WINDOW) + 64 * 1024  # body + topic/properties room
        while offset < until and len(out) < max_records:
            seg = self.segments.find(offset)
            if seg is None:
                if offset < self.min_offset:
                    raise Expired(f"offset {offset} is below the minimum {self.min_offset} (its segment expired)")
                raise NotFound(f"no segment holds physical offset {offset}")
            # A bounded window: a reader far behind must not pull the rest of a 1 GiB segment
            # into memory for every batch.
            chunk = seg.read(offset, min(until, seg.end, offset + READ_WINDOW) - offset)
            pos = 0
            while pos + BLANK_HEADER_SIZE <= len(chunk) and len(out) < max_records:
                size, magic = read_size_and_magic(chunk, pos)
                if magic == BLANK_MAGIC:
                    pos = seg.end - offset
                    break
                if size > len(chunk) - pos and size <= largest and offset + pos + size <= min(until, seg.end):
                    if out or pos:
                        break  # the record straddles the window: the next read starts at it
                    chunk = seg.read(offset, size)  # one record larger than the window
                try:
                    info = decode_dispatch(chunk, pos, offset + pos)
                except CorruptRecordError as exc:
                    raise NotFound(f"no record starts at physical offset {offset + pos}: {exc.reason}") from None
                out.append(info)
                pos += info.size
            if pos == 0:
                break
            offset += pos
            if offset >= seg.end:
                offset = seg.end
        return out, offset

    def check_tail_start(self, offset: int) -> None:
        """Raise unless `offset` is where a Tail may start: a record start or the end."""
        if offset < 0:
            raise InvalidArgument("from_offset", "must be >= 0")
        if offset < self.min_offset:
            raise Expired(f"from_offset {offset} is below the minimum {self.min_offset}")
        if offset > self.write_offset:
            raise Expired(f"from_offset {offset} is past the end of the log ({self.write_offset})")
        if offset == self.write_offset:
            return
        seg = self.segments.find(offset)
        if seg is None:
            raise NotFound(f"from_offset {offset}: no segment holds it")
        if offset == seg.start:
            return
        size, magic = read_size_and_magic(seg.read(offset, 8).ljust(8, b"\0"), 0)
        if magic == BLANK_MAGIC:
            return
        self.read(offset)

    # -- retention ------------------------------------------------------------------------
    def delete_expired(self, now_s: float | None = None) -> int:
        """Delete segments older than the reserved time, oldest first, never the active one."""
        if self.read_only:
            return 0
        now_s = now_s if now_s is not None else time.time()
        limit = self.config.file_reserved_hours * 3600
        expired = []
        with self.lock:
            while len(self.segments.segments) > 1:
                oldest = self.segments.segments[0]
                if self.segments.segments[1].start > self.write_offset:
                    break
                if now_s - os.path.getmtime(oldest.path) < limit:
                    break
                expired.append(self.segments.detach_oldest())
                log_event(log, "segment expired", file=oldest.path.name, min_offset=self.segments.min_offset)
        for seg in expired:  # appends go on meanwhile: unlinking a 1 GiB file takes a while
            self.segments.remove(seg)
        return len(expired)

    # -- status ---------------------------------------------------------------------------
    def status(self) -> StoreStatus:
        with self.lock:
            segs = []
            for s in self.segments.segments:
                written = max(0, min(self.write_offset, s.end) - s.start)
                segs.append((s.path.name, s.start, written, s.size))
            topics = {}
            for topic, n in sorted(self.topics.items()):
                topics[topic] = [(cq.max_offset if (cq := self.cqs.existing(topic, q)) else 0) for q in range(n)]
            return StoreStatus(self.min_offset, self.write_offset, self.flushed_offset, segs, topics, self.config.flush_mode, self.read_only, list(self.corruption), self.recovered)

    def close(self) -> None:
        """Flush, write a clean checkpoint, remove the abort marker, close files."""
        if self._closed:
            return
        if not self.read_only:
            self._stop.set()
            self._flush_wanted.set()
            if self._flusher is not None:
                self._flusher.join(timeout=10)
            self.flush(clean=True)
        with self.lock:
            self._closed = True
        with self.flushed:
            self.flushed.notify_all()
        self.segments.close()
        self.cqs.close()
        if not self.read_only:
            try:
                os.unlink(self.dir / ABORT_FILE)
            except FileNotFoundError:
                pass


