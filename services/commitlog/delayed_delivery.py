"""Delivers parked delayed messages (parking.py) when they are due, as a RocketMQ 4.x
broker's ScheduleMessageService does.

Each delay level's queue of SCHEDULE_TOPIC_XXXX holds its messages in deliver-time order (one
delay per queue), and a unit's tagsCode is its deliver time: each queue is read from a cursor,
units first, records only once due. A due record is stored again under its REAL_TOPIC /
REAL_QID as the broker stores it: body (inflated), keys, tags, UNIQ_KEY, born time and host,
flag and the properties it was parked with, DELAY, REAL_TOPIC and REAL_QID included (RocketMQ
writes the copy's properties before it clears the level; a record under its own topic that
carries REAL_TOPIC is read as delivered, formats/scheduled.py). The copy is not parked again.

The cursors move in memory once the copies are appended, and are written to the store's
config/delayOffset.json (RocketMQ's file: {"offsetTable": {level: next queue offset}}) once
those copies are on disk, so a crash can deliver a message twice (as RocketMQ may), never not
at all; a restart, or a RocketMQ store opened by Quarry, goes on from the file.
"""
from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from pathlib import Path
from typing import Callable

from quarry.formats.body import readable_body
from quarry.formats.properties import KEYS, REAL_QID, REAL_TOPIC, TAGS, UNIQ_KEY
from quarry.formats.record import Record
from quarry.formats.scheduled import MAX_DELAY_LEVEL, PARKING_TOPICS, SCHEDULE_TOPIC
from quarry.formats.state_file import write_json_atomic
from quarry.services.commitlog.errors import DiskFull, InvalidArgument, NotFound, ReadOnly, StoreError
from quarry.services.commitlog.flush_signal import FlushSignal
from quarry.services.commitlog.flushing import await_flushed
from quarry.services.commitlog.message_input import NewMessage
from quarry.services.commitlog.sending import SendPath
from quarry.services.log import log_event

log = logging.getLogger("quarry.commitlog.delayed")

OFFSETS_FILE = "delayOffset.json"
INTERVAL_S = 0.1  # how soon the queues are looked at again when nothing more is due (RocketMQ: 100 ms)
BATCH = 256  # records delivered by one append at most
FLUSH_WAIT_S = 5.0  # copies not on disk by then: their cursors are written at a later round
# Topics a copy is never delivered to: the parking topics themselves (it would come back due
# at once, for ever) and the transaction topics (RocketMQ drops those too).
_NOT_DELIVERED_TO = (*PARKING_TOPICS, "RMQ_SYS_TRANS_HALF_TOPIC", "RMQ_SYS_TRANS_OP_HALF_TOPIC")
_OWN_FIELDS = (KEYS, TAGS, UNIQ_KEY)  # a NewMessage carries these in fields of their own
_BARE_KEY = re.compile(r'([{,]\s*)(-?\d+)(\s*:)')


def load_offsets(path: Path) -> dict[int, int]:
    """Level -> next queue offset, from delayOffset.json (missing: none delivered yet).
    RocketMQ's fastjson writes the table's integer keys bare ({1:5}): read either way."""
    if not path.exists():
        return {}
    text = path.read_text()
    try:
        data = json.loads(text)
    except ValueError:
        data = json.loads(_BARE_KEY.sub(r'\1"\2"\3', text))
    table = data.get("offsetTable") or {}
    if not isinstance(table, dict):
        raise ValueError(f"{path}: offsetTable is not a table")
    return {int(level): int(offset) for level, offset in table.items()}


def delivered_copy(rec: Record) -> NewMessage | None:
    """The message a parked record becomes when due; None when it names no topic it can be
    delivered to (logged by the caller)."""
    props = rec.properties
    real_topic = props.get(REAL_TOPIC, "")
    try:
        real_queue = int(props.get(REAL_QID, ""))
    except ValueError:
        return None
    if not real_topic or real_topic in _NOT_DELIVERED_TO or real_queue < 0:
        return None
    return NewMessage(
        real_topic, readable_body(rec.body, rec.sys_flag), rec.keys, rec.tags or "", rec.unique_key or "",
        [(n, v) for n, v in rec.properties_pairs if n not in _OWN_FIELDS],
        rec.flag, real_queue, rec.born_timestamp, rec.born_host, rec.sys_flag, rec.reconsume_times, 0,
    )


