"""What reacts to records once they are in the log (RocketMQ's CommitLogDispatcher): each
dispatcher gets the placed records' dispatch rows, once per batch, in log order.

A row is a plain tuple in DispatchInfo's field order (a DispatchInfo is one too): the append's
rows, or what the follower read from another writer's log. The store's constructor registers
the dispatchers: the ConsumeQueue units here, then the Tail cache (dispatch_cache.py).
"""
from __future__ import annotations

from typing import Any, Protocol, Sequence, TypeAlias

from quarry.formats.consume_queue import CQ_UNIT
from quarry.formats.record import SYSFLAG_TRANSACTION_MASK, SYSFLAG_TRANSACTION_PREPARED, SYSFLAG_TRANSACTION_ROLLBACK
from quarry.services.commitlog.storage.consume_queue_store import ConsumeQueueStore

# DispatchInfo's fields as a plain tuple: physical offset, size, topic, queue id, queue offset,
# tags code, keys, unique key, store timestamp, sys flag, prepared transaction offset.
Row: TypeAlias = tuple[int, int, str, int, int, int, str | None, str | None, int, int, int]


class Dispatcher(Protocol):
    def dispatch(self, rows: Sequence[Row]) -> None:
        """React to records just placed (the caller holds the store's lock); an OSError means
        the dispatch failed and the append it belongs to is undone."""


class ConsumeQueueDispatcher:
    """Each record's 20-byte unit to its queue (CommitLogDispatcherBuildConsumeQueue), one write
    per run of consecutive units of a queue; prepared and rollback records take no unit."""

    def __init__(self, cqs: ConsumeQueueStore) -> None:
        self.cqs = cqs

    def dispatch(self, rows: Sequence[Row]) -> None:
        runs: dict[tuple[str, int], list[Any]] = {}  # queue -> [first queue offset, next, units]
        pack = CQ_UNIT.pack
        queue = self.cqs.queue
        for at, size, topic, qid, queue_offset, code, _, _, _, flag, _ in rows:
            tx = flag & SYSFLAG_TRANSACTION_MASK
            if tx and (tx == SYSFLAG_TRANSACTION_PREPARED or tx == SYSFLAG_TRANSACTION_ROLLBACK):
                continue
            run = runs.get((topic, qid))
            if run is not None and run[1] == queue_offset:
                run[2].append(pack(at, size, code))
                run[1] = queue_offset + 1
            else:
                if run is not None:  # a gap in the queue's offsets (a follower's damaged log)
                    queue(topic, qid).write_units(run[0], b"".join(run[2]))
                runs[(topic, qid)] = [queue_offset, queue_offset + 1, [pack(at, size, code)]]
        for (topic, qid), run in runs.items():
            queue(topic, qid).write_units(run[0], b"".join(run[2]))
