"""Reading the log: one record by offset, a queue's records (pull), dispatch infos for Tail.

Reads use pread on the segments and take no lock: they only look below the end that was
written when they started (appends never rewrite a record).
"""
from __future__ import annotations

from typing import Callable, TypeVar

from quarry.formats.dispatch import DispatchInfo, decode_dispatch
from quarry.formats.record import (
    BLANK_HEADER_SIZE, BLANK_MAGIC, FIXED_SIZE, MESSAGE_MAGIC, CorruptRecordError, Record, decode_dispatch_fields, decode_record,
    read_size_and_magic,
)
from quarry.services.commitlog.storage.errors import DamagedRecord, Expired, InvalidArgument, NotFound
from quarry.services.commitlog.storage.store_state import StoreState

READ_WINDOW = 4 * 1024 * 1024  # bytes read_dispatch reads at a time
T = TypeVar("T")
FIRST_READ = 4096  # bytes a record read takes at once: most records whole in one pread, not a header read and then the rest


def read_record(state: StoreState, physical_offset: int) -> Record:
    """The record starting at physical_offset (NotFound / Expired / InvalidArgument)."""
    return _read(state, physical_offset, decode_record)[0]


def read_record_bytes(state: StoreState, physical_offset: int) -> tuple[Record, bytes]:
    """The record at physical_offset and its stored bytes, checked as read_record checks them
    (what RocketMQ's broker hands its remoting clients)."""
    return _read(state, physical_offset, decode_record)


def read_key_fields(state: StoreState, physical_offset: int) -> tuple[str, int, str, bytes]:
    """(topic, store timestamp, properties text, stored bytes) of the record at physical_offset,
    its frame and body CRC checked, nothing else decoded: what a key query needs to decide
    whether the record answers it."""
    fields, data = _read(state, physical_offset, _key_fields)
    return fields[1], fields[4], fields[7], data


def _key_fields(buf: bytes, pos: int, *, physical_offset: int) -> tuple[int, str, int, int, int, int, int, str]:
    return decode_dispatch_fields(buf, pos, physical_offset, checked=True)


def _read(state: StoreState, physical_offset: int, decode: Callable[..., T]) -> tuple[T, bytes]:
    if physical_offset < 0:
        raise InvalidArgument("physical_offset", "must be >= 0")
    if physical_offset < state.min_offset:
        raise Expired(f"physical offset {physical_offset} is below the minimum {state.min_offset}: the message has expired")
    if physical_offset >= state.write_offset:
        raise NotFound(f"physical offset {physical_offset} is past the end of the log ({state.write_offset})")
    seg = state.segments.find(physical_offset)
    if seg is None:
        raise NotFound(f"no segment holds physical offset {physical_offset}")
    try:
        return record_at(seg.read, seg.end, physical_offset, largest_record(state.config.max_message_size), decode)
    except DamagedRecord as exc:
        cause = exc.__cause__
        if isinstance(cause, CorruptRecordError):
            state.report(str(cause), cause.offset)
        raise


def largest_record(max_message_size: int) -> int:
    """The largest TOTALSIZE a record of this store can have: a corrupt TOTALSIZE must not make
    a read allocate (up to) a whole segment."""
    return max(max_message_size, 4 * 1024 * 1024) + 32767 + 127 + FIXED_SIZE + 24


def record_at(read: Callable[[int, int], bytes], seg_end: int, physical_offset: int, largest: int,
              decode: Callable[..., T]) -> tuple[T, bytes]:
    """The record starting at physical_offset of a segment ending at seg_end, read with
    read(offset, size), and its bytes: NotFound when no record starts there, DamagedRecord when
    one does and fails its checks (the cause is the CorruptRecordError); `decode(data, 0,
    physical_offset=)` decodes it (formats.record.decode_record, or fewer fields). The one rule
    for the commitlog's own reads and for readers of its files (services/commitlog/storage/log_files.py)."""
    head = read(physical_offset, FIRST_READ)
    if len(head) < 8:
        raise NotFound(f"no record starts at physical offset {physical_offset}")
    size, magic = read_size_and_magic(head, 0)
    if magic != MESSAGE_MAGIC or size <= 0 or size > seg_end - physical_offset or size > largest:
        raise NotFound(f"no record starts at physical offset {physical_offset}")
    data = head[:size] if size <= len(head) else head + read(physical_offset + len(head), size - len(head))
    try:
        return decode(data, 0, physical_offset=physical_offset), data
    except CorruptRecordError as exc:
        if "PHYSICALOFFSET" in exc.reason or "magic" in exc.reason:
            raise NotFound(f"no record starts at physical offset {physical_offset}") from None
        raise DamagedRecord(f"record at physical offset {physical_offset} is corrupt: {exc.reason}") from exc


