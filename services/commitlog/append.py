"""Appending messages: validate and encode outside the lock, then place, patch and write under it.

A batch is all or nothing on bad input. Under the lock only the queue offset, physical offset
and store timestamp are patched into records already encoded; one write per segment touched,
one ConsumeQueue write per queue; the dispatch info of every record goes to the Tail cache.
"""
from __future__ import annotations

import errno
import logging
import time
from dataclasses import dataclass

from quarry.formats import offset_msg_id
from quarry.formats.consume_queue import encode_unit
from quarry.formats.dispatch import DispatchInfo, build_dispatch
from quarry.formats.record import BLANK_HEADER_SIZE, patch_record
from quarry.services.commitlog.errors import DiskFull, InvalidArgument, NotFound, ReadOnly
from quarry.services.commitlog.message_input import NewMessage, Prepared, prepare_many
from quarry.services.commitlog.store_state import StoreState
from quarry.services.commitlog.topic_table import save_topics
from quarry.services.log import log_event

log = logging.getLogger("quarry.store")

MAX_BATCH_MESSAGES = 10_000
MAX_BATCH_BYTES = 64 * 1024 * 1024


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


class Appender:
    """Places prepared records in the log; the caller's batch checks run first (`prepare`)."""

    def __init__(self, state: StoreState) -> None:
        self.state = state
        self._round_robin: dict[str, int] = {}
        # offsetMsgId = hex(store host ip + port) + hex(offset): the host part never changes.
        self._id_prefix = offset_msg_id.create(state.config.store_host[0], state.config.store_host[1], 0)[:-16]

    def prepare(self, msgs: list[NewMessage], same_topic: bool) -> list[Prepared]:
        """Validate and encode a batch (no lock held); InvalidArgument names the field."""
        state = self.state
        if state.read_only:
            raise ReadOnly("store is read-only")
        if not msgs:
            raise InvalidArgument("messages", "must not be empty")
        if len(msgs) > MAX_BATCH_MESSAGES:
            raise InvalidArgument("messages", f"at most {MAX_BATCH_MESSAGES} per batch, got {len(msgs)}")
        config = state.config
        now = int(time.time() * 1000)
        prepared = prepare_many(msgs, config.max_message_size, config.store_host, now)
        if same_topic and any(p.topic != prepared[0].topic for p in prepared):
            bad = next(i for i, p in enumerate(prepared) if p.topic != prepared[0].topic)
            raise InvalidArgument(f"messages[{bad}].topic", f"a batch holds one topic ({prepared[0].topic!r})")
        for i, p in enumerate(prepared):
            if len(p.record) + BLANK_HEADER_SIZE > config.segment_size:  # a record never spans two segments
                raise InvalidArgument(f"messages[{i}].body" if len(prepared) > 1 else "body",
                                      f"the record ({len(p.record)} bytes) does not fit in a {config.segment_size}-byte segment")
        if sum(len(p.record) for p in prepared) > MAX_BATCH_BYTES:
            raise InvalidArgument("messages", f"batch exceeds {MAX_BATCH_BYTES} bytes")
        return prepared

    def append_locked(self, prepared: list[Prepared]) -> list[AppendResult]:
        """Store prepared records; the caller holds state.lock."""
        state = self.state
        config = state.config
        if state.closed:
            raise ReadOnly("store is closed")
        for i, p in enumerate(prepared):
            queues = state.topics.get(p.topic)
            if queues is None:
                if not config.auto_create_topics:
                    raise NotFound(f"topic {p.topic} does not exist and auto-creation is off")
            elif p.queue_id >= queues:
                field = f"messages[{i}].queue_id" if len(prepared) > 1 else "queue_id"
                raise InvalidArgument(field, f"{p.queue_id} out of range: topic {p.topic} has queues 0..{queues - 1}")
            elif p.queue_id < -1:
                raise InvalidArgument("queue_id", "must be >= -1")
        created = list(dict.fromkeys(p.topic for p in prepared if p.topic not in state.topics))  # each once, in order
        new_topics = dict(state.topics)
        for topic in created:
            new_topics[topic] = config.default_queues
        for i, p in enumerate(prepared):
            if p.queue_id >= new_topics[p.topic]:
                field = f"messages[{i}].queue_id" if len(prepared) > 1 else "queue_id"
                raise InvalidArgument(field, f"{p.queue_id} out of range: topic {p.topic} has queues 0..{new_topics[p.topic] - 1}")
        now = int(time.time() * 1000)
        offset = state.write_offset
        segments = state.segments
        cqs = state.cqs
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
                cq = cqs.existing(*key)
                queue_next[key] = cq.max_offset if cq else 0
            advances = p.takes_queue_offset
            queue_offset = queue_next[key] if advances else 0
            size = len(p.record)
            if buf is not None and offset + size + BLANK_HEADER_SIZE <= buf_seg_end:
                at = offset  # fast path: the record fits in the segment being filled
            else:
                seg, at, blank = segments.segment_for_append(offset, size)
                if blank is not None:
                    writes.append((segments.find(offset), offset, bytearray(blank)))
                buf = bytearray()
                buf_seg_end = seg.end
                writes.append((seg, at, buf))
            rec_at = len(buf)
            buf += p.record
            # the queue id is patched too: it may have been chosen here
            patch_record(buf, rec_at, queue_id, queue_offset, at, now, p.store_timestamp_pos)
            # Positional: this runs once per record under the append lock.
            info = build_dispatch(at, size, p.topic, queue_id, queue_offset, p.has_properties, p.keys, p.tags,
                                  p.unique_key or None, p.delay_level, now, p.stored_sys_flag, p.prepared_transaction_offset)
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
                cqs.queue(topic, qid).write_units(first, bytes(units))
        except OSError as exc:
            # Nothing is acknowledged; the next append overwrites whatever part was written.
            for (topic, qid) in cq_writes:
                cq = cqs.existing(topic, qid)
                if cq is not None:
                    cq.truncate_from_phy(state.write_offset)
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise DiskFull(f"no space left on device writing {state.dir}: nothing stored") from exc
            raise
        if created:
            state.topics = new_topics
            save_topics(state.dir / "config", state.topics)
            for topic in created:
                log_event(log, "topic created", topic=topic, queues=config.default_queues)
        self._round_robin = rr
        state.write_offset = offset
        state.dispatch_cache.add(dispatched)
        return results
