"""Pop consumption over the store (RocketMQ 5's SimpleConsumer semantics), in store terms:
records and queue offsets, no gRPC.

A pop hands out, per queue: first the group's waiting messages that are due (a redelivery
after the invisible time, a delayed message at its time, a FIFO message whose predecessor
was acked), then messages past the group's cursor. It only hands out durable records (below
the flushed end): a record recovery could still truncate would free its queue offset for
another message that the group's state would then wrongly treat as handled.

Rules, each once: a FIFO message (one carrying a message group) is delivered only when no
earlier message of its group is outstanding in the queue; a delayed message not before its
delivery time (formats/scheduled); a message whose attempts reached the group's maximum goes
to the dead-letter topic instead of a further delivery.
"""
from __future__ import annotations

from dataclasses import dataclass

from quarry.formats import scheduled
from quarry.formats.properties import SHARDING_KEY
from quarry.formats.record import Record
from quarry.formats.tag_expression import TagFilter
from quarry.formats.topic import dlq_topic
from quarry.services.commitlog.storage.consumer_groups import ConsumerGroups, Pending
from quarry.services.commitlog.storage.errors import Expired, NotFound

MAX_WAITING = 10_000  # waiting messages a queue may hold before its scan pauses (FIFO backlog)
DLQ_HOLD_MS = 30_000  # a message being dead-lettered is held back this long meanwhile
SCAN_CHUNK = 64


@dataclass
class Delivery:
    record: Record
    pending: Pending  # as delivered: attempt, invisible until, nonce


@dataclass
class PopResult:
    deliveries: list[Delivery]
    to_dead_letter: list[tuple[Record, Pending]]  # reached max attempts: the caller forwards them


def message_group(record: Record) -> str:
    return record.properties.get(SHARDING_KEY, "")


def due_time(record: Record) -> int:
    return scheduled.due_at(record.topic, record.properties, record.store_timestamp) or 0


def _read(store, topic: str, queue_id: int, offset: int) -> Record | None:  # type: ignore[no-untyped-def]
    try:
        records, _, _, _ = store.pull(topic, queue_id, offset, 1)
    except (NotFound, Expired):
        return None
    return records[0] if records and records[0].queue_offset == offset else None


def pop_queue(store, groups: ConsumerGroups, group: str, topic: str, queue_id: int, filt: TagFilter, batch: int,  # type: ignore[no-untyped-def]
              invisible_ms: int, max_attempts: int, now: int) -> PopResult:
    """Deliver up to `batch` messages of one queue to `group`; the change is logged (not yet
    synced: the caller calls groups.sync() before answering)."""
    deliveries: list[Delivery] = []
    dead: list[tuple[Record, Pending]] = []
    changed: list[Pending] = []
    gone: list[tuple[int, int]] = []  # pending offsets whose record expired meanwhile
    with groups.lock():
        q = groups.queue_view(group, topic, queue_id)
        waiting = sorted(q.pending.values(), key=lambda p: p.offset)
        first_of_group: dict[str, int] = {}  # FIFO: the earliest outstanding offset of each message group
        for p in waiting:
            if p.msg_group:
                first_of_group.setdefault(p.msg_group, p.offset)
        outstanding = set(first_of_group)
        for p in waiting:
            if len(deliveries) >= batch:
                break
            if p.visible_at > now or (p.msg_group and first_of_group[p.msg_group] < p.offset):
                continue
            record = _read(store, topic, queue_id, p.offset)
            if record is None:
                gone.append((p.offset, now))
                continue
            if p.attempt >= max_attempts:
                held = Pending(p.offset, p.attempt, now + DLQ_HOLD_MS, p.msg_group, p.received_at, p.nonce)
                changed.append(held)
                dead.append((record, held))
                continue
            d = Pending(p.offset, p.attempt + 1, now + invisible_ms, p.msg_group, now, groups.new_nonce())
            changed.append(d)
            deliveries.append(Delivery(record, d))
        cursor = q.next
        durable_end = store.committed_offset
        scanning = len(deliveries) < batch and len(q.pending) < MAX_WAITING
        while scanning:
            try:
                records, nxt, lo, _hi = store.pull(topic, queue_id, cursor, SCAN_CHUNK)
            except NotFound:
                break
            if cursor < lo:  # expired before this group looked: nothing left to deliver there
                cursor = lo
            if not records:
                cursor = max(cursor, nxt)
                break
            for record in records:
                if record.physical_offset + record.store_size > durable_end or len(deliveries) >= batch or len(q.pending) + len(changed) >= MAX_WAITING:
                    scanning = False
                    break
                cursor = record.queue_offset + 1
                if not filt.matches_tag(record.tags):
                    continue  # not this group's: handled by being passed
                grp = message_group(record)
                due = due_time(record)
                if due > now or (grp and grp in outstanding):
                    changed.append(Pending(record.queue_offset, 0, due, grp))
                else:
                    d = Pending(record.queue_offset, 1, now + invisible_ms, grp, now, groups.new_nonce())
                    changed.append(d)
                    deliveries.append(Delivery(record, d))
                if grp:
                    outstanding.add(grp)
            else:
                cursor = max(cursor, nxt)
        if cursor != q.next or changed or gone:
            groups.record(group, topic, queue_id, next_offset=cursor, pending=changed, acked=gone)
    return PopResult(deliveries, dead)