def pull(state: StoreState, topic: str, queue_id: int, queue_offset: int, max_count: int) -> tuple[list[Record], int, int, int]:
    """Records of topic/queue from queue_offset; returns (records, next, min, max queue
    offset). `next` passes the units read, skipped ones included (so a consumer never
    reads a record twice or sticks on a damaged unit); below the minimum it is the
    minimum, past the end it is the end."""
    if queue_id < 0:
        raise InvalidArgument("queue_id", "must be >= 0")
    if queue_offset < 0:
        raise InvalidArgument("queue_offset", "must be >= 0")
    queues = state.topics.get(topic)
    if queues is None:
        raise NotFound(f"topic {topic} does not exist")
    if queue_id >= queues:
        raise NotFound(f"queue {queue_id} does not exist: topic {topic} has queues 0..{queues - 1}")
    cq = state.cqs.existing(topic, queue_id)
    if cq is None:
        return [], 0, 0, 0
    records = []
    units = list(cq.read_units(queue_offset, max_count))
    for i, (phy, _size, _tags) in enumerate(units):
        expected = queue_offset + i
        try:
            record = read_record(state, phy)
        except Expired:
            continue
        except NotFound as exc:
            state.report(f"consume queue {topic}/{queue_id} unit {expected} points at {phy}: {exc}; skipped")
            continue
        # A damaged unit may point at another message: never hand that out as this one.
        if (record.topic, record.queue_id, record.queue_offset) != (topic, queue_id, expected):
            state.report(f"consume queue {topic}/{queue_id} unit {expected} points at {phy}, a record of {record.topic}/{record.queue_id}/{record.queue_offset}; skipped")
            continue
        records.append(record)
    lo, hi = cq.min_offset, cq.max_offset
    next_offset = queue_offset + len(units) if units else min(max(queue_offset, lo), hi)
    return records, next_offset, lo, hi


def read_dispatch(state: StoreState, from_offset: int, max_records: int, until: int) -> tuple[list[DispatchInfo], int]:
    """Dispatch infos of records in [from_offset, until), at most max_records; returns
    (infos, next offset). from_offset must be a record start, a segment's blank, or `until`."""
    cached = state.dispatch_cache.get(from_offset, max_records, until)
    if cached is not None:
        return cached
    out: list[DispatchInfo] = []
    offset = from_offset
    largest = max(state.config.max_message_size, READ_WINDOW) + 64 * 1024  # body + topic/properties room
    while offset < until and len(out) < max_records:
        seg = state.segments.find(offset)
        if seg is None:
            if offset < state.min_offset:
                raise Expired(f"offset {offset} is below the minimum {state.min_offset} (its segment expired)")
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


def check_tail_start(state: StoreState, offset: int) -> None:
    """Raise unless `offset` is where a Tail may start: a record start or the end."""
    if offset < 0:
        raise InvalidArgument("from_offset", "must be >= 0")
    if offset < state.min_offset:
        raise Expired(f"from_offset {offset} is below the minimum {state.min_offset}")
    if offset > state.write_offset:
        raise Expired(f"from_offset {offset} is past the end of the log ({state.write_offset})")
    if offset == state.write_offset:
        return
    seg = state.segments.find(offset)
    if seg is None:
        raise NotFound(f"from_offset {offset}: no segment holds it")
    if offset == seg.start:
        return
    _size, magic = read_size_and_magic(seg.read(offset, 8).ljust(8, b"\0"), 0)
    if magic == BLANK_MAGIC:
        return
    read_record(state, offset)
