"""RocketMQ 5's transactional messages, translated to the broker's (services/commitlog/broker/transactions.py).

SendMessage of a TRANSACTION message stores a half record carrying TRAN_MSG=true and PGROUP
(the topic, as the proxy names the producer group). The receipt's transaction_id is the half
record's offsetMsgId, so EndTransaction finds it again with no state kept between the two calls
(and after a restart). A half not ended in time is checked back by the broker's transaction
check (services/commitlog/broker/transaction_check.py): this door asks a live producer publishing the
half's topic with a RecoverOrphanedTransactionCommand on its Telemetry stream (orphan_command;
rmq5_messaging.ask_producer), and the SDK's TransactionChecker answers with EndTransaction
(source SOURCE_SERVER_CHECK), as RocketMQ 5's proxy does.
"""
from __future__ import annotations

import hashlib

from google.protobuf import timestamp_pb2

from quarry.formats import offset_msg_id
from quarry.formats.body import readable_body
from quarry.formats.properties import BORN_HOST, PRODUCER_GROUP, REAL_QID, REAL_TOPIC, SYSTEM_PROPERTY_NAMES, TRAN_MSG, UNIQ_KEY
from quarry.formats.record import Record
from quarry.formats.topic import TopicError, validate_topic
from quarry.services.commitlog.storage.message_input import NewMessage, Property
from quarry.services.commitlog.broker.transactions import AlreadyResolved, NotAHalf, Transactions, as_half
from quarry.services.rmq5.contract import Code, service, v2
from quarry.services.commitlog.doors.rmq5_send import to_new_message
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


def _ts(ms: int) -> timestamp_pb2.Timestamp:
    return timestamp_pb2.Timestamp(seconds=ms // 1000, nanos=(ms % 1000) * 1_000_000)


def orphan_command(half: Record, store_host: str) -> service.TelemetryCommand:
    """The check of a half not ended in time, as RocketMQ's proxy sends it to a producer: the
    message as the producer sent it (its real topic, id, keys, tag, properties, body with its
    MD5 digest, which the SDKs verify) and the transaction_id its EndTransaction names (the
    half's offsetMsgId, as the SendMessage receipt gave it)."""
    props = half.properties
    body = readable_body(half.body, half.sys_flag)
    try:
        queue_id = int(props.get(REAL_QID, "0"))
    except ValueError:
        queue_id = 0
    sp = v2.SystemProperties(
        message_id=props.get(UNIQ_KEY) or half.offset_msg_id, message_type=v2.MessageType.TRANSACTION,
        body_digest=v2.Digest(type=v2.DigestType.MD5, checksum=hashlib.md5(body).hexdigest().upper()), body_encoding=v2.Encoding.IDENTITY,
        born_timestamp=_ts(half.born_timestamp), born_host=props.get(BORN_HOST) or half.born_host[0],
        store_timestamp=_ts(half.store_timestamp), store_host=store_host, queue_id=queue_id, queue_offset=half.queue_offset)
    if half.tags:
        sp.tag = half.tags
    sp.keys.extend(half.keys)
    m = v2.Message(topic=v2.Resource(name=props.get(REAL_TOPIC, half.topic)), system_properties=sp, body=body)
    for name, value in props.items():
        if name not in SYSTEM_PROPERTY_NAMES:
            m.user_properties[name] = value
    return service.TelemetryCommand(recover_orphaned_transaction_command=service.RecoverOrphanedTransactionCommand(
        message=m, transaction_id=half.offset_msg_id))
