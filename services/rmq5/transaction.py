"""Transactional messages, as a RocketMQ 4.3+/5 broker keeps them.

SendMessage of a TRANSACTION message stores a half record under RMQ_SYS_TRANS_HALF_TOPIC
(queue 0) carrying REAL_TOPIC / REAL_QID, TRAN_MSG=true and PGROUP (the topic, as the proxy
names the producer group): queries under the real topic do not see it. The receipt's
transaction_id is the half record's offsetMsgId, so EndTransaction finds it again with no
state kept between the two calls (and after a restart).

EndTransaction COMMIT appends the message under its real topic and queue with the commit
sysflag and preparedTransactionOffset = the half's physical offset, and an op record
(RMQ_SYS_TRANS_OP_HALF_TOPIC, tag "d", body = the half's queue offset) that marks the half
resolved; ROLLBACK appends only the op record. Both go in one append. A half resolved
before is refused (INVALID_TRANSACTION_ID), so a retried commit never stores twice.
Orphaned halves are not checked back with the producer (no RecoverOrphanedTransactionCommand).
"""
from __future__ import annotations

import threading
import time

from quarry.formats import offset_msg_id
from quarry.formats.properties import KEYS, PRODUCER_GROUP, REAL_QID, REAL_TOPIC, TAGS, TRAN_MSG, UNIQ_KEY
from quarry.formats.record import SYSFLAG_TRANSACTION_COMMIT, Record
from quarry.formats.topic import TopicError, validate_topic
from quarry.services.commitlog.errors import Expired, NotFound
from quarry.services.commitlog.message_input import NewMessage, Property
from quarry.services.commitlog.store import CommitLogStore
from quarry.services.rmq5.contract import Code, service, v2
from quarry.services.rmq5.send import to_new_message
from quarry.services.rmq5.status import RmqError

HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"
OP_TOPIC = "RMQ_SYS_TRANS_OP_HALF_TOPIC"
REMOVE_TAG = "d"
_NOT_COPIED = {KEYS, TAGS, UNIQ_KEY, REAL_TOPIC, REAL_QID}  # set by their own fields, or the half's only


def half_message(m: v2.Message, peer: tuple[str, int], field: str = "messages[0]", now_ms: int | None = None) -> NewMessage:
    """The half record of a TRANSACTION message."""
    msg = to_new_message(m, peer, field, now_ms)
    real_topic, real_queue = msg.topic, msg.queue_id
    try:
        validate_topic(real_topic, f"{field}.topic.name")
    except TopicError as exc:
        raise RmqError(Code.ILLEGAL_TOPIC, str(exc)) from None
    msg.properties = msg.properties + [Property(REAL_TOPIC, real_topic), Property(REAL_QID, str(max(real_queue, 0))), Property(TRAN_MSG, "true"),
                                       Property(PRODUCER_GROUP, real_topic)]
    msg.topic, msg.queue_id = HALF_TOPIC, 0
    return msg


class Transactions:
    """Locates half records and builds their resolution; remembers which halves are resolved."""

    def __init__(self, store: CommitLogStore) -> None:
        self.store = store
        self._lock = threading.Lock()
        self._resolved: set[int] | None = None  # physical offsets of resolved halves, loaded on first use

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

    def claim(self, request: service.EndTransactionRequest) -> Record:
        """The unresolved half record `request` names, now marked resolved (release() it if the
        resolution cannot be stored); RmqError saying what does not match."""
        try:
            decoded = offset_msg_id.decode(request.transaction_id)
        except ValueError as exc:
            raise RmqError(Code.INVALID_TRANSACTION_ID, f"transaction_id: {exc} (it is the transaction_id the SendMessage receipt returned)") from None
        host = self.store.config.store_host
        if (decoded.ip, decoded.port) != (host[0], host[1]):
            raise RmqError(Code.INVALID_TRANSACTION_ID, f"transaction_id: names a half stored at {decoded.ip}:{decoded.port}, not on this broker ({host[0]}:{host[1]})")
        try:
            half = self.store.read(decoded.offset)
        except (NotFound, Expired) as exc:
            raise RmqError(Code.INVALID_TRANSACTION_ID, f"transaction_id: no half record at offset {decoded.offset} ({exc})") from None
        props = half.properties
        if half.topic != HALF_TOPIC:
            raise RmqError(Code.INVALID_TRANSACTION_ID, f"transaction_id: the record at offset {decoded.offset} is not a half (transactional) message")
        if props.get(UNIQ_KEY) != request.message_id:
            raise RmqError(Code.ILLEGAL_MESSAGE_ID, f"message_id: {request.message_id!r} is not the id of this transaction's message ({props.get(UNIQ_KEY)!r})")
        if props.get(REAL_TOPIC) != request.topic.name:
            raise RmqError(Code.ILLEGAL_TOPIC, f"topic.name: {request.topic.name!r} is not this transaction's topic ({props.get(REAL_TOPIC)!r})")
        with self._lock:
            if self._resolved is None:
                self._resolved = self._load_resolved()
            if half.physical_offset in self._resolved:
                raise RmqError(Code.INVALID_TRANSACTION_ID, f"transaction_id: transaction of message {request.message_id} was already committed or rolled back")
            self._resolved.add(half.physical_offset)  # claimed before the append: a concurrent retry is refused
        return half

    def release(self, half: Record) -> None:
        with self._lock:
            if self._resolved is not None:
                self._resolved.discard(half.physical_offset)

    @staticmethod
    def resolution(half: Record, commit: bool, now_ms: int | None = None) -> list[NewMessage]:
        """What EndTransaction appends: (the committed message,) then the op record."""
        props = half.properties
        out: list[NewMessage] = []
        if commit:
            pairs = [(n, v) for n, v in half.properties_pairs if n not in _NOT_COPIED]
            out.append(NewMessage(
                props[REAL_TOPIC], half.body, half.keys, props.get(TAGS, ""), props.get(UNIQ_KEY, ""), pairs,
                half.flag, int(props.get(REAL_QID, "0")), half.born_timestamp, half.born_host,
                SYSFLAG_TRANSACTION_COMMIT, half.reconsume_times, half.physical_offset,
            ))
        out.append(NewMessage(OP_TOPIC, str(half.queue_offset).encode(), [], REMOVE_TAG, "", [], 0, 0,
                              now_ms if now_ms is not None else int(time.time() * 1000), half.store_host))
        return out
