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
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from quarry.formats.body import readable_body
from quarry.formats.properties import KEYS, REAL_QID, REAL_TOPIC, TAGS, UNIQ_KEY
from quarry.formats.record import Record
from quarry.formats.scheduled import DELAY_LEVEL_MS, MAX_DELAY_LEVEL, PARKING_TOPICS, SCHEDULE_TOPIC
from quarry.formats.topic import is_valid_topic
from quarry.formats.state_file import read_json, write_json_atomic
from quarry.services.commitlog.storage.errors import DiskFull, InvalidArgument, NotFound, ReadOnly, StoreError
from quarry.services.commitlog.broker.flush_signal import FlushSignal, await_flushed
from quarry.services.commitlog.storage.message_input import Host, NewMessage, Property
from quarry.services.commitlog.broker.sending import SendPath
from quarry.services.log import log_event
from quarry.services.progress import Progress

log = logging.getLogger("quarry.commitlog.delayed")

OFFSETS_FILE = "delayOffset.json"
INTERVAL_S = 0.1  # how soon the queues are looked at again when nothing more is due (RocketMQ: 100 ms)
BATCH = 256  # records delivered by one append at most
FLUSH_WAIT_S = 5.0
CLOCK_SLACK_MS = 60_000  # a unit due this much past its level's delay from now is due now (see _due_of_level)  # copies not on disk by then: their cursors are written at a later round
# Topics a copy is never delivered to: the parking topics themselves (it would come back due
# at once, for ever) and the transaction topics (RocketMQ drops those too).
_NOT_DELIVERED_TO = (*PARKING_TOPICS, "RMQ_SYS_TRANS_HALF_TOPIC", "RMQ_SYS_TRANS_OP_HALF_TOPIC")
_OWN_FIELDS = (KEYS, TAGS, UNIQ_KEY)  # a NewMessage carries these in fields of their own


def load_offsets(path: Path) -> dict[int, int]:
    """Level -> next queue offset, from delayOffset.json (missing: none delivered yet; a
    RocketMQ broker's, with fastjson's bare integer keys, is read too)."""
    if not path.exists():
        return {}
    data = read_json(path)
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
    if not is_valid_topic(real_topic) or real_topic in _NOT_DELIVERED_TO or real_queue < 0:
        return None
    return NewMessage(
        real_topic, readable_body(rec.body, rec.sys_flag), rec.keys, rec.tags or "", rec.unique_key or "",
        [Property(n, v) for n, v in rec.properties_pairs if n not in _OWN_FIELDS],
        rec.flag, real_queue, rec.born_timestamp, Host(*rec.born_host), rec.sys_flag, rec.reconsume_times, 0,
    )


