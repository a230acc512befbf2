"""Queue offset ranges and each consumer group's progress in them, with its lag: what
mqadmin's topicStatus and consumerProgress show, for every topic and group at once.

Groups come from both places a group's position is kept: committed consumer offsets (RocketMQ 4
pull/push consumers) and RocketMQ 5 pop state, where every offset below the first pending one
is done. Protocol-free: the commitlog servicer translates.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from quarry.services.commitlog.storage.consumer_groups import ConsumerGroups
from quarry.services.commitlog.storage.consumer_offsets import ConsumerOffsets


@dataclass(frozen=True)
class QueueRange:
    topic: str
    queue_id: int
    min_offset: int
    max_offset: int


@dataclass(frozen=True)
class GroupProgress:
    group: str
    topic: str
    queue_id: int
    consumer_offset: int
    max_offset: int
    lag: int
    source: str  # "offset" or "pop"


def queue_ranges(state: Any, topic: str = "") -> list[QueueRange]:
    """Every queue of `topic` (every topic when empty) with its readable offsets; `state` is
    the store's state (topics, ConsumeQueues, lock)."""
    out = []
    with state.lock:
        for t, n in sorted(state.topics.items()):
            if topic and t != topic:
                continue
            for q in range(n):
                cq = state.cqs.existing(t, q)
                out.append(QueueRange(t, q, cq.min_offset, cq.max_offset) if cq is not None else QueueRange(t, q, 0, 0))
    return out


def lag(consumer_offset: int, min_offset: int, max_offset: int) -> int:
    """Messages still to consume; those retention deleted are not counted as owed."""
    return max(0, max_offset - max(consumer_offset, min_offset))


def progress(ranges: list[QueueRange], offsets: ConsumerOffsets, groups: ConsumerGroups, group: str = "") -> list[GroupProgress]:
    """Each group's position in each of `ranges`' queues it has one in, by group, topic, queue.
    A group with both a committed offset and pop state on a queue is listed once per source."""
    by_queue = {(r.topic, r.queue_id): r for r in ranges}
    out: list[GroupProgress] = []
    for topic, g, queue_id, offset in offsets.entries():
        r = by_queue.get((topic, queue_id))
        if r is not None and (not group or g == group):
            out.append(GroupProgress(g, topic, queue_id, offset, r.max_offset, lag(offset, r.min_offset, r.max_offset), "offset"))
    with groups.lock():
        for g, topic, gt in groups.all():
            if group and g != group:
                continue
            for queue_id, q in gt.queues.items():
                r = by_queue.get((topic, queue_id))
                if r is not None:
                    done = q.committed()
                    out.append(GroupProgress(g, topic, queue_id, done, r.max_offset, lag(done, r.min_offset, r.max_offset), "pop"))
    out.sort(key=lambda p: (p.group, p.topic, p.queue_id, p.source))
    return out
