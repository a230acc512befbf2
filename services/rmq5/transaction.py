"""RocketMQ 5's transactional messages, translated to the broker's (services/commitlog/transactions.py).

SendMessage of a TRANSACTION message stores a half record carrying TRAN_MSG=true and PGROUP
(the topic, as the proxy names the producer group). The receipt's transaction_id is the half
record's offsetMsgId, so EndTransaction finds it again with no state kept between the two calls
(and after a restart). Orphaned halves are not checked back with the producer (no
RecoverOrphanedTransactionCommand).
"""
from __future__ import annotations

from quarry.formats import offset_msg_id
from quarry.formats.properties import PRODUCER_GROUP, REAL_TOPIC, TRAN_MSG, UNIQ_KEY
from quarry.formats.record import Record
from quarry.formats.topic import TopicError, validate_topic
from quarry.services.commitlog.message_input import NewMessage, Property
from quarry.services.commitlog.transactions import AlreadyResolved, NotAHalf, Transactions, as_half
from quarry.services.rmq5.contract import Code, service, v2
from quarry.services.rmq5.send import to_new_message
from quarry.services.rmq5.status import RmqError


def half_message(m: v2.Message, peer: tuple[str, int], field: str = "messages[0]", now_ms: int | None = None) -> NewMessage:
    """The half record of a TRANSACTION message."""
    msg = to_new_message(m, peer, field, now_ms)
    real_topic = msg.topic
    try:
        validate_topic(real_topic, f"{field}.topic.name")
    except TopicError as exc:
        raise RmqError(Code.ILLEGAL_TOPIC, str(exc)) from None
    msg.properties = list(msg.properties) + [Property(TRAN_MSG, "true"), Property(PRODUCER_GROUP, real_topic)]
    return as_half(msg)


def claim(transactions: Transactions, request: service.EndTransactionRequest) -> Record:
    """The unresolved half record `request` names, now marked resolved (release() it if the
    resolution cannot be stored); RmqError saying what does not match."""
    try:
        decoded = offset_msg_id.decode(request.transaction_id)
    except ValueError as exc:
        raise RmqError(Code.INVALID_TRANSACTION_ID, f"transaction_id: {exc} (it is the transaction_id the SendMessage receipt returned)") from None
    host = transactions.store.config.store_host
    if (decoded.ip, decoded.port) != (host[0], host[1]):
        raise RmqError(Code.INVALID_TRANSACTION_ID, f"transaction_id: names a half stored at {decoded.ip}:{decoded.port}, not on this broker ({host[0]}:{host[1]})")
    try:
        half = transactions.half_at(decoded.offset)
    except NotAHalf as exc:
        raise RmqError(Code.INVALID_TRANSACTION_ID, f"transaction_id: {exc}") from None
    props = half.properties
    if props.get(UNIQ_KEY) != request.message_id:
        raise RmqError(Code.ILLEGAL_MESSAGE_ID, f"message_id: {request.message_id!r} is not the id of this transaction's message ({props.get(UNIQ_KEY)!r})")
    if props.get(REAL_TOPIC) != request.topic.name:
        raise RmqError(Code.ILLEGAL_TOPIC, f"topic.name: {request.topic.name!r} is not this transaction's topic ({props.get(REAL_TOPIC)!r})")
    try:
        transactions.claim(half)
    except AlreadyResolved:
        raise RmqError(Code.INVALID_TRANSACTION_ID, f"transaction_id: transaction of message {request.message_id} was already committed or rolled back") from None
    return half