class DelayedDelivery:
    """The delivery of one writable store's parked messages, on its event loop."""

    def __init__(self, sending: SendPath, flushed: FlushSignal, clock_ms: Callable[[], int] = lambda: int(time.time() * 1000)) -> None:
        self.sending = sending
        self.store = sending.store
        self.flushed = flushed
        self.clock_ms = clock_ms
        self.path = self.store.dir / "config" / OFFSETS_FILE
        self.offsets = load_offsets(self.path)  # level -> next queue offset, as appended
        self._saved = dict(self.offsets)  # as in the file
        self._unsaved_end = 0  # the log end the file's cursors wait for (copies appended, not yet known on disk)
        self._first_level = 1  # where a round starts: turns round, so no level waits behind a busy one
        self._failing = ""  # the failure last logged (said once, not every round)

    def due(self, now_ms: int) -> list[tuple[int, int, NewMessage | None]]:
        """Up to BATCH parked records due at `now_ms`, each level's in queue order: (level, the
        level's cursor past it, its copy, or None when it cannot be delivered or the entry
        only passes units the queue skips: expired, damaged)."""
        out: list[tuple[int, int, NewMessage | None]] = []
        if SCHEDULE_TOPIC not in self.store.topics:
            return out
        first = self._first_level
        self._first_level = first % MAX_DELAY_LEVEL + 1
        for level in [*range(first, MAX_DELAY_LEVEL + 1), *range(1, first)]:
            cq = self.store.cqs.existing(SCHEDULE_TOPIC, level - 1)
            if cq is None:
                continue
            cursor = self.offsets.get(level, 0)
            if cursor < cq.min_offset:  # removed with their segments before they were due
                log_event(log, "delayed messages expired before delivery; passed", logging.WARNING, delay_level=level, count=cq.min_offset - cursor)
                out.append((level, cq.min_offset, None))
                cursor = cq.min_offset
            while len(out) < BATCH:
                units = cq.read_units(cursor, BATCH - len(out))
                n = 0
                for _, _, deliver_at in units:  # (a parked unit's tagsCode is its deliver time)
                    if deliver_at > now_ms:
                        break
                    n += 1
                if not n:
                    break
                records, next_offset, _, _ = self.store.pull(SCHEDULE_TOPIC, level - 1, cursor, n)
                for rec in records:
                    copy = delivered_copy(rec)
                    if copy is None:
                        log_event(log, "parked record names no topic it can be delivered to; passed", logging.WARNING, delay_level=level,
                                  queue_offset=rec.queue_offset, real_topic=rec.properties.get(REAL_TOPIC, "-"), real_qid=rec.properties.get(REAL_QID, "-"))
                    out.append((level, rec.queue_offset + 1, copy))
                if next_offset > (out[-1][1] if out and out[-1][0] == level else cursor):
                    out.append((level, next_offset, None))
                if n < len(units) or next_offset <= cursor:
                    break
                cursor = next_offset
        return out

    def _deliverable(self, msg: NewMessage) -> NewMessage:
        """`msg` as its topic takes it now: the topic made when missing (the message was taken
        when sent), a queue gone since folded onto those left (RocketMQ's store would write
        to a queue no reader knows)."""
        queues = self.store.topics.get(msg.topic)
        if queues is None:
            self.store.create_topic(msg.topic, self.store.config.default_queues)
            queues = self.store.topics[msg.topic]
        if msg.queue_id >= queues:
            log_event(log, "delayed message's queue is gone; delivered to another", logging.WARNING, topic=msg.topic,
                      queue_id=msg.queue_id, queues=queues, to=msg.queue_id % queues)
            msg.queue_id %= queues
        return msg

    async def deliver_due(self) -> int:
        """Deliver what is due now; the number of messages stored again."""
        await self._save_when_durable()
        due = self.due(self.clock_ms())
        if not due:
            return 0
        done = len(due)  # the entries handled, in order (their cursors move)
        stored, appended, failure = 0, None, None
        copies = [self._deliverable(m) for _, _, m in due if m is not None]
        if copies:
            try:
                appended = await self.sending.append_flushed(copies, "DelayedDelivery", wait_flush=False, same_topic=False, delivered=True)
                stored = len(copies)
            except (DiskFull, ReadOnly):  # nothing can be stored now: the same entries next round
                raise
            except StoreError:  # one by one: a copy refused for good is passed, said once
                done = 0
                for level, _, msg in due:
                    if msg is not None:
                        try:
                            appended = await self.sending.append_flushed((msg,), "DelayedDelivery", wait_flush=False, delivered=True)
                            stored += 1
                        except (InvalidArgument, NotFound) as exc:
                            log_event(log, "delayed message refused by its topic; passed", logging.WARNING, delay_level=level, topic=msg.topic,
                                      unique_key=msg.unique_key or "-", reason=str(exc))
                        except StoreError as exc:
                            failure = exc
                            break
                    done += 1
        for level, cursor, _ in due[:done]:
            if cursor > self.offsets.get(level, 0):
                self.offsets[level] = cursor
        if appended is not None:
            self._unsaved_end = max(self._unsaved_end, appended.end)
            await await_flushed(self.store.flusher, self.flushed, appended.end, FLUSH_WAIT_S)
        await self._save_when_durable()
        if failure is not None:
            raise failure
        return stored

    async def _save_when_durable(self) -> None:
        """Write the cursors if they moved and every copy they pass is on disk."""
        if self.offsets == self._saved or self.store.flushed_offset < self._unsaved_end:
            return
        snapshot = dict(self.offsets)
        table = {"offsetTable": {str(level): offset for level, offset in sorted(snapshot.items())}}
        await asyncio.to_thread(write_json_atomic, self.path, table, 2)  # (fsyncs: off the loop)
        self._saved = snapshot

    def save_at_close(self) -> None:
        """At a clean stop, after the store's close flushed everything: the cursors as they are."""
        if self.offsets != self._saved:
            write_json_atomic(self.path, {"offsetTable": {str(level): offset for level, offset in sorted(self.offsets.items())}}, 2)
            self._saved = dict(self.offsets)

    async def run(self, stopping: asyncio.Event) -> None:
        """Deliver until `stopping` is set: at once while more is due, else every INTERVAL_S."""
        while not stopping.is_set():
            delivered = 0
            try:
                delivered = await self.deliver_due()
                if self._failing:
                    log_event(log, "delayed delivery resumed")
                    self._failing = ""
            except Exception as exc:  # never the end of delivery: said once, tried again
                why = f"{type(exc).__name__}: {exc}"
                if why != self._failing:
                    log_event(log, "delayed delivery failed; trying again", logging.ERROR, error=why)
                    self._failing = why
            if delivered < BATCH:
                try:
                    async with asyncio.timeout(INTERVAL_S):
                        await stopping.wait()
                except TimeoutError:
                    pass
