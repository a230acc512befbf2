"""Opening a store: find where the log ends, re-write ConsumeQueue units, cut a torn tail.

After a clean shutdown the checkpoint holds the exact end; after a crash the log is scanned
from the checkpoint (a durable record boundary). A read-only store scans its newest
segment(s) without changing anything.
"""
from __future__ import annotations

import logging
import time

from quarry.formats.consume_queue import encode_unit
from quarry.formats.dispatch import dispatch_info
from quarry.formats.record import Record, body_crc, takes_queue_offset
from quarry.formats.segment_walk import WalkResult, walk_segments
from quarry.services.commitlog.checkpoint import StoreCheckpoint, load_checkpoint, save_checkpoint
from quarry.services.commitlog.store_state import ABORT_FILE, StoreState
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
    if not state.read_only and not unclean and checkpoint is not None and checkpoint.clean:
        # Clean shutdown: the checkpoint holds the exact end; no rescan.
        state.write_offset = state.flushed_offset = checkpoint.flushed_offset
        log_event(log, "store opened after clean shutdown", dir=str(state.dir), end=state.write_offset)
        return
    if state.rebuild_in_memory:
        start = state.segments.min_offset  # every record: the queues are built from the log
        log_event(log, "read-only store without consumequeue/: rebuilding queues in memory", dir=str(state.dir), scan_from=start)
    elif state.read_only:
        start = state.segments.segments[-1].start
        for seg in reversed(state.segments.segments):
            start = seg.start
            if seg.read(seg.start, 8) != bytes(8):
                break
    else:
        start = checkpoint.flushed_offset if checkpoint else state.segments.min_offset
        start = max(start, state.segments.min_offset)
        state.recovered = True
        log_event(log, "unclean shutdown: recovering", logging.WARNING, dir=str(state.dir), scan_from=start, checkpoint=checkpoint.flushed_offset if checkpoint else None)
    state.write_offset = _scan_and_repair(state, start)
    state.flushed_offset = state.write_offset
    if not state.read_only:
        state.segments.fsync_all()
        state.cqs.flush()
        save_checkpoint(state.dir, StoreCheckpoint(state.write_offset, int(time.time() * 1000)))


def _scan_and_repair(state: StoreState, start: int) -> int:
    """Walk from `start`, re-write ConsumeQueue units, cut a torn or corrupt tail.

    A record whose CRC fails but whose frame is intact, with valid records after it, is
    kept out of the queues and reported; anything unreadable ends the log there.
    """
    result = WalkResult()
    count = 0
    bad_tail: int | None = None  # first of the CRC-failed records at the very end, if any
    for record in walk_segments(state.dir / "commitlog", from_offset=start, check_crc=False, result=result):
        if record.body and record.body_crc != body_crc(record.body):
            state.report(f"record at {record.physical_offset}: body CRC mismatch (stored {record.body_crc}, computed {body_crc(record.body)}); excluded from queues")
            bad_tail = record.physical_offset if bad_tail is None else bad_tail
            continue
        bad_tail = None  # valid records follow: the bad ones were mid-log, kept and reported
        if not state.read_only or state.rebuild_in_memory:
            _redispatch(state, record)
        if state.rebuild_in_memory:
            state.store_hosts_seen.add(record.store_host)
        count += 1
    if result.corruption is not None:
        state.report(f"{result.corruption} ({'log truncated here' if not state.read_only else 'read-only: reads stop here'})")
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
