"""Between the commitlog's protobuf messages and the store's types (no RPC logic here). A
request's messages need no conversion: the store reads them as they are (message_input.MessageFields)."""
from __future__ import annotations

import ipaddress
import socket
from operator import itemgetter
from typing import Any, Callable

import grpc

from quarry.channels import parse_peer
from quarry.formats.addresses import split_host_port
from quarry.v1 import commitlog_pb2, common_pb2
from quarry.services.commitlog.storage.append import Appended
from quarry.services.commitlog.broker.consume_status import GroupStatus


def resolve_store_host(advertise: str) -> tuple[str, int]:
    """The IP and port offsetMsgIds carry: a host name is resolved, a wildcard replaced by
    this host's address (an id must hold an IP the router can match)."""
    host, port = split_host_port(advertise)
    if host in ("0.0.0.0", "::", ""):
        host = socket.gethostbyname(socket.gethostname())
    try:
        ipaddress.ip_address(host)
    except ValueError:
        host = str(socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][4][0])
    return host, port


_SEND_OK = common_pb2.SEND_STATUS_SEND_OK
_FLUSH_TIMEOUT = common_pb2.SEND_STATUS_FLUSH_DISK_TIMEOUT

def peer_host(context: grpc.ServicerContext) -> tuple[str, int]:
    """The caller's (ip, port): the born host of a message sent without one."""
    return parse_peer(context.peer() or "")


def _status(appended: Appended) -> common_pb2.SendStatus.ValueType:
    """SEND_OK, or FLUSH_DISK_TIMEOUT when a SYNC store did not fsync the records in time."""
    return _SEND_OK if appended.flushed else _FLUSH_TIMEOUT


def send_results(appended: Appended, broker: str, add: Callable[..., Any]) -> None:
    """The wire's SendResult of each stored message, made by `add` (a repeated field's add,
    which fills a response in place: a batch answers thousands of these)."""
    status = _status(appended)
    offset_msg_id = appended.offset_msg_id
    for row in appended.rows:  # DispatchInfo's field order (append.Appended)
        at = row[0]
        add(status=status, unique_key=row[7] or "", offset_msg_id=offset_msg_id(at), queue_id=row[3], queue_offset=row[4],
            physical_offset=at, topic=row[2], broker_name=broker)


# Columns of the append's rows (DispatchInfo's field order, append.Appended).
_PHYSICAL_OFFSET, _TOPIC, _QUEUE_ID, _QUEUE_OFFSET = itemgetter(0), itemgetter(2), itemgetter(3), itemgetter(4)


def send_result_columns(appended: Appended, broker: str, store_host: tuple[str, int], out: commitlog_pb2.SendResultColumns) -> None:
    """The batch's SendResults as columns, filled into `out` (the contract's
    SendResultColumns: each message's SendResult is rebuilt from them and its own unique key,
    as clients.batch_results does). No object per message: the four columns taken from the rows
    (zip(*rows) would build all eleven)."""
    rows = appended.rows
    out.status = _status(appended)
    out.broker_name = broker
    out.store_host.ip, out.store_host.port = store_host
    topic = rows[0][2]
    out.topic = topic
    topics = list(map(_TOPIC, rows))
    if topics.count(topic) != len(topics):
        out.topics.extend(topics)
    out.physical_offsets.extend(map(_PHYSICAL_OFFSET, rows))
    out.queue_ids.extend(map(_QUEUE_ID, rows))
    out.queue_offsets.extend(map(_QUEUE_OFFSET, rows))


def send_result(appended: Appended, broker: str) -> common_pb2.SendResult:
    """The SendResult of a single send."""
    at, _, topic, queue_id, queue_offset, _, _, unique_key = appended.rows[0][:8]
    return common_pb2.SendResult(status=_status(appended), unique_key=unique_key or "",
                                 offset_msg_id=appended.offset_msg_id(at), queue_id=queue_id, queue_offset=queue_offset,
                                 physical_offset=at, topic=topic, broker_name=broker)


def to_group_status(s: GroupStatus, online: bool) -> common_pb2.GroupConsumeStatus:
    return common_pb2.GroupConsumeStatus(
        group=s.group, state=common_pb2.ConsumeState.Value("CONSUME_STATE_" + s.state), attempt=s.attempt,
        invisible_until_ms=s.invisible_until_ms, consumed_at_ms=s.consumed_at_ms, dead_lettered_at_ms=s.dead_lettered_at_ms,
        due_at_ms=s.due_at_ms, expression=s.expression, online=online, source=s.source, note=s.note)
