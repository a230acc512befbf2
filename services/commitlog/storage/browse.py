"""Browsing a topic by store time: RocketMQ's search-offset-by-time and a windowed, filtered,
store-time-ordered walk over one broker's ConsumeQueues.

A ConsumeQueue unit holds no store time, so, as RocketMQ's ConsumeQueue.getOffsetInQueueByTime
does, a binary search over the queue's units reads each probed record's STORETIMESTAMP from the
commitlog (RocketMQ's pickupStoreTimestamp). Within a queue store times do not decrease (one
appender stamps them in order), so a window [begin, end] is the unit range
[lower(begin), lower(end + 1)): its cost is log(queue length) reads plus the window itself.

Records whose segments retention deleted cannot be returned; a page says so (`GoneRange`) when
the window may hold some, rather than passing for complete.

Plain Python over the store (no gRPC).
"""
from __future__ import annotations

import heapq
import struct
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterator

from quarry.formats import scheduled
from quarry.formats.record import MESSAGE_MAGIC, SYSFLAG_POS, Record, read_size_and_magic, store_timestamp_pos
from quarry.formats.tag_expression import TagFilter
from quarry.services.commitlog.storage.consume_queue_store import ConsumeQueue, MemoryConsumeQueue
from quarry.services.commitlog.storage.errors import DamagedRecord, Expired, InvalidArgument, NotFound

if TYPE_CHECKING:
    from quarry.services.commitlog.storage.store import CommitLogStore

LOWER, UPPER = "LOWER", "UPPER"
UNIT_BATCH = 256  # units read per pread while walking a window
MAX_BROWSE_BYTES = 16 * 1024 * 1024  # one answer stays well inside a gRPC message
_I64 = struct.Struct(">q")
_I32 = struct.Struct(">i")
_HEADER = 80  # enough for STORETIMESTAMP after an IPv6 born host (48 + 20 + 8)


def store_timestamp_at(store: "CommitLogStore", phy: int, size: int) -> int | None:
    """STORETIMESTAMP of the record at phy (RocketMQ's pickupStoreTimestamp); None when it is
    expired, past the end or not a record of that size."""
    if phy < store.min_offset or phy + size > store.write_offset:
        return None
    seg = store.segments.find(phy)
    if seg is None:
        return None
    head = seg.read(phy, min(_HEADER, size))
    if len(head) < 56:
        return None
    rec_size, magic = read_size_and_magic(head, 0)
    if magic != MESSAGE_MAGIC or rec_size != size:
        return None
    pos = store_timestamp_pos(_I32.unpack_from(head, SYSFLAG_POS)[0])
    if pos + 8 > len(head):
        return None
    return int(_I64.unpack_from(head, pos)[0])


def search_offset_by_time(store: "CommitLogStore", cq: ConsumeQueue | MemoryConsumeQueue, timestamp: int, boundary: str = LOWER) -> int:
    """LOWER: the first queue offset whose store time is >= timestamp (max offset when none).
    UPPER: the last queue offset whose store time is <= timestamp (min offset - 1 when none).

    Units whose record expired or cannot be read count as older than any time, as RocketMQ
    moves past units below the commitlog's minimum offset.
    """
    if boundary not in (LOWER, UPPER):
        raise InvalidArgument("boundary", f"must be {LOWER} or {UPPER}")
    lo, hi = cq.min_offset, cq.max_offset  # search [lo, hi)
    if boundary == UPPER:
        timestamp += 1  # last unit <= t is one before the first unit >= t + 1
    while lo < hi:
        mid = (lo + hi) // 2
        unit = cq.read_units(mid, 1)
        if not unit:  # a hole: nothing readable from here on
            hi = mid
            continue
        ts = store_timestamp_at(store, unit[0][0], unit[0][1])
        if ts is None or ts < timestamp:
            lo = mid + 1
        else:
            hi = mid
    return lo if boundary == LOWER else lo - 1


@dataclass(slots=True)
class Browsed:
    """One record the browse returns, with where its queue stands."""

    record: Record
    queue_topic: str  # the topic of the queue it was read from (a parking topic for parked messages)

    def order_key(self, newest_first: bool) -> tuple[int, str, int, int]:
        r = self.record
        if newest_first:
            return (-r.store_timestamp, self.queue_topic, r.queue_id, -r.queue_offset)
        return (r.store_timestamp, self.queue_topic, r.queue_id, r.queue_offset)


