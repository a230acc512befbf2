"""Delivers parked delayed messages (parking.py) when they are due, as a RocketMQ 4.x
broker's ScheduleMessageService does.

Each delay level's queue of SCHEDULE_TOPIC_XXXX holds its messages in deliver-time order (one
delay per queue), so each is read from a cursor: every record due is stored again under its
REAL_TOPIC / REAL_QID (DELAY dropped, everything else kept: body, keys, tags, UNIQ_KEY, born
time and host, flag, REAL_TOPIC / REAL_QID as RocketMQ keeps them), and the cursor moves past it
once that copy is on disk. The cursors are kept in the store's config/delayOffset.json
(RocketMQ's file: {"offsetTable": {level: next queue offset}}), so a restart, or a RocketMQ
store opened by Quarry, goes on where delivery stopped. A crash between the copy and the cursor
delivers a message twice (as RocketMQ may), never not at all.
"""
from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from pathlib import Path
from typing import Callable

from quarry.formats.properties import DELAY, KEYS, REAL_QID, REAL_TOPIC, TAGS, UNIQ_KEY
from quarry.formats.record import Record
from quarry.formats.scheduled import MAX_DELAY_LEVEL, SCHEDULE_TOPIC, delay_level_deliver_time
from quarry.formats.state_file import write_json_atomic
from quarry.services.commitlog.errors import InvalidArgument, NotFound, StoreError
from quarry.services.commitlog.flush_signal import FlushSignal
from quarry.services.commitlog.flushing import await_flushed
from quarry.services.commitlog.message_input import Host, NewMessage, Property
from quarry.services.commitlog.sending import SendPath
from quarry.services.log import log_event

log = logging.getLogger("quarry.commitlog.delayed")

OFFSETS_FILE = "delayOffset.json"
INTERVAL_S = 0.1  # how soon a level is looked at again when nothing more is due (RocketMQ: 100 ms)
BATCH = 256  # records delivered by one append at most
FLUSH_WAIT_S = 30.0  # a copy not on disk by then is delivered again from the same cursor
# Fields a copy gets from the record's own fields (not from its other properties), and the level.
_NOT_COPIED = (DELAY, KEYS, TAGS, UNIQ_KEY)
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
    """The message a parked record becomes when due; None when it names no real topic."""
    props = rec.properties
    real_topic = props.get(REAL_TOPIC)
    try:
        real_queue = int(props.get(REAL_QID, ""))
    except ValueError:
        return None
    if not real_topic or real_queue < 0:
        return None
    keys = props.get(KEYS)
    return NewMessage(
        real_topic, rec.body, keys.split(" ") if keys else [], props.get(TAGS, ""), props.get(UNIQ_KEY, ""),
        [Property(n, v) for n, v in rec.properties_pairs if n not in _NOT_COPIED],
        rec.flag, real_queue, rec.born_timestamp, Host(*rec.born_host), rec.sys_flag, rec.reconsume_times, rec.prepared_transaction_offset,
    )


class DelayedDelivery:
    """The delivery of one writable store's parked messages, on its event loop."""

    def __init__(self, sending: SendPath, flushed: FlushSignal, clock_ms: Callable[[], int] = lambda: int(time.time() * 1000)) -> None:
        self.sending = sending
        self.store = sending.store
        self.flushed = flushed
        self.clock_ms = clock_ms
        self.path = self.store.dir / "config" / OFFSETS_FILE
        self.offsets = load_offsets(self.path)  # level -> next queue offset to deliver
        self._failing = ""  # the failure last logged (reported once, not every round)

    def due(self, now_ms: int) -> list[tuple[int, int, NewMessage | None]]:
        """Up to BATCH parked records due at `now_ms`, level by level in queue order: (level,
        the level's cursor past it, its copy, or None when it cannot be delivered or the entry
        only passes units the queue skips: expired, damaged)."""
        out: list[tuple[int, int, NewMessage | None]] = []
        if SCHEDULE_TOPIC not in self.store.topics:
            return out
        for level in range(1, MAX_DELAY_LEVEL + 1):
            cursor = self.offsets.get(level, 0)
            while len(out) < BATCH:
                try:
                    records, next_offset, _, _ = self.store.pull(SCHEDULE_TOPIC, level - 1, cursor, BATCH - len(out))
                except NotFound:  # (a parking topic with fewer queues than levels)
                    break
                waiting_at = None
                for rec in records:
                    at = delay_level_deliver_time(rec.properties.get(DELAY), rec.store_timestamp)
                    if at is not None and at > now_ms:
                        waiting_at = rec.queue_offset
                        break
                    out.append((level, rec.queue_offset + 1, delivered_copy(rec)))
                end = waiting_at if waiting_at is not None else next_offset
                if end > (out[-1][1] if out and out[-1][0] == level else cursor):
                    out.append((level, end, None))
                if waiting_at is not None or next_offset <= cursor:
                    break
                cursor = next_offset
        return out

    async def deliver_due(self) -> int:
        """Deliver what is due now; the number of messages stored again."""
        due = self.due(self.clock_ms())
        if not due:
            return 0
        copies = [m for _, _, m in due if m is not None]
        done = len(due)  # the entries handled, in order (their cursors may move)
        stored = 0
        if copies:
            try:
                appended = await self.sending.append_flushed(copies, "DelayedDelivery", wait_flush=False, same_topic=False)
                stored = len(copies)
            except StoreError:
                appended, done, stored = None, 0, 0
                for level, _, msg in due:  # one by one: a copy refused for good is skipped, said once
                    if msg is not None:
                        try:
                            appended = await self.sending.append_flushed((msg,), "DelayedDelivery", wait_flush=False)
                            stored += 1
                        except (InvalidArgument, NotFound) as exc:
                            log_event(log, "delayed message not deliverable; skipped", logging.WARNING, delay_level=level, topic=msg.topic,
                                      unique_key=msg.unique_key or "-", reason=str(exc))
                        except StoreError:
                            break  # (disk full, read-only): tried again from here next round
                    done += 1
            if appended is not None:
                # On disk before the cursor passes it: a crash then delivers it again, never loses it.
                self.store.request_flush()
                if not await await_flushed(self.store.flusher, self.flushed, appended.end, FLUSH_WAIT_S):
                    return stored
        moved = False
        for level, cursor, _ in due[:done]:
            if cursor > self.offsets.get(level, 0):
                self.offsets[level] = cursor
                moved = True
        if moved:
            write_json_atomic(self.path, {"offsetTable": {str(level): offset for level, offset in sorted(self.offsets.items())}}, indent=2)
        return stored

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
