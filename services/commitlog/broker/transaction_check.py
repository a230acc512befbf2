"""The broker's transaction check, as RocketMQ 4's TransactionalMessageCheckService does it.

A half message (transactions.py) whose producer never ended it (it returned UNKNOW, or died
before sending END_TRANSACTION) is asked about: every `interval_ms`, each half older than
`timeout_ms` (by its store time; a half's CHECK_IMMUNITY_TIME_IN_SECONDS property sets its own)
that has no op record is handed to the askers (a door's way of asking a live producer of the
half's PGROUP: RocketMQ 4's CHECK_TRANSACTION_STATE, see doors/remoting.py). The producer
answers by ending the transaction as usual. A half is asked about at most `max_checks` times
(RocketMQ's transactionCheckMax); a check with no producer online to ask counts too, as on a
RocketMQ broker. The round after the last check, the half is discarded: a copy is stored under
TRANS_CHECK_MAX_TIME_TOPIC (queue 0; found there by key and unique key), the discard is logged
at WARNING and counted, and the half is never asked about again. Like RocketMQ's broker, a
discard writes no op record: a producer that ends the transaction later still can.

The halves before `cursor` (HALF_TOPIC queue 0) are all resolved or discarded; the cursor is
kept as RocketMQ keeps it, the offset of consumer group CID_RMQ_SYS_TRANS on the half queue
(config/consumerOffset.json), so a restart does not look at them again. The check counts are
kept in memory: after a restart a pending half may be asked `max_checks` times more.
Protocol-free: doors add askers.
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Callable

from quarry.formats.properties import KEYS, PRODUCER_GROUP, REAL_TOPIC, TAGS, UNIQ_KEY
from quarry.formats.properties import REAL_QID
from quarry.formats.record import SYSFLAG_TRANSACTION_MASK, Record, encode_record
from quarry.services.commitlog.storage.errors import Expired, NotFound, StoreError
from quarry.services.commitlog.storage.message_input import Host, NewMessage, Property
from quarry.services.commitlog.broker.sending import SendPath
from quarry.services.commitlog.storage.store import CommitLogStore
from quarry.services.commitlog.broker.transactions import HALF_TOPIC, Transactions
from quarry.services.log import log_event
from quarry.services.settings import EnvArgumentParser

log = logging.getLogger("quarry.commitlog.transactions")

CHECK_GROUP = "CID_RMQ_SYS_TRANS"  # RocketMQ's consumer group of the half queue: the check's cursor
DISCARD_TOPIC = "TRANS_CHECK_MAX_TIME_TOPIC"
CHECK_IMMUNITY = "CHECK_IMMUNITY_TIME_IN_SECONDS"
SCAN_BATCH = 256
MAX_SCAN = 100_000  # halves one round reads at most (the rest wait for the next round)


@dataclass(frozen=True)
class CheckSettings:
    timeout_ms: int = 6_000  # RocketMQ's transactionTimeOut
    interval_ms: int = 60_000  # RocketMQ's transactionCheckInterval
    max_checks: int = 15  # RocketMQ's transactionCheckMax


def add_check_settings(p: EnvArgumentParser) -> None:
    d = CheckSettings()
    p.add_setting("--transaction-timeout-ms", "QUARRY_TRANSACTION_TIMEOUT_MS", d.timeout_ms,
                  "a half (prepared) transactional message not ended this long after it was stored is checked with its producer "
                  "(CHECK_TRANSACTION_STATE; RocketMQ's transactionTimeOut)", int, minimum=0)
    p.add_setting("--transaction-check-interval-ms", "QUARRY_TRANSACTION_CHECK_INTERVAL_MS", d.interval_ms,
                  "how often unended half messages are checked with their producers (RocketMQ's transactionCheckInterval)", int, minimum=10)
    p.add_setting("--transaction-check-max", "QUARRY_TRANSACTION_CHECK_MAX", d.max_checks,
                  "checks of one half message before it is discarded to TRANS_CHECK_MAX_TIME_TOPIC (RocketMQ's transactionCheckMax)",
                  int, minimum=1)


def check_settings(args: argparse.Namespace) -> CheckSettings:
    return CheckSettings(args.transaction_timeout_ms, args.transaction_check_interval_ms, args.transaction_check_max)


@dataclass(frozen=True)
class CheckRequest:
    """What a producer is asked (RocketMQ's CheckTransactionStateRequestHeader): the half by its
    queue offset and physical offset, its ids, and which check of `max_checks` this is."""

    tran_state_table_offset: int
    commit_log_offset: int
    msg_id: str
    transaction_id: str
    offset_msg_id: str
    group: str
    real_topic: str
    check: int


# An asker sends the check to one live producer of the half's group and says whether it could.
Asker = Callable[[Record, CheckRequest], bool]


@dataclass
class RoundReport:
    asked: int = 0  # checks sent to a producer
    unasked: int = 0  # checks counted with no producer online to ask
    discarded: list[Record] = field(default_factory=list)
    cursor: int = 0


def due_after_ms(half: Record, timeout_ms: int) -> int:
    """How old (since stored) a half must be before its first check."""
    immunity = half.properties.get(CHECK_IMMUNITY, "")
    try:
        seconds = int(immunity)
    except ValueError:
        return timeout_ms
    return timeout_ms if seconds < 0 else seconds * 1000


def as_sent(half: Record) -> bytes:
    """The half in RocketMQ's message layout as a check shows it to its producer (RocketMQ's
    sendCheckMessage): its real topic and queue, everything else as stored, the ids and offsets
    the check names included."""
    props = half.properties
    try:
        queue_id = int(props.get(REAL_QID, "0"))
    except ValueError:
        queue_id = 0
    return encode_record(topic=props.get(REAL_TOPIC, half.topic), body=half.body, properties=half.properties_text, queue_id=queue_id,
                         flag=half.flag, queue_offset=half.queue_offset, physical_offset=half.physical_offset, sys_flag=half.sys_flag,
                         born_timestamp=half.born_timestamp, born_host=half.born_host, store_timestamp=half.store_timestamp,
                         store_host=half.store_host, reconsume_times=half.reconsume_times,
                         prepared_transaction_offset=half.prepared_transaction_offset, crc=half.body_crc)


def discarded_copy(half: Record) -> NewMessage:
    """The half, kept under TRANS_CHECK_MAX_TIME_TOPIC (as RocketMQ's resolveDiscardMsg keeps
    it): body, keys, tags, unique key and every property, REAL_TOPIC and PGROUP included."""
    props = half.properties
    pairs = [Property(n, v) for n, v in half.properties_pairs if n not in (KEYS, TAGS, UNIQ_KEY)]
    return NewMessage(DISCARD_TOPIC, half.body, half.keys, props.get(TAGS, ""), props.get(UNIQ_KEY, ""), pairs, half.flag, 0,
                      half.born_timestamp, Host(*half.born_host), half.sys_flag & ~SYSFLAG_TRANSACTION_MASK, half.reconsume_times)


class TransactionCheck:
    def __init__(self, store: CommitLogStore, transactions: Transactions, sending: SendPath, settings: CheckSettings = CheckSettings(),
                 clock_ms: Callable[[], int] | None = None) -> None:
        self.store, self.transactions, self.sending, self.settings = store, transactions, sending, settings
        self.askers: list[Asker] = []
        self._clock = clock_ms or (lambda: int(time.time() * 1000))
        self._checks: dict[int, int] = {}  # half physical offset -> checks made (this process)
        self._discarded: set[int] = set()  # discarded halves past which the cursor has not moved yet
        self._told_unasked: set[int] = set()
        self.checks_sent = 0
        self.discards = 0

    @property
    def cursor(self) -> int:
        return self.store.consumer_offsets.get(CHECK_GROUP, HALF_TOPIC, 0) or 0

    def _scan(self, now_ms: int) -> tuple[list[Record], int]:
        """(the unresolved halves due now, in queue order; the new cursor: past every half
        resolved or discarded before the first that is not). Reads the store: run off the loop."""
        due: list[Record] = []
        offset = cursor = self.cursor
        settled = True  # every half before `offset` is resolved or discarded
        read = 0
        while read < MAX_SCAN:
            try:
                records, next_offset, _, _ = self.store.pull(HALF_TOPIC, 0, offset, SCAN_BATCH)
            except (NotFound, Expired):
                break
            if next_offset <= offset and not records:
                break  # the end of the queue
            if settled and not records:
                cursor = next_offset  # below the queue's minimum (retention) or units expired: nothing to check there
            for half in records:
                read += 1
                if self._settled(half):
                    if settled:
                        cursor = half.queue_offset + 1
                    continue
                settled = False
                if now_ms - half.store_timestamp >= due_after_ms(half, self.settings.timeout_ms):
                    due.append(half)
                elif CHECK_IMMUNITY not in half.properties:
                    return due, cursor  # the halves after it are newer: not due either
            offset = next_offset
        return due, cursor

    def _settled(self, half: Record) -> bool:
        return half.physical_offset in self._discarded or self.transactions.is_resolved(half)

    async def round(self) -> RoundReport:
        """One pass over the half queue: each due half asked about (or discarded)."""
        now = self._clock()
        due, cursor = await asyncio.to_thread(self._scan, now)
        report = RoundReport()
        for half in due:
            if self.transactions.is_resolved(half):
                continue  # ended while the queue was read
            made = self._checks.get(half.physical_offset, 0)
            if made >= self.settings.max_checks:
                await self._discard(half, made)
                report.discarded.append(half)
                continue
            self._checks[half.physical_offset] = made + 1
            request = self.request(half, made + 1)
            if any(ask(half, request) for ask in self.askers):
                report.asked += 1
                self.checks_sent += 1
            else:
                report.unasked += 1
                if half.physical_offset not in self._told_unasked:
                    self._told_unasked.add(half.physical_offset)
                    log_event(log, "transaction check: no producer of the group online to ask; the check counts", logging.INFO,
                              group=request.group, topic=request.real_topic, msg_id=request.msg_id, commit_log_offset=half.physical_offset,
                              check=f"{made + 1}/{self.settings.max_checks}")
        # The cursor moves past what is settled, discards of this round included.
        cursor = self._settled_cursor(cursor)
        if cursor > self.cursor:
            self.store.consumer_offsets.commit(CHECK_GROUP, HALF_TOPIC, 0, cursor)
        report.cursor = self.cursor
        self._forget_below(report.cursor)
        return report

    def _settled_cursor(self, cursor: int) -> int:
        while True:
            try:
                records, _, _, _ = self.store.pull(HALF_TOPIC, 0, cursor, 1)
            except (NotFound, Expired):
                return cursor
            if not records:
                return cursor
            half = records[0]
            if self._settled(half):
                cursor = half.queue_offset + 1
            else:
                return cursor

    def _forget_below(self, cursor: int) -> None:
        """Halves behind the cursor are never looked at again: their counts go."""
        if not self._discarded and len(self._checks) < 1024:
            return
        try:
            records, _, _, _ = self.store.pull(HALF_TOPIC, 0, cursor, 1)
        except (NotFound, Expired):
            return
        if not records:
            below = self.store.write_offset
        else:
            below = records[0].physical_offset
        self._discarded = {o for o in self._discarded if o >= below}
        self._checks = {o: n for o, n in self._checks.items() if o >= below}
        self._told_unasked = {o for o in self._told_unasked if o >= below}

    @staticmethod
    def request(half: Record, check: int) -> CheckRequest:
        props = half.properties
        uniq = props.get(UNIQ_KEY, "")
        return CheckRequest(half.queue_offset, half.physical_offset, uniq, uniq, half.offset_msg_id,
                            props.get(PRODUCER_GROUP, ""), props.get(REAL_TOPIC, ""), check)

    async def _discard(self, half: Record, checks: int) -> None:
        try:
            if DISCARD_TOPIC not in self.store.topics and self.store.create_topic(DISCARD_TOPIC, 1):
                self.sending.on_topic_created()
            await self.sending.append_flushed([discarded_copy(half)], "TransactionCheckDiscard", same_topic=False, delivered=True)
        except StoreError as exc:
            log_event(log, "transaction check: could not store a discarded half; asked about again next round", logging.ERROR,
                      commit_log_offset=half.physical_offset, reason=str(exc))
            return
        self._discarded.add(half.physical_offset)
        self.discards += 1
        props = half.properties
        log_event(log, f"transaction check: half message checked {checks} times without being ended; discarded to {DISCARD_TOPIC} "
                       "(its producer may still end it)", logging.WARNING,
                  group=props.get(PRODUCER_GROUP, ""), topic=props.get(REAL_TOPIC, ""), msg_id=props.get(UNIQ_KEY, ""),
                  offset_msg_id=half.offset_msg_id, commit_log_offset=half.physical_offset)

    async def run(self, stop: asyncio.Event) -> None:
        """A round every interval until `stop` is set."""
        interval = self.settings.interval_ms / 1000.0
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), interval)
                return
            except asyncio.TimeoutError:
                pass
            try:
                await self.round()
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - a round's failure is logged; the next round tries again
                log.exception("transaction check round failed")


