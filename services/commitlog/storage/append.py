"""Appending messages: encode and place the records, then the dispatchers (RocketMQ's shape).

The store routes a batch first (routing.py: topics, queues); under the append lock each message
is then checked (cheap guards; `message_input.reject` names the field when one trips), its
properties encoded once, its whole record packed with one precompiled struct
(formats.record.record_struct) at its final position in a buffer per segment touched, and its
dispatch fields taken as a plain tuple, a row. Nothing is written or changed until the whole
batch passed (all or nothing on bad input); then one write per segment, and the rows go to the
dispatchers (dispatchers.py: ConsumeQueue units, the Tail cache) and back to the caller
(`Appended`). No object is built per message on the way.
"""
from __future__ import annotations

import errno
import struct
import logging
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

from quarry.formats import offset_msg_id
from quarry.formats.crc import crc32
from quarry.formats.dispatch import tags_code
from quarry.formats.java_hash import tags_code as java_tags_code
from quarry.formats.properties import DELAY, PropertyError, stored_properties
from quarry.formats.record import (BLANK_HEADER_SIZE, FIXED_SIZE, MESSAGE_MAGIC, SYSFLAG_BORNHOST_V6, SYSFLAG_STOREHOST_V6,
                                   SYSFLAG_TRANSACTION_MASK, SYSFLAG_TRANSACTION_PREPARED, SYSFLAG_TRANSACTION_ROLLBACK, blank_record,
                                   host_bytes, middle_size, record_middle, record_struct, topic_field)
from quarry.formats.scheduled import SCHEDULE_TOPIC
from quarry.services.commitlog.storage.dispatchers import Dispatcher, Row
from quarry.services.commitlog.storage.errors import DiskFull, InvalidArgument, ReadOnly
from quarry.services.commitlog.storage.message_input import MessageFields, reject
from quarry.services.commitlog.storage.routing import Routes
from quarry.services.commitlog.storage.store_state import StoreState
from quarry.services.commitlog.storage.topic_table import save_topics
from quarry.services.log import log_event

log = logging.getLogger("quarry.store")

MAX_BATCH_MESSAGES = 10_000
MAX_BATCH_BYTES = 64 * 1024 * 1024
_TAG_CODES_MAX = 4096
_SCRATCH_MAX = 8 << 20  # the largest write buffer an Appender keeps between batches


def _no_field_presence(message: object, field: str) -> bool:
    """A message type without HasField: every field reads as set."""
    return True


@dataclass(slots=True)
class AppendResult:
    """Where one message was stored (one row of `Appended`, for callers that want an object)."""

    topic: str
    queue_id: int
    queue_offset: int
    physical_offset: int
    size: int
    store_timestamp: int
    offset_msg_id: str
    unique_key: str
    flushed: bool = True


class Appended:
    """What one append stored. `rows` holds one plain tuple per message in DispatchInfo's field
    order (physical_offset, size, topic, queue_id, queue_offset, tags_code, keys, unique_key or
    None, store_timestamp, sys_flag, prepared_transaction_offset): the same tuples the Tail cache
    keeps. `flushed` is False when a SYNC store did not fsync them within its timeout.
    Indexing and iteration give AppendResults."""

    __slots__ = ("rows", "offset_msg_id", "bytes", "flushed")

    def __init__(self, rows: list[Row], offset_msg_id: Callable[[int], str], size: int) -> None:
        self.rows = rows
        # offset_msg_id(physical_offset): the offsetMsgId of the record stored there (this store's host)
        self.offset_msg_id = offset_msg_id
        self.bytes = size
        self.flushed = True

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> AppendResult:
        r = self.rows[i]
        return AppendResult(r[2], r[3], r[4], r[0], r[1], r[8], self.offset_msg_id(r[0]), r[7] or "", self.flushed)

    def __iter__(self) -> Iterator[AppendResult]:
        return (self[i] for i in range(len(self.rows)))

    @property
    def end(self) -> int:
        """The log offset just past the last record."""
        last = self.rows[-1]
        return last[0] + last[1]