@dataclass
class Entry:
    """One step of a level's cursor: past a parked record, with the copy to store (None:
    passed), and why, when it is passed or changed (logged once the cursor has moved)."""

    level: int
    cursor: int
    copy: NewMessage | None
    why: str


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
        self._failing = ""  # the round's failure last logged (said once, not every round)
        self._level_failing: dict[int, str] = {}  # a level's read failure last logged
        self._full = False  # the last round took a whole batch: look again at once
        # Due entries found against entries handled: a delivery that stops while messages are due says so.
        self.progress = Progress("delayed delivery", unit="messages")
        self._handled = 0

    def due(self, now_ms: int) -> list[Entry]:
        """Up to BATCH entries due at `now_ms`, each level's in queue order: a parked record's
        copy, or an entry that only moves the level's cursor past what cannot be delivered
        (with why: logged once the cursor has moved)."""
        out: list[Entry] = []
        if SCHEDULE_TOPIC not in self.store.topics:
            return out
        first = self._first_level
        self._first_level = first % MAX_DELAY_LEVEL + 1
        for level in [*range(first, MAX_DELAY_LEVEL + 1), *range(1, first)]:
            try:
                self._due_of_level(level, now_ms, out)
            except (StoreError, OSError) as exc:  # this level's queue cannot be read now: the others go on
                why = f"{type(exc).__name__}: {exc}"
                if self._level_failing.get(level) != why:
                    log_event(log, "delayed messages of a level not readable; tried again", logging.ERROR, delay_level=level, error=why)
                    self._level_failing[level] = why
            else:
                if self._level_failing.pop(level, None) is not None:
                    log_event(log, "delayed messages of a level readable again", delay_level=level)
            if len(out) >= BATCH:
                break
        return out

    def _due_of_level(self, level: int, now_ms: int, out: list[Entry]) -> None:
        cq = self.store.cqs.existing(SCHEDULE_TOPIC, level - 1)
        if cq is None:
            return
        cursor = self.offsets.get(level, 0)
        if cursor > cq.max_offset:  # past the queue's end (an edited file, a rebuilt queue): from its start again (delivered twice, not lost)
            log_event(log, "delayed delivery cursor past its queue's end; read again from the queue's start", logging.WARNING,
                      delay_level=level, cursor=cursor, queue_end=cq.max_offset)
            self.store.state.problems.append(
                f"delayed delivery's cursor of level {level} was {cursor}, past its queue's end {cq.max_offset} (the log was cut below it, "
                f"or the file edited): read again from the queue's start {cq.min_offset}, so a message may be delivered twice, never lost")
            self.offsets[level] = cursor = cq.min_offset
        if cursor < cq.min_offset:  # removed with their segments before they were due
            out.append(Entry(level, cq.min_offset, None, f"{cq.min_offset - cursor} delayed messages expired before delivery; passed"))
            cursor = cq.min_offset
        # A unit due far later than its level's delay from now was stored under a clock since
        # set back a long way (or sent to another level's queue): due now, as RocketMQ's
        # correctDeliverTimestamp has it, with some slack for a clock that merely drifted.
        delay = DELAY_LEVEL_MS[level - 1]
        latest = now_ms + delay + max(delay, CLOCK_SLACK_MS)
        while len(out) < BATCH:
            units = cq.read_units(cursor, BATCH - len(out))
            if not units:
                if cursor < cq.max_offset:  # a hole in the queue (a unit never written): passed
                    out.append(Entry(level, cursor + 1, None, f"no unit at queue offset {cursor}; passed"))
                    cursor += 1
                    continue
                return
            n = 0
            for _, _, deliver_at in units:  # (a parked unit's tagsCode is its deliver time)
                if now_ms < deliver_at <= latest:
                    break
                n += 1
            if not n:
                return
            try:
                records, next_offset, _, _ = self.store.pull(SCHEDULE_TOPIC, level - 1, cursor, n)
            except (InvalidArgument, NotFound) as exc:  # a damaged unit: passed, the level goes on
                out.append(Entry(level, cursor + 1, None, f"unit at queue offset {cursor} cannot be read ({exc}); passed"))
                cursor += 1
                continue
            for rec in records:
                copy = delivered_copy(rec)
                why = "" if copy is not None else (f"parked record at queue offset {rec.queue_offset} names no topic it can be delivered to "
                                                   f"(REAL_TOPIC {rec.properties.get(REAL_TOPIC, '-')!r}, REAL_QID {rec.properties.get(REAL_QID, '-')!r}); passed")
                out.append(Entry(level, rec.queue_offset + 1, copy, why))
            if next_offset > (out[-1].cursor if out and out[-1].level == level else cursor):
                out.append(Entry(level, next_offset, None, ""))  # units the queue skips (expired, damaged: the store reports those)
            if n < len(units) or next_offset <= cursor:
                return
            cursor = next_offset

    def _deliverable(self, entry: Entry) -> Entry:
        """`entry` with its copy as its topic takes it now: the topic made when missing (the
        message was taken when sent), a queue gone since folded onto those left (RocketMQ's
        store would write to a queue no reader knows)."""
        msg = entry.copy
        if msg is None:
            return entry
        queues = self.store.topics.get(msg.topic)
        if queues is None:  # (an error making it, a full disk say, fails the round: tried again)
            self.store.create_topic(msg.topic, self.store.config.default_queues)
            self.sending.on_topic_created()
            queues = self.store.topics[msg.topic]
        if msg.queue_id >= queues:
            msg.queue_id %= queues
            return Entry(entry.level, entry.cursor, msg, f"delayed message {msg.unique_key or '-'} for {msg.topic}: its queue is gone (the topic has {queues}); delivered to queue {msg.queue_id}")
        return entry

    async def deliver_due(self) -> int:
        """Deliver what is due now; the number of messages stored again."""
        await self._save_when_durable()
        due = [self._deliverable(e) for e in self.due(self.clock_ms())]
        self._full = len(due) >= BATCH
        # A level that cannot be read holds back what is due in it: counted as one waiting.
        self.progress.input(self._handled + len(due) + (1 if self._level_failing else 0))
        self.progress.block("; ".join(f"delay level {lv}: {why}" for lv, why in sorted(self._level_failing.items())))
        if not due:
            return 0
        done = len(due)  # the entries handled, in order (their cursors move)
        stored, appended, failure = 0, None, None
        copies = [e.copy for e in due if e.copy is not None]
        if copies:
            try:
                appended = await self.sending.append_flushed(copies, "DelayedDelivery", wait_flush=False, same_topic=False, delivered=True)
                stored = len(copies)
            except (DiskFull, ReadOnly):  # nothing can be stored now: the same entries next round
                raise
            except StoreError:  # one by one: a copy refused for good is passed
                done = 0
                for i, e in enumerate(due):
                    if e.copy is not None:
                        try:
                            appended = await self.sending.append_flushed((e.copy,), "DelayedDelivery", wait_flush=False, delivered=True)
                            stored += 1
                        except (InvalidArgument, NotFound) as exc:
                            due[i] = Entry(e.level, e.cursor, None, f"delayed message {e.copy.unique_key or '-'} refused by {e.copy.topic!r} ({exc}); passed")
                        except StoreError as exc:
                            failure = exc
                            break
                    done += 1
        for e in due[:done]:
            if e.cursor > self.offsets.get(e.level, 0):
                self.offsets[e.level] = e.cursor
            if e.why:  # (said once: the cursor has moved past it)
                log_event(log, "delayed delivery", logging.WARNING, delay_level=e.level, detail=e.why)
        self._handled += done
        self.progress.advanced(self._handled)
        if appended is not None:
            self._unsaved_end = max(self._unsaved_end, appended.end)
            await await_flushed(self.store.flusher, self.flushed, appended.end, FLUSH_WAIT_S)
        await self._save_when_durable()
        if failure is not None:
            raise failure
        return stored

    def _to_save(self) -> dict[int, int] | None:
        """The cursors to write: when they moved and every copy they pass is on disk."""
        if self.offsets == self._saved or self.store.flushed_offset < self._unsaved_end:
            return None
        return dict(self.offsets)

    def _write(self, cursors: dict[int, int]) -> None:
        write_json_atomic(self.path, {"offsetTable": {str(level): offset for level, offset in sorted(cursors.items())}}, 2)

    async def _save_when_durable(self) -> None:
        cursors = self._to_save()
        if cursors is not None:
            await asyncio.to_thread(self._write, cursors)  # (fsyncs: off the loop)
            self._saved = cursors

    def save_at_close(self) -> None:
        """At a clean stop, once delivery has ended and the store's close flushed everything:
        the cursors as they are (only if every copy they pass is on disk)."""
        cursors = self._to_save()
        if cursors is None:
            return
        try:
            self._write(cursors)
        except OSError as exc:  # the last round's messages are delivered again at the next start
            log_event(log, "delay offsets not written at stop", logging.WARNING, path=str(self.path), error=str(exc))
            return
        self._saved = cursors

    async def run(self, stopping: asyncio.Event) -> None:
        """Deliver until `stopping` is set: at once while more is due, else every INTERVAL_S."""
        while not stopping.is_set():
            try:
                await self.deliver_due()
                if self._failing:
                    log_event(log, "delayed delivery resumed")
                    self._failing = ""
            except Exception as exc:  # never the end of delivery: said once, tried again
                why = f"{type(exc).__name__}: {exc}"
                if why != self._failing:
                    log_event(log, "delayed delivery failed; trying again", logging.ERROR, error=why)
                    self._failing = why
                self.progress.block(why)
                self._full = False
            if self._full:
                await asyncio.sleep(0)  # (a batch of passed entries awaits nothing: let the loop in)
            else:
                try:
                    async with asyncio.timeout(INTERVAL_S):
                        await stopping.wait()
                except TimeoutError:
                    pass