@dataclass
class QueueState:
    """A queue's window and whether the browse has nothing more of it."""

    topic: str
    queue_id: int
    window_begin: int  # first queue offset of the window
    window_end: int  # one past the last
    exhausted: bool = False


@dataclass
class BrowseRequest:
    topic: str
    begin: int
    end: int
    tags: TagFilter
    newest_first: bool = True
    max_count: int = 64
    cursors: dict[tuple[str, int], int] = field(default_factory=dict)  # next offset to read, per queue
    done: set[tuple[str, int]] = field(default_factory=set)  # queues already exhausted
    queue_ids: list[int] | None = None  # only these queues of the topic (printMsgByQueue)
    include_parked: bool = True  # delayed messages for the topic still parked


@dataclass
class GoneQueue:
    """Queue offsets [first, end) of one queue whose records retention deleted."""

    topic: str
    queue_id: int
    first: int
    end: int  # the queue's oldest readable offset


@dataclass
class GoneRange:
    """What of a window may be gone: records below the log's minimum offset (deleted segments)."""

    below_physical_offset: int  # the log's minimum offset
    stored_at_or_before: int  # store time of the oldest readable record; 0 when none tells
    queues: list[GoneQueue]


@dataclass
class BrowsePage:
    records: list[Browsed]
    queues: list[QueueState]
    gone: GoneRange | None = None  # set when the window may hold deleted records


def _queue_walk(store: "CommitLogStore", cq: ConsumeQueue | MemoryConsumeQueue, req: BrowseRequest, queue_topic: str, queue_id: int, state: QueueState) -> Iterator[Browsed]:
    """Matching records of one queue in the browse direction, from the cursor, inside the window."""
    parked = queue_topic != req.topic
    start = req.cursors.get((queue_topic, queue_id))
    if req.newest_first:
        pos = state.window_end - 1 if start is None else min(start, state.window_end - 1)
    else:
        pos = state.window_begin if start is None else max(start, state.window_begin)
    while state.window_begin <= pos < state.window_end:
        if req.newest_first:
            first = max(state.window_begin, pos - UNIT_BATCH + 1)
            units = cq.read_units(first, pos - first + 1)
            order = range(len(units) - 1, -1, -1)
            base = first
        else:
            units = cq.read_units(pos, min(UNIT_BATCH, state.window_end - pos))
            order = range(len(units))
            base = pos
        if not units:
            return
        for i in order:
            offset = base + i
            phy, _size, tags_code = units[i]
            # Parked units carry the deliver time as tagsCode: only the real tag can be checked.
            if not parked and not req.tags.matches_code(tags_code):
                continue
            try:
                record = store.read(phy)
            except (NotFound, Expired):
                continue
            if (record.topic, record.queue_id, record.queue_offset) != (queue_topic, queue_id, offset):
                continue  # a damaged unit: never hand out another record as this one
            if not req.begin <= record.store_timestamp <= req.end:
                continue
            props = record.properties
            if parked and not scheduled.belongs_to(record.topic, props, req.topic):
                continue
            if not req.tags.matches_tag(props.get("TAGS")):
                continue
            yield Browsed(record, queue_topic)
        pos = base - 1 if req.newest_first else base + len(units)


def first_live_offset(store: "CommitLogStore", cq: ConsumeQueue | MemoryConsumeQueue) -> int:
    """The queue's first offset whose record was not deleted: every unit below it points under
    the log's minimum offset (or was dropped with its record). Units point ever higher in the
    log, so a binary search over the units, reading no record."""
    floor = store.min_offset
    lo, hi = cq.min_offset, cq.max_offset
    first = cq.read_units(lo, 1)
    if not first or first[0][0] >= floor:
        return lo  # the usual case, one unit read: nothing of the held units is gone
    while lo < hi:
        mid = (lo + hi) // 2
        unit = cq.read_units(mid, 1)
        if unit and unit[0][0] < floor:
            lo = mid + 1
        else:
            hi = mid  # a hole is not known to be gone
    return lo