class Appender:
    """Places routed batches of messages (any MessageFields) in the log, then hands their
    dispatch rows to the dispatchers (dispatchers.py) the store registered."""

    def __init__(self, state: StoreState, dispatchers: Sequence[Dispatcher]) -> None:
        self.state = state
        self.dispatchers = list(dispatchers)
        host = state.config.store_host
        self._offset_msg_id = offset_msg_id.formatter(host[0], host[1])  # the host part never changes
        self._store_b = host_bytes(host)
        self._tag_codes: dict[str, int] = {}  # Java hashCode of TAGS: a producer repeats a few tags
        self._scratch: bytearray | None = None

    def check(self, msgs: Sequence[MessageFields]) -> None:
        """What can be refused before the lock is taken."""
        if self.state.read_only:
            raise ReadOnly("store is read-only")
        if not msgs:
            raise InvalidArgument("messages", "must not be empty")
        if len(msgs) > MAX_BATCH_MESSAGES:
            raise InvalidArgument("messages", f"at most {MAX_BATCH_MESSAGES} per batch, got {len(msgs)}")

    def append_locked(self, msgs: Sequence[MessageFields], routes: Routes, peer: tuple[str, int] | None) -> Appended:
        """Store `msgs` in order at their `routes` (the caller holds state.lock, ran `check` and
        routing.Routing.route); all or nothing. A message whose born host has no IP was born at
        `peer` (the caller's address)."""
        state = self.state
        # The last batch's buffer, reused when big enough: a fresh one is zero-filled for nothing.
        # Given back only after a successful write (a failed batch's may still be viewed).
        scratch, self._scratch = self._scratch, None
        queue_ids, created, _ = routes
        rows, writes, queues, total, end = self._place(msgs, queue_ids, peer, scratch)
        try:
            for at, data, used in writes:
                state.segments.segment_at(at).write(at, memoryview(data)[:used])
            for dispatcher in self.dispatchers:
                dispatcher.dispatch(rows)
            if created:
                save_topics(state.dir / "config", {**state.topics, **created})
        except OSError as exc:
            # Nothing is acknowledged; the next append overwrites whatever part was written.
            for (topic, qid) in queues:
                cq = state.cqs.existing(topic, qid)
                if cq is not None:
                    cq.truncate_from_phy(state.write_offset)
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise DiskFull(f"no space left on device writing {state.dir}: nothing stored") from exc
            raise
        for _, data, _ in writes:
            if len(data) <= _SCRATCH_MAX and (scratch is None or len(data) > len(scratch)):
                scratch = data
        self._scratch = scratch
        if created:
            state.topics = {**state.topics, **created}
            for topic in created:
                log_event(log, "topic created", topic=topic, queues=created[topic])
        state.write_offset = end
        return Appended(rows, self._offset_msg_id, total)

    def _place(self, msgs: Sequence[MessageFields], queue_ids: list[int], peer: tuple[str, int] | None,
               scratch: bytearray | None) -> tuple[list[Row], list[tuple[int, bytearray, int]], dict[tuple[str, int], int], int, int]:
        """Encode each message's record at its place in the log, in buffers (one per segment
        touched; `scratch` reused when big enough), with its dispatch row: (rows, writes (log
        offset of buf[0], buffer, bytes used), the queues touched (-> next queue offset), bytes,
        end offset). Raises on a message that cannot be stored; changes nothing."""
        state = self.state
        config = state.config
        n = len(msgs)
        many = n > 1
        max_size = config.max_message_size
        seg_size = config.segment_size
        cqs = state.cqs
        tag_codes = self._tag_codes
        store_b = self._store_b
        store_flag = SYSFLAG_STOREHOST_V6 if len(store_b) == 20 else 0
        now = int(time.time() * 1000)

        rows: list[Row] = []
        append_row = rows.append
        writes: list[tuple[int, bytearray, int]] = []
        queue_next: dict[tuple[str, int], int] = {}  # (topic, queue) -> next queue offset
        total = 0
        offset = state.write_offset
        seg_end = offset - offset % seg_size + seg_size  # writable segments start at multiples of the size
        seg_limit = seg_end - BLANK_HEADER_SIZE  # a record must end here, leaving room for the blank record
        max_record = seg_size - BLANK_HEADER_SIZE
        buf: bytearray | None = None
        # Records are packed through a view of the buffer: a bytearray's slice assignment
        # copies a bytes value into a temporary bytearray first (three per record), a view's does not.
        view = memoryview(b"")
        buf_at = cap = buf_end = 0
        # What stays the same from one message to the next, refreshed when it changes.
        cur_topic: str | None = None
        base = 0
        fixed = 0  # a record's size less body and properties: base (topic, store host) + born host
        tf = b""
        schedule = False
        born: tuple[str, int] | None = None  # the born host whose bytes born_b holds
        born_b = b""
        usual_middle = b""  # record_middle of a message born now, not reconsumed, not prepared (packed when one comes; b"" when the born host changes)
        lmid = 0
        ltf = 0
        structs: dict[int, struct.Struct] = {}  # record_struct by body and properties length, for the born host and topic at hand
        born_extra = 0  # 12 for an IPv6 born host
        host_flags = store_flag  # the born and store hosts' IPv6 bits
        q_key: tuple[str, int] | None = None
        q_next = 0

        # A protobuf message (its type has HasField) builds an empty sub-message when an unset
        # born_host is read; asking HasField first is cheaper.
        proto_type: type[Any] | None = type(msgs[0]) if n and hasattr(type(msgs[0]), "HasField") else None
        # Called from the type: m.HasField would first look "HasField" up among the fields.
        # (Without a protobuf type it is never called: `type(m) is proto_type` is false first.)
        has_field: Callable[[object, str], bool] = proto_type.HasField if proto_type is not None else _no_field_presence

        for i, m in enumerate(msgs):
            topic = m.topic
            same_topic = topic == cur_topic
            if not same_topic:  # (a valid topic: routing checked it)
                tf = topic_field(topic)
                ltf = len(tf)
                structs = {}
                base = FIXED_SIZE - 1 + len(tf) + len(store_b) - 8
                fixed = base + born_extra
                schedule = topic == SCHEDULE_TOPIC
                cur_topic = topic
            body = m.body
            lb = len(body)
            born_ts = m.born_timestamp
            reconsume = m.reconsume_times
            prepared_offset = m.prepared_transaction_offset
            if peer is not None and type(m) is proto_type and not has_field(m, "born_host"):
                host = peer  # as an unset born_host reads (ip ""), without building it
            else:
                bh = m.born_host
                host = (bh.ip, bh.port) if bh.ip or peer is None else peer
            # (The three are ints: their OR is negative when one is, 0 when all are; a port is
            # checked when the host changes.)
            optional = born_ts | reconsume | prepared_offset
            flag = m.flag
            # (Also past their fields' widths: a 64-bit one when the OR needs more than 63 bits.)
            if not 0 < lb <= max_size or optional < 0 or optional >> 63 or reconsume >> 31 or not -0x80000000 <= flag <= 0x7FFFFFFF:
                reject(m, f"messages[{i}]." if many else "", max_size, peer)
            tags = m.tags
            ukey = m.unique_key
            props = m.properties
            try:
                props_b, keys_text = stored_properties(m.keys, tags, ukey, props)
            except PropertyError:
                reject(m, f"messages[{i}]." if many else "", max_size, peer)
                raise
            if host is not born and host != born:
                if not 0 <= host[1] <= 65535:
                    reject(m, f"messages[{i}]." if many else "", max_size, peer)
                try:
                    born_b = host_bytes(host)
                except ValueError:
                    reject(m, f"messages[{i}]." if many else "", max_size, peer)
                    raise
                born = host
                usual_middle = b""
                lmid = middle_size(len(born_b), len(store_b))
                structs = {}
                born_extra = len(born_b) - 8
                fixed = base + born_extra
                host_flags = (SYSFLAG_BORNHOST_V6 if born_extra else 0) | store_flag
            tx = m.sys_flag & SYSFLAG_TRANSACTION_MASK
            lp = len(props_b)
            size = fixed + lb + lp
            if size > max_record:  # a record never spans two segments
                raise InvalidArgument(f"messages[{i}].body" if many else "body",
                                      f"the record ({size} bytes) does not fit in a {seg_size}-byte segment")
            total += size
            if total > MAX_BATCH_BYTES:
                raise InvalidArgument("messages", f"batch exceeds {MAX_BATCH_BYTES} bytes")

            # The queue offset: the queue's next, counted from its ConsumeQueue's end.
            qid = queue_ids[i]
            if not same_topic or q_key is None or qid != q_key[1]:
                if q_key is not None:
                    queue_next[q_key] = q_next
                q_key = (topic, qid)
                got = queue_next.get(q_key)
                if got is None:
                    cq = cqs.existing(topic, qid)
                    got = cq.max_offset if cq else 0
                q_next = got
            # Prepared and rollback records sit at queue offset 0 and do not advance their queue.
            advances = not tx or (tx != SYSFLAG_TRANSACTION_PREPARED and tx != SYSFLAG_TRANSACTION_ROLLBACK)
            queue_offset = q_next if advances else 0

            # Where: the end of the log, or the next segment when the record would not leave
            # room for the blank record that closes a segment.
            at = offset
            end = at + size
            if end > seg_limit:
                blank = blank_record(seg_end - at)
                if buf is None:
                    buf, buf_at, cap = bytearray(blank), at, len(blank)
                else:
                    view.release()  # the slice assignment may grow the buffer
                    p = at - buf_at
                    buf[p:p + len(blank)] = blank
                writes.append((buf_at, buf, at - buf_at + len(blank)))
                buf = None
                at = seg_end
                end = at + size
                seg_end += seg_size
                seg_limit += seg_size
            if buf is None:
                buf_at = at
                # Room for the rest of the batch if its records are like this one (grown if not),
                # never more than a segment or a batch can hold.
                cap = max(min(seg_end - at, size * (n - i) + 4096, MAX_BATCH_BYTES), size)
                if scratch is not None and len(scratch) >= cap:
                    buf, scratch = scratch, None  # every byte up to what is written gets overwritten
                else:
                    buf = bytearray(cap)
                cap = len(buf)
                buf_end = buf_at + cap
                view = memoryview(buf)
            if end > buf_end:
                view.release()
                buf.extend(bytes(max(end - buf_end, cap)))
                cap = len(buf)
                buf_end = buf_at + cap
                view = memoryview(buf)
            p = at - buf_at
            stored_flag = tx | host_flags
            rs = structs.get(lb << 16 | lp)  # PROPLEN < 2**15
            if rs is None:
                rs = structs[lb << 16 | lp] = record_struct(lmid, lb, ltf, lp)
            # Born at the store time, never reconsumed, not prepared (the usual message): the
            # middle packed when the born host was last set.
            if optional:
                middle = record_middle(born_ts or now, born_b, now, store_b, reconsume, prepared_offset)
            else:
                middle = usual_middle = usual_middle or record_middle(now, born_b, now, store_b, 0, 0)
            rs.pack_into(view, p, size, MESSAGE_MAGIC, crc32(body) & 0x7FFFFFFF, qid, flag, queue_offset, at, stored_flag, middle,
                         lb, body, tf, lp, props_b)

            # The dispatch row (formats.dispatch.build_dispatch's rule).
            if schedule:
                delay = next((v for nm, v in reversed([(q.name, q.value) for q in props]) if nm == DELAY and v), None)
                code = tags_code(topic, tags or None, delay, now)
            elif tags:
                known = tag_codes.get(tags)
                if known is None:
                    known = java_tags_code(tags)
                    if len(tag_codes) < _TAG_CODES_MAX:
                        tag_codes[tags] = known
                code = known
            else:
                code = 0
            append_row((at, size, topic, qid, queue_offset, code, keys_text if lp else "", ukey or None, now, stored_flag, prepared_offset))
            if advances:
                q_next += 1
            offset = end
        if q_key is not None:
            queue_next[q_key] = q_next
        if buf is not None:
            view.release()
            writes.append((buf_at, buf, offset - buf_at))
        return rows, writes, queue_next, total, offset
