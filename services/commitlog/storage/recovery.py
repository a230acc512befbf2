"""Opening a store: find where the log ends, re-write ConsumeQueue units, cut a torn tail.

What is on disk decides, never the checkpoint alone. A writable store walks, at every start,
its newest `verify_segments` segments (RocketMQ's checkCRCOnRecover walks the newest three)
and checks each record's body CRC; after a crash it also walks from the start of the segment
holding the checkpoint, and from the start of a torn (short) newest file. The log ends at the
last whole record: anything after it is cut, queue units pointing there are dropped (queues
stay contiguous), the torn file gets its full size back, and all of it is reported. A record
whose CRC fails mid-log is kept out of the queues and reported once. A read-only store scans
its newest segment(s) without changing anything.
"""
from __future__ import annotations

import logging
import time

from quarry.formats.consume_queue import encode_unit
from quarry.formats.dispatch import dispatch_info
from quarry.formats.record import Record, body_crc, takes_queue_offset
from quarry.formats.segment_walk import WalkResult, walk_segments
from quarry.services.commitlog.storage.checkpoint import StoreCheckpoint, load_checkpoint, save_checkpoint
from quarry.services.commitlog.storage.store_state import ABORT_FILE, StoreState
from quarry.services.log import log_event

log = logging.getLogger("quarry.store")


def recover(state: StoreState) -> None:
    """Set state.write_offset / flushed_offset to the end of the valid log, repairing it
    (and the queues) unless read-only."""
    unclean = (state.dir / ABORT_FILE).exists()
    checkpoint = load_checkpoint(state.dir)
    if not state.segments.segments:
        state.write_offset = state.flushed_offset = 0
        return
    if state.config.follow:
        # A live writer's store: the follower reads it from the start (services/commitlog/storage/follow.py).
        state.write_offset = state.flushed_offset = state.segments.min_offset
        return
    segments = state.segments
    if state.rebuild_in_memory:
        start = segments.min_offset  # every record: the queues are built from the log
        log_event(log, "read-only store without consumequeue/: rebuilding queues in memory", dir=str(state.dir), scan_from=start)
        redispatch_from = start
    elif state.read_only:
        start = segments.segments[-1].start
        for seg in reversed(segments.segments):
            start = seg.start
            if seg.read(seg.start, 8) != bytes(8):
                break
        redispatch_from = start
    else:
        clean = not unclean and checkpoint is not None and checkpoint.clean
        claimed = max(checkpoint.flushed_offset if checkpoint else segments.min_offset, segments.min_offset)
        # Records from here on are re-dispatched to the queues (after a crash, what the
        # checkpoint does not cover may be missing from them); before it, only verified.
        redispatch_from = claimed if clean else _segment_start(state, claimed)
        start = redispatch_from
        if segments.torn is not None:
            start = min(start, segments.torn[0])
            redispatch_from = min(redispatch_from, segments.torn[0])
        verify = max(0, state.config.verify_segments)
        if verify:
            start = min(start, segments.segments[max(0, len(segments.segments) - verify)].start)
        if not clean:
            state.recovered = True
            log_event(log, "unclean shutdown: recovering", logging.WARNING, dir=str(state.dir), scan_from=start,
                      checkpoint=checkpoint.flushed_offset if checkpoint else None)
        elif start >= claimed and segments.torn is None:
            # Clean shutdown and nothing to verify: the checkpoint holds the exact end.
            state.write_offset = state.flushed_offset = claimed
            log_event(log, "store opened after clean shutdown", dir=str(state.dir), end=claimed)
            return
    state.write_offset = _scan_and_repair(state, start, redispatch_from)
    state.flushed_offset = state.write_offset
    if not state.read_only:
        _report_cut(state, checkpoint)
        segments.restore_sizes()
        segments.fsync_all()
        state.cqs.flush()
        save_checkpoint(state.dir, StoreCheckpoint(state.write_offset, int(time.time() * 1000)))


def _segment_start(state: StoreState, offset: int) -> int:
    """Start of the segment holding `offset` (the newest segment's start when past them all)."""
    seg = state.segments.find(offset)
    if seg is not None:
        return seg.start
    before = [s.start for s in state.segments.segments if s.start <= offset]
    return before[-1] if before else state.segments.min_offset