def _oldest_store_time(store: "CommitLogStore") -> int | None:
    """Store time of the record at the log's minimum offset: no deleted record is newer (one
    appender stamps the log in order). None when no record there can be read."""
    try:
        return store.read(store.min_offset).store_timestamp
    except (NotFound, Expired, InvalidArgument, DamagedRecord):
        return None


def gone_in_window(store: "CommitLogStore", req: BrowseRequest, queue_ids: list[int]) -> GoneRange | None:
    """The topic's queues that may have lost records of the window to retention, or None.

    A queue lost records when its first readable offset is above 0. They were stored before the
    log's oldest readable record, so a window beginning after that record misses nothing (no
    warning then); when that record cannot be read, the queue's own first readable record bounds
    its losses, and with neither the loss is reported. Parked queues (delayed messages) are
    left out: whose topic their lost records were is not known."""
    lost: list[tuple[int, ConsumeQueue | MemoryConsumeQueue, int]] = []
    for qid in queue_ids:
        cq = store.cqs.existing(req.topic, qid)
        if cq is not None and (live := first_live_offset(store, cq)) > 0:
            lost.append((qid, cq, live))
    if not lost:
        return None
    log_bound = _oldest_store_time(store)
    queues: list[GoneQueue] = []
    for qid, cq, live in lost:
        bound = log_bound
        if bound is None:
            unit = cq.read_units(live, 1)
            bound = store_timestamp_at(store, unit[0][0], unit[0][1]) if unit else None
        if bound is None or req.begin <= bound:
            queues.append(GoneQueue(req.topic, qid, 0, live))
    return GoneRange(store.min_offset, log_bound or 0, queues) if queues else None


def browse(store: "CommitLogStore", req: BrowseRequest) -> BrowsePage:
    """Up to max_count matching records of the topic's queues (and parked delayed messages of
    the topic) with store time in [begin, end], merged in store-time order."""
    if req.begin < 0:
        raise InvalidArgument("begin_timestamp", "must be >= 0")
    if req.end < req.begin:
        raise InvalidArgument("end_timestamp", f"must be >= begin_timestamp ({req.begin})")
    if not 1 <= req.max_count <= 1024:
        raise InvalidArgument("max_count", "must be 1..1024")
    queues_of = store.topics.get(req.topic)
    if queues_of is None and not req.include_parked:
        raise NotFound(f"topic {req.topic} does not exist")
    wanted: list[tuple[str, int]] = []
    for qid in (req.queue_ids if req.queue_ids is not None else range(queues_of or 0)):
        if qid < 0 or qid >= (queues_of or 0):
            raise NotFound(f"queue {qid} does not exist: topic {req.topic} has queues 0..{(queues_of or 0) - 1}")
        wanted.append((req.topic, qid))
    if req.include_parked and req.queue_ids is None:
        for parking in scheduled.PARKING_TOPICS:
            for qid in range(store.topics.get(parking, 0)):
                wanted.append((parking, qid))
    states: list[QueueState] = []
    heap: list[tuple[tuple[int, str, int, int], int, Browsed, Iterator[Browsed]]] = []
    for n, (topic, qid) in enumerate(wanted):
        cq = store.cqs.existing(topic, qid)
        if cq is None:
            states.append(QueueState(topic, qid, 0, 0, True))
            continue
        if (topic, qid) in req.done:  # finished on an earlier page: not searched again
            states.append(QueueState(topic, qid, 0, 0, True))
            continue
        state = QueueState(topic, qid, search_offset_by_time(store, cq, req.begin), search_offset_by_time(store, cq, req.end + 1))
        states.append(state)
        walk = _queue_walk(store, cq, req, topic, qid, state)
        first = next(walk, None)
        if first is None:
            state.exhausted = True
        else:
            heapq.heappush(heap, (first.order_key(req.newest_first), n, first, walk))
    out: list[Browsed] = []
    size = 0
    while heap and len(out) < req.max_count and size < MAX_BROWSE_BYTES:
        _, n, item, walk = heapq.heappop(heap)
        out.append(item)
        size += item.record.store_size
        following = next(walk, None)  # peek one ahead: a queue without a next one is exhausted
        if following is None:
            states[n].exhausted = True
        else:
            heapq.heappush(heap, (following.order_key(req.newest_first), n, following, walk))
    topic_queues = [qid for topic, qid in wanted if topic == req.topic]
    return BrowsePage(out, states, gone_in_window(store, req, topic_queues))
