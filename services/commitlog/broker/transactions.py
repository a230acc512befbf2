"""Transactional messages, as a RocketMQ 4.3+/5 broker keeps them, whichever door they came by.

A prepared (half) message is stored under RMQ_SYS_TRANS_HALF_TOPIC (queue 0) carrying
REAL_TOPIC / REAL_QID and its transaction flags cleared, so neither its real topic's consumers
nor its queries see it. Ending the transaction finds the half by its physical offset: COMMIT
appends the message under its real topic and queue with the commit sysflag and
preparedTransactionOffset = the half's offset, then an op record (RMQ_SYS_TRANS_OP_HALF_TOPIC,
tag "d", body = the half's queue offset) marking the half resolved; ROLLBACK appends only the
op record. A half is resolved once: a second commit or rollback is refused, so a retried or
replayed end never stores the message twice (RocketMQ's broker would store it again).
Broker semantics, protocol-free: each door translates its own request and errors.
"""
from __future__ import annotations

import threading
import time
from dataclasses import replace

from quarry.formats.properties import KEYS, REAL_QID, REAL_TOPIC, TAGS, UNIQ_KEY
from quarry.formats.record import SYSFLAG_TRANSACTION_COMMIT, SYSFLAG_TRANSACTION_MASK, Record
from quarry.services.commitlog.storage.errors import Expired, NotFound, StoreError
from quarry.services.commitlog.storage.message_input import Host, NewMessage, Property
from quarry.services.commitlog.storage.store import CommitLogStore

HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"
OP_TOPIC = "RMQ_SYS_TRANS_OP_HALF_TOPIC"
REMOVE_TAG = "d"
_NOT_COPIED = {KEYS, TAGS, UNIQ_KEY, REAL_TOPIC, REAL_QID}  # set by their own fields, or the half's only


class NotAHalf(StoreError):
    """No unresolved half message at the offset given."""


class AlreadyResolved(StoreError):
    """The half's transaction was committed or rolled back before."""


def as_half(msg: NewMessage) -> NewMessage:
    """The half record of a prepared message: under the half topic, its real topic and queue
    kept as properties, its transaction flags cleared (RocketMQ's parseHalfMessageInner)."""
    props = [Property(*p) for p in msg.properties if p[0] not in (REAL_TOPIC, REAL_QID)]
    props += [Property(REAL_TOPIC, msg.topic), Property(REAL_QID, str(max(msg.queue_id, 0)))]
    return replace(msg, topic=HALF_TOPIC, queue_id=0, properties=props, sys_flag=msg.sys_flag & ~SYSFLAG_TRANSACTION_MASK)


class Transactions:
    """Locates half records and builds their resolution; remembers which halves are resolved.
    One per store, shared by every door."""

    def __init__(self, store: CommitLogStore) -> None:
        self.store = store
        self._lock = threading.Lock()
        self._resolved: set[int] | None = None  # physical offsets of resolved halves, loaded on first use
        self._pruned_at = 0  # its size after the last prune: halves retention deleted are forgotten

    def _load_resolved(self) -> set[int]:
        """Halves resolved before this process started, from the op records' bodies."""
        resolved: set[int] = set()
        for qid in range(self.store.topics.get(OP_TOPIC, 0)):
            offset = 0
            while True:
                try:
                    records, next_offset, _, _ = self.store.pull(OP_TOPIC, qid, offset, 256)
                except (NotFound, Expired):
                    break
                for r in records:
                    if r.body.isdigit():
                        try:
                            halves, _, _, _ = self.store.pull(HALF_TOPIC, 0, int(r.body), 1)
                        except (NotFound, Expired):
                            continue
                        resolved.update(h.physical_offset for h in halves)
                if not records or next_offset <= offset:
                    break
                offset = next_offset
        return resolved

    def half_at(self, offset: int) -> Record:
        """The half record at `offset`; NotAHalf saying why there is none."""
        try:
            half = self.store.read(offset)
        except (NotFound, Expired) as exc:
            raise NotAHalf(f"no half record at offset {offset} ({exc})") from None
        if half.topic != HALF_TOPIC:
            raise NotAHalf(f"the record at offset {offset} is not a half (prepared transaction) message")
        return half

    def claim(self, half: Record) -> None:
        """Mark `half` resolved (release() it if its resolution cannot be stored); claimed before
        the append, so a concurrent retry is refused too."""
        with self._lock:
            if self._resolved is None:
                self._resolved = self._load_resolved()
            if half.physical_offset in self._resolved:
                raise AlreadyResolved(f"the transaction of the half message at offset {half.physical_offset} was already committed or rolled back")
            self._resolved.add(half.physical_offset)
            if len(self._resolved) >= 2 * max(self._pruned_at, 4096):
                self._prune()

    def _prune(self) -> None:
        """Forget halves below the log's start: retention deleted them, nothing can end them again."""
        first = self.store.min_offset
        self._resolved = {offset for offset in self._resolved or () if offset >= first}
        self._pruned_at = len(self._resolved)

    def is_resolved(self, half: Record) -> bool:
        """Whether `half`'s transaction was committed or rolled back (or is being ended now)."""
        with self._lock:
            if self._resolved is None:
                self._resolved = self._load_resolved()
            return half.physical_offset in self._resolved

    def release(self, half: Record) -> None:
        with self._lock:
            if self._resolved is not None:
                self._resolved.discard(half.physical_offset)

    @staticmethod
    def resolution(half: Record, commit: bool, now_ms: int | None = None) -> list[NewMessage]:
        """What ending the transaction appends: (the committed message,) then the op record."""
        props = half.properties
        out: list[NewMessage] = []
        if commit:
            pairs = [Property(n, v) for n, v in half.properties_pairs if n not in _NOT_COPIED]
            out.append(NewMessage(
                props[REAL_TOPIC], half.body, half.keys, props.get(TAGS, ""), props.get(UNIQ_KEY, ""), pairs,
                half.flag, int(props.get(REAL_QID, "0")), half.born_timestamp, Host(*half.born_host),
                SYSFLAG_TRANSACTION_COMMIT, half.reconsume_times, half.physical_offset,
            ))
        out.append(NewMessage(OP_TOPIC, str(half.queue_offset).encode(), [], REMOVE_TAG, "", [], 0, 0,
                              now_ms if now_ms is not None else int(time.time() * 1000), Host(*half.store_host)))
        return out