def _report_cut(state: StoreState, checkpoint: StoreCheckpoint | None) -> None:
    """Say what a crash cut: a short newest file, and records the checkpoint claimed."""
    torn = state.segments.torn
    if torn is not None:
        start, on_disk = torn
        state.report(f"segment {start:020d} was {on_disk} bytes, not {state.segments.segment_size}: torn by a crash; "
                     f"the log ends at the last whole record ({state.write_offset}) and the file has its full size again")
    if checkpoint is not None and checkpoint.flushed_offset > state.write_offset:
        state.report(f"the checkpoint says the log reached {checkpoint.flushed_offset} but whole records end at "
                     f"{state.write_offset}: {checkpoint.flushed_offset - state.write_offset} bytes were cut; queues end there too")


def _scan_and_repair(state: StoreState, start: int, redispatch_from: int) -> int:
    """Walk from `start`, check each record's CRC, re-write ConsumeQueue units of records from
    `redispatch_from`, cut a torn or corrupt tail.

    A record whose CRC fails but whose frame is intact, with valid records after it, is
    kept out of the queues and reported; anything unreadable ends the log there.
    """
    result = WalkResult()
    count = 0
    bad_tail: int | None = None  # first of the CRC-failed records at the very end, if any
    for record in walk_segments(state.dir / "commitlog", from_offset=start, check_crc=False, result=result):
        if record.body and record.body_crc != body_crc(record.body):
            kept_out = "excluded from queues" if record.physical_offset >= redispatch_from else "reads of it answer that it is corrupt"
            state.report(f"record at {record.physical_offset}: body CRC mismatch (stored {record.body_crc}, computed {body_crc(record.body)}); {kept_out}",
                         record.physical_offset)
            bad_tail = record.physical_offset if bad_tail is None else bad_tail
            continue
        bad_tail = None  # valid records follow: the bad ones were mid-log, kept and reported
        if (not state.read_only or state.rebuild_in_memory) and record.physical_offset >= redispatch_from:
            _redispatch(state, record)
        if state.rebuild_in_memory:
            state.store_hosts_seen.add(record.store_host)
        count += 1
    if result.corruption is not None:
        state.report(f"{result.corruption} ({'log truncated here' if not state.read_only else 'read-only: reads stop here'})", result.corruption.offset)
    end = result.end_offset
    if bad_tail is not None and not state.read_only:
        state.report(f"corrupt tail from {bad_tail}: truncated")
        end = bad_tail
    if not state.read_only:
        deleted = state.segments.truncate(end) if _has_bytes_after(state, end) or result.corruption or bad_tail is not None else 0
        for cq in state.cqs.queues.values():
            cq.truncate_from_phy(end)
        if result.corruption is not None or bad_tail is not None or deleted:
            log_event(log, "log truncated", logging.WARNING, at=end, segments_deleted=deleted)
    if state.rebuild_in_memory:
        log_event(log, "queues rebuilt in memory", dir=str(state.dir), topics=len(state.topics), queues=len(state.cqs.queues),
                  store_hosts=",".join(f"{h}:{p}" for h, p in sorted(state.store_hosts_seen)))
    log_event(log, "scan finished", dir=str(state.dir), start=start, end=end, records=count)
    return end


def _has_bytes_after(state: StoreState, end: int) -> bool:
    seg = state.segments.find(end)
    if seg is None:
        return any(s.start > end for s in state.segments.segments)
    tail = seg.read(end, min(4096, seg.end - end))
    return any(tail) or any(s.start > seg.start for s in state.segments.segments)


def _redispatch(state: StoreState, record: Record) -> None:
    info = dispatch_info(record)
    # Enough queues for every queue id the log holds (a rebuilt store knows no more than that).
    floor = 0 if state.rebuild_in_memory else state.config.default_queues
    state.topics[record.topic] = max(state.topics.get(record.topic, floor), record.queue_id + 1)
    if takes_queue_offset(record.sys_flag):
        state.cqs.queue(record.topic, record.queue_id).write_units(record.queue_offset, encode_unit(info.physical_offset, info.size, info.tags_code))
