"""Positions kept in the store's queues, reconciled with where the queues end after recovery.

Recovery may cut the log (a torn tail, a hand repair, a restored snapshot), and the queues end
with it. Consumer offsets and consumer groups' pop state saved before the cut may point past a
queue's new end: left so, a consumer would wait there while new messages are written below its
offset, and skip them. Each is brought back to the queue's end (what lay beyond it is gone, what
is written from there on is delivered) and reported once. Delayed delivery's cursors are
reconciled where they are read (delayed_delivery.py), the indexer's position by the indexer
(services/indexer/reconcile.py). Plain Python over files.
"""
from __future__ import annotations

import logging
from typing import Callable

from quarry.services.commitlog.storage.consume_queue_store import ConsumeQueueStore
from quarry.services.commitlog.storage.consumer_groups import ConsumerGroups
from quarry.services.commitlog.storage.consumer_offsets import ConsumerOffsets
from quarry.services.log import log_event

log = logging.getLogger("quarry.store")


def reconcile_positions(cqs: ConsumeQueueStore, offsets: ConsumerOffsets, groups: ConsumerGroups, report: Callable[[str], None]) -> int:
    """Bring every consumer offset and pop cursor past its queue's end back to the end; returns
    how many were moved, each reported with what it was and what it is now."""
    moved = 0
    for topic, group, queue_id, offset in offsets.entries():
        cq = cqs.existing(topic, queue_id)
        if cq is not None and offset > cq.max_offset:
            offsets.commit(group, topic, queue_id, cq.max_offset)
            moved += 1
            _say(report, f"consumer group {group}'s offset on {topic} queue {queue_id} was {offset}, past the queue's end "
                         f"{cq.max_offset} (the log was cut below it): set to {cq.max_offset}, so messages written from there are consumed")
    for group, topic, gt in groups.all():
        for queue_id, q in list(gt.queues.items()):
            cq = cqs.existing(topic, queue_id)
            if cq is None:
                continue
            beyond = [o for o in q.pending if o >= cq.max_offset]
            if q.next > cq.max_offset or beyond:
                was = q.next
                groups.rewind(group, topic, queue_id, cq.max_offset)
                moved += 1
                _say(report, f"consumer group {group}'s pop cursor on {topic} queue {queue_id} was {was} with {len(beyond)} messages in flight "
                             f"at or past the queue's end {cq.max_offset} (the log was cut below them): those are forgotten, the cursor is {cq.max_offset}")
    if moved:
        offsets.persist()
    return moved


def _say(report: Callable[[str], None], problem: str) -> None:
    log_event(log, "position past a queue's end after recovery; brought back", logging.WARNING, problem=problem)
    report(problem)