def take_exhausted(store, groups: ConsumerGroups, group: str, topic: str, queue_id: int, max_attempts: int, now: int) -> list[tuple[Record, Pending]]:  # type: ignore[no-untyped-def]
    """Messages whose last delivery ran out and whose attempts reached the maximum, held back
    for the caller to dead-letter: the same step a receive takes, for groups with no consumer
    polling (their messages still reach the DLQ, and their status says so)."""
    out: list[tuple[Record, Pending]] = []
    with groups.lock():
        q = groups.queue_view(group, topic, queue_id)
        due = [p for p in q.pending.values() if p.attempt >= max_attempts and p.visible_at <= now and not q.blocked(p)]
        held = []
        for p in sorted(due, key=lambda p: p.offset):
            record = _read(store, topic, queue_id, p.offset)
            if record is None:
                continue
            h = Pending(p.offset, p.attempt, now + DLQ_HOLD_MS, p.msg_group, p.received_at, p.nonce)
            held.append(h)
            out.append((record, h))
        if held:
            groups.record(group, topic, queue_id, pending=held)
    return out


@dataclass(frozen=True)
class Handle:
    """What a receipt handle names: one delivery of one queue offset."""

    queue_id: int
    offset: int
    nonce: int

    def text(self) -> str:
        return f"Q1.{self.queue_id}.{self.offset}.{self.nonce}"

    @classmethod
    def parse(cls, text: str) -> "Handle":
        parts = text.split(".")
        if len(parts) != 4 or parts[0] != "Q1" or not all(p.isdigit() for p in parts[1:]):
            raise ValueError("not a receipt handle this broker issued (expected Q1.<queue>.<offset>.<n>)")
        return cls(int(parts[1]), int(parts[2]), int(parts[3]))


class HandleError(Exception):
    """The handle names no current delivery; the message says why."""


def _current(groups: ConsumerGroups, group: str, topic: str, h: Handle) -> Pending | None:
    """The pending entry the handle names; None when already acked (idempotent ack)."""
    q = groups.queue_view(group, topic, h.queue_id)
    if h.offset in q.acked:
        return None
    p = q.pending.get(h.offset)
    if p is None:
        if h.offset in q.dead:
            raise HandleError(f"queue {h.queue_id} offset {h.offset} was dead-lettered to {dlq_topic(group)}")
        raise HandleError(f"queue {h.queue_id} offset {h.offset} is not in flight for group {group}")
    if p.nonce != h.nonce or p.attempt == 0:
        raise HandleError(f"queue {h.queue_id} offset {h.offset}: this delivery was superseded (delivered again as attempt {p.attempt}, or its invisible duration changed)")
    return p


def ack(groups: ConsumerGroups, group: str, topic: str, h: Handle, now: int) -> bool:
    """Mark the delivery acked; False when it already was. Logged, not yet synced."""
    with groups.lock():
        p = _current(groups, group, topic, h)
        if p is None:
            return False
        groups.record(group, topic, h.queue_id, acked=[(h.offset, now)])
        return True


def change_invisible(groups: ConsumerGroups, group: str, topic: str, h: Handle, invisible_ms: int, now: int) -> Handle:
    """Invisible for invisible_ms from now; returns the delivery's new handle."""
    with groups.lock():
        p = _current(groups, group, topic, h)
        if p is None:
            raise HandleError(f"queue {h.queue_id} offset {h.offset} is already acked")
        n = Pending(p.offset, p.attempt, now + invisible_ms, p.msg_group, p.received_at, groups.new_nonce())
        groups.record(group, topic, h.queue_id, pending=[n])
        return Handle(h.queue_id, h.offset, n.nonce)


def take_for_dead_letter(groups: ConsumerGroups, group: str, topic: str, h: Handle, now: int) -> Pending:
    """The delivery a client forwards to the DLQ (held back while it is written)."""
    with groups.lock():
        p = _current(groups, group, topic, h)
        if p is None:
            raise HandleError(f"queue {h.queue_id} offset {h.offset} is already acked")
        held = Pending(p.offset, p.attempt, now + DLQ_HOLD_MS, p.msg_group, p.received_at, p.nonce)
        groups.record(group, topic, h.queue_id, pending=[held])
        return held


def mark_dead(groups: ConsumerGroups, group: str, topic: str, queue_id: int, offset: int, now: int) -> None:
    groups.record(group, topic, queue_id, dead=[(offset, now)])


def committed(groups: ConsumerGroups, group: str, topic: str, queue_id: int) -> int:
    with groups.lock():
        return groups.queue_view(group, topic, queue_id).committed()
